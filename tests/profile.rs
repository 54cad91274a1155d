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
use xtask::lab::{in_netns, Topology};

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
    let pinged = in_netns(&lab.0.pod("web-0").netns, "ping")
        .args(["-q", "-c", "100", "-i", "0.01"])
        .arg(lab.0.pod("db-0").ip.to_string())
        .output()
        .unwrap();
    assert!(pinged.status.success());
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

    let svg = std::fs::read_to_string(&plot).expect("the --plot file");
    let _ = std::fs::remove_file(&plot);
    let doc = roxmltree::Document::parse(&svg).expect("the SVG parses");
    let histograms = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("histogram"))
        .count();
    assert_eq!(histograms, steps.len(), "one histogram per step");
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
