//! Shared by the kernel integration tests: preconditions, a running
//! podtrace, traffic from inside pod namespaces, and attachment checks.

use std::{
    io::Read,
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        mpsc,
    },
    time::Duration,
};

use aya::programs::{SchedClassifier, TcAttachType};
use podtrace::node::netns;
use serde_json::Value;
use xtask::{
    lab::{Lab, LabGuard, Topology},
    podtrace_run,
};

pub const PODTRACE: &str = env!("CARGO_BIN_EXE_podtrace");

/// Kernel tests never pass silently: without root or BTF they fail and say why.
pub fn require_kernel() {
    // SAFETY: no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "kernel integration tests need root: run `cargo xtask test` as root"
    );
    assert!(
        std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        "kernel integration tests need BTF (/sys/kernel/btf/vmlinux is missing)"
    );
}

/// This test process's scratch directory for `kind` of test. A process of
/// an earlier run with the same PID may have left one: it is removed
/// before this process makes its own (a symlink there would exist).
pub fn scratch_dir(kind: &str) -> std::path::PathBuf {
    static FRESH: std::sync::Once = std::sync::Once::new();
    let dir = std::env::temp_dir().join(format!("podtrace-{kind}-tests-{}", std::process::id()));
    FRESH.call_once(|| {
        let _ = std::fs::remove_dir_all(&dir);
    });
    dir
}

/// A lab under a name prefix no other test uses.
///
/// Each lab also gets its own pod CIDR (10.1xx.0.0/16): the drop
/// tracepoint sees every namespace, so concurrent labs must not share pod
/// addresses (a lab of another test process with the same addresses shows
/// up as drops in "an unknown namespace"). It also keeps the CIDR a real
/// parameter.
pub fn lab(topology: Topology) -> LabGuard {
    require_kernel();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let prefix = format!("pt{}x{n}", std::process::id() % 100_000);
    // The process id spreads concurrent test processes (other checkouts
    // on the same machine) over the range too.
    let pod_cidr = format!("10.{}.0.0/16", 100 + (std::process::id() + n) % 100)
        .parse()
        .expect("a CIDR");
    LabGuard::up(&prefix, topology, Some(pod_cidr)).expect("lab up")
}

/// The flannel VXLAN lab with its Services, kube-proxy in iptables mode.
pub fn services_lab() -> LabGuard {
    let lab = lab(Topology::FlannelVxlan);
    lab.0
        .install_services(xtask::lab::kube_proxy::ProxyMode::Iptables)
        .expect("install services");
    lab
}

pub struct Trace {
    child: Child,
    stderr_lines: mpsc::Receiver<String>,
    pub banner: String,
}

pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Parsed JSON lines of `--output json`.
    pub fn json(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect()
    }

    /// Stories of pings in the order the packets were sent: by sequence,
    /// each request before its reply. (podtrace tells a story when its
    /// journey is over, so a delivered reply can come before a request
    /// still awaited elsewhere.)
    pub fn ping_stories(&self) -> Vec<Value> {
        let mut stories = self.stories();
        stories.sort_by_key(|s| {
            let t = &s["transport"];
            (t["seq"].as_u64(), t["icmp_type"].as_u64() == Some(0))
        });
        stories
    }

    /// The summary record of `--output json`.
    pub fn summary(&self) -> Value {
        self.json()
            .into_iter()
            .find(|v| v["type"] == "summary")
            .unwrap_or_else(|| panic!("no summary: {}", self.stdout))
    }

    /// The records of `--probe`'s results.
    pub fn probes(&self) -> Vec<Value> {
        self.json()
            .into_iter()
            .filter(|v| v["type"] == "probe")
            .collect()
    }

    /// The first story of a run that must have succeeded.
    pub fn first_story(&self) -> Value {
        assert!(self.status.success(), "{}", self.stderr);
        self.stories().into_iter().next().expect("a story")
    }

    pub fn stories(&self) -> Vec<Value> {
        self.json()
            .into_iter()
            .filter(|v| v["type"] == "story")
            .collect()
    }

    /// The line that says what is traced (`podtrace: tracing … on …`).
    pub fn start_line(&self) -> &str {
        (self.stderr.lines())
            .find(|l| l.starts_with("podtrace: tracing "))
            .unwrap_or_else(|| panic!("no start line: {}", self.stderr))
    }

    /// The stories of a run that traced web-0 ⇄ db-0's IPv6 pair `web` ⇄
    /// `db` alone while both families pinged once: its start line names
    /// that pair and no other, and its stories are the IPv6 echo and its
    /// reply.
    pub fn ipv6_echo_alone(&self, web: std::net::Ipv6Addr, db: std::net::Ipv6Addr) -> Vec<Value> {
        let alone = format!("tracing {web} (default/web-0) ⇄ {db} (default/db-0) on");
        assert!(
            self.start_line().contains(&alone),
            "the IPv6 pair alone named: {}",
            self.stderr
        );
        let stories = self.stories();
        assert_eq!(stories.len(), 2, "the echo and its reply: {}", self.stdout);
        assert!(
            stories.iter().all(|s| s["transport"]["proto"] == "icmpv6"),
            "{}",
            self.stdout
        );
        stories
    }
}

/// Arguments: `first`, then `rest`.
pub fn argv(first: &[&str], rest: Vec<String>) -> Vec<String> {
    first.iter().map(|s| s.to_string()).chain(rest).collect()
}

/// podtrace's arguments for one packet `src` → `dst` traced on both nodes
/// of `lab` for at most 20 s, told as `output` (json, human).
pub fn one_packet(lab: &Lab, src: &str, dst: &str, output: &str) -> Vec<String> {
    let first = [src, dst, "--count", "1", "--duration", "20s", "-o", output];
    argv(&first, lab_args(lab, &[1, 2]))
}

/// The story of one ping web-0 → db-0 traced on both nodes of `lab`, as
/// JSON and as text (a broken path makes the ping fail; the story is
/// what matters).
pub fn one_ping_told(lab: &LabGuard) -> (Value, String) {
    let (done, human) = told_as_json_and_text(&one_packet(&lab.0, "web-0", "db-0", "json"), || {
        let _answered = ping(&lab.0, "web-0", "db-0");
    });
    let story = done.ping_stories().into_iter().next().expect("a story");
    (story, human)
}

/// A trace (`json_argv`, with `-o json`) while `act` runs: its JSON, and
/// its stories as a person reads them, told again by `podtrace read` from
/// the pcapng it wrote. One trace, not one per output: each start loads
/// every program, most of such a test's time under TCG.
pub fn told_as_json_and_text(json_argv: &[String], act: impl FnOnce()) -> (Finished, String) {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = scratch_dir("told");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let pcapng = dir.join(format!("{}.pcapng", NEXT.fetch_add(1, Ordering::Relaxed)));
    let pcapng = pcapng.display().to_string();
    let mut argv = json_argv.to_vec();
    argv.extend(["-w".to_string(), pcapng.clone()]);
    let trace = Trace::start(&argv);
    act();
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let read = run_podtrace(&["read", &pcapng]);
    assert!(read.status.success(), "podtrace read: {}", read.stderr);
    let _ = std::fs::remove_file(&pcapng);
    (done, read.stdout)
}

/// `podtrace doctor` on both lab nodes (files as the inventory): the JSON
/// report, and the exit code.
pub fn doctor_report(lab: &LabGuard, extra: &[&str]) -> (Value, i32) {
    let mut argv: Vec<String> = vec!["doctor".into(), "-o".into(), "json".into()];
    argv.extend([
        "--pods-file".into(),
        lab.0.pods_file().display().to_string(),
    ]);
    argv.extend([
        "--nodes-file".into(),
        lab.0.nodes_file().display().to_string(),
    ]);
    argv.extend(doctor_node_args(lab));
    argv.extend(extra.iter().map(|s| s.to_string()));
    run_doctor(&argv)
}

