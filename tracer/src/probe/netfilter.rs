//! Which iptables / nftables rule dropped the packet, from nftables packet
//! tracing (the kernel's NFT_MSG_TRACE events).
//!
//! podtrace adds one table of its own per traced node, `inet podtrace_r<run id>`,
//! whose chains run before raw (priority -350) and set `meta nftrace 1` on
//! the traced flow only; no other table is touched. The events are read by
//! the system's `nft -a monitor trace` (`nft_trace` names the rules:
//! iptables syntax in iptables-nft's tables, `nft -a list` text in native
//! ones, such as kube-proxy's nftables mode). The table goes away on
//! exit; a table left by a killed podtrace is removed on the next start,
//! which tells dead from alive by the run registry (`run_registry`), not
//! by PID: a podtrace in another PID namespace cannot see the host's PIDs.
//! Tables of older podtraces (`podtrace_<pid>`) are judged by their PID
//! only from the initial PID namespace, where every PID is visible.

use std::{
    io::{BufRead, BufReader},
    net::IpAddr,
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, Stdio},
};

use crate::model::netfilter::TracedRule;
use anyhow::{bail, Context, Result};
use tokio::sync::mpsc;

use super::{
    nft::{delete_table, nft_script},
    nft_trace::TraceParser,
    rule_text::KernelRules,
    run_registry::{self, Held, Liveness, Record},
};
use crate::node::netns::Namespace;

fn table_name(run_id: u64) -> String {
    format!("podtrace_r{run_id:016x}")
}

/// The tracing table and monitor of one node.
pub struct NodeTrace {
    netns: Namespace,
    monitor: Child,
    table: String,
    record: Record,
    /// Which traced packets the node may send itself.
    sent_here: SentHere,
    /// Senders whose ICMP errors about packets too big are traced.
    errors_followed: Vec<IpAddr>,
}

/// Which traced pairs a node may send through its output hook: those
/// whose source is one of its own addresses (a host-network pod, the
/// node itself), and with kube-proxy in IPVS mode every pair, since IPVS
/// sends a Service's packet on to its backend from the output hook under
/// the client's own address.
#[derive(Clone, Debug, Default)]
pub struct SentHere {
    pub own_addresses: Vec<IpAddr>,
    pub ipvs: bool,
}

impl SentHere {
    fn may_send(&self, src: &IpAddr) -> bool {
        self.ipvs || self.own_addresses.contains(src)
    }
}

