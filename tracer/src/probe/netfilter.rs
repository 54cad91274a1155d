//! Which iptables / nftables rule dropped the packet, from nftables packet
//! tracing (the kernel's NFT_MSG_TRACE events).
//!
//! podtrace adds one table of its own per traced node, `inet podtrace_r<run id>`,
//! whose chains run before raw (priority -350) and set `meta nftrace 1` on
//! the traced flow only; no other table is touched. The events are read by
//! the system's `xtables-monitor --trace`, which prints iptables-nft rules
//! in the syntax their author wrote (`-A FORWARD -s … -j DROP`, comments
//! included) — decoding xt match payloads ourselves would mean
//! re-implementing iptables' extension printers. The table goes away on
//! exit; a table left by a killed podtrace is removed on the next start,
//! which tells dead from alive by the run registry (`run_registry`), not
//! by PID: a podtrace in another PID namespace cannot see the host's PIDs.
//! Tables of older podtraces (`podtrace_<pid>`) are judged by their PID
//! only from the initial PID namespace, where every PID is visible.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Write},
    net::Ipv4Addr,
    os::unix::process::CommandExt,
    path::Path,
    process::{Child, Command, Stdio},
};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::run_registry::{self, Held, Liveness, Record};
use crate::node::netns::Namespace;

/// The rule that gave a traced packet its final DROP, or translated its
/// addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetfilterRule {
    pub table: String,
    pub chain: String,
    /// The base chain the packet entered by (FORWARD, INPUT, …).
    pub hook: String,
    /// As iptables-save prints it (`-A FORWARD … -j DROP`), or the nft rule
    /// handle where the rule is native nftables.
    pub rule: String,
}

/// A DROP verdict or a nat rule from the trace, and the packet it was for
/// (its addresses as the rule saw them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracedRule {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub ip_id: u16,
    pub rule: NetfilterRule,
}

/// Which iptables is in use on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Nft,
    Legacy,
    Missing,
}

impl Backend {
    pub fn detect() -> Self {
        match Command::new("iptables").arg("--version").output() {
            Ok(out) if String::from_utf8_lossy(&out.stdout).contains("nf_tables") => Self::Nft,
            Ok(out) if out.status.success() => Self::Legacy,
            _ => Self::Missing,
        }
    }
}

/// How a packet is known across signals: source, destination, IP ID.
pub type PacketId = (Ipv4Addr, Ipv4Addr, u16);

/// Parses `xtables-monitor --trace` output into DROP verdicts and nat
/// rules.
#[derive(Default)]
pub struct TraceParser {
    /// trace id → (packet, the base chain it entered by)
    packets: HashMap<String, (PacketId, Option<String>)>,
}

impl TraceParser {
    pub fn feed(&mut self, line: &str) -> Option<TracedRule> {
        let line = line.trim_start();
        if let Some(rest) = line.strip_prefix("PACKET: ") {
            let mut fields = rest.split_whitespace();
            let _family = fields.next()?;
            let id = fields.next()?.to_string();
            let mut src = None;
            let mut dst = None;
            let mut ip_id = None;
            for field in fields {
                match field.split_once('=') {
                    Some(("SRC", v)) => src = v.parse().ok(),
                    Some(("DST", v)) => dst = v.parse().ok(),
                    Some(("ID", v)) => ip_id = v.parse().ok(),
                    _ => {}
                }
            }
            if self.packets.len() > 4096 {
                self.packets.clear();
            }
            self.packets.insert(id, ((src?, dst?, ip_id?), None));
            return None;
        }
        let rest = line.strip_prefix("TRACE: ")?;
        let mut fields = rest.splitn(4, ' ');
        let _family = fields.next()?;
        let id = fields.next()?;
        let what = fields.next()?;
        let rule_text = fields.next().unwrap_or("").trim();
        let (packet, base) = self.packets.get_mut(id)?;
        let mut parts = what.split(':');
        let (table, chain) = (parts.next()?, parts.next()?);
        let kind = parts.next()?;
        let base = base.get_or_insert_with(|| chain.to_string()).clone();
        let (handle, verdict) = match kind {
            "rule" => (parts.next()?.to_string(), parts.next()?),
            _ => (String::new(), parts.next()?),
        };
        let translates = kind == "rule" && is_nat_rule(rule_text);
        if verdict != "DROP" && !translates {
            return None;
        }
        let rule = match (kind, rule_text) {
            ("rule", "") => format!(
                "nft rule handle {} in table {table} chain {chain}",
                u64::from_str_radix(handle.trim_start_matches("0x"), 16).unwrap_or(0)
            ),
            ("rule", text) => strip_family_and_table(text),
            (_, _) => format!("the policy of chain {chain} (DROP)"),
        };
        let (src, dst, ip_id) = *packet;
        Some(TracedRule {
            src,
            dst,
            ip_id,
            rule: NetfilterRule {
                table: table.into(),
                chain: chain.into(),
                hook: base,
                rule,
            },
        })
    }
}

