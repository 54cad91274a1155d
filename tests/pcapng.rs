//! `--write FILE.pcapng` against the real kernel: Debian's tshark reads
//! what podtrace writes on the lab (one packet per hop on its node's
//! interface, the direction flags, the story and verdict in the comments,
//! VXLAN inside and out), and `podtrace read` tells the same stories again.
//! A healthy cross-node ping and an iptables FORWARD drop.

#[allow(dead_code)]
mod capture_checks;
#[allow(dead_code)]
mod support;

use std::path::Path;

use capture_checks::*;

use support::*;
use xtask::{
    faults::Fault,
    lab::{LabGuard, Topology},
};

/// One ping web-0 → db-0 traced on both nodes, as JSON, with `--write`.
fn trace_and_write(lab: &LabGuard, count: &str, file: &Path) -> Finished {
    let mut args = argv(
        &["web-0", "db-0", "--count", count, "--duration", "20s"],
        lab_args(&lab.0, &[1, 2]),
    );
    args.extend(["-o", "json", "-w"].map(String::from));
    args.push(file.display().to_string());
    args.push("--nodes-file".into());
    args.push(lab.0.nodes_file().display().to_string());
    let trace = Trace::start(&args);
    let _answered = lab.0.ping("web-0", lab.0.pod("db-0").ip, &[]);
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    assert!(done.stderr.contains("podtrace: wrote"), "{}", done.stderr);
    done
}

#[test]
fn a_cross_node_ping_is_written_for_wireshark_and_read_back() {
    let lab = lab(Topology::FlannelVxlan);
    let file = temp_file("healthy");
    let done = trace_and_write(&lab, "2", &file);
    readable(&file);
    assert_written(&done, &file);
    // VXLAN on the underlay: tshark decodes the outer and the inner packet.
    let tunnelled: usize = done
        .stories()
        .iter()
        .flat_map(|s| s["hops"].as_array().unwrap().clone())
        .filter(|h| h["tunnel"]["kind"] == "vxlan")
        .count();
    assert!(tunnelled >= 2, "{}", done.stdout);
    let vxlan = tshark(&file, "vxlan && icmp", &["vxlan.vni", "ip.src", "ip.dst"]);
    assert_eq!(vxlan.len(), tunnelled, "{vxlan:?}");
    let (web, db) = (lab.0.pod("web-0").ip, lab.0.pod("db-0").ip);
    for frame in &vxlan {
        assert_eq!(frame[0], "1", "{frame:?}");
        let srcs: Vec<&str> = frame[1].split(',').collect();
        assert_eq!(srcs.len(), 2, "outer and inner: {frame:?}");
        assert!(
            [web.to_string(), db.to_string()].contains(&srcs[1].to_string()),
            "{frame:?}"
        );
    }
    assert_read_back(&done, &file);
    std::fs::remove_file(&file).ok();
}

#[test]
fn an_iptables_forward_drop_is_a_packet_with_its_verdict() {
    let lab = lab(Fault::IptablesForwardDrop.topology());
    Fault::IptablesForwardDrop
        .apply(&lab.0)
        .expect("apply the fault");
    let file = temp_file("drop");
    let done = trace_and_write(&lab, "1", &file);
    readable(&file);
    let story = &done.stories()[0];
    assert_eq!(story["verdict"]["outcome"], "dropped", "{story}");
    let frames = assert_written(&done, &file);
    let last = frames.last().expect("frames");
    assert!(last[2].contains(" DROP: "), "{last:?}");
    assert!(last[2].contains("NETFILTER_DROP"), "{last:?}");
    assert!(last[2].contains("verdict: "), "{last:?}");
    assert_read_back(&done, &file);
    std::fs::remove_file(&file).ok();
}

/// `--probe` with `--write`: the probe's result is the comment of its last
/// packet, once, so Wireshark shows the answer where the story ends; and
/// `podtrace read` tells it again, as the run did.
#[test]
fn a_probes_result_is_on_its_last_packets_comment_and_read_back() {
    let lab = lab(Topology::FlannelVxlan);
    let file = temp_file("probe");
    let mut args = argv(
        &["web-0", "db-0", "--probe", "tcp:8081", "-o", "json", "-w"],
        lab_args(&lab.0, &[1, 2]),
    );
    args.insert(7, file.display().to_string());
    let done = Trace::start(&args).finish();
    assert!(done.status.success(), "{}", done.stderr);
    let comments: Vec<String> = tshark(&file, "", &["frame.comment"])
        .into_iter()
        .map(|row| row.join(" "))
        .collect();
    let said = |c: &&String| c.contains("probe 1 tcp:8081 → ");
    assert_eq!(comments.iter().filter(said).count(), 1, "{comments:?}");
    let last = comments.last().expect("packets written");
    assert!(
        said(&last) && last.contains("✗ refused (RST)"),
        "{comments:?}"
    );
    let probes = done.probes();
    assert_eq!(probes.len(), 1, "{}", done.stdout);
    assert_eq!(probes[0]["result"], "refused (RST)");
    // The same stories, the probe's record and the summary, offline.
    readable(&file);
    assert_read_back(&done, &file);
    std::fs::remove_file(&file).ok();
}