pub fn doctor_node_args(lab: &LabGuard) -> Vec<String> {
    (1..=2)
        .flat_map(|n| {
            [
                "--netns".to_string(),
                lab.0.node_netns(n),
                "--host-root".to_string(),
                lab.0.host_root(n).display().to_string(),
            ]
        })
        .collect()
}

pub fn run_doctor(argv: &[String]) -> (Value, i32) {
    let out = Command::new(PODTRACE)
        .args(argv)
        .output()
        .expect("podtrace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (report, out.status.code().unwrap_or(-1))
}

/// The check named `name` on `node`.
pub fn check_on(report: &Value, node: &str, name: &str) -> Value {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["node"] == node && c["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no check {name:?} on {node}: {report:#}"))
}

/// The hop of `story` on `node`'s `iface` in `direction`, if any.
pub fn hop_on<'a>(story: &'a Value, node: &str, iface: &str, direction: &str) -> Option<&'a Value> {
    story["hops"]
        .as_array()
        .expect("hops")
        .iter()
        .find(|h| h["node"] == node && h["iface"] == iface && h["direction"] == direction)
}

/// tc ingress on an IPIP device sees the decapsulated packet from Linux
/// 5.14; before, it saw the outer headers, so the hop is asked of newer
/// kernels only.
pub fn sees_tunl0_ingress() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut numbers = release
        .split(['.', '-'])
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (major, minor) >= (5, 14)
}

/// A story's encrypted WireGuard leg (the UDP packet WireGuard sent with
/// the story's packet inside), and where it is among the story's hops.
pub fn encrypted_leg(story: &Value) -> Option<(usize, &Value)> {
    story["hops"]
        .as_array()
        .expect("hops")
        .iter()
        .enumerate()
        .find(|(_, h)| h["tunnel"]["kind"] == "wireguard")
}

/// Where a hop is among its story's hops.
pub fn hop_index(story: &Value, hop: &Value) -> usize {
    let hops = story["hops"].as_array().expect("hops");
    hops.iter()
        .position(|h| h == hop)
        .expect("a hop of the story")
}

/// Asserts that a delivered WireGuard story shows its encrypted leg:
/// leaving node-1 by the underlay as UDP to node-2's WireGuard port,
/// with WireGuard's counter, between the plaintext legs `into` and
/// `out_of`, and the path says it was encrypted and decrypted.
pub fn assert_encrypted_leg_between(story: &Value, human: &str, into: &Value, out_of: &Value) {
    let (at, leg) = encrypted_leg(story).unwrap_or_else(|| panic!("no encrypted leg: {human}"));
    assert_eq!(leg["node"], "node-1", "{leg}");
    assert_eq!(leg["direction"], "egress", "{leg}");
    assert!(leg["tunnel"]["wireguard"]["counter"].is_u64(), "{leg}");
    let note = leg["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("encrypted WireGuard ")
            && note.contains(":51820 (receiver ")
            && note.contains("known by the tag in its flow hash"),
        "{note}\n{human}"
    );
    assert!(
        hop_index(story, into) < at && at < hop_index(story, out_of),
        "the leg is not between the plaintext legs:\n{human}"
    );
    assert!(
        human.contains("encrypted (WireGuard ") && human.contains("decrypted"),
        "{human}"
    );
}

/// `--netns` and `--pods-file` arguments for the given nodes of `lab`.
pub fn lab_args(lab: &Lab, nodes: &[u8]) -> Vec<String> {
    let mut args = vec![
        "--pods-file".to_string(),
        lab.pods_file().display().to_string(),
    ];
    for node in nodes {
        args.push("--netns".into());
        args.push(lab.node_netns(*node));
    }
    args
}

