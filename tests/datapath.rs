//! What `cargo xtask bench` measures on the real datapath besides ping:
//! TCP throughput with iperf3 between lab pods, the kernel's own run-time
//! statistics of podtrace's programs (bpf_stats), and a process's CPU time,
//! so that every bench case is measured the same way.

use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use xtask::lab::{in_netns, Lab};

/// TCP port of the bench's iperf3 servers (the lab's `default/iperf`
/// Service targets it too).
const IPERF_PORT: u16 = xtask::lab::kube_proxy::IPERF_PORT;

/// An iperf3 TCP run of `seconds` from pod `from` to pod `to`: bits/s
/// received, and retransmits.
pub fn iperf(lab: &Lab, from: &str, to: &str, seconds: u32) -> (f64, u64) {
    iperf_to(lab, from, to, lab.pod(to).ip, seconds)
}

/// The same, the client connecting to `address` (a ClusterIP whose
/// Service sends it to pod `to`).
pub fn iperf_to(lab: &Lab, from: &str, to: &str, address: Ipv4Addr, seconds: u32) -> (f64, u64) {
    let (client, server) = (lab.pod(from), lab.pod(to));
    let mut listening = in_netns(&server.netns, "iperf3")
        .args(["-s", "-1", "-p", &IPERF_PORT.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 server");
    std::thread::sleep(Duration::from_millis(300));
    let out = in_netns(&client.netns, "iperf3")
        .args(["-J", "-c", &address.to_string(), "-p"])
        .arg(IPERF_PORT.to_string())
        .args(["-t", &seconds.to_string()])
        // A path that drops the SYN fails the run (0 bits/s) instead of
        // hanging the bench through TCP's retries.
        .args(["--connect-timeout", "3000"])
        .output()
        .expect("iperf3 client");
    stop(&mut listening);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let sum = &report["end"]["sum_received"];
    let retransmits = report["end"]["sum_sent"]["retransmits"].as_u64();
    (
        sum["bits_per_second"].as_f64().unwrap_or(0.0),
        retransmits.unwrap_or(0),
    )
}

fn stop(child: &mut Child) {
    if child.try_wait().ok().flatten().is_none() {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// `kernel.bpf_stats_enabled` on while it lives, restored on drop.
pub struct BpfStats {
    before: String,
}

impl BpfStats {
    pub fn enable() -> Self {
        let before = sysctl_read("kernel.bpf_stats_enabled");
        sysctl_write("kernel.bpf_stats_enabled", "1");
        Self { before }
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        sysctl_write("kernel.bpf_stats_enabled", &self.before);
    }
}

fn sysctl_read(key: &str) -> String {
    let out = Command::new("sysctl").args(["-n", key]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|_| "0".into())
}

fn sysctl_write(key: &str, value: &str) {
    let _ = Command::new("sysctl")
        .arg("-q")
        .arg(format!("{key}={value}"))
        .status();
}

/// Per program name: (runs, ns) summed over the programs process `pid`
/// holds (every node's instance), found through its fds' fdinfo.
pub fn prog_stats(pid: i32) -> BTreeMap<String, (u64, u64)> {
    let ids = prog_ids(pid);
    let out = Command::new("bpftool")
        .args(["prog", "show", "-j"])
        .output()
        .expect("bpftool");
    let progs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let mut stats: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for prog in &progs {
        let ours = prog["id"].as_u64().is_some_and(|id| ids.contains(&id));
        let name = prog["name"].as_str().unwrap_or_default();
        if !ours || !name.starts_with("podtrace") {
            continue;
        }
        let entry = stats.entry(name.to_string()).or_default();
        entry.0 += prog["run_cnt"].as_u64().unwrap_or(0);
        entry.1 += prog["run_time_ns"].as_u64().unwrap_or(0);
    }
    stats
}

/// Ids of the eBPF programs process `pid` holds an fd of.
fn prog_ids(pid: i32) -> std::collections::BTreeSet<u64> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .into_iter()
        .flatten();
    fds.flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|id| id.trim().parse().ok())
        })
        .collect()
}

/// `name N ns/run (R runs)`, one per program that ran.
pub fn format_stats(stats: &BTreeMap<String, (u64, u64)>) -> String {
    stats
        .iter()
        .filter(|(_, (runs, _))| *runs > 0)
        .map(|(name, (runs, ns))| {
            format!(
                "{name} {:.0} ns/run ({runs} runs)",
                *ns as f64 / *runs as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// User + system CPU seconds of process `pid` so far.
pub fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which may hold spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after ')'.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz
}
