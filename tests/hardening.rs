//! Stories that were wrong when podtrace was tried as a new user would:
//! each test reproduces one on the lab and asserts the story a user must
//! get now.

#[allow(dead_code)]
mod support;

use serde_json::Value;
use support::*;
use xtask::{
    faults::{Fault, GONE_GATEWAY},
    lab::{in_netns, Topology},
};

/// web-0 → db-0 traced on `nodes`, `pings` pings one second apart; the
/// stories in the order podtrace told them.
fn trace_pings(lab: &xtask::lab::Lab, nodes: &[u8], pings: u32, extra: &[&str]) -> Finished {
    let mut args = vec!["web-0", "db-0", "--duration", "15s", "-o", "json"];
    args.extend_from_slice(extra);
    let trace = Trace::start(&argv(&args, lab_args(lab, nodes)));
    let db = lab.pod("db-0");
    let _ = in_netns(&lab.pod("web-0").netns, "ping")
        .args(["-c", &pings.to_string(), "-W", "2", &db.ip.to_string()])
        .stdout(std::process::Stdio::null())
        .status();
    trace.finish()
}

fn icmp_type(story: &Value) -> u64 {
    story["transport"]["icmp_type"].as_u64().unwrap_or(99)
}

#[test]
fn count_tells_the_first_packets_in_the_order_they_were_sent() {
    let lab = lab(Topology::FlannelVxlan);
    // Only node-1 is traced: each request leaves toward an untraced node,
    // each reply is delivered. With two pings, the replies used to be
    // told first and --count 2 never told a request.
    let done = trace_pings(&lab.0, &[1], 2, &["--count", "2"]);
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let told: Vec<(u64, u64)> = stories
        .iter()
        .map(|s| (s["transport"]["seq"].as_u64().unwrap_or(0), icmp_type(s)))
        .collect();
    assert_eq!(
        told,
        [(1, 8), (1, 0)],
        "request 1 then reply 1: {}",
        done.stdout
    );
    assert_eq!(stories[0]["verdict"]["outcome"], "left_node");
    assert_eq!(stories[1]["verdict"]["outcome"], "delivered");
}

#[test]
fn a_next_hop_that_never_answers_arp_is_a_drop_that_names_it() {
    let lab = lab(Topology::FlannelVxlan);
    Fault::NextHopNoArp.apply(&lab.0).expect("apply the fault");
    let done = trace_pings(&lab.0, &[1, 2], 1, &["--count", "1"]);
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let request = stories.first().expect("a story");
    let verdict = &request["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{verdict}");
    let reason = verdict["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("NEIGH_"), "{verdict}");
    let summary = verdict["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(&format!("no ARP reply from {GONE_GATEWAY} on eth0")),
        "{summary}"
    );
}

#[test]
fn a_missing_pod_subnet_route_is_no_route_without_the_nodes_file() {
    let lab = lab(Topology::FlannelVxlan);
    Fault::FlannelRouteMissing
        .apply(&lab.0)
        .expect("apply the fault");
    // lab_args gives --pods-file, never --nodes-file.
    let done = trace_pings(&lab.0, &[1, 2], 1, &["--count", "1"]);
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let verdict = &stories.first().expect("a story")["verdict"];
    assert_eq!(verdict["outcome"], "no_route", "{verdict}");
    assert_eq!(verdict["check"]["node"], "node-1", "{verdict}");
    let expected = verdict["check"]["expected"].as_str().unwrap_or_default();
    assert!(expected.contains("inside the pod CIDR"), "{expected}");
}
