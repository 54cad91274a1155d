//! What agents said, held for [`HOLD`] before it is placed on the common
//! timeline, and how far each agent's hops are through: one agent's
//! stream falling behind holds journeys back rather than cutting a packet
//! that crossed to its node in two.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    time::{Duration, Instant},
};

use crate::{
    decode::hop::Hop,
    story::clock::{Clocks, Placement},
};

/// How long a hop waits before it is placed on the timeline.
pub(super) const HOLD: Duration = Duration::from_millis(300);
/// How long an agent may say nothing before stories stop waiting for it.
pub(super) const STALLED_AGENT: Duration = Duration::from_secs(10);
/// What an agent said that waits for [`HOLD`] after it came.
pub(super) enum Held {
    Hop(Box<Hop>),
    /// The agent had read through this kernel time: every hop it stamped
    /// before then came before this.
    ReadThrough(u64),
    /// Its log ended: nothing more comes from it.
    Ended,
}

/// How far an agent's hops are in the correlator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Delivered {
    /// It has not said yet: no journey may finish.
    Nothing,
    /// Every hop it stamped before this kernel time.
    Through(u64),
    /// All it will send: it ended, or it is older than `ReadThrough`
    /// (then, as before, only [`HOLD`] waits for it).
    Everything,
}

/// What agents said, held for [`HOLD`] in the order it came, and how far
/// each agent's hops are through it. An agent's stream can fall behind
/// the others' (its ring reader or its log, at line rate): a journey must
/// not finish while hops of it may still be on their way from there.
#[derive(Default)]
pub(super) struct Arrivals {
    held: VecDeque<(Instant, String, Held)>,
    delivered: BTreeMap<String, Delivered>,
    /// When each agent was last heard from.
    last_heard: BTreeMap<String, Instant>,
    /// Agents silent for [`STALLED_AGENT`]: they hold nothing back until
    /// they are heard again.
    stalled: BTreeSet<String>,
}

/// Agents that fell silent, or were heard again, since the last check.
#[derive(Debug, Default, PartialEq)]
pub(super) struct StallChanges {
    pub stalled: Vec<String>,
    pub resumed: Vec<String>,
}

impl Arrivals {
    /// `agent` started tracing at `at`; `reports_read_through`: it will
    /// say how far it has read.
    pub(super) fn started(&mut self, at: Instant, agent: &str, reports_read_through: bool) {
        let delivered = if reports_read_through {
            Delivered::Nothing
        } else {
            Delivered::Everything
        };
        self.delivered.insert(agent.to_string(), delivered);
        self.last_heard.insert(agent.to_string(), at);
    }

    pub(super) fn hold(&mut self, at: Instant, agent: String, held: Held) {
        self.last_heard.insert(agent.clone(), at);
        self.held.push_back((at, agent, held));
    }

    /// Which agents have been silent for [`STALLED_AGENT`] by `now` (a
    /// live agent says how far it has read ten times a second): a stalled
    /// log must not keep every story untold. One heard again holds
    /// stories back by its own progress again, so its late hops join one
    /// another rather than being told piecemeal.
    pub(super) fn check_stalls(&mut self, now: Instant) -> StallChanges {
        let mut changes = StallChanges::default();
        for (agent, at) in &self.last_heard {
            let silent = now.saturating_duration_since(*at) >= STALLED_AGENT;
            let ended = self.delivered.get(agent) == Some(&Delivered::Everything);
            if silent && !ended && self.stalled.insert(agent.clone()) {
                changes.stalled.push(agent.clone());
            } else if !silent && self.stalled.remove(agent) {
                changes.resumed.push(agent.clone());
            }
        }
        changes
    }

    /// The next hop held long enough by `now` (`all`: any), with when it
    /// came and from which agent. What agents said of their progress
    /// before it counts on the way: the hops it covers are out already.
    pub(super) fn next_hop(&mut self, now: Instant, all: bool) -> Option<(Instant, String, Hop)> {
        while let Some((at, _, _)) = self.held.front() {
            if !all && now.saturating_duration_since(*at) < HOLD {
                return None;
            }
            let (at, agent, held) = self.held.pop_front()?;
            let delivered = match held {
                Held::Hop(hop) => return Some((at, agent, *hop)),
                Held::ReadThrough(ktime_ns) => Delivered::Through(ktime_ns),
                Held::Ended => Delivered::Everything,
            };
            self.delivered.insert(agent, delivered);
        }
        None
    }

    /// The slowest agent's progress on the common timeline: every hop
    /// stamped before it is in the correlator. An agent whose clock is not
    /// measured yet is read on its wall clock, where its hops are placed.
    pub(super) fn delivered_ns(&self, clocks: &Clocks, placed: &HashMap<String, Placement>) -> u64 {
        self.delivered
            .iter()
            .filter(|(agent, _)| !self.stalled.contains(*agent))
            .map(|(agent, delivered)| match *delivered {
                Delivered::Nothing => 0,
                Delivered::Through(ktime_ns) => clocks.common_ns(placed, agent, ktime_ns),
                Delivered::Everything => u64::MAX,
            })
            .min()
            .unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalls_are_noticed_once_and_so_is_the_return() {
        let mut arrivals = Arrivals::default();
        let t0 = Instant::now();
        arrivals.started(t0, "n2", true);
        assert_eq!(arrivals.check_stalls(t0 + HOLD), StallChanges::default());
        let silent = t0 + STALLED_AGENT;
        assert_eq!(arrivals.check_stalls(silent).stalled, ["n2"]);
        assert_eq!(arrivals.check_stalls(silent), StallChanges::default());
        arrivals.hold(silent, "n2".into(), Held::ReadThrough(0));
        assert_eq!(arrivals.check_stalls(silent).resumed, ["n2"]);
    }
}
