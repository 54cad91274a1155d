//! Services on the lab (`lab up … --services`), in both kube-proxy modes
//! (each case runs as `…_iptables` and `…_nftables`): a packet to a
//! ClusterIP is followed through kube-proxy's DNAT to its backend on the
//! other node, its reply through conntrack's un-DNAT back, one story per
//! packet, each translation named with both tuples and its rule (iptables
//! syntax for KUBE-SEP-…, `nft -a list` text for the `endpoint-…` chain);
//! a Service without endpoints is `rejected`.

#[allow(dead_code)]
mod support;

use serde_json::Value;
use support::*;
use xtask::{
    api_stub::{Stub, TOKEN},
    lab::{kube_proxy::ProxyMode, Lab, LabGuard, Topology},
};

/// The nodes' names, when the pods file or the API names them.
const NAMED: [&str; 2] = ["node-1", "node-2"];

fn services_lab(mode: ProxyMode) -> LabGuard {
    let lab = lab(Topology::FlannelVxlan);
    lab.0.install_services(mode).expect("install services");
    lab
}

/// web-0 → `dst` traced on both nodes (JSON, `extra` flags) while one TCP
/// request goes from web-0 to db's ClusterIP:80.
fn trace_request(
    lab: &Lab,
    src: &str,
    dst: &str,
    extra: &[&str],
) -> (Finished, Result<String, String>) {
    let mut args = vec![src, dst, "-o", "json", "--duration", "6s"];
    args.extend_from_slice(extra);
    let mut rest = vec![];
    for node in [1, 2] {
        rest.push("--netns".to_string());
        rest.push(lab.node_netns(node));
    }
    let trace = Trace::start(&argv(&args, rest));
    let db = lab.service("db");
    let answer = lab.tcp_request("web-0", db.cluster_ip, 80);
    (trace.finish(), answer)
}

fn files(lab: &Lab) -> [String; 4] {
    [
        "--pods-file".into(),
        lab.pods_file().display().to_string(),
        "--services-file".into(),
        lab.services_file().display().to_string(),
    ]
}

/// The SYN's story and the SYN-ACK's.
fn syn_and_synack(done: &Finished) -> (Value, Value) {
    let stories = done.stories();
    let flags = |s: &Value| s["transport"]["flags"].as_u64().unwrap_or(0);
    let syn = stories.iter().find(|s| flags(s) == 0x02);
    let synack = stories.iter().find(|s| flags(s) == 0x12);
    match (syn, synack) {
        (Some(a), Some(b)) => (a.clone(), b.clone()),
        _ => panic!(
            "no SYN and SYN-ACK stories: {}\n{}",
            done.stdout, done.stderr
        ),
    }
}

fn nat_hops<'a>(story: &'a Value, kind: &str) -> Vec<&'a Value> {
    story["hops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| {
            h["nat"]
                .as_array()
                .is_some_and(|n| n.iter().any(|s| s["kind"] == kind))
        })
        .collect()
}

