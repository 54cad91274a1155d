//! A packet's story is told from the namespaces of the traced nodes and
//! of the pods behind their veths, never from whatever namespace holds
//! the same address: pod ranges overlap on hosts that run several
//! clusters or labs, and any namespace may hold any address.

#[allow(dead_code)]
mod support;

use std::process::{Command, Stdio};

use serde_json::Value;
use support::*;
use xtask::{
    faults::Fault,
    lab::{in_netns, Lab, LabGuard, Topology},
};

/// A pod CIDR outside the per-test range `support::lab` spreads labs over
/// (10.100-199.0.0/16): only the two labs of one test share it.
const SHARED_POD_CIDR: &str = "10.98.0.0/16";

fn run(command: &mut Command) {
    let status = command.status().expect("run");
    assert!(status.success(), "{command:?}");
}

/// A namespace of the lab's (taken down with it) that holds `ip` on a
/// veth whose peer is in it too, connected to nothing, whose firewall drops what it
/// sends to `dst`.
fn namespace_holding(
    lab: &Lab,
    name: &str,
    ip: std::net::Ipv4Addr,
    dst: std::net::Ipv4Addr,
) -> String {
    let netns = format!("{}-{name}", lab.prefix);
    run(Command::new("ip").args(["netns", "add", &netns]));
    run(in_netns(&netns, "ip").args(["link", "add", "d0", "type", "veth", "peer", "name", "d1"]));
    run(in_netns(&netns, "ip").args(["addr", "add", &format!("{ip}/16"), "dev", "d0"]));
    run(in_netns(&netns, "ip").args(["link", "set", "d0", "up"]));
    run(in_netns(&netns, "iptables").args(["-A", "OUTPUT", "-d", &dst.to_string(), "-j", "DROP"]));
    netns
}

