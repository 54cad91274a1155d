//! Policy routing on the real kernel, as the AWS VPC CNI wires an EKS
//! node (`cargo xtask lab up --topology aws-vpc`): pod routes in a table
//! of their own, reached by `ip rule`. A healthy pair's story names the
//! table and the rule; a table that rejects the remote pods' subnet is a
//! no-route verdict in `ip rule` / `ip route show table N` terms.

#[allow(dead_code)]
mod support;

use serde_json::Value;
use support::*;
use xtask::lab::{aws_vpc::ENI_TABLE, ip, LabGuard, Topology};

/// The JSON story of one ping web-0 → db-0, traced on both nodes.
fn one_ping(lab: &LabGuard) -> (Value, bool) {
    let trace = Trace::start(&one_packet(&lab.0, "web-0", "db-0", "json"));
    let answered = lab.0.ping("web-0", lab.0.pod("db-0").ip, &[]);
    let story = trace.finish().first_story();
    (story, answered)
}

/// The rule the CNI added for web-0, as `ip rule` prints it.
fn web_rule(lab: &LabGuard) -> String {
    format!(
        "rule 1536: from {} lookup {ENI_TABLE}",
        lab.0.pod("web-0").ip
    )
}

#[test]
fn a_policy_routed_pair_is_delivered_and_its_hop_names_the_table_and_rule() {
    let lab = lab(Topology::AwsVpc);
    let (story, answered) = one_ping(&lab);
    assert!(answered, "the healthy aws-vpc lab must answer");
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "delivered", "{verdict}");
    let notes: Vec<&str> = (story["hops"].as_array().expect("hops").iter())
        .filter_map(|h| h["note"].as_str())
        .collect();
    let expected = format!("dev eth1 table {ENI_TABLE} ({})", web_rule(&lab));
    assert!(
        notes.iter().any(|n| n.contains(&expected)),
        "no hop says {expected}: {notes:#?}"
    );
}

#[test]
fn an_unreachable_route_in_the_pods_table_is_no_route_naming_rule_and_table() {
    let lab = lab(Topology::AwsVpc);
    let remote = lab.0.node_subnet(2);
    ip(
        &lab.0.node_netns(1),
        &format!("route add unreachable {remote} table {ENI_TABLE}"),
    )
    .expect("the fault");
    let (story, answered) = one_ping(&lab);
    assert!(!answered);
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "no_route", "{verdict}");
    let check = &verdict["check"];
    assert_eq!(check["node"], "node-1", "{verdict}");
    let db = lab.0.pod("db-0").ip;
    assert_eq!(
        check["expected"],
        format!(
            "a route to {db} in table {ENI_TABLE}, where {} sends the packet",
            web_rule(&lab)
        )
        .as_str(),
        "{verdict}"
    );
    let used = check["used"].as_str().expect("used");
    assert!(
        used.starts_with(&format!("unreachable {remote} table {ENI_TABLE} ")),
        "{verdict}"
    );
    assert!(
        used.ends_with(&format!("({})", web_rule(&lab))),
        "{verdict}"
    );
}

#[test]
fn the_doctor_names_a_rule_tables_gateway_that_never_answered_arp() {
    let lab = lab(Topology::AwsVpc);
    let (report, _) = doctor_report(&lab, &[]);
    let healthy = check_on(&report, "node-1", "next hops");
    assert_eq!(healthy["ok"], true, "{healthy}");
    // The VPC router replaced by an address nothing on eth1 holds: the
    // kernel asks for its MAC, hears nothing, and marks it FAILED.
    let gone = "198.51.100.254";
    let node1 = lab.0.node_netns(1);
    ip(
        &node1,
        &format!("route replace default via {gone} dev eth1 table {ENI_TABLE}"),
    )
    .expect("the fault");
    assert!(!lab.0.ping("web-0", lab.0.pod("db-0").ip, &[]));
    let failed = || {
        let out = std::process::Command::new("ip")
            .args(["-n", &node1, "neigh", "show", gone, "dev", "eth1"])
            .output()
            .expect("ip neigh");
        String::from_utf8_lossy(&out.stdout).contains("FAILED")
    };
    // ARP's three probes a second apart, then FAILED.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !failed() {
        assert!(std::time::Instant::now() < deadline, "{gone} never FAILED");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (report, code) = doctor_report(&lab, &[]);
    assert_ne!(code, 0);
    let check = check_on(&report, "node-1", "next hops");
    assert_eq!(check["ok"], false, "{check}");
    let evidence = check["evidence"].as_str().expect("evidence");
    let expected = format!(
        "default via {gone} dev eth1 table {ENI_TABLE} (route -n: 0.0.0.0 {gone} 0.0.0.0 UG eth1) ({}): neighbour {gone} dev eth1 FAILED",
        web_rule(&lab)
    );
    assert!(evidence.contains(&expected), "{evidence}");
    // The rule's table still routes the pods: that check passes.
    let policy = check_on(&report, "node-1", "policy routing");
    assert_eq!(policy["ok"], true, "{policy}");
}
