//! The one stream loop of a trace on this host (pwru's read → decode →
//! hand over): the nodes' records placed as hops, their netfilter rules,
//! conntrack entries and link changes, and the traced pods' moves, each
//! handed to a [`Consumer`]: node mode's local correlator ([`Local`]), or
//! an agent's wire (`agent::Output`).

use std::{io::Write, time::Duration};

use anyhow::Result;
use ipnet::Ipv4Net;
use tokio::sync::mpsc;

use super::traced::TracedNode;
use super::{
    follow_move, learn_connection, link_changed,
    losses::LossWatch,
    probing::ProbeEvent,
    stop::Stop,
    teller::{new_teller, pcap_writer, Teller},
    to_hop, until, watch_moves, Trace, ARP_PATIENCE, JOURNEY_IDLE, JOURNEY_PATIENCE,
};
use crate::{
    cli::Args,
    cluster::api::PodMoved,
    decode::hop::Hop,
    model::{ProbeResult, Summary},
    probe::{clock::monotonic_ns, conntrack, netfilter::TracedRule, RING_HANDOVER},
    story::{
        correlator::{Correlator, Waits},
        Context,
    },
};

/// Streams until Ctrl-C, SIGTERM, `--duration` or `--count`; returns the
/// summary so far and a teller holding what is still to be told.
pub(super) async fn here(
    args: &Args,
    trace: &mut Trace,
    stop: &mut Stop,
    write: Option<Box<dyn Write>>,
) -> Result<(Summary, Teller<'static>)> {
    let ends = (trace.targets.src.ip, trace.targets.dst.ip);
    let mut teller = new_teller(args, std::mem::take(&mut trace.ctx), Some(ends));
    if let Some(out) = write {
        teller.pcap = Some(pcap_writer(out, args, trace, &teller.ctx)?);
    }
    let mut summary = Summary {
        hooks_attached: trace.nodes.iter().map(TracedNode::hooks).sum(),
        sample: args.sample,
        kernel: Some(trace.kernel_summary.clone()),
        ..Default::default()
    };
    let mut correlator = correlator_for(&teller.ctx, trace.rules_traced);
    for (a, b) in &trace.joining_only {
        correlator.trace_for_joining(*a, *b);
    }
    let mut local = Local {
        teller,
        correlator,
        probes: Vec::new(),
    };
    // Node mode has no lease to lose.
    let (_, no_lease) = mpsc::unbounded_channel();
    stream(args, trace, stop, &mut local, &mut summary, no_lease).await?;
    let Local {
        mut teller,
        mut correlator,
        probes,
    } = local;
    teller.tell_all(&correlator.take_all())?;
    teller.tell_probes(probes, &mut summary)?;
    Ok((summary, teller))
}

/// The correlator for a trace told with `ctx`, node mode's and the
/// front-end's alike.
pub(super) fn correlator_for(ctx: &Context, rules_traced: bool) -> Correlator {
    Correlator::new(Waits {
        idle_ns: JOURNEY_IDLE.as_nanos() as u64,
        patience_ns: JOURNEY_PATIENCE.as_nanos() as u64,
        arp_ns: ARP_PATIENCE.as_nanos() as u64,
        rules_traced,
        // The traced nodes' pods, and the nodes themselves: a packet sent
        // to a traced node's own address is seen again when it arrives.
        traced_destinations: ctx
            .nodes
            .values()
            .flat_map(|facts| {
                let own = facts.view.own_addresses().map(Ipv4Net::from);
                facts.local_pod_subnets.iter().copied().chain(own)
            })
            .collect(),
    })
    .with_nat(ctx.nat.clone())
}

/// How long after the last probe its stories may take to be told (the
/// journey's patience, and its drop's rule).
pub(super) const PROBE_STORIES: Duration = JOURNEY_PATIENCE;

/// Where the stream loop's events go.
pub(super) trait Consumer {
    /// How often [`Consumer::tick`] runs.
    fn tick_every(&self) -> Duration;
    /// One sighting, placed.
    fn hop(&mut self, hop: Hop);
    /// Every record stamped before `read_through` has been handed over;
    /// `loss` is a window (from, to, count) of records the kernel lost.
    /// Returns whether to go on (`--count` may be reached).
    fn tick(&mut self, read_through: u64, now: u64, loss: Option<(u64, u64, u64)>) -> Result<bool>;
    /// A traced pod came back with a new IP (already traced).
    fn moved(&mut self, moved: &PodMoved);
    /// A netfilter rule that dropped a traced packet.
    fn rule(&mut self, rule: TracedRule, at_ns: u64);
    /// A node's conntrack entry.
    async fn conntrack(&mut self, entry: conntrack::Entry, trace: &mut Trace) -> Result<()>;
    /// The number of attached hooks changed.
    fn hooks(&mut self, hooks: usize);
    /// `--probe`: a probe goes out, or its result.
    fn probe(&mut self, _event: ProbeEvent) {}
    /// Whether the trace ends once the probes' stories are told (without
    /// `--count` or `--duration`).
    fn ends_with_probes(&self) -> bool {
        true
    }
}

