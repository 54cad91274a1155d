//! Conntrack's own counters, from ctnetlink: the per-CPU statistics
//! (IPCTNL_MSG_CT_GET_STATS_CPU, what `conntrack -S` prints: insert_failed,
//! drop, early_drop, invalid…) summed, and the table's fill
//! (IPCTNL_MSG_CT_GET_STATS: nf_conntrack_count and nf_conntrack_max).
//!
//! The socket is opened in the node's namespace and stays bound to it, so
//! the run reads the counters at start, at a drop and at the end from any
//! thread. The TCP sysctls that decide what conntrack finds INVALID are
//! read once, at open, from the namespace's own /proc/sys/net.

use anyhow::{bail, Context, Result};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket};

use super::conntrack::{
    attrs, be32, request, split, NFGEN_HDR, NFNL_SUBSYS_CTNETLINK, NLMSG_DONE, NLM_F_DUMP,
    NLM_F_REQUEST,
};
use crate::model::conntrack::{ConntrackCounters, ConntrackTable};

// linux/netfilter/nfnetlink_conntrack.h: cntl_msg_types, ctattr_stats_*.
const IPCTNL_MSG_CT_GET_STATS_CPU: u16 = 4;
const IPCTNL_MSG_CT_GET_STATS: u16 = 5;
const CTA_STATS_INVALID: u16 = 4;
const CTA_STATS_INSERT: u16 = 8;
const CTA_STATS_INSERT_FAILED: u16 = 9;
const CTA_STATS_DROP: u16 = 10;
const CTA_STATS_EARLY_DROP: u16 = 11;
const CTA_STATS_ERROR: u16 = 12;
const CTA_STATS_CLASH_RESOLVE: u16 = 14;
const CTA_STATS_CHAIN_TOOLONG: u16 = 15;
const CTA_STATS_GLOBAL_ENTRIES: u16 = 1;
const CTA_STATS_GLOBAL_MAX_ENTRIES: u16 = 2;
const NLMSG_ERROR: u16 = 2;

/// One node's conntrack counters, readable for the whole run.
pub struct ConntrackStats {
    socket: Socket,
    table: ConntrackTable,
}

impl ConntrackStats {
    /// Opens the reader in the calling thread's namespace and reads the
    /// counters as they are at start.
    pub fn open(node: &str) -> Result<Self> {
        let mut socket =
            Socket::new(NETLINK_NETFILTER).context("cannot open a ctnetlink socket")?;
        socket.bind_auto()?;
        super::conntrack::set_timeout(&socket, std::time::Duration::from_secs(1))?;
        let sysctl = |name: &str| {
            std::fs::read_to_string(format!("/proc/sys/net/netfilter/{name}"))
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
        };
        let mut stats = Self {
            socket,
            table: ConntrackTable {
                node: node.to_string(),
                tcp_loose: sysctl("nf_conntrack_tcp_loose").map(|v| v != 0),
                tcp_be_liberal: sysctl("nf_conntrack_tcp_be_liberal").map(|v| v != 0),
                tcp_timeout_established: sysctl("nf_conntrack_tcp_timeout_established"),
                ..Default::default()
            },
        };
        stats.read()?;
        stats.table.start = stats.table.now;
        Ok(stats)
    }

    /// The table now: the counters and the fill read again.
    pub fn read(&mut self) -> Result<&ConntrackTable> {
        let per_cpu = self.ask(IPCTNL_MSG_CT_GET_STATS_CPU, NLM_F_REQUEST | NLM_F_DUMP)?;
        self.table.now = summed(&per_cpu);
        let global = self.ask(IPCTNL_MSG_CT_GET_STATS, NLM_F_REQUEST)?;
        if let Some(body) = global.first() {
            (self.table.entries, self.table.max) = fill(body);
        }
        Ok(&self.table)
    }

