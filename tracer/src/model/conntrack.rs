//! A conntrack entry and its tuples, as ctnetlink gives them (read by
//! `probe::conntrack`, used by NAT stories); and conntrack's own account
//! of a node over a run: its per-CPU counters
//! (summed), the table's fill and the sysctls that decide what it finds
//! INVALID. Read by `probe::conntrack_stats`, judged by `story::conntrack`,
//! shown in the summary.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// Conntrack's counters in one namespace, summed over its CPUs
/// (ctnetlink's IPCTNL_MSG_CT_GET_STATS_CPU; `conntrack -S` shows them).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize,
)]
#[serde(default)]
pub struct ConntrackCounters {
    /// Packets conntrack could not make sense of (no entry a mid-stream
    /// TCP segment belongs to, out of window, a bad header): ctstate INVALID.
    pub invalid: u64,
    /// Entries confirmed into the table.
    pub insert: u64,
    /// Entries that clashed at confirm (a race of two packets of one
    /// tuple, or a source NAT that found no free tuple): their packet dropped.
    pub insert_failed: u64,
    /// Packets dropped because no entry could be made (the table full).
    pub drop: u64,
    /// Entries evicted early to make room in a full table.
    pub early_drop: u64,
    /// ICMP errors for no known connection.
    pub error: u64,
    /// Clashes resolved without a drop (UDP's same-tuple race).
    pub clash_resolve: u64,
    /// Hash chains found too long (an entry refused).
    pub chain_toolong: u64,
}

impl ConntrackCounters {
    /// What grew since `start` (a counter that went down, none).
    pub fn since(&self, start: &Self) -> Self {
        let d = |now: u64, then: u64| now.saturating_sub(then);
        Self {
            invalid: d(self.invalid, start.invalid),
            insert: d(self.insert, start.insert),
            insert_failed: d(self.insert_failed, start.insert_failed),
            drop: d(self.drop, start.drop),
            early_drop: d(self.early_drop, start.early_drop),
            error: d(self.error, start.error),
            clash_resolve: d(self.clash_resolve, start.clash_resolve),
            chain_toolong: d(self.chain_toolong, start.chain_toolong),
        }
    }

    /// The failure counters that are not zero, by name (`insert` is no failure).
    pub fn failures(&self) -> Vec<(&'static str, u64)> {
        [
            ("insert_failed", self.insert_failed),
            ("drop", self.drop),
            ("early_drop", self.early_drop),
            ("invalid", self.invalid),
            ("error", self.error),
            ("clash_resolve", self.clash_resolve),
            ("chain_toolong", self.chain_toolong),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
    }
}

/// One node's conntrack table over the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConntrackTable {
    pub node: String,
    /// The counters when tracing began.
    pub start: ConntrackCounters,
    /// The counters when last read (at a drop, at the end).
    pub now: ConntrackCounters,
    /// nf_conntrack_count when last read.
    pub entries: u64,
    /// nf_conntrack_max.
    pub max: u64,
    /// net.netfilter.nf_conntrack_tcp_loose: whether a mid-stream segment
    /// of a connection conntrack did not see open may start an entry.
    pub tcp_loose: Option<bool>,
    /// net.netfilter.nf_conntrack_tcp_be_liberal: whether out-of-window
    /// segments are let through.
    pub tcp_be_liberal: Option<bool>,
    /// net.netfilter.nf_conntrack_tcp_timeout_established, in seconds.
    pub tcp_timeout_established: Option<u64>,
}

impl ConntrackTable {
    /// What grew over the run so far.
    pub fn grew(&self) -> ConntrackCounters {
        self.now.since(&self.start)
    }
}

/// A node's conntrack over the run, as the summary shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
#[serde(default)]
pub struct ConntrackRun {
    pub node: String,
    /// How much each counter grew over the run.
    pub grew: ConntrackCounters,
    /// nf_conntrack_count at the end.
    pub entries: u64,
    /// nf_conntrack_max.
    pub max: u64,
}

impl From<&ConntrackTable> for ConntrackRun {
    fn from(table: &ConntrackTable) -> Self {
        Self {
            node: table.node.clone(),
            grew: table.grew(),
            entries: table.entries,
            max: table.max,
        }
    }
}

/// One direction of a connection, as conntrack keys it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tuple {
    pub protocol: u8,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Ports (0 for port-less protocols).
    pub sport: u16,
    pub dport: u16,
}

/// A conntrack entry whose addresses are translated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The connection as its first packet was sent.
    pub orig: Tuple,
    /// The reply as the translated peer sends it.
    pub reply: Tuple,
    /// `IPS_*` status bits.
    pub status: u32,
    pub zone: u16,
    pub mark: u32,
}

pub(crate) const IPS_SRC_NAT: u32 = 1 << 4;
pub(crate) const IPS_DST_NAT: u32 = 1 << 5;

impl Entry {
    /// The destination was rewritten (DNAT: a Service).
    pub fn dnat(&self) -> bool {
        self.status & IPS_DST_NAT != 0
            && (self.orig.dst != self.reply.src || self.orig.dport != self.reply.sport)
    }

    /// The source was rewritten (SNAT, MASQUERADE).
    pub fn snat(&self) -> bool {
        self.status & IPS_SRC_NAT != 0
            && (self.orig.src != self.reply.dst || self.orig.sport != self.reply.dport)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_per_counter_and_never_negative() {
        let start = ConntrackCounters {
            insert_failed: 2,
            invalid: 9,
            ..Default::default()
        };
        let now = ConntrackCounters {
            insert_failed: 5,
            invalid: 3,
            insert: 4,
            ..Default::default()
        };
        let grew = now.since(&start);
        assert_eq!((grew.insert_failed, grew.invalid, grew.insert), (3, 0, 4));
        assert_eq!(grew.failures(), [("insert_failed", 3)]);
    }
}
