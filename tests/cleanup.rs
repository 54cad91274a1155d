//! Kernel integration tests of coexistence and cleanup: several podtraces
//! on one node, killed ones, signals during start, other PID namespaces.
//! Each podtrace must remove exactly what it attached, never a live one's.

#[allow(dead_code)]
mod support;

use std::{
    fs::{File, OpenOptions},
    io::Write,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    process::{Command, Stdio},
    sync::{RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::{Duration, Instant},
};

use support::*;
use xtask::lab::{in_netns, Lab, Topology};

/// Every podtrace sweeps what dead runs left, in every lab, before it
/// attaches. A test that looks at a killed run's leftovers before its own
/// sweep would see another test's podtrace remove them first (CI saw 0
/// filters "left by the kill"), so it runs alone: it takes this for
/// writing, every other test for reading.
static SWEEPERS: RwLock<()> = RwLock::new(());

fn among_sweepers() -> RwLockReadGuard<'static, ()> {
    SWEEPERS
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn no_other_sweeper() -> RwLockWriteGuard<'static, ()> {
    SWEEPERS
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn run_in(netns: &str, program: &str, args: &[&str]) -> String {
    let out = in_netns(netns, program)
        .args(args)
        .output()
        .expect("run in netns");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// podtrace's clsact filters on one hook of an interface.
fn our_filters(netns: &str, iface: &str, hook: &str) -> usize {
    run_in(netns, "tc", &["filter", "show", "dev", iface, hook])
        .lines()
        .filter(|l| l.contains("direct-action") && l.contains("podtrace_"))
        .count()
}

fn has_clsact(netns: &str, iface: &str) -> bool {
    run_in(netns, "tc", &["qdisc", "show", "dev", iface]).contains("clsact")
}

fn nft_tables(netns: &str) -> String {
    run_in(netns, "nft", &["list", "tables"])
}

fn clsact_args(lab: &Lab, extra: &[&str]) -> Vec<String> {
    let mut first = vec!["web-0", "db-0", "--attach", "clsact", "-o", "json"];
    first.extend(extra);
    argv(&first, lab_args(lab, &[1]))
}

#[test]
fn two_clsact_runs_leave_each_other_attached_whichever_exits_first() {
    let _sweepers = among_sweepers();
    let lab = lab(Topology::FlannelVxlan);
    let node1 = lab.0.node_netns(1);
    for first_to_exit in [0, 1] {
        let runs = [
            Trace::start(&clsact_args(&lab.0, &[])),
            Trace::start(&clsact_args(&lab.0, &[])),
        ];
        assert_eq!(our_filters(&node1, "cni0", "ingress"), 2, "one filter each");
        let [a, b] = runs;
        let (leaving, staying) = if first_to_exit == 0 { (a, b) } else { (b, a) };
        leaving.signal(libc::SIGINT);
        assert!(leaving.finish().status.success());
        assert_eq!(
            our_filters(&node1, "cni0", "ingress"),
            1,
            "the run still tracing keeps its filter (first to exit: {first_to_exit})"
        );
        assert_eq!(our_filters(&node1, "cni0", "egress"), 1);
        assert!(has_clsact(&node1, "cni0"), "the shared qdisc stays");
        assert!(ping(&lab.0, "web-0", "db-0"));
        std::thread::sleep(Duration::from_millis(800));
        staying.signal(libc::SIGINT);
        let done = staying.finish();
        assert!(done.status.success(), "{}", done.stderr);
        let stories = done.ping_stories();
        assert_eq!(stories.len(), 2, "{}", done.stdout);
        assert_eq!(stories[0]["verdict"]["outcome"], "left_node");
        let request_hops = stories[0]["hops"].as_array().unwrap().len();
        assert!(
            request_hops >= 4,
            "a full story, not one hop: {}",
            stories[0]
        );
        let summary = done
            .json()
            .into_iter()
            .find(|v| v["type"] == "summary")
            .expect("a summary");
        assert_eq!(
            summary["hooks_attached"], 8,
            "eth0, cni0, flannel.1 and web-0's veth, two hooks each"
        );
        assert_eq!(our_filters(&node1, "cni0", "ingress"), 0);
        assert!(
            !has_clsact(&node1, "cni0"),
            "the qdisc podtrace added goes with the last podtrace filter"
        );
    }
}

#[test]
fn a_default_run_removes_what_a_killed_clsact_run_left() {
    let _sweepers = no_other_sweeper();
    let lab = lab(Topology::FlannelVxlan);
    let node1 = lab.0.node_netns(1);
    let killed = Trace::start(&clsact_args(&lab.0, &[]));
    killed.signal(libc::SIGKILL);
    killed.finish();
    assert_eq!(
        our_filters(&node1, "cni0", "ingress"),
        1,
        "left by the kill"
    );
    assert!(has_clsact(&node1, "cni0"));
    let tcx = Trace::start(&argv(&["web-0", "db-0"], lab_args(&lab.0, &[1])));
    assert_eq!(our_filters(&node1, "cni0", "ingress"), 0);
    assert_eq!(our_filters(&node1, "cni0", "egress"), 0);
    assert!(!has_clsact(&node1, "cni0"), "the empty qdisc goes too");
    assert_eq!(
        tcx_programs(&node1).len(),
        8,
        "eth0, cni0, flannel.1 and web-0's veth, two hooks each"
    );
    tcx.signal(libc::SIGINT);
    assert!(tcx.finish().status.success());
}

#[test]
fn a_qdisc_podtrace_did_not_add_stays_with_its_filters() {
    let _sweepers = among_sweepers();
    let lab = lab(Topology::FlannelVxlan);
    let node1 = lab.0.node_netns(1);
    run_in(&node1, "tc", &["qdisc", "add", "dev", "cni0", "clsact"]);
    // Another tool's filter (classic BPF: no module to load).
    let foreign = [
        "filter",
        "add",
        "dev",
        "cni0",
        "ingress",
        "prio",
        "7",
        "bpf",
        "bytecode",
        "1,6 0 0 0,",
    ];
    run_in(&node1, "tc", &foreign);
    let count_foreign = || {
        run_in(&node1, "tc", &["filter", "show", "dev", "cni0", "ingress"])
            .matches("bytecode")
            .count()
    };
    assert_eq!(count_foreign(), 1, "the lab's own filter");
    let trace = Trace::start(&clsact_args(&lab.0, &[]));
    trace.signal(libc::SIGINT);
    assert!(trace.finish().status.success());
    assert_eq!(our_filters(&node1, "cni0", "ingress"), 0);
    assert!(has_clsact(&node1, "cni0"), "not podtrace's to remove");
    assert_eq!(count_foreign(), 1);
    // Nor after a kill and a sweep by the next run.
    let trace = Trace::start(&clsact_args(&lab.0, &[]));
    trace.signal(libc::SIGKILL);
    trace.finish();
    let trace = Trace::start(&argv(&["web-0", "db-0"], lab_args(&lab.0, &[1])));
    trace.signal(libc::SIGINT);
    assert!(trace.finish().status.success());
    assert_eq!(our_filters(&node1, "cni0", "ingress"), 0);
    assert!(has_clsact(&node1, "cni0"));
    assert_eq!(count_foreign(), 1);
}

/// Every tc filter and qdisc line of every interface of a node.
fn tc_state(netns: &str) -> String {
    let mut state = run_in(netns, "tc", &["qdisc", "show"]);
    let links = run_in(netns, "ip", &["-o", "link", "show"]);
    for iface in links.lines().filter_map(|l| l.split(": ").nth(1)) {
        let iface = iface.split('@').next().unwrap_or(iface);
        for hook in ["ingress", "egress"] {
            state.push_str(&run_in(
                netns,
                "tc",
                &["filter", "show", "dev", iface, hook],
            ));
        }
    }
    state
}

#[test]
fn a_signal_during_start_leaves_nothing_behind() {
    let _sweepers = among_sweepers();
    let lab = lab(Topology::FlannelVxlan);
    let nodes = [lab.0.node_netns(1), lab.0.node_netns(2)];
    let before: Vec<String> = nodes.iter().map(|n| tc_state(n)).collect();
    for mode in ["auto", "clsact"] {
        // 150-220 ms lands in the programs' load: the verifier gave up
        // with EAGAIN on the pending signal, and podtrace exited 1 with
        // its log, 5 runs in 30.
        for delay in [0, 50, 100, 150, 175, 200, 220, 400] {
            let args = argv(
                &["web-0", "db-0", "--attach", mode],
                lab_args(&lab.0, &[1, 2]),
            );
            let mut child = Command::new(PODTRACE)
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn podtrace");
            std::thread::sleep(Duration::from_millis(delay));
            // SAFETY: a child we own.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().expect("wait").is_none() {
                assert!(Instant::now() < deadline, "podtrace did not exit");
                std::thread::sleep(Duration::from_millis(20));
            }
            let out = child.wait_with_output().expect("output");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let what = format!("{mode}, SIGTERM after {delay} ms");
            // At 0 ms the signal may come before main: nothing is attached.
            assert!(
                !stderr.contains("Resource temporarily unavailable"),
                "{what}: {stderr}"
            );
            if delay > 0 {
                assert!(out.status.success(), "{what}: {:?} {stderr}", out.status);
                assert!(
                    stdout.contains("podtrace: 0 stories"),
                    "{what}: a summary: {stdout} {stderr}"
                );
            }
            for (node, before) in nodes.iter().zip(&before) {
                assert!(
                    !nft_tables(node).contains("podtrace"),
                    "{what}: {}",
                    nft_tables(node)
                );
                assert_eq!(&tc_state(node), before, "{what}: tc on {node}");
                assert!(tcx_programs(node).is_empty(), "{what}");
            }
        }
    }
}

/// A run that looks alive to podtrace: its registry file, locked.
struct FakeRun {
    id: String,
    _lock: File,
}

impl FakeRun {
    /// Holding a table in `netns`, recorded as a real run records it.
    fn alive(netns: &str) -> Self {
        let id = format!("{:016x}", std::process::id() as u64 * 7_919 + 0xabc0_0000);
        std::fs::create_dir_all("/run/podtrace").unwrap();
        let path = format!("/run/podtrace/{id}.run");
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .open(path)
            .unwrap();
        // SAFETY: plain syscall on a valid fd.
        assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
        let path = format!("/run/netns/{netns}");
        let inum = std::fs::metadata(&path).unwrap().ino() as u32;
        writeln!(file, "table {inum} podtrace_r{id} {path}").unwrap();
        Self { id, _lock: file }
    }

    fn table(&self) -> String {
        format!("podtrace_r{}", self.id)
    }
}

fn add_table(netns: &str, name: &str) {
    run_in(netns, "nft", &["add", "table", "inet", name]);
    assert!(nft_tables(netns).contains(name), "cannot add table {name}");
}

/// A default run on node 1 that starts and stops.
fn start_and_stop(lab: &Lab) -> String {
    let trace = Trace::start(&argv(&["web-0", "db-0"], lab_args(lab, &[1])));
    trace.signal(libc::SIGINT);
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    done.stderr
}

#[test]
fn a_live_runs_table_stays_and_a_dead_runs_goes() {
    let _sweepers = among_sweepers();
    let lab = lab(Topology::FlannelVxlan);
    let node1 = lab.0.node_netns(1);
    let live = FakeRun::alive(&node1);
    let table = live.table();
    add_table(&node1, &table);
    start_and_stop(&lab.0);
    assert!(
        nft_tables(&node1).contains(&table),
        "a live run's table stays"
    );
    drop(live);
    let stderr = start_and_stop(&lab.0);
    assert!(
        !nft_tables(&node1).contains(&table),
        "a dead run's table goes: {stderr}"
    );
}

#[test]
fn a_podtrace_in_its_own_pid_namespace_leaves_live_runs_alone() {
    let _sweepers = among_sweepers();
    let lab = lab(Topology::FlannelVxlan);
    let node1 = lab.0.node_netns(1);
    let host = Trace::start(&argv(&["web-0", "db-0"], lab_args(&lab.0, &[1])));
    let tables = nft_tables(&node1);
    let host_table = tables
        .lines()
        .find_map(|l| {
            l.strip_prefix("table inet ")
                .filter(|t| t.starts_with("podtrace_r"))
        })
        .unwrap_or_else(|| panic!("the host podtrace's table: {tables}"))
        .to_string();
    // An older podtrace's table, named by a PID no process has.
    let legacy = "podtrace_4194300";
    add_table(&node1, legacy);
    let mut command = Command::new("unshare");
    command
        .args(["--pid", "--fork", "--mount-proc", PODTRACE])
        .args(argv(
            &["web-0", "db-0", "--duration", "2s"],
            lab_args(&lab.0, &[1]),
        ))
        .stdout(Stdio::piped());
    let contained = xtask::podtrace_run::start(command, Duration::from_secs(20))
        .expect("start in a PID namespace");
    let tables = nft_tables(&node1);
    assert!(
        tables.contains(&host_table),
        "the live host run's table stays: {tables}"
    );
    assert!(
        tables.contains(legacy),
        "PIDs cannot be judged from here: {tables}"
    );
    let mut child = contained.child;
    assert!(child.wait().expect("wait").success());
    assert!(nft_tables(&node1).contains(&host_table));
    host.signal(libc::SIGINT);
    assert!(host.finish().status.success());
    assert!(!nft_tables(&node1).contains(&host_table));
    // From the initial PID namespace the old PID rule holds.
    start_and_stop(&lab.0);
    assert!(!nft_tables(&node1).contains(legacy));
}

/// A clsact podtrace in a mount namespace with a /run/podtrace of its own
/// (a container that mounts none of the host's): while it lives, a run
/// with the host's leaves its filters alone; once it is killed, the next
/// run removes its filters and its nft table, and says so,
/// although no run file it can read tells of them.
#[test]
fn what_a_killed_run_with_its_own_run_directory_left_goes_and_is_said() {
    let _sweepers = no_other_sweeper();
    let lab = lab(Topology::FlannelVxlan);
    let node1 = lab.0.node_netns(1);
    std::fs::create_dir_all("/run/podtrace").unwrap();
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t tmpfs private-runs /run/podtrace && exec \"$0\" \"$@\"")
        .arg(PODTRACE)
        .args(clsact_args(&lab.0, &[]))
        .stdout(Stdio::piped());
    let private = xtask::podtrace_run::start(command, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("start with a private /run/podtrace: {e:#}"));
    assert_eq!(our_filters(&node1, "cni0", "ingress"), 1);
    let table = nft_tables(&node1)
        .lines()
        .find_map(|l| l.strip_prefix("table inet "))
        .filter(|t| t.starts_with("podtrace_r"))
        .map(str::to_string)
        .expect("the private run's table");

    let alongside = Trace::start(&clsact_args(&lab.0, &[]));
    assert_eq!(
        our_filters(&node1, "cni0", "ingress"),
        2,
        "the live private run's filter stays beside the new one"
    );
    alongside.signal(libc::SIGINT);
    let done = alongside.finish();
    assert!(done.status.success(), "{}", done.stderr);
    assert!(!done.stderr.contains("killed podtrace"), "{}", done.stderr);
    assert_eq!(our_filters(&node1, "cni0", "ingress"), 1);
    assert!(nft_tables(&node1).contains(&table));

    let mut child = private.child;
    child.kill().expect("kill -9 the private run");
    child.wait().expect("wait");
    assert_eq!(our_filters(&node1, "cni0", "egress"), 1, "left by the kill");
    let stderr = start_and_stop(&lab.0);
    assert!(
        stderr.contains("removed the clsact filters a killed podtrace left on")
            && stderr.contains("cni0"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("removing nft table {table}")),
        "{stderr}"
    );
    for hook in ["ingress", "egress"] {
        assert_eq!(our_filters(&node1, "cni0", hook), 0, "{hook}");
        assert_eq!(our_filters(&node1, "eth0", hook), 0, "{hook}");
    }
    assert!(!nft_tables(&node1).contains(&table));
}
