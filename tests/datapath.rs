//! What `cargo xtask bench` measures on the real datapath besides ping:
//! TCP throughput with iperf3 between lab pods, the kernel's own run-time
//! statistics of podtrace's programs (bpf_stats), and a process's CPU time,
//! so that every bench case is measured (and its rounds summed up) the
//! same way.

use std::{
    collections::BTreeMap,
    net::IpAddr,
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
pub fn iperf_to(
    lab: &Lab,
    from: &str,
    to: &str,
    address: impl Into<IpAddr>,
    seconds: u32,
) -> (f64, u64) {
    let address: IpAddr = address.into();
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

    /// Stats on or off while the guard lives (off: BPF_PROG_TEST_RUN
    /// times a program without the two clock reads per run).
    pub fn set(&self, on: bool) {
        sysctl_write("kernel.bpf_stats_enabled", if on { "1" } else { "0" });
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
    let progs = programs();
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
    held_ids(pid, "prog")
}

/// Ids of the eBPF programs or maps (`kind`: `prog`, `map`) process `pid`
/// holds an fd of, from the fds' fdinfo (`prog_id:`, `map_id:`).
fn held_ids(pid: i32, kind: &str) -> std::collections::BTreeSet<u64> {
    let line = format!("{kind}_id:");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .into_iter()
        .flatten();
    fds.flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix(line.as_str()))
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

/// The `p` quantile (0 to 1) of some measurements: the one at rank
/// ⌊(n − 1)·p⌋ in ascending order, not interpolated; 0 of none.
pub fn percentile(values: impl IntoIterator<Item = f64>, p: f64) -> f64 {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p) as usize)
        .copied()
        .unwrap_or(0.0)
}

/// The median as `percentile` takes it: the middle of an odd count, the
/// lower middle of an even one.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    percentile(values, 0.5)
}

/// An empty tc program (it returns TC_ACT_UNSPEC at once) on both hooks of
/// every interface of some lab nodes, attached with clsact while it lives:
/// what bpf_stats charges any program per run (its two clock reads), so
/// that podtrace's ns/run can be read against it, measured in the same
/// run on the same packets.
pub struct Floor {
    /// (netns, interface) with the clsact qdisc this added.
    hooked: Vec<(String, String)>,
    pub ids: std::collections::BTreeSet<u64>,
}

/// The empty program, in BPF assembly for llvm-mc (no C compiler needed).
const FLOOR_ASM: &str = "\t.section classifier,\"ax\",@progbits
\t.globl bench_floor
\t.type bench_floor,@function
bench_floor:
\tr0 = -1
\texit
\t.size bench_floor, .-bench_floor
\t.section license,\"aw\",@progbits
\t.asciz \"GPL\"
";