impl NodeTrace {
    /// Inside `netns`: removes stale podtrace tables, adds ours for the
    /// traced pairs, and starts the monitor; its drops go to `tx`.
    pub fn start(
        netns: &Namespace,
        node_id: u32,
        pairs: &[(IpAddr, IpAddr)],
        sent_here: SentHere,
        tx: mpsc::UnboundedSender<(u32, TracedRule)>,
    ) -> Result<Self> {
        super::sweep::sweep_dead_runs()?;
        let table = table_name(run_registry::id()?);
        let record = Record::at(
            netns,
            Held::Table {
                name: table.clone(),
            },
        );
        // Recorded before it exists: a kill in between leaves no orphan.
        run_registry::claim(record.clone())?;
        let started = netns.run(|| {
            remove_stale_tables()?;
            let mut script = format!(
                "table inet {table} {{\n chain prerouting {{ type filter hook prerouting priority -350; }}\n}}\n"
            );
            script.push_str(&trace_rules(&table, pairs, &sent_here));
            nft_script(&script).context("cannot add podtrace's nft tracing table")?;
            let mut command = Command::new("nft");
            command
                .args(["-a", "monitor", "trace"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            // SAFETY: prctl is async-signal-safe. The monitor must not
            // outlive podtrace, even after SIGKILL.
            #[cfg(target_os = "linux")]
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let spawned = command.spawn();
            let mut monitor = match spawned {
                Ok(child) => child,
                Err(e) => {
                    let _ = delete_table(&table);
                    bail!("cannot run nft monitor trace (package nftables): {e}");
                }
            };
            // Naming rules is worth waiting for, not worth refusing to
            // trace: a monitor that never listens leaves drops unnamed.
            if let Err(e) = until_listening(&mut monitor) {
                eprintln!("podtrace: netfilter rules may go unnamed on this node: {e:#}");
            }
            let stdout = monitor.stdout.take().expect("piped");
            // A thread starts in the namespace of the thread that spawns
            // it: the rule lookups ask this node.
            std::thread::spawn(move || read_traces(stdout, node_id, &tx));
            Ok(Self {
                netns: netns.clone(),
                monitor,
                table: table.clone(),
                record: record.clone(),
              sent_here: sent_here.clone(),
                errors_followed: Vec::new(),
            })
        });
        if started.is_err() {
            // Absent already is fine.
            let _ = netns.run(|| delete_table(&table));
            run_registry::release(&record);
        }
        started
    }
}

/// Names the rules of the monitor's trace lines, for as long as it runs.
fn read_traces(
    monitor: std::process::ChildStdout,
    node_id: u32,
    tx: &mpsc::UnboundedSender<(u32, TracedRule)>,
) {
    let mut parser = TraceParser::default();
    let mut kernel = KernelRules::default();
    // Before the first line: its packet's rule is then listed already.
    kernel.warm();
    for line in BufReader::new(monitor).lines().map_while(Result::ok) {
        if let Some(drop) = parser.feed(&line, &mut kernel) {
            if tx.send((node_id, drop)).is_err() {
                return;
            }
        }
    }
}

/// How long `nft monitor trace` may take to start listening: it reads the
/// whole ruleset first (kube-proxy's, with thousands of Services, takes
/// seconds on a busy node).
const MONITOR_START: std::time::Duration = std::time::Duration::from_secs(20);

/// NFNLGRP_NFTRACE's bit in /proc/net/netlink's group mask.
const NFTRACE_GROUP: u32 = 1 << (9 - 1);

/// Waits until `monitor` listens for trace events (its netlink socket
/// joined NFNLGRP_NFTRACE in the current thread's namespace): events sent
/// before that are lost, so the trace is not announced until then. An
/// error if it exited or took longer than [`MONITOR_START`].
fn until_listening(monitor: &mut Child) -> Result<()> {
    let started = std::time::Instant::now();
    loop {
        let table = std::fs::read_to_string("/proc/thread-self/net/netlink").unwrap_or_default();
        if listens_for_traces(&table, &socket_inodes(monitor.id())) {
            return Ok(());
        }
        if let Ok(Some(status)) = monitor.try_wait() {
            bail!("nft monitor trace exited ({status}) before it listened");
        }
        if started.elapsed() > MONITOR_START {
            bail!(
                "nft monitor trace did not start listening in {} s",
                MONITOR_START.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The inodes of the sockets process `pid` holds open: its netlink
/// socket's port id need not be its pid.
fn socket_inodes(pid: u32) -> Vec<String> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_string(),
            )
        })
        .collect()
}

/// Whether /proc/net/netlink's `table` has a NETLINK_NETFILTER socket of
/// one of `inodes` in the trace group.
fn listens_for_traces(table: &str, inodes: &[String]) -> bool {
    const NETLINK_NETFILTER: &str = "12";
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 9
            && fields[1] == NETLINK_NETFILTER
            && inodes.iter().any(|inode| inode == fields[9])
            && u32::from_str_radix(fields[3], 16).is_ok_and(|groups| groups & NFTRACE_GROUP != 0)
    })
}

impl NodeTrace {
    /// Traces the ICMP errors about `sender`'s packets too big for their
    /// path from now on ([`error_trace_rules`]), once per sender.
    pub fn follow_errors_to(&mut self, sender: IpAddr) -> Result<()> {
        if self.errors_followed.contains(&sender) {
            return Ok(());
        }
        self.errors_followed.push(sender);
        self.netns
            .run(|| nft_script(&error_trace_rules(&self.table, &sender)))
    }

    /// Traces more pairs too (a traced pod came back with a new IP).
    pub fn follow(&self, pairs: &[(IpAddr, IpAddr)]) -> Result<()> {
        self.netns
            .run(|| nft_script(&trace_rules(&self.table, pairs, &self.sent_here)))
    }
}

/// Packets per second and direction that are traced through the rules.
/// Every rule a traced packet crosses costs the kernel a netlink event;
/// tracing a flood would double its latency. Beyond the first
/// [`TRACED_PER_SECOND`] a second (a burst of as many), packets go
/// untraced: a failing connection's few packets are all traced, a flood's
/// first ones and then a steady sample.
pub const TRACED_PER_SECOND: u32 = 5;

/// Why a netfilter drop's rule is not named although rule tracing is on.
pub const UNTRACED_DROP: &str =
    "no DROP verdict was traced for this packet (rule tracing follows 5 packets/s per direction)";

