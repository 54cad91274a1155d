//! What every `--write` file must satisfy, read by Debian's tshark: one
//! frame per hop on its node's interface with the hook's direction and
//! the story's note, the verdict on each story's last packet, no frame
//! longer than its packet; and `podtrace read` telling the live JSON
//! again. Shared by node mode's and cluster mode's capture tests.

use std::{collections::BTreeMap, path::Path, process::Command};

use serde_json::Value;

use crate::support::{Finished, PODTRACE};

/// tshark's fields, one row per frame (tab-separated).
pub fn tshark(file: &Path, filter: &str, fields: &[&str]) -> Vec<Vec<String>> {
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
pub fn temp_file(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("podtrace-{}-{name}.pcapng", std::process::id()))
}

/// What every written trace must satisfy; returns tshark's frames
/// (interface, direction flags, comments).
pub fn assert_written(done: &Finished, file: &Path) -> Vec<Vec<String>> {
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
pub fn assert_no_frame_longer_than_its_packet(file: &Path) {
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
pub fn assert_read_back(done: &Finished, file: &Path) {
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

pub fn readable(file: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
}
