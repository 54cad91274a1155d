//! `--probe`: podtrace sends the test traffic itself, from the source
//! pod's network namespace, traces exactly those packets (the pair's other
//! traffic is skipped and counted), and ends with each probe's result
//! beside the verdict of the packet that failed. On the lab with its
//! Services (listeners on db-0 and db-1: TCP 8080, UDP echo 5353).

#[allow(dead_code)]
mod support;

use serde_json::Value;
use support::*;
use xtask::{
    faults::Fault,
    lab::{in_netns, sysctl, LabGuard},
};

/// `podtrace web-0 DST --probe PROBE EXTRA…` on both nodes, in JSON: it
/// ends by itself once the probes' stories are told.
fn probe(lab: &LabGuard, dst: &str, probe: &str, extra: &[&str]) -> Finished {
    let mut first = vec!["default/web-0", dst, "--probe", probe, "-o", "json"];
    first.extend_from_slice(extra);
    let mut rest = lab_args(&lab.0, &[1, 2]);
    rest.push("--services-file".into());
    rest.push(lab.0.services_file().display().to_string());
    let done = Trace::start(&argv(&first, rest)).finish();
    // (--fail's own status is the test's to check.)
    if !extra.contains(&"--fail") {
        assert!(done.status.success(), "{}", done.stderr);
    }
    done
}

/// The one probe's result line.
fn result(done: &Finished) -> String {
    let results = done.probes();
    assert_eq!(results.len(), 1, "{}", done.stdout);
    results[0]["result"].as_str().unwrap().to_string()
}

