//! Scale and churn: thousands of Services on the nodes, and a pod opening
//! hundreds of new TCP connections a second through one of them (connect,
//! send, answer, close, a port the kernel picks each time, so ports come
//! round again within minutes), traced with podtrace in JSON. Every story
//! of a connection that succeeded must be `delivered`: none of those
//! packets was lost.
//!
//! `churn_at_scale` (a benchmark: `cargo xtask bench`) runs 5,000
//! Services, 200 connections a second for 230 s, and prints podtrace's
//! memory and CPU; `PODTRACE_CHURN_SERVICES`, `PODTRACE_CHURN_RATE` and
//! `PODTRACE_CHURN_SECONDS` change them (`PODTRACE_CHURN_MODE=nftables`:
//! kube-proxy's nftables mode instead of iptables), `PODTRACE_CHURN_KEEP=1` keeps
//! the whole JSON. `churn_guard` is its small, fast
//! version, run with the other kernel tests.
//!
//! The JSON is written to a file, not held: the full run tells about half
//! a million stories. The stories that were not delivered, and the
//! summary, are kept beside it (the path is printed).

#[allow(dead_code)]
mod support;

#[allow(dead_code)]
mod datapath;

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use support::*;
use xtask::lab::{kube_proxy::ProxyMode, Lab, Topology};

/// One churn run's shape.
struct Churn {
    /// Services on the nodes, the lab's own included.
    services: usize,
    /// New connections a second.
    rate: u32,
    seconds: u32,
    /// web-0's ephemeral ports, narrowed so that each comes round again
    /// within seconds (while the server's side of its last connection is
    /// still in TIME_WAIT, and conntrack's entries on both nodes too);
    /// `None`: the kernel's range, which comes round in about 70 s at 200
    /// connections a second.
    ports: Option<(u16, u16)>,
    mode: ProxyMode,
}

/// What the client saw: connections that got their answer, and the local
/// ports of those that did not.
struct Client {
    ok: u64,
    failed_ports: Vec<u16>,
    achieved_rate: f64,
}

/// What the stories said.
#[derive(Default)]
struct Told {
    stories: u64,
    by_outcome: BTreeMap<String, u64>,
    /// Stories of successful connections that were not delivered.
    not_delivered: Vec<Value>,
    summary: Value,
    /// web-0's ports seen in SYNs.
    client_ports: std::collections::BTreeSet<u64>,
}

#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn churn_at_scale() {
    let env = |name: &str, default: u32| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let churn = Churn {
        services: env("PODTRACE_CHURN_SERVICES", 5000) as usize,
        rate: env("PODTRACE_CHURN_RATE", 200),
        seconds: env("PODTRACE_CHURN_SECONDS", 230),
        ports: None,
        mode: match std::env::var("PODTRACE_CHURN_MODE").as_deref() {
            Ok("nftables") => ProxyMode::Nftables,
            _ => ProxyMode::Iptables,
        },
    };
    run_and_check(&churn);
}

/// The small version: 200 Services, 50 connections a second for 20 s,
/// over 100 ports, so that each 4-tuple is reused about ten times.
#[test]
fn churn_guard() {
    run_and_check(&Churn {
        services: 200,
        rate: 50,
        seconds: 20,
        ports: Some((40000, 40199)),
        mode: ProxyMode::Iptables,
    });
}

fn run_and_check(churn: &Churn) {
    let lab = lab(Topology::FlannelVxlan);
    let own = lab.0.services().len();
    lab.0
        .install_services_at_scale(churn.mode, churn.services.saturating_sub(own))
        .expect("install services");
    if let Some((low, high)) = churn.ports {
        let web = lab.0.pod("web-0");
        xtask::lab::sysctl(
            &web.netns,
            "net.ipv4.ip_local_port_range",
            &format!("{low} {high}"),
        )
        .expect("narrow web-0's ports");
    }
    // Warm the neighbour and route caches.
    let db = lab.0.service("db");
    assert!(lab.0.tcp_request("web-0", db.cluster_ip, 80).is_ok());

    let dir = scratch_dir("churn");
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("churn.json");
    let started = Instant::now();
    let mut tracing = start_trace(&lab.0, &json);
    let pid = tracing.child.id() as i32;
    let client = connections(&lab.0, churn);
    let (peak_kib, cpu) = (peak_rss_kib(pid), datapath::cpu_seconds(pid));
    // SAFETY: a child we own.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let status = tracing.child.wait().expect("podtrace exits");
    let elapsed = started.elapsed().as_secs_f64();
    let stderr: Vec<String> = tracing.stderr_lines.try_iter().collect();
    assert!(
        status.success(),
        "podtrace: {status}\n{}",
        stderr.join("\n")
    );

    let told = read_stories(&json, &client.failed_ports);
    let kept = keep_evidence(&dir, &told);
    println!(
        "churn: {} Services ({:?} kube-proxy), {} new connections/s for {} s (achieved {:.0}/s) web-0 → svc/db, traced on both nodes",
        churn.services, churn.mode, churn.rate, churn.seconds, client.achieved_rate
    );
    println!(
        "  connections: {} answered, {} failed; stories: {} {:?}",
        client.ok,
        client.failed_ports.len(),
        told.stories,
        told.by_outcome
    );
    println!(
        "  podtrace: peak RSS {peak_kib} KiB, CPU {cpu:.1} s over {elapsed:.0} s ({:.0}% of one core); summary {}",
        cpu / elapsed * 100.0,
        told.summary
    );
    println!(
        "  the JSON: {} (not delivered: {})",
        json.display(),
        kept.display()
    );
    if std::env::var_os("PODTRACE_CHURN_KEEP").is_none() {
        let _ = std::fs::remove_file(&json);
    }
    for story in told.not_delivered.iter().take(5) {
        println!("  not delivered: {story}");
    }
    assert!(client.ok > 0, "no connection succeeded");
    let distinct_ports = told.client_ports.len() as u64;
    println!(
        "  web-0's ports: {distinct_ports} distinct for {} connections",
        client.ok + client.failed_ports.len() as u64
    );
    assert!(
        told.not_delivered.is_empty(),
        "{} stories of successful connections were not delivered (first above; all in {})",
        told.not_delivered.len(),
        kept.display()
    );
}

