//! `cargo xtask bench`: what each of podtrace's tc programs costs a packet,
//! per path a packet can take through it, timed by the kernel itself
//! (BPF_PROG_TEST_RUN, bpf_stats off: no traffic, no clock read per run)
//! beside an empty tc program on the same packet in the same round.
//! Repeatable where throughput is not. Numbers, not asserts.

#[allow(dead_code)]
mod support;

#[allow(dead_code)]
mod datapath;

use std::{collections::BTreeMap, process::Command, time::Duration};

use datapath::Better;
use support::*;
use xtask::{lab::Topology, podtrace_run};

const ROUNDS: usize = 5;

/// Runs per measurement of a packet no record is made of.
const REPEAT: u32 = 1_000_000;

/// Runs per measurement of a packet each run reports: the ring (16 MiB)
/// holds them while podtrace reads, so no run takes the ring-full path.
const REPEAT_REPORTED: u32 = 20_000;

/// The tc programs every hook runs one of (the IPv6 ones run only for
/// IPv6 packets, after a tail call).
const PROGRAMS: [&str; 3] = ["podtrace_egress", "podtrace_ingress", "podtrace_to_pod"];

/// A way podtrace runs, and the packets whose path through it is timed.
struct Mode {
    key: &'static str,
    args: &'static [&'static str],
    /// (key, what, packet, runs)
    paths: Vec<(&'static str, &'static str, Vec<u8>, u32)>,
}

#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn kernel_cost_per_path() {
    let lab = lab(Topology::FlannelVxlan);
    let stats = datapath::BpfStats::enable();
    stats.set(false);
    let floor = datapath::Floor::attach(&lab.0, &[1]);
    let floor_id = *floor.ids.first().expect("the empty program attached");
    let frame = |from, to, port| datapath::tcp_frame(&lab.0, from, to, port);
    let untraced = || {
        vec![
            (
                "untraced-ipv4",
                "untraced IPv4 TCP",
                frame("web-0", "db-0", 5201),
                REPEAT,
            ),
            (
                "untraced-vxlan",
                "untraced VXLAN (inner pair read)",
                datapath::vxlan_frame(frame("web-0", "db-0", 5201)),
                REPEAT,
            ),
            (
                "untraced-ipv6",
                "untraced IPv6 TCP",
                datapath::tcp6_frame(),
                REPEAT,
            ),
        ]
    };
    let with = |mut paths: Vec<_>, more| {
        paths.push(more);
        paths
    };
    let modes = [
        Mode {
            key: "trace",
            args: &["web-1", "db-1"],
            paths: with(
                untraced(),
                (
                    "traced",
                    "traced, reported",
                    frame("web-1", "db-1", 5201),
                    REPEAT_REPORTED,
                ),
            ),
        },
        Mode {
            key: "port",
            args: &["web-1", "db-1", "--port", "80"],
            paths: [
                untraced(),
                vec![
                    (
                        "left-out",
                        "traced pair, left out by --port",
                        frame("web-1", "db-1", 5201),
                        REPEAT,
                    ),
                    (
                        "left-out-vxlan",
                        "traced pair in VXLAN, left out by --port",
                        datapath::vxlan_frame(frame("web-1", "db-1", 5201)),
                        REPEAT,
                    ),
                ],
            ]
            .concat(),
        },
        Mode {
            key: "profile",
            args: &["profile", "web-1", "db-1"],
            paths: with(
                untraced(),
                (
                    "traced",
                    "traced, stamped",
                    frame("web-1", "db-1", 5201),
                    REPEAT,
                ),
            ),
        },
    ];
    println!("kernel cost per program and path: BPF_PROG_TEST_RUN, ns/run, median of {ROUNDS} interleaved rounds (in brackets: over the empty tc program on the same packet)");
    for mode in &modes {
        measure(&lab.0, mode, floor_id);
    }
}

/// Starts podtrace as `mode` says, and times each of its programs on each
/// of the mode's packets beside the empty program `floor_id`.
fn measure(lab: &xtask::lab::Lab, mode: &Mode, floor_id: u64) {
    let mut command = Command::new(PODTRACE);
    command
        .args(mode.args)
        .args(["-o", "json"])
        .args(lab_args(lab, &[1, 2]))
        .stdout(std::process::Stdio::null());
    let mut tracing = podtrace_run::start(command, Duration::from_secs(30)).expect("podtrace");
    let pid = tracing.child.id() as i32;
    let ids: Vec<(&str, u64)> = PROGRAMS
        .iter()
        .filter_map(|&name| Some((name, *datapath::program_ids(pid, name).first()?)))
        .collect();
    let jited: Vec<String> = ids
        .iter()
        .map(|&(name, id)| {
            let bytes = datapath::jited_bytes(id);
            datapath::figure(
                &format!("kernel/{}/{name} jited", mode.key),
                bytes as f64,
                "B",
                Better::Lower,
            );
            format!("{name} {bytes}")
        })
        .collect();
    println!(
        "  podtrace {} (JIT code, bytes: {})",
        mode.args.join(" "),
        jited.join(", ")
    );
    for (key, what, packet, repeat) in &mode.paths {
        let mut times: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
        for _ in 0..ROUNDS {
            for id in ids.iter().map(|&(_, id)| id).chain([floor_id]) {
                let ns = datapath::test_run(id, packet, *repeat).unwrap_or(f64::NAN);
                times.entry(id).or_default().push(ns);
            }
        }
        let median = |id| datapath::median(times[&id].iter().copied());
        let floor = median(floor_id);
        datapath::figure(
            &format!("kernel/{}/{key}/empty program", mode.key),
            floor,
            "ns/run",
            Better::Lower,
        );
        let cells: Vec<String> = ids
            .iter()
            .map(|&(name, id)| {
                let ns = median(id);
                datapath::figure(
                    &format!("kernel/{}/{key}/{name}", mode.key),
                    ns,
                    "ns/run",
                    Better::Lower,
                );
                format!(
                    "{} {ns:.0} (+{:.0})",
                    name.trim_start_matches("podtrace_"),
                    ns - floor
                )
            })
            .collect();
        println!(
            "    {what}, {} B: {}; empty program {floor:.0}",
            packet.len(),
            cells.join(", ")
        );
    }
    // SAFETY: a child we own.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let _ = tracing.child.wait();
}
