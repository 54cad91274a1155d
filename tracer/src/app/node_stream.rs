//! A traced node's kernel as a stream loop's source ([`NodeStream`]: its
//! records placed as hops, its netfilter rules, conntrack entries and link
//! changes, and the traced pods' moves), each handed to a [`Consumer`]:
//! node mode's local correlator ([`Local`]), or an agent's wire
//! (`agent::Output`). Linux only, as what it reads.

use std::{
    io::Write,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::Result;
use tokio::sync::mpsc;

use super::traced::TracedNode;
use super::{
    follow::{follow_move, learn_connection, watch_moves},
    losses::LossWatch,
    probing::ProbeEvent,
    sightings::to_hop,
    stop::Stop,
    story_context::JOURNEY_IDLE,
    stream::{correlator_for, drive, ends_with_probes, Source},
    teller::{new_teller, pcap_writer, ConntrackReader, Teller, WireguardReader},
    trace::{link_changed, Trace},
};
use crate::model::conntrack;
use crate::model::netfilter::TracedRule;
use crate::{
    cli::Args,
    cluster::api::PodMoved,
    decode::hop::Hop,
    model::{ProbeResult, Summary},
    node::wireguard_watch::Watch,
    output::pcapng::Announced,
    probe::{
        clock::monotonic_ns, conntrack_stats::ConntrackStats, link_watch::LinkChange, Batch,
        RING_HANDOVER,
    },
    story::correlator::Correlator,
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
    // Before the context goes to the teller: each watch starts from the
    // state its node's facts hold.
    let wireguard_now = wireguard_reader(trace);
    let mut teller = new_teller(args, std::mem::take(&mut trace.ctx), ends);
    teller.conntrack_now = conntrack_reader(trace);
    teller.wireguard_now = wireguard_now;
    if let Some(out) = write {
        let watched = announced(trace);
        let ends = (trace.targets.src.ip, trace.targets.dst.ip);
        teller.pcap = Some(pcap_writer(out, args, &watched, ends, &teller.ctx)?);
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
                    hand_over(sighting, self.trace, self.summary, self.consumer).await;
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
            hand_over(sighting, trace, summary, consumer).await;
        }
    }
}

/// The sighting placed as a hop, and any WireGuard drop that waited for
/// the leg it is (`EncryptedLegs::wait_for_leg`), handed to `consumer`.
async fn hand_over(
    sighting: &podtrace_common::sighting::Sighting,
    trace: &mut Trace,
    summary: &mut Summary,
    consumer: &mut impl Consumer,
) {
    if let Some(hop) = to_hop(sighting, trace, summary).await {
        consumer.hop(hop);
    }
    if let Some(paired) = trace.encrypted_legs.take_paired() {
        paired.for_each(|hop| consumer.hop(hop));
    }
}

/// Every interface the trace watches, announced in the `--write` file
/// before any packet (by node, in ifindex order).
fn announced(trace: &Trace) -> Vec<Announced<'_>> {
    let mut watched = Vec::new();
    for node in &trace.nodes {
        let mut ifaces: Vec<_> = node.interfaces.values().collect();
        ifaces.sort_by_key(|w| w.index);
        watched.extend(ifaces.into_iter().map(|w| Announced {
            node: &node.name,
            iface: &w.name,
            role: w.role,
            has_l2: w.has_ethernet_header,
        }));
    }
    watched
}

/// Reads the traced nodes' conntrack counters (each socket bound to its
/// node's namespace), taken from the nodes for the teller; none when no
/// node's could be read.
fn conntrack_reader(trace: &mut Trace) -> Option<ConntrackReader> {
    let mut readers: Vec<ConntrackStats> = (trace.nodes.iter_mut())
        .filter_map(|node| node.conntrack_stats.take())
        .collect();
    if readers.is_empty() {
        return None;
    }
    Some(Box::new(move || {
        (readers.iter_mut())
            .filter_map(|r| r.read().ok().cloned())
            .collect()
    }))
}

/// Reads a traced node's WireGuard devices (each socket bound to its
/// node's namespace), taken from the nodes for the teller; none when no
/// node has one.
fn wireguard_reader(trace: &mut Trace) -> Option<WireguardReader> {
    let mut watches: Vec<(String, Watch)> = (trace.nodes.iter_mut())
        .filter_map(|node| {
            let reader = node.wireguard_now.take()?;
            let at_start = (trace.ctx.nodes.get(&*node.name))
                .map(|facts| facts.view.wireguard.clone())
                .unwrap_or_default();
            Some((node.name.to_string(), Watch::new(reader, at_start)))
        })
        .collect();
    if watches.is_empty() {
        return None;
    }
    Some(Box::new(move |node: &str| {
        let (_, watch) = watches.iter_mut().find(|(name, _)| name == node)?;
        watch.refresh();
        Some(watch.state().clone())
    }))
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