    /// The answers' bodies (after the nfgenmsg) to one request.
    fn ask(&self, message: u16, flags: u16) -> Result<Vec<Vec<u8>>> {
        self.socket
            .send(&request(message, flags), 0)
            .context("cannot ask ctnetlink for conntrack's statistics")?;
        let mut buf = vec![0u8; 1 << 16];
        let mut bodies = Vec::new();
        let kind = NFNL_SUBSYS_CTNETLINK << 8 | message;
        loop {
            let n = self
                .socket
                .recv(&mut &mut buf[..], 0)
                .context("no answer from ctnetlink")?;
            let mut done = n == 0 || flags & NLM_F_DUMP == 0;
            for m in split(&buf[..n]) {
                match m.kind {
                    NLMSG_DONE => done = true,
                    NLMSG_ERROR if error_code(m.body) != 0 => bail!(
                        "ctnetlink refused to give conntrack's statistics (error {})",
                        -error_code(m.body)
                    ),
                    k if k == kind && m.body.len() >= NFGEN_HDR => {
                        bodies.push(m.body[NFGEN_HDR..].to_vec())
                    }
                    _ => {}
                }
            }
            if done {
                return Ok(bodies);
            }
        }
    }
}

/// An NLMSG_ERROR's code (0 is an acknowledgement).
fn error_code(body: &[u8]) -> i32 {
    body.get(..4)
        .map_or(0, |b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
}

/// The per-CPU answers' counters, summed.
fn summed(per_cpu: &[Vec<u8>]) -> ConntrackCounters {
    let mut sum = ConntrackCounters::default();
    for body in per_cpu {
        for (kind, payload) in attrs(body) {
            let n = u64::from(be32(payload).unwrap_or(0));
            let counter = match kind {
                CTA_STATS_INVALID => &mut sum.invalid,
                CTA_STATS_INSERT => &mut sum.insert,
                CTA_STATS_INSERT_FAILED => &mut sum.insert_failed,
                CTA_STATS_DROP => &mut sum.drop,
                CTA_STATS_EARLY_DROP => &mut sum.early_drop,
                CTA_STATS_ERROR => &mut sum.error,
                CTA_STATS_CLASH_RESOLVE => &mut sum.clash_resolve,
                CTA_STATS_CHAIN_TOOLONG => &mut sum.chain_toolong,
                _ => continue,
            };
            *counter += n;
        }
    }
    sum
}

/// nf_conntrack_count and nf_conntrack_max, from the global answer.
fn fill(body: &[u8]) -> (u64, u64) {
    let (mut entries, mut max) = (0, 0);
    for (kind, payload) in attrs(body) {
        match kind {
            CTA_STATS_GLOBAL_ENTRIES => entries = u64::from(be32(payload).unwrap_or(0)),
            CTA_STATS_GLOBAL_MAX_ENTRIES => max = u64::from(be32(payload).unwrap_or(0)),
            _ => {}
        }
    }
    (entries, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::conntrack::align;

    fn attr(kind: u16, value: u32) -> Vec<u8> {
        let mut out = 8u16.to_ne_bytes().to_vec();
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&value.to_be_bytes());
        out.resize(align(out.len()), 0);
        out
    }

    #[test]
    fn per_cpu_counters_are_summed_and_the_fill_read() {
        let cpu0 = [
            attr(CTA_STATS_INSERT_FAILED, 2),
            attr(CTA_STATS_INVALID, 7),
            attr(CTA_STATS_DROP, 1),
        ]
        .concat();
        let cpu1 = [
            attr(CTA_STATS_INSERT_FAILED, 3),
            attr(CTA_STATS_EARLY_DROP, 4),
        ]
        .concat();
        let sum = summed(&[cpu0, cpu1]);
        assert_eq!(
            (sum.insert_failed, sum.invalid, sum.drop, sum.early_drop),
            (5, 7, 1, 4)
        );
        let global = [
            attr(CTA_STATS_GLOBAL_ENTRIES, 12),
            attr(CTA_STATS_GLOBAL_MAX_ENTRIES, 262_144),
        ]
        .concat();
        assert_eq!(fill(&global), (12, 262_144));
        // A truncated attribute: ignored, no panic.
        assert_eq!(fill(&global[..6]), (0, 0));
    }
}
