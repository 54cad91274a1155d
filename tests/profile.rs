//! Line-rate tracing on the flannel-vxlan lab: `podtrace profile` (step
//! latencies aggregated in the kernel, told as JSON, drawn as SVG with one
//! histogram per step) and `--sample N` stories of a full-rate TCP flow.

// The profile test uses only part of the shared helpers.
#[allow(dead_code)]
mod support;

#[allow(dead_code)]
mod datapath;

use std::time::Duration;

use support::*;
use xtask::lab::{in_netns, sysctl, Topology};

#[test]
fn profile_aggregates_steps_in_the_kernel_and_plots_them() {
    let lab = lab(Topology::FlannelVxlan);
    assert!(ping(&lab.0, "web-0", "db-0"));
    let plot = std::env::temp_dir().join(format!("podtrace-profile-{}.svg", std::process::id()));
    let mut argv = argv(
        &["profile", "web-0", "db-0", "-o", "json", "--plot"],
        vec![],
    );
    argv.push(plot.display().to_string());
    argv.extend(lab_args(&lab.0, &[1, 2]));
    let trace = Trace::start(&argv);
    ping_burst(&lab.0, 100, "0.01");
    std::thread::sleep(Duration::from_millis(300));
    trace.signal(libc::SIGINT);
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let lines = done.json();
    assert_eq!(
        lines.len(),
        1,
        "one profile line, no per-packet record: {lines:?}"
    );
    let steps = lines[0]["steps"].as_array().expect("steps");
    let step = |from: &str, to: &str| {
        steps
            .iter()
            .find(|s| s["from"] == from && s["to"] == to)
            .unwrap_or_else(|| panic!("no step {from} → {to} in {steps:?}"))
    };
    // Into the tunnel and out encapsulated, on each node, each direction.
    for node in ["node-1", "node-2"] {
        let encap = step(
            &format!("{node}/flannel.1:egress"),
            &format!("{node}/eth0:egress"),
        );
        assert!(encap["packets"].as_u64().unwrap() >= 90, "{encap}");
        assert_eq!(encap["bytes_added"], 50, "VXLAN adds 50 B: {encap}");
        let decap = step(
            &format!("{node}/eth0:ingress"),
            &format!("{node}/flannel.1:ingress"),
        );
        assert_eq!(decap["bytes_added"], -50, "{decap}");
        let p50 = encap["p50_us"].as_f64().unwrap();
        assert!(p50 > 0.0 && p50 <= encap["max_us"].as_f64().unwrap());
    }
    // The lab's nodes share one kernel clock: the wire is a step.
    for (from, to) in [("node-1", "node-2"), ("node-2", "node-1")] {
        let wire = step(
            &format!("{from}/eth0:egress"),
            &format!("{to}/eth0:ingress"),
        );
        assert!(wire["packets"].as_u64().unwrap() >= 90, "{wire}");
        assert_eq!(wire["node"], to, "{wire}");
    }

    let svg = std::fs::read_to_string(&plot).expect("the --plot file");
    let _ = std::fs::remove_file(&plot);
    let doc = roxmltree::Document::parse(&svg).expect("the SVG parses");
    let histograms = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("histogram"))
        .count();
    assert_eq!(histograms, steps.len(), "one histogram per step");
}