impl Floor {
    pub fn attach(lab: &Lab, nodes: &[u8]) -> Self {
        let dir = std::env::temp_dir().join(format!("podtrace-floor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("floor dir");
        let (asm, object) = (dir.join("floor.s"), dir.join("floor.o"));
        std::fs::write(&asm, FLOOR_ASM).expect("floor.s");
        let built = Command::new("llvm-mc-22")
            .args(["-triple", "bpfel", "-filetype=obj", "-o"])
            .args([&object, &asm])
            .status();
        assert!(
            built.is_ok_and(|s| s.success()),
            "llvm-mc-22 (cargo xtask setup installs LLVM 22)"
        );
        let mut floor = Floor {
            hooked: Vec::new(),
            ids: Default::default(),
        };
        for &node in nodes {
            let netns = lab.node_netns(node);
            for iface in interfaces(&netns) {
                floor.hook(&netns, &iface, &object);
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        floor
    }

    fn hook(&mut self, netns: &str, iface: &str, object: &std::path::Path) {
        let tc = |args: &[&str]| in_netns(netns, "tc").args(args).output().ok();
        if !tc(&["qdisc", "add", "dev", iface, "clsact"]).is_some_and(|o| o.status.success()) {
            return;
        }
        self.hooked.push((netns.to_string(), iface.to_string()));
        let object = object.to_string_lossy();
        for hook in ["ingress", "egress"] {
            tc(&[
                "filter",
                "add",
                "dev",
                iface,
                hook,
                "bpf",
                "da",
                "obj",
                &object,
                "sec",
                "classifier",
            ]);
            let shown = tc(&["filter", "show", "dev", iface, hook]).map(|o| o.stdout);
            let text = String::from_utf8_lossy(&shown.unwrap_or_default()).to_string();
            self.ids.extend(
                text.split_whitespace()
                    .skip_while(|w| *w != "id")
                    .nth(1)
                    .and_then(|id| id.parse::<u64>().ok()),
            );
        }
    }

    /// (runs, ns) of every floor program together.
    pub fn stats(&self) -> (u64, u64) {
        programs()
            .iter()
            .filter(|p| p["id"].as_u64().is_some_and(|id| self.ids.contains(&id)))
            .fold((0, 0), |(runs, ns), p| {
                (
                    runs + p["run_cnt"].as_u64().unwrap_or(0),
                    ns + p["run_time_ns"].as_u64().unwrap_or(0),
                )
            })
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        for (netns, iface) in &self.hooked {
            let _ = in_netns(netns, "tc")
                .args(["qdisc", "del", "dev", iface, "clsact"])
                .status();
        }
    }
}

/// Every interface of a namespace but lo.
fn interfaces(netns: &str) -> Vec<String> {
    let out = in_netns(netns, "ip").args(["-o", "link", "show"]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).to_string());
    text.unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .filter(|name| name != "lo")
        .collect()
}

/// `bpftool prog show`, every program.
fn programs() -> Vec<Value> {
    bpftool(&["prog", "show"])
}

/// `bpftool ARGS -j`, parsed (an empty list when it says nothing).
fn bpftool(args: &[&str]) -> Vec<Value> {
    let out = Command::new("bpftool")
        .args(args)
        .arg("-j")
        .output()
        .expect("bpftool");
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// Average ns per run of program `id` on `packet`, run `repeat` times by
/// the kernel (BPF_PROG_TEST_RUN): no traffic and, with bpf_stats off, no
/// clock read per run, so the program's own cost.
pub fn test_run(id: u64, packet: &[u8], repeat: u32) -> Option<f64> {
    let file = std::env::temp_dir().join(format!("podtrace-testrun-{}", std::process::id()));
    std::fs::write(&file, packet).ok()?;
    let out = Command::new("bpftool")
        .args(["prog", "run", "id", &id.to_string(), "data_in"])
        .arg(&file)
        .args(["repeat", &repeat.to_string()])
        .output()
        .ok()?;
    let _ = std::fs::remove_file(&file);
    let text = String::from_utf8_lossy(&out.stdout);
    let average = text.split("duration (average): ").nth(1)?;
    average.trim().trim_end_matches("ns").parse().ok()
}

/// Ids of the programs named `name` that process `pid` holds.
pub fn program_ids(pid: i32, name: &str) -> Vec<u64> {
    held_named(pid, "prog", name)
}

/// Ids of the maps named `name` that process `pid` holds (a map shared
/// by several nodes' instances once).
pub fn map_ids(pid: i32, name: &str) -> Vec<u64> {
    held_named(pid, "map", name)
}

/// Ids of the programs or maps (`kind`) named `name` that `pid` holds.
fn held_named(pid: i32, kind: &str, name: &str) -> Vec<u64> {
    let ids = held_ids(pid, kind);
    bpftool(&[kind, "show"])
        .iter()
        .filter(|p| p["name"] == name)
        .filter_map(|p| p["id"].as_u64())
        .filter(|id| ids.contains(id))
        .collect()
}

/// The values of map `id` now, as bytes (`bpftool map dump`).
pub fn map_values(id: u64) -> Vec<Vec<u8>> {
    let byte = |b: &Value| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok();
    bpftool(&["map", "dump", "id", &id.to_string()])
        .iter()
        .filter_map(|entry| entry["value"].as_array()?.iter().map(byte).collect())
        .collect()
}

/// A full-size TCP segment (1400 B of payload) from pod `from` to port
/// `port` of pod `to`, as the sending pod's veth carries it.
pub fn tcp_frame(lab: &Lab, from: &str, to: &str, port: u16) -> Vec<u8> {
    let (src, dst) = (lab.pod(from).ip.octets(), lab.pod(to).ip.octets());
    let mut out = Vec::new();
    etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4(src, dst, 64)
        .tcp(40_000, port, 1, 64_000)
        .write(&mut out, &[0; 1400])
        .expect("a frame");
    out
}

/// A full-size IPv6 TCP segment between two addresses no lab pod holds.
pub fn tcp6_frame() -> Vec<u8> {
    let (src, dst) = (
        [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        [0xfd; 16],
    );
    let mut out = Vec::new();
    etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv6(src, dst, 64)
        .tcp(40_000, 5201, 1, 64_000)
        .write(&mut out, &[0; 1400])
        .expect("a frame");
    out
}

/// `inner` as flannel sends it from node 1 to node 2 (VXLAN, VNI 1).
pub fn vxlan_frame(inner: Vec<u8>) -> Vec<u8> {
    let mut vxlan = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    vxlan.extend(inner);
    let mut out = Vec::new();
    etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4(Lab::node_ip(1).octets(), Lab::node_ip(2).octets(), 64)
        .udp(50_000, 8472)
        .write(&mut out, &vxlan)
        .expect("a frame");
    out
}

/// Bytes of program `id`'s JIT-compiled code (what runs per packet).
pub fn jited_bytes(id: u64) -> u64 {
    let out = Command::new("bpftool")
        .args(["prog", "show", "id", &id.to_string(), "-j"])
        .output()
        .expect("bpftool");
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    shown["bytes_jited"].as_u64().unwrap_or(0)
}

/// Which way a bench figure improves.
#[derive(Clone, Copy)]
pub enum Better {
    Lower,
    Higher,
}

/// Hands a figure to `cargo xtask bench`, which compares it with the
/// baseline committed in the repository: one JSON line appended to the
/// file `PODTRACE_BENCH_FIGURES` names (nothing when run otherwise).
pub fn figure(name: &str, value: f64, unit: &str, better: Better) {
    let Some(path) = std::env::var_os("PODTRACE_BENCH_FIGURES") else {
        return;
    };
    let better = match better {
        Better::Lower => "lower",
        Better::Higher => "higher",
    };
    let line = serde_json::json!({"name": name, "value": value, "unit": unit, "better": better});
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("bench figures file");
    use std::io::Write;
    writeln!(file, "{line}").expect("bench figures file");
}
