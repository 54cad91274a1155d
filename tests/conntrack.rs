//! Conntrack's own failures against the real kernel, each told as such:
//! the verdict's `conntrack` names the mechanism, what shows it and the
//! fix, and the summary says how conntrack's counters grew on the node.
//! Each fault breaks web-0 (node-1) → db-0 (node-2) on node-1, inside
//! the lab's own namespaces.

#[allow(dead_code)]
mod support;

use std::time::Duration;

use serde_json::Value;
use support::*;
use xtask::{
    faults::{Fault, SNAT_PORT},
    lab::{in_netns, Lab, LabGuard},
};

fn faulty(fault: Fault) -> LabGuard {
    let lab = lab(fault.topology());
    fault.apply(&lab.0).expect("apply the fault");
    lab
}

/// podtrace on both nodes, as JSON, for `seconds`, while `act` runs.
fn trace_while(lab: &Lab, seconds: u32, act: impl FnOnce()) -> Finished {
    let duration = format!("{seconds}s");
    let first = ["web-0", "db-0", "-o", "json", "--duration", &duration];
    let trace = Trace::start(&argv(&first, lab_args(lab, &[1, 2])));
    act();
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    done
}

/// The dropped story's `conntrack`, and its summary.
fn conntrack_of(done: &Finished, node: &str) -> (Value, String) {
    let stories = done.stories();
    let dropped = stories
        .iter()
        .find(|s| s["verdict"]["outcome"] == "dropped")
        .unwrap_or_else(|| panic!("a dropped story: {}\n{}", done.stdout, done.stderr));
    assert_eq!(dropped["verdict"]["node"], node, "{dropped}");
    let summary = dropped["verdict"]["summary"].as_str().unwrap().to_string();
    (dropped["verdict"]["conntrack"].clone(), summary)
}

/// How much a conntrack counter grew on `node` over the run, by the summary.
fn grew(done: &Finished, node: &str, counter: &str) -> u64 {
    let summary = done.summary();
    let run = summary["conntrack"]
        .as_array()
        .and_then(|runs| runs.iter().find(|r| r["node"] == node).cloned())
        .unwrap_or_else(|| panic!("no conntrack run for {node}: {summary}"));
    run["grew"][counter].as_u64().unwrap_or(0)
}

#[test]
fn a_late_answer_conntrack_forgot_is_told_invalid_with_why_and_fix() {
    let lab = faulty(Fault::ConntrackInvalid);
    let db = lab.0.pod("db-0");
    let port = 9090;
    let mut server = slow_server(&lab.0, "db-0", port, Duration::from_secs(3));
    let mut answer = None;
    let done = trace_while(&lab.0, 8, || {
        answer = Some(lab.0.tcp_request_patient("web-0", db.ip, port));
    });
    let _ = server.kill();
    let _ = server.wait();
    assert!(answer.unwrap().is_err(), "the late answer must not arrive");
    let (conntrack, summary) = conntrack_of(&done, "node-1");
    assert_eq!(conntrack["mechanism"], "invalid", "{conntrack}");
    assert!(
        conntrack["why"]
            .as_str()
            .unwrap_or("")
            .contains("nf_conntrack_tcp_loose=0"),
        "{conntrack}"
    );
    assert!(
        conntrack["fix"]
            .as_str()
            .unwrap()
            .contains("nf_conntrack_tcp_be_liberal=1"),
        "{conntrack}"
    );
    assert!(
        summary.starts_with("dropped as conntrack INVALID"),
        "{summary}"
    );
    assert!(summary.contains("--ctstate INVALID"), "{summary}");
    assert!(grew(&done, "node-1", "invalid") > 0, "{}", done.stdout);
}

/// Two UDP datagrams from web-0, each from its own socket (its own
/// source port), to db-0: node-1 masquerades both to one port.
fn two_udp_flows(lab: &Lab, port: u16) {
    const CLIENT: &str = r#"
import socket, sys, time
for _ in range(2):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"hello", (sys.argv[1], int(sys.argv[2])))
    time.sleep(0.3)
"#;
    let db = lab.pod("db-0");
    let status = in_netns(&lab.pod("web-0").netns, "python3")
        .args(["-c", CLIENT, &db.ip.to_string(), &port.to_string()])
        .status()
        .expect("python3");
    assert!(status.success());
}

/// The second flow is dropped at confirm on node-1 (insert_failed; the
/// clash also counts as drop), masqueraded to the port the first holds:
/// its story joins the drop under the translated source, names the
/// mechanism, the first flow's entry and the fix; the summary's counters
/// grew on node-1 alone.
#[test]
fn a_second_flow_with_no_snat_port_left_is_told_snat_exhausted() {
    let lab = faulty(Fault::SnatExhausted);
    let done = trace_while(&lab.0, 4, || two_udp_flows(&lab.0, 9999));
    assert_eq!(grew(&done, "node-1", "insert_failed"), 1, "{}", done.stdout);
    assert_eq!(grew(&done, "node-2", "insert_failed"), 0, "{}", done.stdout);
    let stories = done.stories();
    let second = stories
        .iter()
        .filter(|s| s["transport"]["proto"] == "udp")
        .nth(1)
        .unwrap_or_else(|| panic!("two UDP stories: {}", done.stdout));
    assert_eq!(second["verdict"]["outcome"], "dropped", "{second}");
    let conntrack = &second["verdict"]["conntrack"];
    assert_eq!(conntrack["mechanism"], "snat_exhausted", "{second}");
    assert!(
        conntrack["colliding"]
            .as_str()
            .is_some_and(|c| c.ends_with(&format!(":{SNAT_PORT})"))),
        "the entry holding the one port: {conntrack}"
    );
    assert!(
        conntrack["fix"].as_str().unwrap().contains("--to-ports"),
        "{conntrack}"
    );
}