/// A packet's stamp is forgotten where it is handed to its pod
/// (`podtrace_to_pod`): after pings across nodes, every request and reply
/// delivered, the STAMPS table holds none of them while podtrace still
/// runs. Kept, they would fill its buckets until live packets' stamps
/// were taken.
#[test]
fn profile_forgets_each_stamp_when_its_packet_is_delivered() {
    const PINGS: u32 = 50;
    let lab = lab(Topology::FlannelVxlan);
    assert!(ping(&lab.0, "web-0", "db-0"));
    for pod in ["web-0", "db-0"] {
        pin_neighbours(&lab.0, pod);
    }
    let argv = argv(
        &["profile", "web-0", "db-0", "-o", "json"],
        lab_args(&lab.0, &[1, 2]),
    );
    let trace = Trace::start(&argv);
    ping_burst(&lab.0, PINGS, "0.01");
    // Every reply has reached web-0: ping has returned.
    let maps = datapath::map_ids(trace.pid(), "STAMPS");
    let left: Vec<usize> = maps.iter().map(|&id| stamped_slots(id)).collect();
    trace.signal(libc::SIGINT);
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    assert!(!maps.is_empty(), "podtrace holds no STAMPS map");
    // The pings were profiled (stamped at every hook), so an empty map
    // says they were forgotten, not that none was stamped.
    let lines = done.json();
    let steps = lines[0]["steps"].as_array().expect("steps");
    let delivered = |pod_node: &str| {
        steps
            .iter()
            .filter(|s| s["to"].as_str().is_some_and(|to| to.starts_with(pod_node)))
            .filter(|s| s["to"].as_str().is_some_and(|to| to.contains("/veth")))
            .map(|s| s["packets"].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    assert!(
        delivered("node-2/") >= u64::from(PINGS) && delivered("node-1/") >= u64::from(PINGS),
        "every request and reply reached its pod's veth: {steps:?}"
    );
    let total: usize = left.iter().sum();
    eprintln!("STAMPS maps {maps:?} hold {left:?} entries after {PINGS} pings");
    assert!(
        total <= 2,
        "{total} stamps left after {PINGS} pings delivered both ways (maps {maps:?}: {left:?})"
    );
}

/// Slots of STAMPS table `id` that hold a packet (a stamp time not 0).
fn stamped_slots(id: u64) -> usize {
    use podtrace_common::profile::{StampBucket, StampSlot};
    let slot = std::mem::size_of::<StampSlot>();
    let time = std::mem::offset_of!(StampSlot, stamp);
    let buckets = datapath::map_values(id);
    assert!(
        buckets
            .iter()
            .all(|b| b.len() == std::mem::size_of::<StampBucket>()),
        "STAMPS values are not StampBuckets"
    );
    buckets
        .iter()
        .flat_map(|bucket| bucket.chunks(slot))
        .filter(|s| s[time..time + 8].iter().any(|&b| b != 0))
        .count()
}

/// The histograms account for every packet the flow sent: each step of
/// each direction counts as many packets as the sending pod's interface
/// sent (IPv6 off in both pods, and ARP learnt first and pinned on both
/// sides, so that the flow's IPv4 packets are all its interface carries).
#[test]
fn profile_histograms_count_every_packet_the_interfaces_carried() {
    let (requests, replies) = profile_counts_every_packet(|lab| ping_burst(lab, 300, "0.005"));
    assert!(
        requests >= 300 && replies >= 300,
        "{requests} requests, {replies} replies"
    );
}

/// The same at line rate: a full-rate iperf3 flow (TCP across VXLAN, its
/// GSO super-packets counted as the interfaces count them: one skb each).
#[test]
fn profile_histograms_count_every_packet_of_a_full_rate_iperf3_flow() {
    let mut segments = 0;
    let (requests, replies) = profile_counts_every_packet(|lab| {
        let before = tcp_segments_sent(lab, "web-0");
        let (bits, _) = datapath::iperf(lab, "web-0", "db-0", 3);
        segments = tcp_segments_sent(lab, "web-0") - before;
        assert!(bits > 0.0, "iperf3 ran");
        eprintln!("iperf3: {:.2} Gbit/s", bits / 1e9);
    });
    eprintln!(
        "{requests} packets web-0 → db-0 ({segments} TCP segments), {replies} back, every one in every step"
    );
    assert!(
        segments >= requests,
        "a GSO packet carries one segment or more"
    );
    assert!(
        requests >= 10_000 && replies >= 1_000,
        "{requests} requests, {replies} replies"
    );
}

/// Runs `traffic` web-0 ⇄ db-0 under `podtrace profile` and checks that
/// every step counted exactly what the sending pod's interface sent;
/// returns (packets web-0 sent, packets db-0 sent).
fn profile_counts_every_packet(traffic: impl FnOnce(&xtask::lab::Lab)) -> (u64, u64) {
    let lab = lab(Topology::FlannelVxlan);
    for pod in ["web-0", "db-0"] {
        sysctl(&lab.0.pod(pod).netns, "net.ipv6.conf.all.disable_ipv6", "1").expect("sysctl");
    }
    assert!(ping(&lab.0, "web-0", "db-0"));
    for pod in ["web-0", "db-0"] {
        pin_neighbours(&lab.0, pod);
    }
    let argv = argv(
        &["profile", "web-0", "db-0", "-o", "json"],
        lab_args(&lab.0, &[1, 2]),
    );
    let trace = Trace::start(&argv);
    let sent_before = [tx_packets(&lab.0, "web-0"), tx_packets(&lab.0, "db-0")];
    traffic(&lab.0);
    let requests = tx_packets(&lab.0, "web-0") - sent_before[0];
    let replies = tx_packets(&lab.0, "db-0") - sent_before[1];
    std::thread::sleep(Duration::from_millis(300));
    trace.signal(libc::SIGINT);
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let lines = done.json();
    assert_eq!(
        lines[0]["steps_unmeasured"], 0,
        "no stamp taken by another packet in flight"
    );
    let steps = lines[0]["steps"].as_array().expect("steps");
    let mut from_web = 0;
    for s in steps {
        let expected = if is_reply_step(steps, s) {
            replies
        } else {
            requests
        };
        assert_eq!(
            s["packets"].as_u64(),
            Some(expected),
            "every packet on every step: {s}"
        );
        from_web += u64::from(
            s["from"]
                .as_str()
                .is_some_and(|h| h.starts_with("node-1/veth")),
        );
    }
    assert_eq!(from_web, 1, "one chain starts at web-0's veth: {steps:?}");
    (requests, replies)
}

/// Pins, as the first ping learnt them, the pod's neighbours (its
/// gateway) and the node's entry for the pod: an entry left to age goes
/// stale after 15 to 45 s, and its ARP probe (or the answer to the
/// node's) is a packet the pod's interface counts and the flow does not.
/// A start slowed by a busy machine made that happen mid-burst.
fn pin_neighbours(lab: &xtask::lab::Lab, pod: &str) {
    let pod = lab.pod(pod);
    let node = lab.node_netns(pod.node);
    let pin = |netns: &str, selector: &[&str]| {
        let shown = in_netns(netns, "ip")
            .args(["-4", "neigh", "show"])
            .args(selector)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&shown.stdout).into_owned();
        let pinned = listing.lines().filter_map(|line| {
            // `<ip> [dev <dev>] lladdr <mac> REACHABLE`
            let words: Vec<&str> = line.split_whitespace().collect();
            let after = |k: &str| words.windows(2).find(|w| w[0] == k).map(|w| w[1]);
            let dev = after("dev").or_else(|| selector.last().copied())?;
            Some((
                words[0].to_string(),
                dev.to_string(),
                after("lladdr")?.to_string(),
            ))
        });
        let mut count = 0;
        for (ip, dev, mac) in pinned {
            let status = in_netns(netns, "ip")
                .args([
                    "neigh",
                    "replace",
                    &ip,
                    "lladdr",
                    &mac,
                    "dev",
                    &dev,
                    "nud",
                    "permanent",
                ])
                .status()
                .unwrap();
            assert!(status.success(), "pin {ip} on {dev} in {netns}");
            count += 1;
        }
        assert!(count > 0, "nothing to pin in {netns}: {listing}");
    };
    pin(&pod.netns, &["dev", "eth0"]);
    pin(&node, &[&pod.ip.to_string()]);
}

/// Whether step `s` lies on the chain that starts at db-0's veth (node-2).
fn is_reply_step(steps: &[serde_json::Value], s: &serde_json::Value) -> bool {
    let mut at = s.clone();
    for _ in 0..steps.len() {
        let from = at["from"].as_str().unwrap_or_default().to_string();
        if from.starts_with("node-2/veth") {
            return true;
        }
        if from.starts_with("node-1/veth") {
            return false;
        }
        let Some(before) = steps.iter().find(|p| p["to"].as_str() == Some(&from)) else {
            return false;
        };
        at = before.clone();
    }
    false
}

/// `count` pings from web-0 to db-0, `interval` seconds apart, all answered.
fn ping_burst(lab: &xtask::lab::Lab, count: u32, interval: &str) {
    let pinged = in_netns(&lab.pod("web-0").netns, "ping")
        .args(["-q", "-c", &count.to_string(), "-i", interval])
        .arg(lab.pod("db-0").ip.to_string())
        .output()
        .unwrap();
    assert!(pinged.status.success());
}

/// TCP segments the pod's stack has sent (`Tcp: OutSegs` of its
/// namespace's /proc/net/snmp; a GSO packet counts each segment).
fn tcp_segments_sent(lab: &xtask::lab::Lab, pod: &str) -> u64 {
    let out = in_netns(&lab.pod(pod).netns, "cat")
        .arg("/proc/net/snmp")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut tcp = text.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (
        tcp.next().expect("Tcp names"),
        tcp.next().expect("Tcp values"),
    );
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "OutSegs")
        .and_then(|(_, v)| v.parse().ok())
        .expect("OutSegs")
}

