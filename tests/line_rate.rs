//! `cargo xtask bench`, at line rate: iperf3 TCP across VXLAN between two
//! lab pods, in interleaved rounds of every case (untraced, podtrace on
//! another pair, per-packet on the flow, profile mode, tcpdump likewise),
//! on a bare node and then on one with a cluster's netfilter rules; then
//! `podtrace profile` of the same flow on every lab topology.
//! Numbers, not asserts.

#[allow(dead_code)]
mod support;

#[allow(dead_code)]
mod datapath;

use std::{
    collections::BTreeMap,
    process::{Child, Stdio},
    time::Duration,
};

use serde_json::Value;
use support::*;
use xtask::{
    lab::{in_netns, kube_proxy::ProxyMode, Lab, Topology},
    podtrace_run,
};

const ROUNDS: usize = 5;
const SECONDS: u32 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Case {
    Untraced,
    PodtraceOtherPair,
    PodtraceOtherPairNoRuleset,
    PodtracePerPacket,
    PodtraceSample100,
    PodtraceProfile,
    TcpdumpOtherPair,
    TcpdumpFlow,
}

const CASES: [Case; 8] = [
    Case::Untraced,
    Case::PodtraceOtherPair,
    Case::PodtraceOtherPairNoRuleset,
    Case::PodtracePerPacket,
    Case::PodtraceSample100,
    Case::PodtraceProfile,
    Case::TcpdumpOtherPair,
    Case::TcpdumpFlow,
];

impl Case {
    fn runs_podtrace(self) -> bool {
        matches!(
            self,
            Case::PodtraceOtherPair
                | Case::PodtraceOtherPairNoRuleset
                | Case::PodtracePerPacket
                | Case::PodtraceSample100
                | Case::PodtraceProfile
        )
    }
}

/// One run of one case: throughput, and what the tracer said.
#[derive(Default)]
struct Run {
    bits: f64,
    lost: u64,
    cpu_percent: f64,
    rss_kib: u64,
    prog_ns: BTreeMap<String, (u64, u64)>,
}

#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn line_rate_cases() {
    let lab = lab(Topology::FlannelVxlan);
    let stats = datapath::BpfStats::enable();
    // A node with no netfilter rule at all first: podtrace's rule-tracing
    // table is then the only netfilter hook, so what it costs shows.
    interleaved_rounds(&lab.0, &stats, "bare", "a bare node: no netfilter rule");
    // Then the node as a cluster has it: kube-proxy's Services (iptables
    // mode) and flannel's MASQUERADE, so conntrack and iptables already
    // see every packet.
    lab.0
        .install_services(ProxyMode::Iptables)
        .expect("install services");
    interleaved_rounds(
        &lab.0,
        &stats,
        "cluster",
        "a cluster's node: kube-proxy (iptables) and flannel's rules",
    );
}

/// Every case in [`ROUNDS`] interleaved rounds on `lab` as it is now,
/// printed as medians against the untraced run.
/// `key` names the node's shape in the bench's figures.
fn interleaved_rounds(lab: &Lab, stats: &datapath::BpfStats, key: &str, node: &str) {
    // Throughput with bpf_stats off: its two clock reads per program run
    // would be charged to podtrace's cases alone.
    stats.set(false);
    let mut runs: BTreeMap<Case, Vec<Run>> = BTreeMap::new();
    for round in 0..ROUNDS {
        // Each round starts one case later: no case always follows the
        // same one (and what it left behind, such as a file's write-back).
        for i in 0..CASES.len() {
            let case = CASES[(round + i) % CASES.len()];
            runs.entry(case).or_default().push(run(lab, case));
        }
    }
    // Then one more run of each case with bpf_stats on, for ns/run.
    stats.set(true);
    let timed: BTreeMap<Case, Run> = CASES
        .iter()
        .filter(|case| case.runs_podtrace())
        .map(|&case| (case, run(lab, case)))
        .collect();
    let bare = datapath::median(runs[&Case::Untraced].iter().map(|r| r.bits));
    println!(
        "line rate on {node}: iperf3 TCP web-0 → db-0 across flannel.1 (VXLAN), {ROUNDS} interleaved rounds of {SECONDS} s; medians"
    );
    println!("  untraced: {:.2} Gbit/s", bare / 1e9);
    for case in &CASES[1..] {
        let r = &runs[case];
        let bits = datapath::median(r.iter().map(|r| r.bits));
        let lost: u64 = r.iter().map(|r| r.lost).sum();
        let cpu = datapath::median(r.iter().map(|r| r.cpu_percent));
        let rss = r.iter().map(|r| r.rss_kib).max().unwrap_or(0);
        let progs = timed.get(case).map(|run| &run.prog_ns);
        figures(
            &format!("line-rate/{key}/{case:?}"),
            bits / bare,
            cpu,
            rss,
            lost,
            progs,
        );
        println!(
            "  {case:?}: {:.2} Gbit/s ({:.2}× untraced); lost {lost}; CPU {cpu:.0}%, RSS {rss} KiB{}",
            bits / 1e9,
            bits / bare,
            progs.map_or_else(String::new, |progs| format!(
                "; {} (a run of its own, bpf_stats on)",
                datapath::format_stats(progs)
            ))
        );
    }
}

