//! The one stream loop ([`drive`], pwru's read → decode → hand over), and
//! its two sources: a traced node's kernel ([`NodeStream`]: its records
//! placed as hops, its netfilter rules, conntrack entries and link
//! changes, and the traced pods' moves, each handed to a [`Consumer`]:
//! node mode's local correlator ([`Local`]), or an agent's wire
//! (`agent::Output`)), and the agents' logs (the front-end's `Session`).
//! Profile mode's live progress runs on it too.

use std::{
    io::Write,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::Result;
use tokio::sync::mpsc;

use super::traced::TracedNode;
use super::{
    follow_move, learn_connection, link_changed,
    losses::LossWatch,
    probing::ProbeEvent,
    sightings::to_hop,
    stop::Stop,
    teller::{new_teller, pcap_writer, Teller},
    until, watch_moves, Trace, ARP_PATIENCE, JOURNEY_IDLE, JOURNEY_PATIENCE,
};
use crate::{
    cli::Args,
    cluster::api::PodMoved,
    decode::hop::Hop,
    model::{ProbeResult, Summary},
    probe::{
        clock::monotonic_ns, conntrack, link_watch::LinkChange, netfilter::TracedRule, Batch,
        RING_HANDOVER,
    },
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
    let ends = trace.targets.traced_ipv4_pair();
    let mut teller = new_teller(args, std::mem::take(&mut trace.ctx), ends);
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
        correlator.trace_for_joining((*a).into(), (*b).into());
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
                let own = facts
                    .view
                    .own_addresses()
                    .map(|ip| ipnet::IpNet::from(std::net::IpAddr::V4(ip)));
                facts.local_pod_subnets.iter().copied().chain(own)
            })
            .collect(),
    })
    .with_nat(ctx.nat.clone())
}

/// How long after the last probe its stories may take to be told (the
/// journey's patience, and its drop's rule).
pub(super) const PROBE_STORIES: Duration = JOURNEY_PATIENCE;
/// …and at most this long while one is still under way: a packet that
/// waits for ARP is freed by the kernel after its probes, and ending
/// before then told it `vanished`.
const PROBE_STORIES_AT_MOST: Duration = ARP_PATIENCE.saturating_add(JOURNEY_PATIENCE);

/// Whether the last probe's stories have had their time: each told, or
/// as long as the slowest may take.
fn probes_told(done: Option<Instant>, stories_under_way: bool) -> bool {
    done.is_some_and(|at| {
        let waited = at.elapsed();
        waited >= PROBE_STORIES && (!stories_under_way || waited >= PROBE_STORIES_AT_MOST)
    })
}

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
    /// Whether a story is still under way (correlated here, not told).
    fn stories_under_way(&self) -> bool {
        false
    }
}

/// What a stream loop hears from, and does with what it hears: a traced
/// node's kernel ([`NodeStream`]: node mode and the agent), or the agents'
/// logs (the front-end).
pub(super) trait Source {
    type Event;
    /// How often [`Source::tick`] runs.
    fn tick_every(&self) -> Duration;
    /// The next thing heard; `None` once nothing more will come. Must be
    /// cancel-safe: the loop drops it whenever another arm wins.
    async fn next(&mut self) -> Option<Self::Event>;
    /// One thing heard.
    async fn take(&mut self, event: Self::Event) -> Result<()>;
    /// The periodic step: what is done is told or handed on.
    async fn tick(&mut self) -> Result<()>;
    /// Whether the trace is over (`--count` reached, every agent ended, a
    /// lease lost).
    fn over(&self) -> bool {
        false
    }
    /// When `--probe`'s last probe ended, once it has.
    fn probes_done(&self) -> Option<Instant> {
        None
    }
    /// Whether a story is still under way (not told yet).
    fn stories_under_way(&self) -> bool {
        false
    }
}

/// Why a stream loop ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// The source said the trace is over, or went quiet for good.
    Over,
    /// Ctrl-C or SIGTERM.
    Stopped,
    /// `--duration`, or the loop's own deadline.
    Deadline,
    /// The last probe's stories were told.
    Probed,
}

/// The one stream loop (pwru's read → decode → hand over): everything
/// `source` hears, handed back to it as it comes, and its tick, until it
/// is over, `stop` (when given), `deadline`, or (`end_with_probes`) the
/// last probe's stories have had their time.
pub(super) async fn drive(
    source: &mut impl Source,
    mut stop: Option<&mut Stop>,
    deadline: Option<Duration>,
    end_with_probes: bool,
) -> Result<Ended> {
    let mut tick = tokio::time::interval(source.tick_every());
    let until_deadline = until(deadline);
    tokio::pin!(until_deadline);
    while !source.over() {
        tokio::select! {
            event = source.next() => match event {
                Some(event) => source.take(event).await?,
                None => return Ok(Ended::Over),
            },
            _ = tick.tick() => {
                source.tick().await?;
                if end_with_probes && probes_told(source.probes_done(), source.stories_under_way()) {
                    return Ok(Ended::Probed);
                }
            }
            () = stopped(&mut stop) => return Ok(Ended::Stopped),
            _ = &mut until_deadline => return Ok(Ended::Deadline),
        }
    }
    Ok(Ended::Over)
}

/// Whether a trace without `--count` or `--duration` ends once its probes'
/// stories are told.
pub(super) fn ends_with_probes(args: &Args) -> bool {
    args.count.is_none() && args.duration.is_none()
}