/// A rule that rewrites addresses (kube-proxy's DNAT, a MASQUERADE): its
/// packet's story names it where the addresses changed.
fn is_nat_rule(text: &str) -> bool {
    ["-j DNAT", "-j SNAT", "-j MASQUERADE"]
        .iter()
        .any(|target| text.contains(target))
}

/// `-4 -t filter -A FORWARD …` → `-A FORWARD …` (the table is its own field).
fn strip_family_and_table(text: &str) -> String {
    let mut rest = text.trim();
    for prefix in ["-4 ", "-6 "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    if let Some(after) = rest.strip_prefix("-t ") {
        rest = after.split_once(' ').map_or(after, |(_, r)| r);
    }
    rest.to_string()
}

fn table_name(run_id: u64) -> String {
    format!("podtrace_r{run_id:016x}")
}

/// The tracing table and monitor of one node.
pub struct NodeTrace {
    netns: Namespace,
    monitor: Child,
    table: String,
    record: Record,
}

impl NodeTrace {
    /// Inside `netns`: removes stale podtrace tables, adds ours for the
    /// traced pairs, and starts the monitor; its drops go to `tx`.
    pub fn start(
        netns: &Namespace,
        node_id: u32,
        pairs: &[(Ipv4Addr, Ipv4Addr)],
        tx: mpsc::UnboundedSender<(u32, TracedRule)>,
    ) -> Result<Self> {
        run_registry::sweep_dead_runs()?;
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
                "table inet {table} {{\n chain prerouting {{ type filter hook prerouting priority -350; }}\n chain output {{ type filter hook output priority -350; }}\n}}\n"
            );
            script.push_str(&trace_rules(&table, pairs));
            nft_script(&script).context("cannot add podtrace's nft tracing table")?;
            let mut command = Command::new("xtables-monitor");
            command
                .arg("--trace")
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            // SAFETY: prctl is async-signal-safe. The monitor must not
            // outlive podtrace, even after SIGKILL.
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
                    bail!("cannot run xtables-monitor (package iptables): {e}");
                }
            };
            let stdout = monitor.stdout.take().expect("piped");
            std::thread::spawn(move || {
                let mut parser = TraceParser::default();
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if let Some(drop) = parser.feed(&line) {
                        if tx.send((node_id, drop)).is_err() {
                            return;
                        }
                    }
                }
            });
            Ok(Self {
                netns: netns.clone(),
                monitor,
                table: table.clone(),
                record: record.clone(),
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

impl NodeTrace {
    /// Traces more pairs too (a traced pod came back with a new IP).
    pub fn follow(&self, pairs: &[(Ipv4Addr, Ipv4Addr)]) -> Result<()> {
        self.netns
            .run(|| nft_script(&trace_rules(&self.table, pairs)))
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

/// The rules that mark the traced pairs for tracing, before raw.
fn trace_rules(table: &str, pairs: &[(Ipv4Addr, Ipv4Addr)]) -> String {
    let mut rules = String::new();
    let limit = format!("limit rate {TRACED_PER_SECOND}/second burst {TRACED_PER_SECOND} packets");
    for (src, dst) in pairs {
        for chain in ["prerouting", "output"] {
            rules.push_str(&format!(
                "add rule inet {table} {chain} ip saddr {src} ip daddr {dst} {limit} meta nftrace set 1\n"
            ));
        }
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

/// Runs an nft script atomically (`nft -f -`).
fn nft_script(script: &str) -> Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run nft (package nftables)")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("nft: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Deletes a podtrace table of the current thread's namespace; absent
/// already is fine.
pub(super) fn delete_table(name: &str) -> Result<()> {
    match nft_script(&format!("delete table inet {name}\n")) {
        Err(e) if e.to_string().contains("No such file or directory") => Ok(()),
        other => other,
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
        return run_registry::liveness(id) == Liveness::Dead;
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
    use super::*;

    /// Recorded from `xtables-monitor --trace` on the lab, Calico-style chains.
    const CALICO: &str = r#"PACKET: 1 fecb2fc2 IN=cni0 NFPROTO=2 MACSRC=2:be:d0:67:2e:79 MACDST=be:76:ad:2d:c2:bf MACPROTO=0800 SRC=10.244.1.2 DST=10.244.2.2 LEN=84 TOS=0x0 TTL=64 ID=53798 DF 
 TRACE: 1 fecb2fc2 podtrace_test:pre:rule:0x2:CONTINUE  
 TRACE: 1 fecb2fc2 podtrace_test:pre:policy:ACCEPT 
PACKET: 2 beb3af5f IN=cni0 OUT=flannel.1 MACSRC=2:be:d0:67:2e:79 MACDST=be:76:ad:2d:c2:bf MACPROTO=0800 SRC=10.244.1.2 DST=10.244.2.2 LEN=84 TOS=0x0 TTL=63 ID=53798 DF 
 TRACE: 2 beb3af5f filter:FORWARD:rule:0x6:JUMP:cali-FORWARD  -4 -t filter -A FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD
 TRACE: 2 beb3af5f filter:cali-FORWARD:rule:0x7:JUMP:cali-tw-veth1  -4 -t filter -A cali-FORWARD -j cali-tw-veth1
 TRACE: 2 beb3af5f filter:cali-tw-veth1:rule:0x8:DROP  -4 -t filter -A cali-tw-veth1 -m comment --comment "cali:1" -m comment --comment "Drop if no profiles matched" -j DROP
"#;

    #[test]
    fn tracing_is_rate_limited_per_pair_and_says_so() {
        let pair = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let rules = trace_rules("t", &[pair]);
        assert_eq!(
            rules
                .matches("limit rate 5/second burst 5 packets meta nftrace set 1")
                .count(),
            2
        );
        assert!(UNTRACED_DROP.contains(&format!("{TRACED_PER_SECOND} packets/s")));
    }

    #[test]
    fn the_dropping_rule_is_named_with_its_user_chain_and_hook() {
        let mut parser = TraceParser::default();
        let drops: Vec<_> = CALICO.lines().filter_map(|l| parser.feed(l)).collect();
        assert_eq!(
            drops,
            [TracedRule {
                src: "10.244.1.2".parse().unwrap(),
                dst: "10.244.2.2".parse().unwrap(),
                ip_id: 53798,
                rule: NetfilterRule {
                    table: "filter".into(),
                    chain: "cali-tw-veth1".into(),
                    hook: "FORWARD".into(),
                    rule: r#"-A cali-tw-veth1 -m comment --comment "cali:1" -m comment --comment "Drop if no profiles matched" -j DROP"#.into(),
                },
            }]
        );
    }

    /// Recorded: a connection to a ClusterIP through kube-proxy's chains.
    const KUBE_PROXY: &str = r#"PACKET: 2 012abfe9 IN=cni0 SRC=10.244.1.2 DST=10.96.7.7 LEN=60 TOS=0x0 TTL=64 ID=11032 DF SPORT=46960 DPORT=80 SYN 
 TRACE: 2 012abfe9 nat:PREROUTING:rule:0x4:JUMP:KUBE-SERVICES  -4 -t nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
 TRACE: 2 012abfe9 nat:KUBE-SERVICES:rule:0x9:JUMP:KUBE-SVC-AB  -4 -t nat -A KUBE-SERVICES -d 10.96.7.7/32 -p tcp -m comment --comment "default/db:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-AB
 TRACE: 2 012abfe9 nat:KUBE-SEP-ABC:rule:0x2:ACCEPT  -4 -t nat -A KUBE-SEP-ABC -p tcp -m comment --comment "default/db:http" -m tcp -j DNAT --to-destination 10.244.2.3:8080
"#;

    #[test]
    fn a_dnat_rule_is_reported_with_the_packet_before_it() {
        let mut parser = TraceParser::default();
        let rules: Vec<_> = KUBE_PROXY.lines().filter_map(|l| parser.feed(l)).collect();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].dst, "10.96.7.7".parse::<Ipv4Addr>().unwrap());
        assert_eq!(rules[0].rule.chain, "KUBE-SEP-ABC");
        assert_eq!(rules[0].rule.hook, "PREROUTING");
        assert!(rules[0]
            .rule
            .rule
            .ends_with("-j DNAT --to-destination 10.244.2.3:8080"));
    }

    #[test]
    fn native_rules_and_policies_are_named_by_handle_and_chain() {
        let mut parser = TraceParser::default();
        parser.feed("PACKET: 1 aa IN=eth0 SRC=10.0.0.1 DST=10.0.0.2 LEN=84 TTL=64 ID=7 DF");
        let rule = parser
            .feed(" TRACE: 1 aa mytable:input:rule:0x1a:DROP  ")
            .unwrap();
        assert_eq!(
            rule.rule.rule,
            "nft rule handle 26 in table mytable chain input"
        );
        let policy = parser
            .feed(" TRACE: 1 aa filter:INPUT:policy:DROP ")
            .unwrap();
        assert_eq!(policy.rule.rule, "the policy of chain INPUT (DROP)");
        assert!(parser
            .feed(" TRACE: 9 unknown filter:INPUT:policy:DROP ")
            .is_none());
    }
}