fn ping_from(netns: &str, dst: std::net::Ipv4Addr, count: u32) {
    let _ = in_netns(netns, "ping")
        .args([
            "-c",
            &count.to_string(),
            "-i",
            "0.3",
            "-W",
            "1",
            &dst.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn verdicts(done: &Finished) -> Vec<Value> {
    done.stories()
        .iter()
        .map(|s| s["verdict"].clone())
        .collect()
}

#[test]
fn a_lab_sharing_its_pod_range_with_another_tells_only_its_own_stories() {
    require_kernel();
    let cidr = Some(SHARED_POD_CIDR.parse().expect("a CIDR"));
    let pid = std::process::id() % 100_000;
    let ours = LabGuard::up(&format!("pt{pid}own"), Topology::FlannelVxlan, cidr).expect("lab up");
    let theirs =
        LabGuard::up(&format!("pt{pid}oth"), Topology::FlannelVxlan, cidr).expect("lab up");
    let (web, db) = (ours.0.pod("web-0"), ours.0.pod("db-0"));
    assert_eq!(
        (web.ip, db.ip),
        (theirs.0.pod("web-0").ip, theirs.0.pod("db-0").ip)
    );
    // The other lab drops the same pair's packets on its node-1.
    Fault::IptablesForwardDrop
        .apply(&theirs.0)
        .expect("apply the fault");
    let trace = Trace::start(&argv(
        &[
            "web-0",
            "db-0",
            "-o",
            "json",
            "--duration",
            "12s",
            "--proto",
            "icmp",
        ],
        lab_args(&ours.0, &[1, 2]),
    ));
    let (their_web, our_web) = (theirs.0.pod("web-0").netns.clone(), web.netns.clone());
    let other = std::thread::spawn(move || ping_from(&their_web, db.ip, 4));
    ping_from(&our_web, db.ip, 2);
    other.join().unwrap();
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let verdicts = verdicts(&done);
    // Our two echoes and their replies, delivered; not one of the other
    // lab's drops told as ours.
    assert_eq!(verdicts.len(), 4, "{}", done.stdout);
    for verdict in &verdicts {
        assert_eq!(verdict["outcome"], "delivered", "{verdict}");
    }
    assert!(!done.stdout.contains(&theirs.0.prefix), "{}", done.stdout);
    let summary = done.summary();
    assert!(
        summary["drops_elsewhere"].as_u64().unwrap_or(0) >= 1,
        "the other lab's drops are counted as left out: {summary}"
    );
}

#[test]
fn a_namespace_holding_the_sources_address_neither_tells_a_story_nor_sends_the_probe() {
    let lab = lab(Topology::FlannelVxlan);
    let (web, db) = (lab.0.pod("web-0"), lab.0.pod("db-0"));
    // Named to come first in /run/netns: the old lookup by address alone
    // took the first namespace that held it.
    let dup = namespace_holding(&lab.0, "0dup", web.ip, db.ip);
    let trace = Trace::start(&argv(
        &[
            "web-0",
            "db-0",
            "-o",
            "json",
            "--probe",
            "icmp",
            "--probe-count",
            "2",
        ],
        lab_args(&lab.0, &[1, 2]),
    ));
    // Meanwhile the duplicate drops its own pings to db-0 in OUTPUT.
    ping_from(&dup, db.ip, 3);
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let probes = done.probes();
    assert_eq!(probes.len(), 2, "{}", done.stdout);
    for probe in &probes {
        assert_eq!(probe["answered"], true, "sent from web-0 itself: {probe}");
    }
    for verdict in verdicts(&done) {
        assert_eq!(verdict["outcome"], "delivered", "{verdict}");
    }
    assert!(!done.stdout.contains(&dup), "{}", done.stdout);
}

#[test]
fn a_probe_from_the_loopback_address_is_refused_and_nothing_is_sent() {
    let lab = lab(Topology::FlannelVxlan);
    // Every namespace holds 127.0.0.1: the destination pinged itself, and
    // the probe said ✓ with no story.
    let out = Command::new(PODTRACE)
        .args(argv(
            &["127.0.0.1", "default/db-0", "--probe", "icmp"],
            lab_args(&lab.0, &[1, 2]),
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("127.0.0.1"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("echo reply"));
    for node in [1, 2] {
        assert!(tcx_programs(&lab.0.node_netns(node)).is_empty());
    }
}

/// A UDP reply that reached web-0's socket, which closed without reading
/// it: freed with the socket, where no network namespace is known. The
/// exchange is two delivered stories, not a third "dropped" one.
#[test]
fn a_udp_reply_freed_unread_with_its_socket_is_no_drop_story() {
    let lab = lab(Topology::FlannelVxlan);
    let (web, db) = (lab.0.pod("web-0"), lab.0.pod("db-0"));
    let server = "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.bind(('', 7777))\ns.settimeout(15)\ndata, peer = s.recvfrom(100)\ns.sendto(b'answer', peer)\n";
    let mut listening = in_netns(&db.netns, "python3")
        .args(["-c", server])
        .spawn()
        .expect("python3 in db-0");
    let trace = Trace::start(&argv(
        &[
            "web-0",
            "db-0",
            "-o",
            "json",
            "--proto",
            "udp",
            "--duration",
            "8s",
        ],
        lab_args(&lab.0, &[1, 2]),
    ));
    std::thread::sleep(std::time::Duration::from_millis(300));
    // The reply lands in the socket's queue; the socket closes unread.
    let client = format!(
        "import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.sendto(b'question', ('{}', 7777))\ntime.sleep(0.5)\ns.close()\n",
        db.ip
    );
    run(in_netns(&web.netns, "python3").args(["-c", &client]));
    let _ = listening.wait();
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let verdicts = verdicts(&done);
    assert_eq!(verdicts.len(), 2, "{}", done.stdout);
    for verdict in verdicts {
        assert_eq!(verdict["outcome"], "delivered", "{verdict}");
    }
    let summary = (done.json().into_iter())
        .find(|v| v["type"] == "summary")
        .expect("a summary");
    assert!(
        summary["drops_without_netns"].as_u64() >= Some(1),
        "the unread reply's free is counted: {summary}"
    );
}
