//! `cargo xtask bench`: numbers, not asserts. On the real datapath of a
//! flannel-vxlan lab (the userspace pipeline is `tracer/benches/`):
//! per-step latency, ping RTT with and without podtrace, podtrace's memory.

// The bench uses only part of the helpers it shares with the lab tests.
#[allow(dead_code)]
mod support;

#[allow(dead_code)]
mod datapath;

use std::time::{Duration, Instant};

use support::*;
use xtask::lab::Topology;

/// `rtt min/avg/max/mdev = …` of `ping -q`, as (avg, max) in µs.
fn ping_rtt(lab: &xtask::lab::Lab, count: u32) -> (f64, f64) {
    let (from, to) = (lab.pod("web-0"), lab.pod("db-0"));
    let out = xtask::lab::in_netns(&from.netns, "ping")
        .args(["-q", "-c", &count.to_string(), "-i", "0.01"])
        .arg(to.ip.to_string())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("rtt"))
        .expect("ping summary");
    let numbers: Vec<f64> = line
        .split('=')
        .nth(1)
        .unwrap()
        .trim()
        .trim_end_matches(" ms")
        .split('/')
        .map(|n| n.parse().unwrap())
        .collect();
    (numbers[1] * 1e3, numbers[2] * 1e3)
}

fn rss_kib(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn vxlan_datapath() {
    const PINGS: u32 = 500;
    let lab = lab(Topology::FlannelVxlan);
    ping_rtt(&lab.0, 20); // warm the neighbour and route caches
    let (bare_avg, bare_max) = ping_rtt(&lab.0, PINGS);

    let mut argv: Vec<String> = ["web-0", "db-0", "--profile", "-o", "json"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.extend(lab_args(&lab.0, &[1, 2]));
    let trace = Trace::start(&argv);
    let (traced_avg, traced_max) = ping_rtt(&lab.0, PINGS);
    std::thread::sleep(Duration::from_millis(600));
    let (rss, hwm) = rss_kib(trace.pid());
    trace.signal(libc::SIGINT);
    let done = trace.finish();
    let lines = done.json();
    let profile = lines
        .iter()
        .find(|v| v["type"] == "profile")
        .expect("profile");
    let summary = lines
        .iter()
        .find(|v| v["type"] == "summary")
        .expect("summary");

    // The cost of nft rule tracing alone: the same, without it.
    let mut plain_argv = argv.clone();
    plain_argv.push("--no-ruleset-changes".into());
    let plain = Trace::start(&plain_argv);
    let (no_nft_avg, no_nft_max) = ping_rtt(&lab.0, PINGS);
    plain.signal(libc::SIGINT);
    plain.finish();

    println!("datapath: {PINGS} pings web-0 → db-0 across flannel.1 (VXLAN), traced on both nodes");
    println!(
        "  ping RTT avg/max: {no_nft_avg:.0}/{no_nft_max:.0} µs traced with --no-ruleset-changes ({:+.1}% avg): tc, drops and route lookups only",
        (no_nft_avg / bare_avg - 1.0) * 100.0
    );
    println!("  ping RTT avg/max: {bare_avg:.0}/{bare_max:.0} µs untraced, {traced_avg:.0}/{traced_max:.0} µs traced with nft rule tracing ({:+.1}% avg)", (traced_avg / bare_avg - 1.0) * 100.0);
    println!(
        "  podtrace: {} stories from {} sightings, lost {} (ring buffer) {} (copy); RSS {} KiB, peak {} KiB",
        summary["stories"], summary["sightings"], summary["lost_ringbuf_full"], summary["lost_snapshot"], rss, hwm
    );
    println!("  per-step latency on the datapath (µs):");
    println!(
        "    {:>5}  {:>7}  {:>7}  {:>7}  step",
        "count", "p50", "p90", "p99"
    );
    for step in profile["steps"].as_array().unwrap() {
        println!(
            "    {:>5}  {:>7.1}  {:>7.1}  {:>7.1}  {} → {}",
            step["count"],
            step["p50_us"].as_f64().unwrap(),
            step["p90_us"].as_f64().unwrap(),
            step["p99_us"].as_f64().unwrap(),
            step["from"].as_str().unwrap(),
            step["to"].as_str().unwrap()
        );
    }
}

/// Start and stop with a crowded node: `CROWD` more pod veths on node-1's
/// cni0 (their peers in one extra namespace), as on a node with hundreds
/// of pods. podtrace attaches only to what the trace needs.
#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn start_and_stop_on_a_crowded_node() {
    const CROWD: usize = 500;
    let lab = lab(Topology::FlannelVxlan);
    let crowd = format!("{}-crowd", lab.0.prefix);
    xtask::lab::sh(&["ip", "netns", "add", &crowd]).unwrap();
    let mut batch = String::new();
    for i in 0..CROWD {
        batch.push_str(&format!(
            "link add vcrowd{i} type veth peer name p{i} netns {crowd}\nlink set vcrowd{i} master cni0 up\n"
        ));
    }
    let file = std::env::temp_dir().join(format!("podtrace-crowd-{}", std::process::id()));
    std::fs::write(&file, batch).unwrap();
    let node1 = lab.0.node_netns(1);
    xtask::lab::sh(&["ip", "-n", &node1, "-batch", &file.display().to_string()]).unwrap();
    let _ = std::fs::remove_file(&file);
    // Both pods have talked, so their interfaces can be found.
    assert!(ping(&lab.0, "web-0", "db-0"));

    let mut argv: Vec<String> = ["web-0", "db-0"].iter().map(|s| s.to_string()).collect();
    argv.extend(lab_args(&lab.0, &[1, 2]));
    let mut starts = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let trace = Trace::start(&argv);
        starts.push(started.elapsed());
        let stopping = Instant::now();
        trace.signal(libc::SIGINT);
        let done = trace.finish();
        stops.push(stopping.elapsed());
        assert!(done.status.success(), "{}", done.stderr);
    }
    let ms = |d: &[Duration]| {
        d.iter()
            .map(|d| format!("{:.0}", d.as_secs_f64() * 1e3))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "crowded node: {CROWD} extra pod veths on node-1; start to \"tracing\": {} ms; SIGINT to exit: {} ms (3 runs)",
        ms(&starts),
        ms(&stops)
    );
}

