//! One agent as the front-end follows it, what it counted, for the
//! summary, and how it ended.

use std::{collections::BTreeMap, time::SystemTime};

use anyhow::{bail, Result};

use crate::{
    app::wire::{Reader, Record, Start},
    model::{NodeCounts, Summary},
    story::clock::Placement,
};

/// One agent as the front-end follows it.
#[derive(Default)]
pub(super) struct Followed {
    pub pod: String,
    pub start: Option<Start>,
    pub reader: Reader,
    pub summary: Option<Summary>,
    pub ended: bool,
    pub lost_kernel: u64,
    pub lost_agent: u64,
    /// Hops it sent: what arrived, when its own count never does.
    pub hops_heard: u64,
    /// Its last progress mark (kernel time it had read through), and when
    /// it came.
    pub last_progress: Option<(u64, SystemTime)>,
    /// Its last record or message, and when it came.
    pub last_heard: Option<(&'static str, SystemTime)>,
    /// What became of it when it was lost mid-trace (its log ended before
    /// its summary).
    pub lost: Option<String>,
    /// Why its log ended before it began tracing (its pod refused, its
    /// image not pulled, …), if it said.
    pub never_started: Option<String>,
}

impl Followed {
    /// Adds its counts to `summary`, in all and as its node's line
    /// (`placement`: its clock on the common timeline, if measured).
    pub(super) fn add_counts(
        &self,
        node: &str,
        agents_namespace: &str,
        placement: Option<&Placement>,
        summary: &mut Summary,
    ) {
        let own = self.summary.clone().unwrap_or_default();
        let lost_kernel = self
            .lost_kernel
            .max(own.lost_ringbuf_full + own.lost_snapshot);
        let lost_agent = self.lost_agent.max(own.lost_agent);
        let lost_transport = self.reader.lost.saturating_sub(lost_agent)
            + u64::from(self.summary.is_none() && self.start.is_some());
        let sightings = own.sightings.max(self.hops_heard);
        summary.sightings += sightings;
        summary.lost_ringbuf_full += own.lost_ringbuf_full;
        summary.lost_snapshot += own.lost_snapshot;
        summary.filtered_in_kernel += own.filtered_in_kernel;
        summary.undecodable += own.undecodable;
        summary.wireguard_legs_untold += own.wireguard_legs_untold;
        summary.other_pairs_encapsulated += own.other_pairs_encapsulated;
        summary.unknown_interface += own.unknown_interface;
        summary.drops_elsewhere += own.drops_elsewhere;
        summary.drops_without_netns += own.drops_without_netns;
        summary.interfaces_vanished += own.interfaces_vanished;
        summary.interfaces_added += own.interfaces_added;
        summary.lost_agent += lost_agent;
        summary.lost_transport += lost_transport;
        summary.nodes.push(NodeCounts {
            node: node.to_string(),
            agent: format!("{agents_namespace}/{}", self.pod),
            kernel: self.start.as_ref().and_then(|s| s.kernel.clone()),
            sightings,
            lost_kernel,
            lost_agent,
            lost_transport,
            clock: placement.map(|p| match p.uncertainty_ns {
                Some(0) => "the reference".into(),
                Some(u) => format!(
                    "{:+.1} µs ±{:.1} µs against the reference",
                    -(p.correction_ns as f64) / 1e3,
                    u as f64 / 1e3
                ),
                None => "unmeasured (no traced packet crossed to it)".into(),
            }),
            lost: self.lost.clone(),
        });
    }

    /// Its log ended (`why`: how, when it broke off) before its summary:
    /// what became of it, in one line, and from when its node's hops are
    /// missing (its last progress mark, in its kernel time).
    pub(super) fn lose(&mut self, node: &str, why: Option<&str>, now: SystemTime) -> (String, u64) {
        let how = match why {
            // Said by the follower: the log broke off, or the node killed
            // the agent (evicted, OOM-killed).
            Some(why) => why.to_string(),
            None => "its log ended without its summary".to_string(),
        };
        let mut what = format!("{node}'s agent was lost at {}: {how}", wall(now));
        match self.last_heard {
            Some((record, at)) => what.push_str(&format!("; last heard at {}: {record}", wall(at))),
            None => what.push_str("; nothing was heard from it"),
        }
        let since = match self.last_progress {
            Some((ktime_ns, at)) => {
                what.push_str(&format!("; {node}'s hops after {} never came", wall(at)));
                ktime_ns
            }
            None => 0,
        };
        self.lost = Some(what.clone());
        (what, since)
    }
}

/// A wall-clock time as podtrace's messages give it (UTC, to the ms).
fn wall(at: SystemTime) -> humantime::Rfc3339Timestamp {
    humantime::format_rfc3339_millis(at)
}

/// An error naming the agents lost mid-trace, if any: their nodes'
/// stories may be incomplete.
pub(super) fn unless_agents_lost(agents: &BTreeMap<String, Followed>) -> Result<()> {
    let lost: Vec<&str> = agents
        .iter()
        .filter(|(_, a)| a.lost.is_some())
        .map(|(node, _)| node.as_str())
        .collect();
    if !lost.is_empty() {
        bail!("the agents on {} were lost mid-trace: the stories of packets that went on to their nodes are incomplete", lost.join(", "));
    }
    Ok(())
}

/// What a record is, for "last heard" when its agent is lost.
pub(super) fn record_kind(record: &Record) -> &'static str {
    match record {
        Record::Start(_) => "its start",
        Record::Hop(_) => "a hop",
        Record::Rule { .. } => "a netfilter rule",
        Record::Conntrack { .. } => "a conntrack entry",
        Record::Loss { .. } => "a loss report",
        Record::Hooks { .. } => "its hooks",
        Record::ReadThrough { .. } => "a progress mark",
        Record::ProbeSending { .. } | Record::Probe { .. } => "a probe",
        Record::Wireguard(_) => "its WireGuard state",
        Record::Summary(_) => "its summary",
        Record::Unknown => "a record this front-end does not know",
    }
}