/// Both nodes appear among the hops.
fn nodes_of(story: &Value) -> Vec<String> {
    let mut nodes: Vec<String> = story["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["node"].as_str().unwrap_or("").to_string())
        .collect();
    nodes.dedup();
    nodes
}

/// Runs a case in both kube-proxy modes.
macro_rules! in_both_modes {
    ($($case:ident: $iptables:ident, $nftables:ident;)*) => {$(
        #[test]
        fn $iptables() {
            $case(ProxyMode::Iptables);
        }
        #[test]
        fn $nftables() {
            $case(ProxyMode::Nftables);
        }
    )*};
}

in_both_modes! {
    cluster_ip_to_the_other_node_and_back:
        a_cluster_ip_is_followed_to_its_backend_on_the_other_node_and_back_iptables,
        a_cluster_ip_is_followed_to_its_backend_on_the_other_node_and_back_nftables;
    bare_cluster_ip_and_port:
        a_bare_cluster_ip_and_port_with_the_services_file_is_the_same_story_iptables,
        a_bare_cluster_ip_and_port_with_the_services_file_is_the_same_story_nftables;
    svc_through_the_api:
        svc_db_through_the_api_stub_is_followed_too_iptables,
        svc_db_through_the_api_stub_is_followed_too_nftables;
    service_without_endpoints:
        a_service_without_endpoints_is_rejected_by_kube_proxy_with_the_rule_iptables,
        a_service_without_endpoints_is_rejected_by_kube_proxy_with_the_rule_nftables;
}

/// The DNAT rule as the story must name it, for the backend it picked:
/// kube-proxy's KUBE-SEP chain in iptables syntax, or its endpoint chain
/// with the `dnat to` statement as `nft -a list` shows it.
fn assert_dnat_rule(mode: ProxyMode, rule: &str, backend: std::net::Ipv4Addr) {
    let to = format!("{backend}:8080");
    match mode {
        ProxyMode::Iptables => assert!(
            rule.starts_with("nat KUBE-SEP-")
                && rule.contains(&format!("-j DNAT --to-destination {to}")),
            "{rule}"
        ),
        ProxyMode::Nftables => {
            let chain = format!("__{backend}/8080: ");
            assert!(
                rule.starts_with("ip kube-proxy endpoint-")
                    && rule.contains(&chain)
                    && rule.contains(&format!("dnat to {to} # handle ")),
                "{rule}"
            )
        }
    }
}

/// `nodes`: how the story names node-1 and node-2 (by their netns without
/// the pods file).
fn assert_cluster_ip_followed(lab: &Lab, done: &Finished, mode: ProxyMode, nodes: [&str; 2]) {
    let [n1, n2] = nodes;
    assert!(done.status.success(), "{}", done.stderr);
    let (syn, synack) = syn_and_synack(done);
    let db = lab.service("db");
    // The SYN: one story from web-0's veth to a db backend's, on both nodes.
    let dnat = nat_hops(&syn, "DNAT");
    assert_eq!(dnat.len(), 1, "one DNAT hop: {syn}");
    let step = &dnat[0]["nat"][0];
    assert_eq!(step["before"], format!("{}:80", db.cluster_ip), "{step}");
    let after = step["after"].as_str().unwrap();
    let backend = db
        .backends
        .iter()
        .find(|b| after == format!("{}:8080", b.ip))
        .unwrap_or_else(|| panic!("DNAT to a backend: {step}"));
    assert_dnat_rule(mode, step["rule"].as_str().unwrap(), backend.ip);
    assert_eq!(step["conntrack"]["state"], "new");
    assert_eq!(step["backend"], format!("default/{}", backend.name));
    assert_eq!(dnat[0]["node"], n1);
    assert_eq!(syn["verdict"]["outcome"], "delivered", "{syn}");
    assert_eq!(syn["verdict"]["node"], n2);
    let summary = syn["verdict"]["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("default/{}", backend.name))
            && summary.contains("through default/db"),
        "{summary}"
    );
    assert_eq!(nodes_of(&syn), [n1, n2]);
    // The SYN-ACK: from the backend, un-DNATed on node-1, delivered to web-0.
    let undone = nat_hops(&synack, "un-DNAT");
    assert_eq!(undone.len(), 1, "one un-DNAT hop: {synack}");
    let step = &undone[0]["nat"][0];
    assert_eq!(step["before"], format!("{}:8080", backend.ip));
    assert_eq!(step["after"], format!("{}:80", db.cluster_ip));
    assert_eq!(undone[0]["node"], n1);
    assert_eq!(synack["verdict"]["outcome"], "delivered");
    assert_eq!(nodes_of(&synack), [n2, n1]);
}

fn cluster_ip_to_the_other_node_and_back(mode: ProxyMode) {
    let lab = services_lab(mode);
    let [a, b, c, d] = files(&lab.0);
    let (done, answer) = trace_request(&lab.0, "default/web-0", "svc/db", &[&a, &b, &c, &d]);
    assert_eq!(answer.as_deref(), Ok("ok"));
    assert_cluster_ip_followed(&lab.0, &done, mode, NAMED);
}

fn bare_cluster_ip_and_port(mode: ProxyMode) {
    let lab = services_lab(mode);
    let db = lab.0.service("db");
    let dst = format!("{}:80", db.cluster_ip);
    let [_, _, c, d] = files(&lab.0);
    let src = lab.0.pod("web-0").ip.to_string();
    // No pods file and no API: plain addresses, the Services from the file.
    let (done, answer) = trace_request(&lab.0, &src, &dst, &[&c, &d]);
    assert_eq!(answer.as_deref(), Ok("ok"));
    let (n1, n2) = (lab.0.node_netns(1), lab.0.node_netns(2));
    assert_cluster_ip_followed(&lab.0, &done, mode, [&n1, &n2]);
}

fn svc_through_the_api(mode: ProxyMode) {
    let lab = services_lab(mode);
    let stub = Stub::start(&lab.0.pod_list(), &lab.0.node_list());
    stub.add_services(&lab.0.service_list());
    let dir = std::env::temp_dir().join(format!("podtrace-svc-tests-{}", std::process::id()));
    let kubeconfig = stub.kubeconfig(&dir, TOKEN).display().to_string();
    let (done, answer) = trace_request(
        &lab.0,
        "default/web-0",
        "svc/db",
        &["--kubeconfig", &kubeconfig],
    );
    assert_eq!(answer.as_deref(), Ok("ok"));
    assert_cluster_ip_followed(&lab.0, &done, mode, NAMED);
}

fn service_without_endpoints(mode: ProxyMode) {
    let lab = services_lab(mode);
    let empty = lab.0.service("empty");
    let [a, b, c, d] = files(&lab.0);
    let mut args = vec![
        "default/web-0",
        "svc/empty",
        "-o",
        "json",
        "--duration",
        "5s",
    ];
    args.extend([a.as_str(), &b, &c, &d]);
    let trace = Trace::start(&argv(&args, vec!["--netns".into(), lab.0.node_netns(1)]));
    let answer = lab.0.tcp_request("web-0", empty.cluster_ip, 80);
    let done = trace.finish();
    assert!(
        answer
            .as_ref()
            .is_err_and(|e| e.contains("ConnectionRefused")),
        "{answer:?}"
    );
    let stories = done.stories();
    let syn = stories
        .iter()
        .find(|s| s["verdict"]["outcome"] == "dropped")
        .unwrap_or_else(|| panic!("a dropped SYN: {}\n{}", done.stdout, done.stderr));
    let verdict = &syn["verdict"];
    let summary = verdict["summary"].as_str().unwrap();
    assert!(
        summary.starts_with(
            "rejected: default/empty has no endpoints (the client is sent ICMP port unreachable)"
        ),
        "{summary}"
    );
    let rule = verdict["netfilter"]["rule"].as_str().unwrap();
    match mode {
        ProxyMode::Iptables => {
            assert_eq!(verdict["netfilter"]["chain"], "KUBE-SERVICES", "{verdict}");
            assert!(rule.contains("-j REJECT"), "{rule}");
        }
        ProxyMode::Nftables => {
            // kube-proxy's reject, reached through its map of Services
            // without endpoints, whose element names the Service.
            assert_eq!(verdict["netfilter"]["table"], "ip kube-proxy", "{verdict}");
            assert_eq!(verdict["netfilter"]["chain"], "reject-chain", "{verdict}");
            assert!(
                rule.starts_with("reject # handle ")
                    && rule.contains("vmap @no-endpoint-services")
                    && rule.contains("comment \"default/empty:http\""),
                "{rule}"
            );
        }
    }
}