/// What podtrace costs packets it does not trace: its tc programs' ns/run
/// (the kernel's bpf_stats) while iperf3 runs web-1 → db-1 across VXLAN
/// and podtrace traces web-0 ⇄ db-0. `PODTRACE_BEFORE=<binary>` measures
/// another build the same way, for a before/after.
#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn untraced_pair_cost() {
    let lab = lab(Topology::FlannelVxlan);
    let _stats = datapath::BpfStats::enable();
    let mut binaries = vec![("this build".to_string(), PODTRACE.to_string())];
    if let Ok(before) = std::env::var("PODTRACE_BEFORE") {
        binaries.insert(0, ("PODTRACE_BEFORE".to_string(), before));
    }
    let (bare, _) = datapath::iperf(&lab.0, "web-1", "db-1", 3);
    println!("untraced pair: iperf3 web-1 → db-1 across VXLAN, podtrace tracing web-0 ⇄ db-0");
    println!("  no podtrace: {:.2} Gbit/s", bare / 1e9);
    for (label, binary) in binaries {
        let (gbits, cpu, stats) = iperf_while_tracing(&lab.0, &binary, &["web-0", "db-0"]);
        println!(
            "  {label}: {:.2} Gbit/s ({:.2}× untraced), podtrace CPU {cpu:.0}%; {stats}",
            gbits / 1e9,
            gbits / bare,
        );
    }
}