impl Trace {
    /// Starts podtrace and waits until it says it is tracing.
    pub fn start(args: &[String]) -> Self {
        let mut command = Command::new(PODTRACE);
        command.args(args);
        Self::start_command(command)
    }

    /// Starts `command` (podtrace, or kubectl running it as a plugin) and
    /// waits until it says it is tracing.
    pub fn start_command(mut command: Command) -> Self {
        command.stdout(Stdio::piped());
        // Generous: a start is BTF parsed and every hook attached, which
        // under TCG on a busy 2-core host took past 20 s (5.10's suite).
        let started = podtrace_run::start(command, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e:#}"));
        Self {
            child: started.child,
            stderr_lines: started.stderr_lines,
            banner: started.banner,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: a child we own.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// Waits (at most 60 s) for podtrace to exit: a run's end is its
    /// `--duration` or `--count`, then detaching; under TCG on a busy
    /// host one took past 30 s (cause not yet seen: the panic now quotes
    /// what podtrace printed).
    pub fn finish(mut self) -> Finished {
        let mut stdout = String::new();
        let mut out = self.child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let _ = out.read_to_string(&mut stdout);
            stdout
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = self.child.kill();
                let said: Vec<String> = self.stderr_lines.try_iter().collect();
                panic!(
                    "podtrace did not exit within 60 s; it said:\n{}\n{}",
                    self.banner,
                    said.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let stdout = reader.join().expect("stdout reader");
        let mut stderr = self.banner.clone();
        while let Ok(line) = self.stderr_lines.recv_timeout(Duration::from_millis(200)) {
            stderr.push('\n');
            stderr.push_str(&line);
        }
        Finished {
            status,
            stdout,
            stderr,
        }
    }
}

/// Runs podtrace to completion (bad-input cases).
pub fn run_podtrace(args: &[&str]) -> Finished {
    let out = Command::new(PODTRACE)
        .args(args)
        .output()
        .expect("run podtrace");
    Finished {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Bad input said as podtrace says it: its own errors in one line;
/// clap's usage errors whole (what is wrong on the first line, then the
/// values a flag takes or the missing argument, the usage and the tip),
/// exit 2. Either way `expected` is said, and the exit is not 0.
pub fn said_bad_input(status: std::process::ExitStatus, stderr: &str, expected: &str) {
    assert!(!status.success(), "succeeded: {stderr}");
    assert!(stderr.starts_with("podtrace: "), "{stderr}");
    if stderr.trim_end().ends_with("try '--help'.") {
        assert_eq!(status.code(), Some(2), "{stderr}");
    } else {
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    }
    assert!(stderr.contains(expected), "{expected:?} not said: {stderr}");
}

/// Runs podtrace with `argv` and checks the failure: said as bad input
/// (`said_bad_input`), no panic, and nothing attached on `node_netns`.
pub fn assert_refused(argv: &[&str], expected: &str, node_netns: &str) {
    let done = run_podtrace(argv);
    assert!(!done.status.success(), "{argv:?} succeeded");
    assert_ne!(
        done.status.code(),
        Some(101),
        "{argv:?} panicked: {}",
        done.stderr
    );
    said_bad_input(done.status, &done.stderr, expected);
    assert!(
        tcx_programs(node_netns).is_empty(),
        "{argv:?} left programs attached"
    );
}

/// Rewrites a pod list as an IPv6-primary dual-stack cluster's API serves
/// it: each pod's podIP an IPv6 address (fd00:10:244::2, ::3, …), and
/// podIPs that address first and the pod's IPv4 one second.
pub fn ipv6_first(pods: &mut Value) {
    let items = pods["items"].as_array_mut().expect("a pod list");
    for (i, pod) in items.iter_mut().enumerate() {
        let status = &mut pod["status"];
        let v6 = format!("fd00:10:244::{:x}", i + 2);
        status["podIPs"] = serde_json::json!([{ "ip": v6 }, { "ip": status["podIP"] }]);
        status["podIP"] = v6.into();
    }
}

/// One ping from inside a pod; returns whether it was answered.
pub fn ping(lab: &Lab, from_pod: &str, to_pod: &str) -> bool {
    lab.ping(from_pod, lab.pod(to_pod).ip, &[])
}

/// Names of the programs attached by TCX to any interface of a node.
pub fn tcx_programs(netns_name: &str) -> Vec<String> {
    let _inside = netns::enter(&netns::resolve(netns_name)).expect("enter netns");
    let mut names = Vec::new();
    for iface in interfaces() {
        for hook in [TcAttachType::Ingress, TcAttachType::Egress] {
            if let Ok((_, programs)) = SchedClassifier::query_tcx(&iface, hook) {
                names.extend(
                    programs
                        .iter()
                        .map(|p| format!("{iface}:{}", String::from_utf8_lossy(p.name()))),
                );
            }
        }
    }
    names
}

/// Interface names of the current thread's namespace.
fn interfaces() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .expect("ip link");
    // `ip` runs as a child of this thread, so it sees the entered namespace.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .collect()
}

/// The drop reason podtrace tells for a drop the kernel calls `reason`:
/// the name itself where kfree_skb passes reasons (5.17), else what it
/// says on older kernels. NETFILTER_DROP is known there too, by the drop's
/// location.
pub fn told_reason(reason: &str) -> String {
    let btf = podtrace::probe::btf::Btf::from_sys_fs().expect("the kernel's BTF");
    let features =
        podtrace::probe::features::Features::probe(&btf).expect("a kernel podtrace runs on");
    // Where the kernel names no reason, the two that only one function
    // frees packets for are read from the location.
    if features.drop_reasons || matches!(reason, "NETFILTER_DROP" | "NEIGH_FAILED") {
        reason.to_string()
    } else {
        podtrace::probe::drops::REASON_NOT_NAMED.to_string()
    }
}

/// Sends, from inside pod `from`, three UDP datagrams to `to`:8472 whose
/// payload is a VXLAN header (flannel's VNI 1) and the Ethernet frame the
/// Python lines `frame` build (into `frame`, with `socket` and `struct`
/// imported): a pod forging a tunnel packet of another pair.
pub fn send_vxlan_payload(lab: &Lab, from: &str, to: std::net::IpAddr, frame: &str) {
    let family = if to.is_ipv6() { "AF_INET6" } else { "AF_INET" };
    let script = format!(
        "import socket, struct\n{frame}\nvxlan = struct.pack('!II', 0x08000000, 1 << 8)\n\
         s = socket.socket(socket.{family}, socket.SOCK_DGRAM)\n\
         for _ in range(3):\n    s.sendto(vxlan + frame, ('{to}', 8472))\n"
    );
    let sent = xtask::lab::in_netns(&lab.pod(from).netns, "python3")
        .args(["-c", &script])
        .status()
        .expect("python3");
    assert!(sent.success(), "the forged datagrams were not sent");
}

/// A server in `pod` that answers a request only after `delay`: its
/// connection idles meanwhile.
pub fn slow_server(lab: &Lab, pod: &str, port: u16, delay: Duration) -> Child {
    const SERVER: &str = r#"
import socket, sys, time
t = socket.socket()
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind(("0.0.0.0", int(sys.argv[1])))
t.listen(4)
c, _ = t.accept()
c.recv(64)
time.sleep(float(sys.argv[2]))
c.sendall(b"late\n")
time.sleep(1)
"#;
    let child = xtask::lab::in_netns(&lab.pod(pod).netns, "python3")
        .args([
            "-c",
            SERVER,
            &port.to_string(),
            &delay.as_secs_f64().to_string(),
        ])
        .spawn()
        .expect("python3");
    std::thread::sleep(Duration::from_millis(500));
    child
}