/// Streams until Ctrl-C, SIGTERM, `--duration`, the consumer says stop,
/// or `gone` says why (an agent's lease went stale: returned).
pub(super) async fn stream(
    args: &Args,
    trace: &mut Trace,
    stop: &mut Stop,
    consumer: &mut impl Consumer,
    summary: &mut Summary,
    mut gone: mpsc::UnboundedReceiver<String>,
) -> Result<Option<String>> {
    let mut moved_rx = watch_moves(trace);
    let mut traced_ips = (trace.targets.src.ip, trace.targets.dst.ip);
    let mut losses = LossWatch::new(&trace.nodes, monotonic_ns());
    let mut tick = tokio::time::interval(consumer.tick_every());
    let until_deadline = until(args.duration);
    tokio::pin!(until_deadline);
    let mut why_gone = None;
    // When the last probe ended: its stories are told soon after.
    let mut probes_done: Option<tokio::time::Instant> = None;
    let ends_with_probes =
        consumer.ends_with_probes() && args.count.is_none() && args.duration.is_none();
    loop {
        tokio::select! {
            batch = trace.sightings.recv() => {
                let Some(batch) = batch else { break };
                for sighting in &batch {
                    if let Some(hop) = to_hop(sighting, trace, summary).await {
                        consumer.hop(hop);
                    }
                }
            }
            _ = tick.tick() => {
                // Read before the queue is taken: every record stamped
                // before it is then handed over, whichever node sent it.
                let read_through = trace.read_through();
                hand_over_queued(trace, summary, consumer).await;
                let now = monotonic_ns();
                let loss = losses.check(&trace.nodes, now)?;
                if !consumer.tick(read_through, now, loss)? {
                    break;
                }
                if ends_with_probes && probes_done.is_some_and(|at| at.elapsed() >= PROBE_STORIES) {
                    break;
                }
            }
            event = next_probe_event(&mut trace.probes) => match event {
                Some(event) => consumer.probe(event),
                None => {
                    trace.probes = None;
                    probes_done = Some(tokio::time::Instant::now());
                }
            },
            Some(moved) = moved_rx.recv() => {
                follow_move(trace, &mut traced_ips, &moved)?;
                consumer.moved(&moved);
            }
            Some((_node, rule)) = trace.rules.recv() => consumer.rule(rule, monotonic_ns()),
            Some((_node, entry)) = trace.conntrack.recv() => consumer.conntrack(entry, trace).await?,
            Some((node, change)) = trace.links.recv() => {
                link_changed(trace, node, change, summary);
                consumer.hooks(summary.hooks_attached);
            }
            Some(why) = gone.recv() => { why_gone = Some(why); break }
            () = stop.recv() => break,
            _ = &mut until_deadline => break,
        }
    }
    // Let the ring readers hand over what they have read, then take it.
    tokio::time::sleep(RING_HANDOVER).await;
    hand_over_queued(trace, summary, consumer).await;
    Ok(why_gone)
}

/// What `--probe`'s thread says next; `None` once it is done, and never
/// without probes.
async fn next_probe_event(
    probes: &mut Option<mpsc::UnboundedReceiver<ProbeEvent>>,
) -> Option<ProbeEvent> {
    match probes {
        Some(probes) => probes.recv().await,
        None => std::future::pending().await,
    }
}

/// Every batch queued now, placed and handed over.
async fn hand_over_queued(trace: &mut Trace, summary: &mut Summary, consumer: &mut impl Consumer) {
    for batch in trace.take_queued() {
        for sighting in &batch {
            if let Some(hop) = to_hop(sighting, trace, summary).await {
                consumer.hop(hop);
            }
        }
    }
}

/// Node mode's consumer: journeys correlated here and told.
pub(super) struct Local {
    pub teller: Teller<'static>,
    pub correlator: Correlator,
    /// `--probe`'s results, told after the stories.
    pub probes: Vec<ProbeResult>,
}

impl Consumer for Local {
    fn tick_every(&self) -> Duration {
        JOURNEY_IDLE / 2
    }

    fn hop(&mut self, hop: Hop) {
        self.correlator.observe(hop);
    }

    fn tick(&mut self, read_through: u64, now: u64, loss: Option<(u64, u64, u64)>) -> Result<bool> {
        if let Some((from, to, _)) = loss {
            self.correlator.observe_loss(from, to);
        }
        let finished = self.correlator.take_finished(read_through.min(now));
        Ok(self.teller.tell_all(&finished)?)
    }

    fn moved(&mut self, moved: &PodMoved) {
        self.teller.rename(moved.new, moved.pod.clone());
    }

    fn rule(&mut self, rule: TracedRule, at_ns: u64) {
        self.correlator
            .observe_rule((rule.src, rule.dst, rule.ip_id), rule.rule, at_ns);
    }

    async fn conntrack(&mut self, entry: conntrack::Entry, trace: &mut Trace) -> Result<()> {
        learn_connection(&entry, trace, &mut self.teller.ctx, &mut self.correlator).await
    }

    fn hooks(&mut self, _hooks: usize) {}

    fn probe(&mut self, event: ProbeEvent) {
        match event {
            ProbeEvent::Sending(flow) => {
                if let Some(watch) = &mut self.teller.probe {
                    watch.sending(flow);
                }
            }
            ProbeEvent::Done(result) => self.probes.push(result),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decode::{
            hop::{tests::hop, Direction},
            tests as frames,
        },
        node::{interfaces::Role, NodeFacts},
    };

    #[test]
    fn a_packet_sent_to_a_traced_nodes_own_address_waits_for_its_arrival() {
        let mut ctx = Context::default();
        let mut node_2 = NodeFacts::default();
        node_2.view.addresses = vec![(2, "192.0.2.12".parse().unwrap())];
        ctx.nodes.insert("node-2".into(), node_2);
        let mut correlator = correlator_for(&ctx, false);
        let frame = frames::icmp_echo([10, 244, 1, 2], [192, 0, 2, 12], 63, 1);
        let leaving = hop(
            0,
            "node-1",
            "eth0",
            Role::Underlay,
            Direction::Egress,
            &frame,
        );
        correlator.observe(leaving);
        let idle = JOURNEY_IDLE.as_nanos() as u64;
        assert!(correlator.take_finished(idle + 1).is_empty());
        let patience = JOURNEY_PATIENCE.as_nanos() as u64;
        assert_eq!(correlator.take_finished(patience + 1).len(), 1);
    }
}