/// What tracing a dual-stack pair costs the packets it does not trace,
/// per family: web-0 ⇄ db-0 traced over both families (the IPv6 programs
/// loaded), while iperf3 runs web-1 → db-1 over IPv4, then over IPv6,
/// rounds interleaved. An IPv4 packet never reaches the IPv6 programs; an
/// IPv6 one is handed to them by a tail call, and the kernel counts it in
/// the IPv4 program's ns/run. `PODTRACE_BEFORE=<binary>` (a build from
/// before IPv6) is measured on the same rounds, for the IPv4 path's cost
/// before and after.
#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn untraced_cost_by_family() {
    let lab = lab(Topology::FlannelVxlan);
    lab.0.dual_stack().expect("a dual-stack lab");
    let _stats = datapath::BpfStats::enable();
    let mut binaries = vec![("this build".to_string(), PODTRACE.to_string())];
    if let Ok(before) = std::env::var("PODTRACE_BEFORE") {
        binaries.insert(0, ("PODTRACE_BEFORE".to_string(), before));
    }
    let db1 = lab.0.pod("db-1");
    let families = [
        ("IPv4", std::net::IpAddr::from(db1.ip)),
        ("IPv6", db1.ipv6.expect("a dual-stack pod").into()),
    ];
    println!("untraced pair by family: iperf3 web-1 → db-1, podtrace tracing web-0 ⇄ db-0 (both families)");
    for round in 1..=3 {
        for (family, address) in families {
            let (bare, _) = datapath::iperf_to(&lab.0, "web-1", "db-1", address, 3);
            println!(
                "  round {round} {family}: no podtrace {:.2} Gbit/s",
                bare / 1e9
            );
            for (label, binary) in &binaries {
                let args = ["web-0", "db-0"];
                let (gbits, cpu, stats) = iperf_while_tracing_to(&lab.0, binary, &args, address);
                println!(
                    "  round {round} {family}: {label} {:.2} Gbit/s ({:.2}× untraced), CPU {cpu:.0}%; {stats}",
                    gbits / 1e9,
                    gbits / bare
                );
            }
        }
    }
}

/// iperf3 web-1 → db-1 for 3 s while `binary` traces with `args` on both
/// nodes: bit/s, podtrace's CPU (% of one core), and its programs' stats.
fn iperf_while_tracing(lab: &xtask::lab::Lab, binary: &str, args: &[&str]) -> (f64, f64, String) {
    iperf_while_tracing_to(lab, binary, args, lab.pod("db-1").ip.into())
}

