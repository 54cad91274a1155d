//! A netfilter rule as podtrace names it: the rule that dropped or
//! translated a traced packet, the path of rules it matched on the way,
//! and the packet identity the rule tracing and the kernel records share.

use serde::{Deserialize, Serialize};

/// The rule that gave a traced packet its final DROP, or translated its
/// addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct NetfilterRule {
    /// `nat` for iptables' tables; `<family> <name>` (`ip kube-proxy`) for
    /// native nft tables, as `nft list table` names them.
    pub table: String,
    pub chain: String,
    /// The hook the packet entered the table by: iptables' base chain
    /// (FORWARD, INPUT, …), or the hook a native table's base chain
    /// declares (forward), whatever that chain is named.
    pub hook: String,
    /// As iptables-save prints it (`-A FORWARD … -j DROP`) in iptables'
    /// tables; in native nft tables as `nft -a list` prints it
    /// (`meta l4proto tcp dnat to 10.244.2.3:8080 # handle 58`).
    pub rule: String,
    /// For a drop: every rule the packet matched from the base chain it
    /// was dropped in (nft traces each hook's pass through a table on its
    /// own), first to last, the drop's own rule last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<PathRule>,
}

/// A DROP verdict or a nat rule from the trace, and the packet it was for
/// (its addresses as the rule saw them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracedRule {
    pub src: std::net::IpAddr,
    pub dst: std::net::IpAddr,
    pub ip_id: u16,
    pub rule: NetfilterRule,
}

/// How a packet is known across signals: source, destination, IP ID.
pub type PacketId = (std::net::IpAddr, std::net::IpAddr, u16);

/// One rule the packet matched on its way to the drop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct PathRule {
    /// As [`super::netfilter::NetfilterRule::table`] names it.
    pub table: String,
    pub chain: String,
    /// As the drop's own rule is named.
    pub rule: String,
    /// What the rule did with the packet, as nft traces it: `continue`
    /// (a rule without a verdict, such as a mark or a comment alone),
    /// `jump X`, `goto X`, `return`, `accept`, `drop`.
    pub verdict: String,
    /// For a jump or a goto: the first rule of the chain it went to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_head: Option<String>,
}

impl PathRule {
    /// The chain a jump or goto sent the packet to.
    pub fn target(&self) -> Option<&str> {
        self.verdict
            .strip_prefix("jump ")
            .or_else(|| self.verdict.strip_prefix("goto "))
            .map(str::trim)
    }
}

/// A rule's verdict that handed the packet to a userspace program by
/// nfqueue (kube-network-policies decides there, as an IPS may): the
/// kernel drops it if nothing reads the queue and the rule has no bypass,
/// and the program may drop it; otherwise it goes on.
pub fn is_queue(verdict: &str) -> bool {
    verdict == "queue" || verdict.starts_with("queue ")
}

/// An nft `queue` statement: the queues it hands packets to (a fanout
/// spreads them over a range) and whether it has a bypass (no reader:
/// the packet goes on instead of being dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueStatement {
    pub first: u16,
    pub last: u16,
    pub bypass: bool,
}

impl QueueStatement {
    /// From a rule as nft lists it: `queue to 98`, `queue flags
    /// bypass,fanout to 98-99` (nft ≥ 1.0), `queue num 98 bypass` (older
    /// nft), a bare `queue` (queue 0: nft prints no number for it).
    /// `None` for a rule with no queue statement, or one whose number is
    /// an expression (`queue to jhash …`): its queues are not known.
    pub fn of_nft(rule: &str) -> Option<Self> {
        let statement = rule.split(" # handle").next().unwrap_or(rule);
        let words: Vec<&str> = statement.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "queue")?;
        let words = &words[at + 1..];
        let (first, last) = match words.iter().position(|w| *w == "to" || *w == "num") {
            Some(at) => {
                let range = words.get(at + 1)?;
                let (first, last) = range.split_once('-').unwrap_or((range, range));
                (first.parse().ok()?, last.parse().ok()?)
            }
            None => (0, 0),
        };
        let bypass = words.iter().any(|w| w.contains("bypass"));
        Some(Self {
            first,
            last,
            bypass,
        })
    }

    /// The queue numbers it hands packets to.
    pub fn queues(&self) -> std::ops::RangeInclusive<u16> {
        self.first..=self.last
    }
}

/// Where in the queueing the kernel freed a packet a rule queued to
/// userspace, from the drop's location (`function+offset`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueFate {
    /// In `nf_queue`: nothing read the queue and the rule had no bypass.
    Unread,
    /// In `nf_reinject` or nfnetlink_queue's `nfqnl_*`: the program read
    /// it and its verdict was a drop.
    DroppedByProgram,
}

impl QueueFate {
    /// `None` where the packet was freed outside the queueing: not the
    /// queueing rule's drop.
    pub fn of(location: &str) -> Option<Self> {
        let function = location.split('+').next().unwrap_or(location);
        match function {
            "nf_queue" => Some(Self::Unread),
            "nf_reinject" => Some(Self::DroppedByProgram),
            _ if function.starts_with("nfqnl_") => Some(Self::DroppedByProgram),
            _ => None,
        }
    }
}

impl NetfilterRule {
    /// Whether this rule queued the packet to userspace rather than
    /// dropping it (the last rule of its path).
    pub fn queued(&self) -> bool {
        self.path.last().is_some_and(|r| is_queue(&r.verdict))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_statement_is_read_in_every_nft_spelling() {
        let of = |rule| QueueStatement::of_nft(rule);
        let q = |first, last, bypass| {
            Some(QueueStatement {
                first,
                last,
                bypass,
            })
        };
        assert_eq!(
            of("ip saddr @podips-v4 queue to 98 # handle 7"),
            q(98, 98, false)
        );
        assert_eq!(of("ct state new queue flags bypass to 98"), q(98, 98, true));
        assert_eq!(of("queue flags bypass,fanout to 98-99"), q(98, 99, true));
        assert_eq!(of("queue num 98 bypass"), q(98, 98, true));
        assert_eq!(of("meta l4proto tcp queue"), q(0, 0, false));
        assert_eq!(of("queue to jhash ip saddr mod 2"), None);
        assert_eq!(of("ip saddr 10.0.0.1 drop"), None);
    }

    #[test]
    fn where_a_queued_packet_was_freed_says_who_dropped_it() {
        assert_eq!(QueueFate::of("nf_queue+0x1a4"), Some(QueueFate::Unread));
        assert_eq!(
            QueueFate::of("nf_reinject+0x2c"),
            Some(QueueFate::DroppedByProgram)
        );
        assert_eq!(
            QueueFate::of("nfqnl_recv_verdict+0x310"),
            Some(QueueFate::DroppedByProgram)
        );
        // Not the queueing: a function whose name merely starts alike.
        assert_eq!(QueueFate::of("nf_queue_nf_hook_drop+0x10"), None);
        assert_eq!(QueueFate::of("nf_hook_slow+0x91"), None);
    }
}