/// A case's figures for the bench's baseline: its throughput as a share
/// of untraced, its CPU, RSS and losses, and its programs' ns/run.
fn figures(
    name: &str,
    ratio: f64,
    cpu: f64,
    rss_kib: u64,
    lost: u64,
    progs: Option<&BTreeMap<String, (u64, u64)>>,
) {
    use datapath::{figure, Better};
    figure(
        &format!("{name} throughput"),
        ratio,
        "× untraced",
        Better::Higher,
    );
    figure(&format!("{name} CPU"), cpu, "%", Better::Lower);
    figure(&format!("{name} RSS"), rss_kib as f64, "KiB", Better::Lower);
    figure(
        &format!("{name} lost"),
        lost as f64,
        "packets",
        Better::Lower,
    );
    for (program, (runs, ns)) in progs.into_iter().flatten() {
        if *runs > 0 {
            let per_run = *ns as f64 / *runs as f64;
            figure(
                &format!("{name} {program}"),
                per_run,
                "ns/run",
                Better::Lower,
            );
        }
    }
}

fn run(lab: &Lab, case: Case) -> Run {
    match case {
        Case::Untraced => Run {
            bits: datapath::iperf(lab, "web-0", "db-0", SECONDS).0,
            ..Run::default()
        },
        Case::PodtraceOtherPair => podtrace(lab, &["web-1", "db-1"]),
        // Without the rule-tracing table: the tc programs' share alone.
        Case::PodtraceOtherPairNoRuleset => {
            podtrace(lab, &["web-1", "db-1", "--no-ruleset-changes"])
        }
        Case::PodtracePerPacket => podtrace(lab, &["web-0", "db-0"]),
        Case::PodtraceSample100 => podtrace(lab, &["web-0", "db-0", "--sample", "100"]),
        Case::PodtraceProfile => podtrace(lab, &["profile", "web-0", "db-0"]),
        Case::TcpdumpOtherPair => tcpdump(lab, "web-1", "db-1"),
        Case::TcpdumpFlow => tcpdump(lab, "web-0", "db-0"),
    }
}

/// podtrace with `first` arguments, on both nodes, while iperf3 runs. Its
/// output goes to a file: a pipe nobody reads until the end would stall
/// it. In memory (/dev/shm) where there is one: the disk's write-back of
/// a few hundred MB would be charged to whichever case runs next, and
/// tcpdump's capture goes to /dev/null.
fn podtrace(lab: &Lab, first: &[&str]) -> Run {
    let dir = std::path::Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let out = dir.join(format!("podtrace-bench-{}.json", std::process::id()));
    let mut command = std::process::Command::new(PODTRACE);
    command
        .args(first)
        .args(["-o", "json"])
        .args(lab_args(lab, &[1, 2]))
        .stdout(std::fs::File::create(&out).expect("bench output"));
    let mut tracing = podtrace_run::start(command, Duration::from_secs(20)).expect("podtrace");
    let pid = tracing.child.id() as i32;
    let cpu_before = datapath::cpu_seconds(pid);
    let bits = datapath::iperf(lab, "web-0", "db-0", SECONDS).0;
    let cpu_percent = (datapath::cpu_seconds(pid) - cpu_before) / f64::from(SECONDS) * 100.0;
    let rss_kib = rss(pid);
    let prog_ns = datapath::prog_stats(pid);
    // SAFETY: a child we own.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let _ = tracing.child.wait();
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    let summary: Option<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "summary");
    let lost = summary.map_or(0, |s| {
        s["lost_ringbuf_full"].as_u64().unwrap_or(0) + s["lost_snapshot"].as_u64().unwrap_or(0)
    });
    Run {
        bits,
        lost,
        cpu_percent,
        rss_kib,
        prog_ns,
    }
}

fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// tcpdump (snaplen 128) on every interface of both nodes, filtered to
/// the pair `a` ⇄ `b` and the VXLAN port, while iperf3 runs web-0 → db-0.
fn tcpdump(lab: &Lab, a: &str, b: &str) -> Run {
    let filter = format!(
        "(host {} and host {}) or udp port 8472",
        lab.pod(a).ip,
        lab.pod(b).ip
    );
    // The other pair's filter must not match the flow's VXLAN packets.
    let filter = if a == "web-0" {
        filter
    } else {
        format!("host {} and host {}", lab.pod(a).ip, lab.pod(b).ip)
    };
    let mut dumps: Vec<Child> = [1, 2]
        .iter()
        .map(|&n| {
            in_netns(&lab.node_netns(n), "tcpdump")
                .args(["-i", "any", "-s", "128", "-w", "/dev/null", "-n", &filter])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("tcpdump")
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let cpu_before: f64 = dumps
        .iter()
        .map(|c| datapath::cpu_seconds(c.id() as i32))
        .sum();
    let bits = datapath::iperf(lab, "web-0", "db-0", SECONDS).0;
    let cpu: f64 = dumps
        .iter()
        .map(|c| datapath::cpu_seconds(c.id() as i32))
        .sum();
    let rss_kib = dumps.iter().map(|c| rss(c.id() as i32)).sum();
    let mut lost = 0;
    for dump in &mut dumps {
        // SAFETY: a child we own.
        unsafe { libc::kill(dump.id() as i32, libc::SIGINT) };
        let out = std::mem::replace(dump, spawn_true())
            .wait_with_output()
            .expect("tcpdump");
        lost += dropped_by_kernel(&String::from_utf8_lossy(&out.stderr));
    }
    for dump in &mut dumps {
        let _ = dump.wait();
    }
    Run {
        bits,
        lost,
        cpu_percent: (cpu - cpu_before) / f64::from(SECONDS) * 100.0,
        rss_kib,
        prog_ns: BTreeMap::new(),
    }
}

fn spawn_true() -> Child {
    std::process::Command::new("true").spawn().expect("true")
}

/// `N packets dropped by kernel` of tcpdump's exit lines.
fn dropped_by_kernel(stderr: &str) -> u64 {
    stderr
        .lines()
        .find(|l| l.contains("dropped by kernel"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `podtrace profile` of web-0 → db-0 under iperf3 on every topology:
/// per-step p50/p99 and the throughput.
#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn profile_every_topology() {
    println!("profile per topology: iperf3 TCP web-0 → db-0, {SECONDS} s, podtrace profile; steps of the sending direction, µs");
    for topology in [
        Topology::FlannelVxlan,
        Topology::FlannelHostGw,
        Topology::Calico,
        Topology::CalicoVxlan,
    ] {
        let lab = lab(topology);
        let args = argv(
            &["profile", "web-0", "db-0", "-o", "json"],
            lab_args(&lab.0, &[1, 2]),
        );
        let trace = Trace::start(&args);
        let (bits, _) = datapath::iperf(&lab.0, "web-0", "db-0", SECONDS);
        trace.signal(libc::SIGINT);
        let done = trace.finish();
        let lines = done.json();
        println!("  {} ({:.2} Gbit/s traced):", topology.name(), bits / 1e9);
        let Some(steps) = lines.first().and_then(|l| l["steps"].as_array()) else {
            println!("    no profile: {}", done.stderr);
            continue;
        };
        for s in steps.iter().filter(|s| s["packets"].as_u64() > Some(100)) {
            println!("    {}", step_line(s));
        }
    }
}

fn step_line(s: &Value) -> String {
    format!(
        "{:>8} pkts  p50 {:>6.1}  p99 {:>7.1}  {:>+4} B  {} → {}",
        s["packets"],
        s["p50_us"].as_f64().unwrap_or(0.0),
        s["p99_us"].as_f64().unwrap_or(0.0),
        s["bytes_added"].as_i64().unwrap_or(0),
        s["from"].as_str().unwrap_or(""),
        s["to"].as_str().unwrap_or("")
    )
}

/// What podtrace costs packets it does not report: iperf3 web-0 → db-0
/// while podtrace traces web-1 ⇄ db-1, per-program ns/run from bpf_stats
/// beside an empty program on the same hooks (the floor bpf_stats itself
/// charges), then the kernel's own timing of the same programs
/// (BPF_PROG_TEST_RUN, stats off) on an untraced packet, plain and
/// VXLAN-encapsulated, beside the empty program.
#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn untraced_cost() {
    let lab = lab(Topology::FlannelVxlan);
    let stats = datapath::BpfStats::enable();
    let floor = datapath::Floor::attach(&lab.0, &[1, 2]);
    let args = argv(&["web-1", "db-1", "-o", "json"], lab_args(&lab.0, &[1, 2]));
    let trace = Trace::start(&args);
    let (floor_before, progs_before) = (floor.stats(), datapath::prog_stats(trace.pid()));
    let bits =
        datapath::median((0..ROUNDS).map(|_| datapath::iperf(&lab.0, "web-0", "db-0", SECONDS).0));
    let progs = since(&datapath::prog_stats(trace.pid()), &progs_before);
    let floor_runs = (
        floor.stats().0 - floor_before.0,
        floor.stats().1 - floor_before.1,
    );
    println!("untraced cost: iperf3 web-0 → db-0 ({:.2} Gbit/s, median of {ROUNDS} × {SECONDS} s) while podtrace traces web-1 ⇄ db-1", bits / 1e9);
    println!("  bpf_stats: {}", datapath::format_stats(&progs));
    println!(
        "  bpf_stats floor (an empty tc program on the same hooks): {:.0} ns/run ({} runs)",
        floor_runs.1 as f64 / floor_runs.0.max(1) as f64,
        floor_runs.0
    );
    stats.set(false);
    let packets = [
        (
            "plain TCP",
            datapath::tcp_frame(&lab.0, "web-0", "db-0", 5201),
        ),
        (
            "VXLAN",
            datapath::vxlan_frame(datapath::tcp_frame(&lab.0, "web-0", "db-0", 5201)),
        ),
    ];
    let floor_id = floor.ids.first().copied();
    for (what, packet) in &packets {
        let mut line = format!("  BPF_PROG_TEST_RUN, {what} {} B, ns/run:", packet.len());
        for name in ["podtrace_ingress", "podtrace_egress"] {
            let id = datapath::program_ids(trace.pid(), name).first().copied();
            let ns = id.and_then(|id| datapath::test_run(id, packet, 1_000_000));
            line += &format!(" {name} {:.0}", ns.unwrap_or(f64::NAN));
        }
        let ns = floor_id.and_then(|id| datapath::test_run(id, packet, 1_000_000));
        line += &format!(", empty program {:.0}", ns.unwrap_or(f64::NAN));
        println!("{line}");
    }
    trace.signal(libc::SIGINT);
    trace.finish();
}

/// What ran in `now` since `before`, per program.
fn since(
    now: &BTreeMap<String, (u64, u64)>,
    before: &BTreeMap<String, (u64, u64)>,
) -> BTreeMap<String, (u64, u64)> {
    now.iter()
        .map(|(name, (runs, ns))| {
            let (r0, n0) = before.get(name).copied().unwrap_or_default();
            (name.clone(), (runs - r0, ns - n0))
        })
        .collect()
}