/// The same, iperf3 connecting to `address` (db-1's, of either family).
fn iperf_while_tracing_to(
    lab: &xtask::lab::Lab,
    binary: &str,
    args: &[&str],
    address: std::net::IpAddr,
) -> (f64, f64, String) {
    let mut command = std::process::Command::new(binary);
    command
        .args(args)
        .args(["-o", "json"])
        .args(lab_args(lab, &[1, 2]))
        .stdout(std::process::Stdio::null());
    let mut tracing = xtask::podtrace_run::start(command, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{binary} {args:?}: {e:#}"));
    let pid = tracing.child.id() as i32;
    let cpu_before = datapath::cpu_seconds(pid);
    let (gbits, _) = datapath::iperf_to(lab, "web-1", "db-1", address, 3);
    let cpu = (datapath::cpu_seconds(pid) - cpu_before) / 3.0 * 100.0;
    let stats = datapath::prog_stats(pid);
    // SAFETY: a child we own.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let _ = tracing.child.wait();
    (gbits, cpu, datapath::format_stats(&stats))
}

/// Requests through a ClusterIP, one new TCP connection each (connect,
/// send, answer, close) from inside a pod: each crosses kube-proxy's DNAT
/// and the reply its un-DNAT. Prints each request's time in µs.
const REQUESTS: &str = r#"
import socket, sys, time
ip, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for _ in range(count):
    start = time.perf_counter()
    s = socket.create_connection((ip, port), timeout=2)
    s.sendall(b"hello\n")
    s.recv(64)
    s.close()
    print(int((time.perf_counter() - start) * 1e6))
"#;

/// Request times (µs) from web-0 to `svc`'s ClusterIP:port.
fn request_times(lab: &xtask::lab::Lab, svc: &str, count: u32) -> Vec<f64> {
    let service = lab.service(svc);
    let out = xtask::lab::in_netns(&lab.pod("web-0").netns, "python3")
        .args(["-c", REQUESTS, &service.cluster_ip.to_string()])
        .args([service.ports[0].port.to_string(), count.to_string()])
        .output()
        .expect("python3");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// One traced or untraced round: request times and iperf3 bits/s.
#[derive(Default)]
struct NatRound {
    requests_us: Vec<f64>,
    bits: Vec<f64>,
}

/// What following a packet through kube-proxy's NAT costs it: requests
/// (a new connection each) to db's ClusterIP and iperf3 through the
/// `iperf` Service's ClusterIP (backend db-0 on the other node), untraced
/// and traced (`podtrace default/web-0 svc/…`, both nodes, rule tracing
/// on), in interleaved rounds, in both kube-proxy modes. Ping cannot go
/// through a ClusterIP (kube-proxy translates TCP, UDP and SCTP only):
/// the request time is the round trip that crosses the NAT.
#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn nat_following_cost() {
    use xtask::lab::kube_proxy::ProxyMode;
    const ROUNDS: usize = 3;
    const REQUESTS_PER_ROUND: u32 = 100;
    const IPERF_SECONDS: u32 = 3;
    for mode in [ProxyMode::Iptables, ProxyMode::Nftables] {
        let lab = lab(Topology::FlannelVxlan);
        lab.0.install_services(mode).expect("install services");
        request_times(&lab.0, "db", 20); // warm the caches
        let mut untraced = NatRound::default();
        let mut traced = NatRound::default();
        for _ in 0..ROUNDS {
            for (round, trace) in [(&mut untraced, false), (&mut traced, true)] {
                let tracing = trace.then(|| trace_service(&lab.0, "db"));
                round
                    .requests_us
                    .extend(request_times(&lab.0, "db", REQUESTS_PER_ROUND));
                finish_trace(tracing);
                let tracing = trace.then(|| trace_service(&lab.0, "iperf"));
                let address = lab.0.service("iperf").cluster_ip;
                let (bits, _) = datapath::iperf_to(&lab.0, "web-0", "db-0", address, IPERF_SECONDS);
                round.bits.push(bits);
                finish_trace(tracing);
            }
        }
        print_nat_cost(mode, &untraced, &traced);
    }
}

/// `podtrace default/web-0 svc/<svc>` on both nodes, started.
fn trace_service(lab: &xtask::lab::Lab, svc: &str) -> Trace {
    let mut args = vec![
        "default/web-0".to_string(),
        format!("svc/{svc}"),
        "-o".into(),
        "json".into(),
        "--services-file".into(),
        lab.services_file().display().to_string(),
    ];
    args.extend(lab_args(lab, &[1, 2]));
    Trace::start(&args)
}

/// Stops a trace; one that told no story saw nothing, and its round
/// measured nothing: the bench fails rather than print that number.
fn finish_trace(trace: Option<Trace>) {
    if let Some(trace) = trace {
        trace.signal(libc::SIGINT);
        let done = trace.finish();
        assert!(
            done.stories()
                .iter()
                .any(|s| s["hops"].as_array().is_some_and(|h| !h.is_empty())),
            "the traced round told no story: {}",
            done.stderr
        );
    }
}

fn print_nat_cost(mode: xtask::lab::kube_proxy::ProxyMode, untraced: &NatRound, traced: &NatRound) {
    let p = |r: &NatRound, q| datapath::percentile(r.requests_us.iter().copied(), q);
    let gbit = |r: &NatRound| datapath::median(r.bits.iter().copied()) / 1e9;
    println!(
        "NAT following ({mode:?} kube-proxy): web-0 → ClusterIP → backend on node-2, {} interleaved rounds",
        traced.bits.len()
    );
    println!(
        "  request through db's ClusterIP (new TCP connection each, {} per case) p50/p90: {:.0}/{:.0} µs untraced, {:.0}/{:.0} µs traced ({:+.1}% p50, {:+.0} µs)",
        traced.requests_us.len(),
        p(untraced, 0.5),
        p(untraced, 0.9),
        p(traced, 0.5),
        p(traced, 0.9),
        (p(traced, 0.5) / p(untraced, 0.5) - 1.0) * 100.0,
        p(traced, 0.5) - p(untraced, 0.5)
    );
    println!(
        "  iperf3 through iperf's ClusterIP, median: {:.2} Gbit/s untraced, {:.2} Gbit/s traced ({:.2}×)",
        gbit(untraced),
        gbit(traced),
        gbit(traced) / gbit(untraced)
    );
}

/// What naming the rule costs a ping: interleaved rounds of 300 pings
/// untraced, traced with nft rule tracing (the default), and traced
/// without it (`--no-ruleset-changes`); median average RTTs.
#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn rule_naming_cost() {
    const PINGS: u32 = 300;
    const ROUNDS: usize = 3;
    let lab = lab(Topology::FlannelVxlan);
    ping_rtt(&lab.0, 20);
    let cases: [(&str, Option<&[&str]>); 3] = [
        ("untraced", None),
        ("traced, rules named", Some(&[])),
        (
            "traced, --no-ruleset-changes",
            Some(&["--no-ruleset-changes"]),
        ),
    ];
    let mut rtts = vec![Vec::new(); cases.len()];
    for _ in 0..ROUNDS {
        for (i, (_, flags)) in cases.iter().enumerate() {
            let trace = flags.map(|flags| {
                let mut args = argv(&["web-0", "db-0", "-o", "json"], lab_args(&lab.0, &[1, 2]));
                args.extend(flags.iter().map(|f| f.to_string()));
                Trace::start(&args)
            });
            rtts[i].push(ping_rtt(&lab.0, PINGS).0);
            if let Some(trace) = trace {
                trace.signal(libc::SIGINT);
                trace.finish();
            }
        }
    }
    let median = |v: &[f64]| datapath::median(v.iter().copied());
    let bare = median(&rtts[0]);
    println!("rule naming: {PINGS} pings web-0 → db-0 (10 ms apart), {ROUNDS} interleaved rounds; median average RTT");
    for ((what, _), rtt) in cases.iter().zip(&rtts) {
        let rtt = median(rtt);
        println!(
            "  {what}: {rtt:.0} µs ({:+.1}%)",
            (rtt / bare - 1.0) * 100.0
        );
    }
}

/// What `--port` costs the packets it leaves out, against packets of a
/// pair not traced at all: tc programs' ns/run (bpf_stats) while iperf3
/// runs web-1 → db-1 across VXLAN, podtrace tracing web-1 ⇄ db-1 with
/// `--port 9` (so every iperf3 packet is of the pair and left out), then
/// web-0 ⇄ db-0 (so none is of the pair). `PODTRACE_BEFORE=<binary>`
/// measures another build in the same rounds, interleaved.
#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn filtered_out_cost() {
    const ROUNDS: usize = 3;
    let lab = lab(Topology::FlannelVxlan);
    let _stats = datapath::BpfStats::enable();
    let mut binaries = vec![("this build".to_string(), PODTRACE.to_string())];
    if let Ok(before) = std::env::var("PODTRACE_BEFORE") {
        binaries.insert(0, ("PODTRACE_BEFORE".to_string(), before));
    }
    let (bare, _) = datapath::iperf(&lab.0, "web-1", "db-1", 3);
    println!(
        "--port: iperf3 web-1 → db-1 across VXLAN, {ROUNDS} interleaved rounds; no podtrace: {:.2} Gbit/s",
        bare / 1e9
    );
    let runs = [
        (
            "pair left out by --port 9",
            ["web-1", "db-1", "--port", "9"],
        ),
        ("another pair traced", ["web-0", "db-0", "--proto", "icmp"]),
    ];
    for round in 1..=ROUNDS {
        for (label, args) in &runs {
            for (build, binary) in &binaries {
                let (gbits, cpu, stats) = iperf_while_tracing(&lab.0, binary, args);
                println!(
                    "  round {round}, {label}, {build}: {:.2} Gbit/s ({:.2}× untraced), podtrace CPU {cpu:.0}%; {stats}",
                    gbits / 1e9,
                    gbits / bare,
                );
            }
        }
    }
}