async fn stopped(stop: &mut Option<&mut Stop>) {
    match stop {
        Some(stop) => stop.recv().await,
        None => std::future::pending().await,
    }
}

/// Streams a traced node until Ctrl-C, SIGTERM, `--duration`, the consumer
/// says stop, or `gone` says why (an agent's lease went stale: returned).
pub(super) async fn stream(
    args: &Args,
    trace: &mut Trace,
    stop: &mut Stop,
    consumer: &mut impl Consumer,
    summary: &mut Summary,
    gone: mpsc::UnboundedReceiver<String>,
) -> Result<Option<String>> {
    let end_with_probes = consumer.ends_with_probes() && ends_with_probes(args);
    let mut node = NodeStream {
        moved: watch_moves(trace),
        traced_ips: trace.targets.traced_ipv4_pair(),
        losses: LossWatch::new(&trace.nodes, monotonic_ns()),
        trace,
        consumer,
        summary,
        gone,
        why_gone: None,
        probes_done: None,
        over: false,
    };
    drive(&mut node, Some(stop), args.duration, end_with_probes).await?;
    // Let the ring readers hand over what they have read, then take it.
    tokio::time::sleep(RING_HANDOVER).await;
    hand_over_queued(node.trace, node.summary, node.consumer).await;
    Ok(node.why_gone)
}

/// A traced node's kernel as a stream loop's [`Source`]: its records
/// placed as hops, its netfilter rules, conntrack entries and link
/// changes, the traced pods' moves and `--probe`, each handed to a
/// [`Consumer`].
struct NodeStream<'a, C> {
    trace: &'a mut Trace,
    consumer: &'a mut C,
    summary: &'a mut Summary,
    moved: mpsc::UnboundedReceiver<PodMoved>,
    /// The traced IPv4 pair, as pods move (IPv6 addresses are not
    /// followed to a new pod).
    traced_ips: Option<(Ipv4Addr, Ipv4Addr)>,
    losses: LossWatch,
    /// Says why the trace must end (an agent's lease went stale).
    gone: mpsc::UnboundedReceiver<String>,
    why_gone: Option<String>,
    probes_done: Option<Instant>,
    over: bool,
}

/// What a traced node's kernel and its watchers say.
enum NodeEvent {
    Sightings(Batch),
    Probe(ProbeEvent),
    ProbesDone,
    Moved(PodMoved),
    Rule(TracedRule),
    Conntrack(conntrack::Entry),
    Link(u32, LinkChange),
    Gone(String),
}

impl<C: Consumer> Source for NodeStream<'_, C> {
    type Event = NodeEvent;

    fn tick_every(&self) -> Duration {
        self.consumer.tick_every()
    }

    async fn next(&mut self) -> Option<NodeEvent> {
        let trace = &mut *self.trace;
        tokio::select! {
            batch = trace.sightings.recv() => batch.map(NodeEvent::Sightings),
            event = next_probe_event(&mut trace.probes) => {
                Some(event.map_or(NodeEvent::ProbesDone, NodeEvent::Probe))
            }
            Some(moved) = self.moved.recv() => Some(NodeEvent::Moved(moved)),
            Some((_node, rule)) = trace.rules.recv() => Some(NodeEvent::Rule(rule)),
            Some((_node, entry)) = trace.conntrack.recv() => Some(NodeEvent::Conntrack(entry)),
            Some((node, change)) = trace.links.recv() => Some(NodeEvent::Link(node, change)),
            Some(why) = self.gone.recv() => Some(NodeEvent::Gone(why)),
            else => None,
        }
    }

    async fn take(&mut self, event: NodeEvent) -> Result<()> {
        match event {
            NodeEvent::Sightings(batch) => {
                for sighting in &batch {
                    if let Some(hop) = to_hop(sighting, self.trace, self.summary).await {
                        self.consumer.hop(hop);
                    }
                }
            }
            NodeEvent::Probe(event) => self.consumer.probe(event),
            NodeEvent::ProbesDone => {
                self.trace.probes = None;
                self.probes_done = Some(Instant::now());
            }
            NodeEvent::Moved(moved) => {
                if let Some(traced_ips) = &mut self.traced_ips {
                    follow_move(self.trace, traced_ips, &moved)?;
                }
                self.consumer.moved(&moved);
            }
            NodeEvent::Rule(rule) => self.consumer.rule(rule, monotonic_ns()),
            NodeEvent::Conntrack(entry) => self.consumer.conntrack(entry, self.trace).await?,
            NodeEvent::Link(node, change) => {
                link_changed(self.trace, node, change, self.summary);
                self.consumer.hooks(self.summary.hooks_attached);
            }
            NodeEvent::Gone(why) => {
                self.why_gone = Some(why);
                self.over = true;
            }
        }
        Ok(())
    }

    async fn tick(&mut self) -> Result<()> {
        // Read before the queue is taken: every record stamped before it
        // is then handed over, whichever node sent it.
        let read_through = self.trace.read_through();
        hand_over_queued(self.trace, self.summary, self.consumer).await;
        let now = monotonic_ns();
        let loss = self.losses.check(&self.trace.nodes, now)?;
        if !self.consumer.tick(read_through, now, loss)? {
            self.over = true;
        }
        Ok(())
    }

    fn over(&self) -> bool {
        self.over
    }

    fn probes_done(&self) -> Option<Instant> {
        self.probes_done
    }

    fn stories_under_way(&self) -> bool {
        self.consumer.stories_under_way()
    }
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

    fn stories_under_way(&self) -> bool {
        self.correlator.pending() > 0
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
