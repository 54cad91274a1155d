//! A node's netfilter queues, as read inside its netns: the rules that
//! hand packets to a userspace program (`nft -a list ruleset`), and the
//! queues programs read (/proc/net/netfilter/nfnetlink_queue). What the
//! `nfqueue readers` check (nfqueue.rs) judges.

use crate::model::netfilter::QueueStatement;

/// What the node's netfilter queues are: the rules that queue, and the
/// queues a program has bound.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Queues {
    pub rules: Vec<QueueRule>,
    /// `None`: nfnetlink_queue is not loaded, so no program reads any
    /// queue.
    pub bound: Option<Vec<BoundQueue>>,
}

/// One rule with a queue statement, where nft lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueRule {
    /// `inet kube-network-policies`.
    pub table: String,
    pub chain: String,
    pub rule: String,
    pub statement: QueueStatement,
}

/// One line of /proc/net/netfilter/nfnetlink_queue: a queue a program
/// reads, and what the kernel dropped of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoundQueue {
    pub number: u16,
    /// The reader's netlink port.
    pub portid: u32,
    /// Dropped for want of room in the queue.
    pub queue_dropped: u64,
    /// Dropped because the reader's socket could not take them.
    pub user_dropped: u64,
}

/// The queue rules of `nft list ruleset`'s text, by table and chain.
pub fn parse_ruleset(text: &str) -> Vec<QueueRule> {
    let (mut table, mut chain) = (String::new(), String::new());
    let mut rules = Vec::new();
    for line in text.lines().map(str::trim) {
        // `nft -a` ends tables', chains' and rules' lines with their handle.
        let line = line.split(" # handle").next().unwrap_or(line);
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["table", family, name, "{"] => table = format!("{family} {name}"),
            ["chain", name, "{"] => chain = name.to_string(),
            _ => {
                // A set's or map's elements are no rule.
                let statement =
                    (!line.starts_with("elements")).then(|| QueueStatement::of_nft(line));
                if let Some(Some(statement)) = statement {
                    rules.push(QueueRule {
                        table: table.clone(),
                        chain: chain.clone(),
                        rule: line.to_string(),
                        statement,
                    });
                }
            }
        }
    }
    rules
}

/// /proc/net/netfilter/nfnetlink_queue's lines (queue, peer port, queue
/// total, copy mode, copy range, queue dropped, user dropped, id
/// sequence, 1).
pub fn parse_bound(text: &str) -> Vec<BoundQueue> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<u64> = (line.split_whitespace())
                .map(|f| f.parse().ok())
                .collect::<Option<_>>()?;
            Some(BoundQueue {
                number: u16::try_from(*fields.first()?).ok()?,
                portid: u32::try_from(*fields.get(1)?).ok()?,
                queue_dropped: *fields.get(5)?,
                user_dropped: *fields.get(6)?,
            })
        })
        .collect()
}
