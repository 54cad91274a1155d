//! Agents lost mid-trace: a log that ended before the agent's summary
//! (the agent killed, its node gone) or broke off (the API lost). Said at
//! once; the packets that went on to its node after its last progress
//! mark are told incomplete, not vanished; and the run fails.

use std::{
    collections::BTreeMap,
    time::{Instant, SystemTime},
};

use anyhow::{bail, Result};

use super::{arrivals::Held, followed::Followed, stories_context, Session};
use crate::{app::wire::Record, story::lost_agents::LostAgent};

impl Session {
    /// `node`'s log ended (`why`: how, when it broke off). Without the
    /// agent's summary first, the agent was lost: said at once, and the
    /// packets that went on to its node after its last progress mark are
    /// told incomplete, not vanished.
    pub(super) fn ended(&mut self, node: String, why: Option<String>) {
        let Some(agent) = self.agents.get_mut(&node) else {
            return;
        };
        agent.ended = true;
        if agent.start.is_none() {
            // Said as the run's error, by the wait for the agents' starts.
            agent.never_started = why;
        } else if agent.summary.is_some() {
            if let Some(why) = why {
                eprintln!("podtrace: {node}: {why}");
            }
        } else {
            let (what, since) = agent.lose(&node, why.as_deref(), SystemTime::now());
            // Its probes' results may never come: a run that ends with
            // its probes does not wait for them. (Without --probe the run
            // goes on with the agents left.)
            if self.probes_wanted > 0 {
                self.probes_done.get_or_insert_with(Instant::now);
            }
            eprintln!("podtrace: {what}: packets that went on to {node} are told incomplete");
            let placed = self.clocks.placements();
            let lost = LostAgent {
                since_ns: self.clocks.common_ns(&placed, &node, since),
                node: node.clone(),
                what,
            };
            if let Some(ctx) = stories_context(&mut self.teller, &mut self.ctx) {
                ctx.lost_agents.push(lost);
            }
        }
        self.arrivals.hold(Instant::now(), node, Held::Ended);
    }
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
        Record::Summary(_) => "its summary",
        Record::Unknown => "a record this front-end does not know",
    }
}