/// Packets the pod's own interface has sent.
fn tx_packets(lab: &xtask::lab::Lab, pod: &str) -> u64 {
    let out = in_netns(&lab.pod(pod).netns, "cat")
        .arg("/sys/class/net/eth0/statistics/tx_packets")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("tx_packets")
}

#[test]
fn sample_100_loses_nothing_on_a_full_rate_iperf3_flow() {
    let lab = lab(Topology::FlannelVxlan);
    assert!(ping(&lab.0, "web-0", "db-0"));
    let argv = argv(
        &["web-0", "db-0", "--sample", "100", "-o", "json"],
        lab_args(&lab.0, &[1, 2]),
    );
    let trace = Trace::start(&argv);
    let (bits, _) = datapath::iperf(&lab.0, "web-0", "db-0", 3);
    assert!(bits > 0.0, "iperf3 ran");
    std::thread::sleep(Duration::from_millis(500));
    trace.signal(libc::SIGINT);
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let lines = done.json();
    let summary = lines
        .iter()
        .find(|v| v["type"] == "summary")
        .expect("summary");
    assert_eq!(summary["sample"], 100, "{summary}");
    assert_eq!(summary["lost_ringbuf_full"], 0, "{summary}");
    let stories = done.stories();
    assert!(
        stories.len() >= 10,
        "{} stories at {bits:.0} bit/s",
        stories.len()
    );
    for story in &stories {
        let verdict = &story["verdict"];
        // TCP itself may free a late duplicate inside the pod.
        let tcp_drop = verdict["outcome"] == "dropped"
            && verdict["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("TCP_"));
        assert!(
            verdict["outcome"] == "delivered" || tcp_drop,
            "every hop of a sampled packet is kept: {story}"
        );
    }
}

#[test]
fn calico_vxlan_cross_node_ping_is_encapsulated_with_vni_4096_on_4789() {
    let lab = lab(Topology::CalicoVxlan);
    let argv = argv(
        &["web-0", "db-0", "--count", "1", "-o", "json"],
        lab_args(&lab.0, &[1, 2]),
    );
    let trace = Trace::start(&argv);
    assert!(
        ping(&lab.0, "web-0", "db-0"),
        "web-0 reaches db-0 across vxlan.calico"
    );
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.ping_stories();
    let story = stories.first().expect("a story");
    assert_eq!(story["verdict"]["outcome"], "delivered", "{story}");
    let hops = story["hops"].as_array().unwrap();
    let on = |node: &str, iface: &str, direction: &str| {
        hops.iter()
            .find(|h| h["node"] == node && h["iface"] == iface && h["direction"] == direction)
            .unwrap_or_else(|| panic!("no {node} {iface} {direction} hop in {story}"))
    };
    on("node-1", "vxlan.calico", "egress");
    let encap = on("node-1", "eth0", "egress");
    assert_eq!(encap["tunnel"]["vni"], 4096, "{encap}");
    assert_eq!(
        encap["tunnel"]["outer"]["transport"]["dport"], 4789,
        "{encap}"
    );
    on("node-2", "vxlan.calico", "ingress");
    let path = &story["verdict"]["path"];
    assert!(
        path.as_array().unwrap().iter().any(|p| p == "encapsulated"),
        "{path}"
    );
}
