//! `podtrace profile`: step latencies aggregated in the kernel on the
//! flannel-vxlan lab, told as JSON, and drawn as SVG with one histogram
//! per step.

// The profile test uses only part of the shared helpers.
#[allow(dead_code)]
mod support;

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
        .status()
        .unwrap();
    assert!(pinged.success());
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
