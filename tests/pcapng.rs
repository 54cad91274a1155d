//! `--write FILE.pcapng` against the real kernel: Debian's tshark reads
//! what podtrace writes on the lab (one packet per hop on its node's
//! interface, the direction flags, the story and verdict in the comments,
//! VXLAN inside and out), and `podtrace read` tells the same stories again.
//! A healthy cross-node ping and an iptables FORWARD drop.

#[allow(dead_code)]
mod support;

use std::{collections::BTreeMap, path::Path, process::Command};

use serde_json::Value;
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

/// tshark's fields, one row per frame (tab-separated).
fn tshark(file: &Path, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
    let mut command = Command::new("tshark");
    command
        .args([
            "-r",
            &file.display().to_string(),
            "-d",
            "udp.port==8472,vxlan",
        ])
        .args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=a"]);
    if !filter.is_empty() {
        command.args(["-Y", filter]);
    }
    for field in fields {
        command.args(["-e", field]);
    }
    let out = command
        .output()
        .expect("tshark (cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split('\t').map(String::from).collect())
        .collect()
}

/// A file in the test's temporary directory.
fn temp_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("podtrace-{}-{name}.pcapng", std::process::id()))
}

/// What every written trace must satisfy; returns tshark's frames
/// (interface, direction flags, comments).
fn assert_written(done: &Finished, file: &Path) -> Vec<Vec<String>> {
    let stories = done.stories();
    assert!(!stories.is_empty(), "{}", done.stdout);
    let frames = tshark(
        file,
        "",
        &[
            "frame.interface_name",
            "frame.packet_flags_direction",
            "frame.comment",
        ],
    );
    // Frames not on the story's path: frees inside the pod after delivery.
    let (freed, on_path): (Vec<_>, Vec<_>) = frames
        .iter()
        .partition(|f| f[2].contains("freed inside the pod"));
    let freed_told: usize = stories
        .iter()
        .map(|s| s["freed_after_delivery"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(freed.len(), freed_told, "{frames:?}");
    // One frame per hop, in story order, on its node's interface, with
    // the direction of the hook and the story's note.
    let hops: Vec<(usize, &Value)> = stories
        .iter()
        .enumerate()
        .flat_map(|(n, s)| {
            s["hops"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |h| (n + 1, h))
        })
        .collect();
    assert_eq!(on_path.len(), hops.len(), "{frames:?}");
    let mut per_iface_file = BTreeMap::new();
    let mut per_iface_json = BTreeMap::new();
    for (frame, (n, hop)) in on_path.iter().zip(&hops) {
        let iface = format!(
            "{}/{}",
            hop["node"].as_str().unwrap(),
            hop["iface"].as_str().unwrap()
        );
        *per_iface_file.entry(frame[0].clone()).or_insert(0) += 1;
        *per_iface_json.entry(iface.clone()).or_insert(0) += 1;
        assert_eq!(frame[0], iface);
        let direction = match hop["direction"].as_str().unwrap() {
            "ingress" => "1",
            "egress" => "2",
            _ => "0",
        };
        let flags = frame[1].trim_start_matches("0x").trim_start_matches('0');
        assert_eq!(
            flags.chars().last().map_or("0".into(), String::from),
            direction,
            "{frame:?}"
        );
        assert!(frame[2].starts_with(&format!("#{n} hop ")), "{frame:?}");
        assert!(
            frame[2].contains(hop["note"].as_str().unwrap()),
            "{frame:?}"
        );
    }
    assert_eq!(per_iface_file, per_iface_json);
    assert_no_frame_longer_than_its_packet(file);
    // Each story's verdict is on its last packet.
    for story in &stories {
        let verdict = format!("verdict: {}", story["verdict"]["summary"].as_str().unwrap());
        assert!(
            frames.iter().any(|f| f[2].contains(&verdict)),
            "{verdict} not in {frames:?}"
        );
    }
    frames
}

/// Every frame holds its packet's bytes and not one more: a drop's copy
/// once ran 256 bytes whatever the packet, and the bytes past a 60-byte
/// SYN held an earlier flow's payload and kernel pointers.
fn assert_no_frame_longer_than_its_packet(file: &Path) {
    let frames = tshark(
        file,
        "",
        &[
            "frame.cap_len",
            "frame.len",
            "frame.protocols",
            "ip.len",
            "ipv6.plen",
        ],
    );
    assert!(!frames.is_empty());
    for frame in &frames {
        let number = |i: usize| -> Option<usize> { frame.get(i)?.split(',').next()?.parse().ok() };
        let (captured, original) = (number(0).unwrap(), number(1).unwrap());
        assert!(captured <= original, "{frame:?}");
        let l2 = if frame[2].starts_with("eth:") { 14 } else { 0 };
        let ip = number(3).or_else(|| number(4).map(|payload| payload + 40));
        let ip = ip.unwrap_or_else(|| panic!("no IP length in {frame:?}"));
        // An Ethernet frame may carry padding past its IP packet; a copy
        // that starts at the IP header ends where the packet does.
        if l2 == 0 {
            assert!(
                captured <= ip,
                "{captured} bytes written for a {ip}-byte packet: {frame:?}"
            );
        }
        assert!(original >= ip + l2, "{frame:?}");
    }
}

/// `podtrace read` tells the live JSON again, line for line, without root.
fn assert_read_back(done: &Finished, file: &Path) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", PODTRACE])
        .args(["read", "-o", "json", &file.display().to_string()])
        .output()
        .expect("setpriv");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "podtrace read: {stderr}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        done.stdout,
        "{stderr}"
    );
}

fn readable(file: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
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
