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