/// `podtrace default/web-0 svc/db` on both nodes, JSON to `out`.
/// `PODTRACE_CHURN_BINARY=<podtrace>` runs another build the same way,
/// for a before/after.
fn start_trace(lab: &Lab, out: &Path) -> xtask::podtrace_run::Started {
    let binary = std::env::var("PODTRACE_CHURN_BINARY").unwrap_or_else(|_| PODTRACE.into());
    let mut command = Command::new(binary);
    command
        .args(["default/web-0", "svc/db", "-o", "json", "--services-file"])
        .arg(lab.services_file())
        .args(lab_args(lab, &[1, 2]))
        .stdout(std::fs::File::create(out).expect("the JSON file"));
    xtask::podtrace_run::start(command, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e:#}"))
}

/// New connections from web-0 to db's ClusterIP, `rate` a second for
/// `seconds`, each with a port the kernel picks: connect, send, read the
/// answer and the server's close, close.
fn connections(lab: &Lab, churn: &Churn) -> Client {
    const CLIENT: &str = r#"
import socket, sys, time
ip, port, rate, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
ok, failed = 0, []
start = time.monotonic()
total = rate * seconds
for k in range(total):
    wait = start + k / rate - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((ip, port))
        s.sendall(b"hello\n")
        if s.recv(64):
            ok += 1
        else:
            failed.append(s.getsockname()[1])
        # Until the server's close: it closes first and keeps TIME_WAIT,
        # so the port is free again at once on this side.
        while s.recv(64):
            pass
    except OSError:
        try:
            failed.append(s.getsockname()[1])
        except OSError:
            failed.append(0)
    s.close()
print(ok, total / (time.monotonic() - start))
print(" ".join(map(str, failed)))
"#;
    let db = lab.service("db");
    let out = xtask::lab::in_netns(&lab.pod("web-0").netns, "python3")
        .args(["-c", CLIENT, &db.cluster_ip.to_string()])
        .args([
            db.ports[0].port.to_string(),
            churn.rate.to_string(),
            churn.seconds.to_string(),
        ])
        .stderr(Stdio::inherit())
        .output()
        .expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let mut head = lines.next().unwrap_or_default().split_whitespace();
    Client {
        ok: head.next().and_then(|n| n.parse().ok()).unwrap_or(0),
        achieved_rate: head.next().and_then(|n| n.parse().ok()).unwrap_or(0.0),
        failed_ports: lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect(),
    }
}

/// VmHWM of `pid`, in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The stories in `json`, counted by outcome; those of connections that
/// succeeded (web-0's port not among `failed_ports`) and were not
/// delivered, kept whole.
fn read_stories(json: &Path, failed_ports: &[u16]) -> Told {
    let file = std::fs::File::open(json).expect("the JSON file");
    let mut told = Told::default();
    for line in BufReader::new(file).lines() {
        let line = line.expect("a line");
        let value: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        match value["type"].as_str() {
            Some("story") => {}
            Some("summary") => {
                told.summary = value;
                continue;
            }
            _ => continue,
        }
        told.stories += 1;
        if value["transport"]["flags"] == 2 {
            told.client_ports
                .extend(value["transport"]["sport"].as_u64());
        }
        let outcome = value["verdict"]["outcome"]
            .as_str()
            .unwrap_or("?")
            .to_string();
        *told.by_outcome.entry(outcome.clone()).or_default() += 1;
        if outcome != "delivered" && !of_a_failed_connection(&value, failed_ports) {
            told.not_delivered.push(value);
        }
    }
    told
}

/// Whether the story's web-0 side port is one of a failed connection.
fn of_a_failed_connection(story: &Value, failed_ports: &[u16]) -> bool {
    let t = &story["transport"];
    [&t["sport"], &t["dport"]]
        .iter()
        .filter_map(|p| p.as_u64())
        .any(|p| failed_ports.contains(&(p as u16)))
}

/// Writes the stories not delivered and the summary beside the JSON.
fn keep_evidence(dir: &Path, told: &Told) -> PathBuf {
    let path = dir.join("churn-not-delivered.json");
    let mut file = std::fs::File::create(&path).expect("the evidence file");
    for story in told.not_delivered.iter().chain([&told.summary]) {
        writeln!(file, "{story}").expect("write");
    }
    path
}