/// The rules that mark the traced pairs for tracing, before raw: where
/// packets arrive (prerouting), and where the node sends its own (output)
/// for the pairs it may send itself ([`SentHere`]). Every packet a node
/// sends, encapsulated ones included, pays for a chain on that hook, so it
/// is made only for them.
fn trace_rules(table: &str, pairs: &[(IpAddr, IpAddr)], sent_here: &SentHere) -> String {
    let limit = format!("limit rate {TRACED_PER_SECOND}/second burst {TRACED_PER_SECOND} packets");
    // The table is `inet`: one chain marks both families' pairs.
    let rule = |chain: &str, src: &IpAddr, dst: &IpAddr| {
        let ip = if src.is_ipv6() { "ip6" } else { "ip" };
        format!("add rule inet {table} {chain} {ip} saddr {src} {ip} daddr {dst} {limit} meta nftrace set 1\n")
    };
    let mut rules = String::new();
    if pairs.iter().any(|(src, _)| sent_here.may_send(src)) {
        // `add` of a chain that exists is no error (a pair followed later).
        rules.push_str(&format!(
            "add chain inet {table} output {{ type filter hook output priority -350; }}\n"
        ));
    }
    for (src, dst) in pairs {
        rules.push_str(&rule("prerouting", src, dst));
        if sent_here.may_send(src) {
            rules.push_str(&rule("output", src, dst));
        }
    }
    rules
}

/// The rules that mark the ICMP errors sent to `sender` about its
/// packets too big for their path (fragmentation needed, packet too big),
/// made by this node (output) or by another on the way (prerouting): a
/// PMTU black hole is such an error dropped, and its rule is what to name.
/// Added once a traced packet of `sender`'s was too big on the node, not
/// before: every packet a node sends would pay for an output chain.
fn error_trace_rules(table: &str, sender: &IpAddr) -> String {
    let limit = format!("limit rate {TRACED_PER_SECOND}/second burst {TRACED_PER_SECOND} packets");
    let (ip, error) = if sender.is_ipv6() {
        ("ip6", "icmpv6 type packet-too-big")
    } else {
        (
            "ip",
            "icmp type destination-unreachable icmp code frag-needed",
        )
    };
    let mut rules =
        format!("add chain inet {table} output {{ type filter hook output priority -350; }}\n");
    for chain in ["prerouting", "output"] {
        rules.push_str(&format!(
            "add rule inet {table} {chain} {ip} daddr {sender} {error} {limit} meta nftrace set 1\n"
        ));
    }
    rules
}

impl Drop for NodeTrace {
    fn drop(&mut self) {
        let _ = self.monitor.kill();
        let _ = self.monitor.wait();
        let table = self.table.clone();
        let removed = self.netns.run(|| delete_table(&table));
        match removed {
            Ok(()) => run_registry::release(&self.record),
            Err(e) => eprintln!("podtrace: cannot remove nft table {table}: {e:#}"),
        }
    }
}

/// podtrace tables whose podtrace is gone (killed); those of live runs,
/// and of runs this one cannot judge, stay.
fn remove_stale_tables() -> Result<()> {
    let out = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .context("cannot run nft")?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.strip_prefix("table inet ") else {
            continue;
        };
        if table_is_stale(name) {
            delete_table(name)?;
        }
    }
    Ok(())
}

fn table_is_stale(name: &str) -> bool {
    let Some(owner) = name.strip_prefix("podtrace_") else {
        return false;
    };
    if let Some(id) = owner
        .strip_prefix('r')
        .and_then(|h| u64::from_str_radix(h, 16).ok())
    {
        return match run_registry::liveness(id) {
            Liveness::Dead => true,
            Liveness::Alive => false,
            // No run file here: a run with another /run/podtrace (another
            // container's), judged by its sign of life in this namespace.
            Liveness::Unknown => {
                let dead = !super::run_liveness::alive(run_registry::handle_of(id));
                if dead {
                    eprintln!(
                        "podtrace: removing nft table {name}, left by a killed podtrace whose run file is not in this podtrace's /run/podtrace"
                    );
                }
                dead
            }
        };
    }
    match owner.parse::<u32>() {
        Ok(pid) => in_initial_pid_namespace() && !Path::new(&format!("/proc/{pid}")).exists(),
        Err(_) => false,
    }
}