fn outcomes(done: &Finished) -> Vec<String> {
    done.stories()
        .iter()
        .map(|s| s["verdict"]["outcome"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_tcp_probe_connects_and_its_syn_and_syn_ack_are_told() {
    let lab = services_lab();
    let done = probe(&lab, "default/db-0", "tcp:8080", &["--fail"]);
    assert!(result(&done).starts_with("connected in"), "{}", done.stdout);
    assert_eq!(done.status.code(), Some(0), "--fail: {}", done.stderr);
    let stories = done.stories();
    let flags: Vec<&Value> = stories.iter().map(|s| &s["transport"]["flags"]).collect();
    assert!(stories.len() >= 2, "{}", done.stdout);
    // The SYN, then the SYN-ACK: both delivered.
    assert_eq!(
        (flags[0], flags[1]),
        (&Value::from(0x02), &Value::from(0x12)),
        "{flags:?}"
    );
    assert_eq!(outcomes(&done)[..2], ["delivered", "delivered"]);
}

#[test]
fn a_tcp_probe_to_a_port_nobody_listens_on_is_refused() {
    let lab = services_lab();
    let done = probe(&lab, "default/db-0", "tcp:8081", &[]);
    assert_eq!(result(&done), "refused (RST)");
    assert_eq!(done.probes()[0]["answered"], false);
}

#[test]
fn a_dropped_probe_says_no_answer_and_names_the_rule() {
    let lab = services_lab();
    Fault::IptablesForwardDrop.apply(&lab.0).unwrap();
    let done = probe(&lab, "default/db-0", "tcp:8080", &["--fail"]);
    let said = result(&done);
    assert!(said.starts_with("no answer in 1s: dropped on"), "{said}");
    assert!(said.contains("-j DROP"), "the rule is named: {said}");
    // A script can tell: --fail's status for a probe that failed.
    assert_eq!(done.status.code(), Some(4), "{}", done.stderr);
}

/// A `REJECT --reject-with tcp-reset` on db-0's node answers the SYN in
/// db-0's name: the RST's story says node-2's stack made it, not db-0.
#[test]
fn a_reset_a_reject_rule_sends_is_told_as_the_nodes_not_the_pods() {
    let lab = services_lab();
    let db = lab.0.pod("db-0").ip.to_string();
    let added = in_netns(&lab.0.node_netns(2), "iptables")
        .args(["-I", "FORWARD", "-d", &db, "-p", "tcp", "--dport", "8080"])
        .args(["-j", "REJECT", "--reject-with", "tcp-reset"])
        .status()
        .unwrap();
    assert!(added.success());
    let done = probe(&lab, "default/db-0", "tcp:8080", &[]);
    let reset = done
        .stories()
        .into_iter()
        .find(|s| s["src"] == db.as_str() && s["transport"]["flags"].as_u64() == Some(0x14))
        .unwrap_or_else(|| panic!("the RST is told: {}", done.stdout));
    let first = reset["hops"][0]["note"].as_str().unwrap();
    assert!(
        first.starts_with("made by node-2's own stack in "),
        "{first}"
    );
    assert!(first.contains("not sent by the pod"), "{first}");
}

#[test]
fn a_probe_to_a_service_follows_the_dnat() {
    let lab = services_lab();
    let done = probe(&lab, "svc/db", "tcp:80", &[]);
    assert!(result(&done).starts_with("connected in"), "{}", done.stdout);
    let syn = &done.stories()[0];
    let translated = syn["hops"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h["nat"].as_array().is_some_and(|n| !n.is_empty()));
    assert!(translated, "the SYN's DNAT is told: {syn}");
    assert_eq!(syn["verdict"]["outcome"], "delivered");
}

#[test]
fn icmp_and_udp_probes_are_answered_or_refused() {
    let lab = services_lab();
    let done = probe(&lab, "default/db-0", "icmp", &[]);
    assert!(
        result(&done).starts_with("echo reply in"),
        "{}",
        done.stdout
    );
    let done = probe(&lab, "default/db-0", "udp:5353", &[]);
    assert!(result(&done).starts_with("answered in"), "{}", done.stdout);
    let done = probe(&lab, "default/db-0", "udp:5354", &[]);
    assert!(
        result(&done).starts_with("ICMP port unreachable"),
        "{}",
        done.stdout
    );
}

/// Where the pod allows unprivileged ping sockets (as containerd sets
/// `ping_group_range` in pods), the ICMP probe uses one: an agent needs no
/// CAP_NET_RAW, and the echo identifier is the kernel's.
#[test]
fn an_icmp_probe_takes_the_pods_ping_socket_where_it_may() {
    let lab = services_lab();
    let web_0 = lab.0.pod("web-0").netns;
    sysctl(&web_0, "net.ipv4.ping_group_range", "0 2147483647").unwrap();
    let done = probe(
        &lab,
        "default/db-0",
        "icmp",
        &["--probe-count", "2", "--probe-interval", "200ms"],
    );
    let results = done.probes();
    assert_eq!(results.len(), 2, "{}", done.stdout);
    for result in &results {
        assert!(
            result["result"]
                .as_str()
                .unwrap()
                .starts_with("echo reply in"),
            "{result}"
        );
    }
    // Each probe's request and reply, and nothing else.
    assert_eq!(outcomes(&done), ["delivered"; 4], "{}", done.stdout);
    // Each ping socket had its own identifier (a raw socket's is one per
    // run).
    let mut ids: Vec<u64> = done
        .stories()
        .iter()
        .filter_map(|s| s["transport"]["id"].as_u64())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 2, "{ids:?}");
}

#[test]
fn only_the_probes_are_told_and_the_pairs_other_traffic_is_counted() {
    let lab = services_lab();
    let mut first = vec!["default/web-0", "default/db-0", "-o", "json"];
    first.extend_from_slice(&[
        "--probe",
        "tcp:8080",
        "--probe-count",
        "3",
        "--probe-interval",
        "700ms",
    ]);
    let trace = Trace::start(&argv(&first, lab_args(&lab.0, &[1, 2])));
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(done.probes().len(), 3, "{}", done.stdout);
    assert!(
        done.stories()
            .iter()
            .all(|s| s["transport"]["flags"].is_number()),
        "only TCP"
    );
    let summary = done
        .json()
        .into_iter()
        .find(|v| v["type"] == "summary")
        .unwrap();
    assert!(
        summary["skipped_by_filter"].as_u64() >= Some(2),
        "{summary}"
    );
}

/// Another UDP flow of the pair, to a port nobody listens on, while the
/// probes go: datagrams 250 ms apart, each answered by db-0's port
/// unreachable. How many were refused (the error reached the sender).
fn other_udp_flow(lab: &LabGuard, port: u16, datagrams: u32) -> std::process::Child {
    let db = lab.0.pod("db-0").ip;
    let script = format!(
        "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.connect(('{db}',{port}))\ns.settimeout(0.25)\nrefused=0\nfor _ in range({datagrams}):\n  s.send(b'other traffic')\n  try: s.recv(100)\n  except ConnectionRefusedError: refused+=1\n  except socket.timeout: pass\nprint(refused)"
    );
    in_netns(&lab.0.pod("web-0").netns, "python3")
        .args(["-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3")
}

/// An ICMP error is a probe's answer only if it quotes the probe's own
/// packet: the port unreachable of the pair's other UDP traffic, sent
/// meanwhile, is not told as the probes' (nor put beside their results).
#[test]
fn only_the_icmp_errors_quoting_a_probe_are_the_probes() {
    let lab = services_lab();
    // Every datagram gets its error (not one a second per peer).
    sysctl(&lab.0.pod("db-0").netns, "net.ipv4.icmp_ratelimit", "0").unwrap();
    let first = [
        "default/web-0",
        "default/db-0",
        "-o",
        "json",
        "--probe",
        "udp:5354",
        "--probe-count",
        "3",
        "--probe-interval",
        "700ms",
    ];
    let trace = Trace::start(&argv(&first, lab_args(&lab.0, &[1, 2])));
    let other = other_udp_flow(&lab, 5355, 8).wait_with_output().unwrap();
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let refused: u32 = String::from_utf8_lossy(&other.stdout)
        .trim()
        .parse()
        .unwrap();
    assert!(
        refused >= 2,
        "the other flow got its port unreachables: {refused}"
    );
    let results = done.probes();
    assert_eq!(results.len(), 3, "{}", done.stdout);
    for result in &results {
        assert_eq!(
            result["result"], "ICMP port unreachable: nothing listens there",
            "{result}"
        );
    }
    // Each probe's datagram and its own error; the other flow's are
    // skipped, errors and all.
    let stories = done.stories();
    let errors = stories
        .iter()
        .filter(|s| s["transport"]["proto"] == "icmp")
        .count();
    let datagrams: Vec<&Value> = stories
        .iter()
        .filter(|s| s["transport"]["proto"] == "udp")
        .collect();
    assert_eq!((datagrams.len(), errors), (3, 3), "{}", done.stdout);
    assert!(
        datagrams.iter().all(|s| s["transport"]["dport"] == 5354),
        "{}",
        done.stdout
    );
    assert!(
        done.summary()["skipped_by_filter"].as_u64() >= Some(2 * u64::from(refused)),
        "{}",
        done.summary()
    );
}

#[test]
fn a_probe_that_cannot_be_sent_is_bad_input_and_nothing_is_sent() {
    let lab = services_lab();
    for (probe, says) in [
        ("tcp:0", "tcp:0"),
        ("tcp:70000", "tcp:70000"),
        ("sctp:1", "sctp:1"),
    ] {
        let out = std::process::Command::new(PODTRACE)
            .args(argv(
                &["default/web-0", "default/db-0", "--probe", probe],
                lab_args(&lab.0, &[1, 2]),
            ))
            .output()
            .unwrap();
        said_bad_input(out.status, &String::from_utf8_lossy(&out.stderr), says);
    }
    // A source behind no pod veth of the traced nodes: nothing attached.
    let out = std::process::Command::new(PODTRACE)
        .args(argv(
            &["192.0.2.99", "default/db-0", "--probe", "icmp"],
            lab_args(&lab.0, &[1, 2]),
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && stderr.contains("192.0.2.99 is behind no pod veth of the traced nodes"),
        "{stderr}"
    );
    for node in [1, 2] {
        assert!(tcx_programs(&lab.0.node_netns(node)).is_empty());
    }
}

/// A probe to a Service on a port or protocol it does not have: no
/// kube-proxy rule would translate it, and it would leave by whatever
/// route the ClusterIP has (told `vanished`). Refused before anything is
/// attached, naming the ports the Service has.
#[test]
fn a_probe_to_a_port_the_service_lacks_is_refused_up_front() {
    let lab = services_lab();
    let db = lab.0.service("db");
    let (node1, services) = (
        lab.0.node_netns(1),
        lab.0.services_file().display().to_string(),
    );
    let pods = lab.0.pods_file().display().to_string();
    let ip = db.cluster_ip.to_string();
    for (dst, probe, said) in [
        (
            ip.as_str(),
            "tcp:8080",
            "--probe tcp:8080: default/db has no tcp port 8080 (it has tcp:80, udp:53)",
        ),
        (
            "svc/db",
            "udp:80",
            "--probe udp:80: default/db has no udp port 80",
        ),
    ] {
        let argv = [
            "default/web-0",
            dst,
            "--probe",
            probe,
            "--pods-file",
            &pods,
            "--services-file",
            &services,
            "--netns",
            &node1,
        ];
        assert_refused(&argv, said, &node1);
    }
}
