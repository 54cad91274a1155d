//! What an agent's records become in the front-end: wire records back
//! into the events the agent's stream loop handed over (`agent::Output`,
//! its mirror): hops held for the timeline, progress marks, rules, loss
//! windows, conntrack entries, probes, its summary.

use std::time::{Instant, SystemTime};

use crate::cluster::agents::Heard;
use crate::model::conntrack;
use crate::node::wireguard::WireGuard;

use anyhow::Result;

use super::{arrivals::Held, followed::record_kind, stories_context, Session};
use crate::{
    app::wire::{Read, Record},
    model::ProbeResult,
};

impl Session {
    /// One thing heard from an agent.
    pub(super) fn hear(&mut self, heard: Heard) -> Result<()> {
        let (node, text) = match heard {
            Heard::Line(node, text) => (node, text),
            Heard::Ended(node, why) => {
                self.ended(node, why);
                return Ok(());
            }
        };
        let Some(agent) = self.agents.get_mut(&node) else {
            return Ok(());
        };
        let record = match agent.reader.read(&text) {
            Read::Message(text) => {
                agent.last_heard = Some(("a message", SystemTime::now()));
                // The agent's own lines often name its node already.
                let text = text.trim_start_matches("podtrace: ");
                let text = text.strip_prefix(&format!("{node}: ")).unwrap_or(text);
                eprintln!("podtrace: {node}: {text}");
                if text.contains("'--send-headers'") {
                    eprintln!("podtrace: {node}: its agent image is older than this podtrace and cannot send the header bytes --write needs: give this version's image with --image");
                }
                return Ok(());
            }
            Read::Record(record) => record,
        };
        agent.last_heard = Some((record_kind(&record), SystemTime::now()));
        self.take(node, record)
    }

    /// One record an agent sent: wire records back into the events the
    /// agent's stream loop handed over (`agent::Output`, its mirror).
    pub(super) fn take(&mut self, node: String, record: Record) -> Result<()> {
        let Some(agent) = self.agents.get_mut(&node) else {
            return Ok(());
        };
        match record {
            Record::Start(start) => {
                self.arrivals
                    .started(Instant::now(), &node, start.reports_read_through);
                // Its clock first: its hops may come before every other
                // agent has started, and a crossing measured without its
                // offset would skew the node's placement for good.
                self.clocks.start(&start.node, start.realtime_offset_ns);
                agent.last_progress = Some((0, SystemTime::now()));
                agent.start = Some(*start);
            }
            Record::Hop(hop) => {
                let own = agent.start.as_ref().is_some_and(|s| s.node == hop.node);
                if !own && !self.foreign.first_sight(&hop) {
                    return Ok(());
                }
                agent.hops_heard += 1;
                self.clocks.observe(&hop);
                self.arrivals.hold(Instant::now(), node, Held::Hop(hop));
            }
            Record::ReadThrough { at_ns } => {
                agent.last_progress = Some((at_ns, SystemTime::now()));
                self.arrivals
                    .hold(Instant::now(), node, Held::ReadThrough(at_ns));
            }
            Record::Rule {
                src,
                dst,
                ip_id,
                rule,
                ..
            } => {
                let now = self.now_common(Instant::now());
                self.correlator.observe_rule((src, dst, ip_id), rule, now);
            }
            Record::Loss {
                from_ns,
                to_ns,
                kernel,
                agent: by_agent,
            } => {
                agent.lost_kernel += kernel;
                agent.lost_agent += by_agent;
                let placed = self.clocks.placements();
                let at = |t: u64| self.clocks.common_ns(&placed, &node, t);
                self.correlator.observe_loss(at(from_ns), at(to_ns));
            }
            Record::Conntrack {
                entry,
                untraced_until_ns,
            } => self.learn_conntrack(&node, &entry, untraced_until_ns),
            Record::ProbeSending { flow } => {
                if let Some(watch) = self.teller.as_mut().and_then(|t| t.probe.as_mut()) {
                    watch.sending(flow);
                }
            }
            Record::Probe { flow, result } => {
                // The last, or one that says none could be sent (no flow).
                if flow == 0 || result.seq >= self.probes_wanted {
                    self.probes_done = Some(Instant::now());
                }
                self.probe_results.push(ProbeResult {
                    flow_id: flow,
                    ..*result
                });
            }
            Record::Wireguard(state) => self.learn_wireguard(&node, *state),
            Record::Hooks { .. } | Record::Unknown => {}
            Record::Summary(summary) => agent.summary = Some(*summary),
        }
        Ok(())
    }

    /// The WireGuard state an agent read again: the stories told from
    /// now on judge by it, as node mode's read as they are told.
    fn learn_wireguard(&mut self, agent: &str, state: WireGuard) {
        // Into its start's facts too, which the context is made from once
        // every agent has started.
        let Some(start) = (self.agents.get_mut(agent)).and_then(|a| a.start.as_mut()) else {
            return;
        };
        start.facts.view.wireguard = state.clone();
        let node = start.node.clone();
        if let Some(facts) = stories_context(&mut self.teller, &mut self.ctx)
            .and_then(|ctx| ctx.nodes.get_mut(&node))
        {
            facts.view.wireguard = state;
        }
    }

    /// A translated connection an agent read from its node's conntrack,
    /// and until when (its kernel time) its addresses were untraced.
    fn learn_conntrack(&mut self, node: &str, entry: &conntrack::Entry, untraced_until_ns: u64) {
        // On the common timeline, as the hops.
        let untraced_until_ns = match untraced_until_ns {
            0 => 0,
            t => {
                let placed = self.clocks.placements();
                self.clocks.common_ns(&placed, node, t)
            }
        };
        // Before every agent has started, into the context the
        // correlator will be made from.
        if let Some(ctx) = stories_context(&mut self.teller, &mut self.ctx) {
            crate::app::connections::learn_translations(
                entry,
                untraced_until_ns,
                ctx,
                &mut self.correlator,
            );
        }
    }
}