/// Whether every PID on the machine is visible here.
fn in_initial_pid_namespace() -> bool {
    // PROC_PID_INIT_INO: the inode the kernel gives the initial namespace.
    const INITIAL: u64 = 0xEFFF_FFFC;
    std::fs::metadata("/proc/self/ns/pid").is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.ino() == INITIAL
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_monitor_listens_once_its_socket_joined_the_trace_group() {
        let header = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n";
        let joined = format!("{header}000000009dc50e0f 12  820        00000100 0        0        0     2        0        187304\n");
        let not_yet = format!("{header}000000009dc50e0f 12  820        00000000 0        0        0     2        0        187304\n");
        let other = format!("{header}000000009dc50e0f 0   820        00000100 0        0        0     2        0        187304\n");
        let ours = ["187304".to_string()];
        assert!(super::listens_for_traces(&joined, &ours));
        assert!(!super::listens_for_traces(&joined, &["187305".to_string()]));
        assert!(!super::listens_for_traces(&not_yet, &ours));
        assert!(!super::listens_for_traces(&other, &ours));
    }

    use super::*;

    #[test]
    fn tracing_is_rate_limited_per_pair_and_says_so() {
        let pair = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let rules = trace_rules("t", &[pair], &SentHere::default());
        assert_eq!(
            rules
                .matches("limit rate 5/second burst 5 packets meta nftrace set 1")
                .count(),
            1
        );
        assert!(UNTRACED_DROP.contains(&format!("{TRACED_PER_SECOND} packets/s")));
    }

    /// The errors about a sender's packets too big are marked where the
    /// node makes them and where it forwards another's, in either family.
    #[test]
    fn the_errors_about_packets_too_big_are_marked_by_their_type() {
        let pod: IpAddr = "10.244.1.2".parse().unwrap();
        let rules = error_trace_rules("t", &pod);
        assert_eq!(rules.matches("add chain inet t output").count(), 1);
        for chain in ["prerouting", "output"] {
            assert!(rules.contains(&format!("add rule inet t {chain} ip daddr {pod} icmp type destination-unreachable icmp code frag-needed limit rate 5/second")), "{rules}");
        }
        let pod6: IpAddr = "fd00:10:244:1::2".parse().unwrap();
        let rules6 = error_trace_rules("t", &pod6);
        assert!(
            rules6.contains(&format!(
                "output ip6 daddr {pod6} icmpv6 type packet-too-big"
            )),
            "{rules6}"
        );
    }

    #[test]
    fn only_a_pair_the_node_sends_itself_is_marked_on_output() {
        let node: IpAddr = "192.0.2.11".parse().unwrap();
        let pod: IpAddr = "10.244.1.2".parse().unwrap();
        let backends: Vec<(IpAddr, IpAddr)> = ["10.244.2.2", "10.244.2.3"]
            .iter()
            .map(|b| (node, b.parse().unwrap()))
            .collect();
        let sent_here = SentHere {
            own_addresses: vec![node],
            ipvs: false,
        };
        let between_pods = trace_rules("t", &[(pod, "10.244.2.2".parse().unwrap())], &sent_here);
        assert!(!between_pods.contains(" output "), "{between_pods}");
        let from_node = trace_rules("t", &[(node, pod), (pod, node)], &sent_here);
        assert!(from_node.contains(&format!(
            "add rule inet t output ip saddr {node} ip daddr {pod}"
        )));
        assert!(!from_node.contains(&format!("output ip saddr {pod}")));
        // One chain, however many pairs need it.
        let to_backends = trace_rules("t", &backends, &sent_here);
        assert_eq!(to_backends.matches("add chain inet t output").count(), 1);
        assert_eq!(to_backends.matches("add rule inet t output").count(), 2);
        // IPVS sends a Service's packets on from output under the
        // client's address: every pair is marked there.
        let ipvs = SentHere {
            ipvs: true,
            ..sent_here.clone()
        };
        let via_ipvs = trace_rules("t", &[(pod, "10.244.2.2".parse().unwrap())], &ipvs);
        assert!(via_ipvs.contains(&format!("add rule inet t output ip saddr {pod}")));
        // An IPv6 pair is marked by its IPv6 header, in the same table.
        let pod6: IpAddr = "fd00:10:244:1::2".parse().unwrap();
        let db6: IpAddr = "fd00:10:244:2::2".parse().unwrap();
        let v6 = trace_rules("t", &[(pod6, db6)], &sent_here);
        assert!(v6.contains(&format!(
            "add rule inet t prerouting ip6 saddr {pod6} ip6 daddr {db6}"
        )));
    }
}
