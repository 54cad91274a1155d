//! Cluster mode's front-end (`kubectl podtrace`, `podtrace --cluster-mode`):
//! no root, no node access, only the API.
//!
//! It resolves the pods as node mode does, starts an agent pod on each
//! node involved (`cluster::agents`), follows their logs, and merges
//! their records into the same journeys, stories and verdicts node mode
//! tells. Each node's kernel times are put on one timeline
//! (`story::clock`): hops are held for [`HOLD`] after they arrive, so that
//! the crossings that place their node's clock (a request's and its
//! reply's) are in before the hop is placed and correlated. Journeys are
//! finished no further than every agent's hops have come in
//! ([`Arrivals`]): one agent's stream falling behind holds them back
//! rather than cutting a packet that crossed to its node in two.

mod agent_nodes;
mod arrivals;
mod followed;
mod foreign;
mod lost;
mod records;

use std::{
    collections::BTreeMap,
    io::Write,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Result};
use tokio::sync::mpsc;

use agent_nodes::{agent_args, pick_nodes};
use arrivals::{Arrivals, HOLD, STALLED_AGENT};
use followed::Followed;
use foreign::ForeignSightings;

use super::{
    stop::Stop,
    story_context::context_of,
    stream::{correlator_for, drive, ends_with_probes, Ended, Source},
    targets::{vantage, Targets},
    teller::{new_teller, pcap_writer, Seen, Teller},
};
use crate::{
    cli::Args,
    cluster::agents::{self, Agents, Heard, START_PATIENCE},
    model::{ProbeResult, Summary},
    output::pcapng,
    story::{
        clock::Clocks,
        correlator::{Correlator, Waits},
        journey::Journey,
        Context,
    },
};

/// How long stopped agents may take to say their summary.
const END_PATIENCE: Duration = Duration::from_secs(15);

/// A trace through agent pods; what went wrong in the stories told
/// (`--fail`).
pub async fn run(args: Args) -> Result<Seen> {
    super::probing::check(&args)?;
    let mut stop = Stop::catch()?;
    let Some(targets) =
        super::stop::unless_stopped(Targets::resolve(&args, &[]), stop.recv()).await
    else {
        return Ok(Seen::default());
    };
    let targets = targets?;
    let Some(cluster) = &targets.cluster else {
        bail!("cluster mode needs the Kubernetes API (a kubeconfig), not --pods-file");
    };
    let client = cluster.client();
    let (nodes, untraced) = pick_nodes(&args, &targets)?;
    if let Some(probe) = args.probe.probe {
        // The source's agent sends it, from the pod's namespace.
        let src_node = Targets::node_of(&targets.src);
        if !src_node.is_some_and(|node| nodes.iter().any(|n| n == node)) {
            bail!("--probe {probe}: the source is not a pod on a traced node, whose agent would send it");
        }
    }
    // Before any agent starts: a path that cannot be written changes
    // nothing on the cluster.
    let write = args.write.as_deref().map(pcapng::open).transpose()?;
    let image = agents::image(client.clone(), args.image.as_ref(), &args.agent_namespace).await?;
    let mut agents = Agents::new(client.clone(), &args.agent_namespace).await?;
    let renewing = agents.renew();
    let mut session = Session::new(front_context(&args, &targets), untraced);
    session.write = write;
    let outcome = session
        .run(&args, &targets, &mut agents, &nodes, &image, &mut stop)
        .await;
    // Whatever happened: the agents go, then the lease.
    let stopped = agents.stop().await;
    let ended = session.drain(&agents).await;
    agents.wait_gone(Duration::from_secs(5)).await;
    renewing.abort();
    agents.release().await;
    if session.write.is_some() {
        // Opened but never begun: no empty file is left where a capture
        // was asked for.
        if let Some(path) = args.write.as_deref().filter(|p| *p != "-") {
            let _ = std::fs::remove_file(path);
        }
    }
    outcome?;
    ended?;
    let seen = session.finish(&agents)?;
    stopped.map(|()| seen)
}

/// Everything one cluster-mode trace holds while it runs.
struct Session {
    agents: BTreeMap<String, Followed>,
    heard: mpsc::UnboundedReceiver<Heard>,
    heard_tx: mpsc::UnboundedSender<Heard>,
    clocks: Clocks,
    arrivals: Arrivals,
    /// Sightings in other namespaces (a pod's own stack) that every agent
    /// of a shared kernel reports (the lab): told once.
    foreign: ForeignSightings,
    correlator: Correlator,
    teller: Option<Teller<'static>>,
    ctx: Option<Context>,
    /// Common time minus local monotonic time, from placed hops.
    lag_ns: Option<i64>,
    started_at: Instant,
    summary: Summary,
    wanted_more: bool,
    /// The agents were told to stop: only their last records are heard.
    draining: bool,
    /// `--probe`: the results the source's agent sent, and when the last
    /// came.
    probe_results: Vec<ProbeResult>,
    probes_done: Option<Instant>,
    probes_wanted: u32,
    /// `--write`, until every agent has said its node and the file's
    /// context is known.
    write: Option<Box<dyn Write>>,
}

/// The context stories are told in, before any agent said its node's.
fn front_context(args: &Args, targets: &Targets) -> Context {
    let mut ctx = context_of(args, targets);
    ctx.why_rule_unnamed = if args.no_ruleset_changes {
        "rule tracing is off (--no-ruleset-changes)"
    } else {
        crate::probe::netfilter::UNTRACED_DROP
    };
    ctx
}

impl Session {
    fn new(ctx: Context, untraced: Vec<String>) -> Self {
        let (heard_tx, heard) = mpsc::unbounded_channel();
        Self {
            agents: BTreeMap::new(),
            heard,
            heard_tx,
            clocks: Clocks::default(),
            arrivals: Arrivals::default(),
            foreign: ForeignSightings::default(),
            correlator: Correlator::new(Waits::default()),
            teller: None,
            ctx: Some(ctx),
            lag_ns: None,
            started_at: Instant::now(),
            summary: Summary {
                untraced_nodes: untraced,
                ..Default::default()
            },
            wanted_more: true,
            draining: false,
            probe_results: Vec::new(),
            probes_done: None,
            probes_wanted: 0,
            write: None,
        }
    }

    async fn run(
        &mut self,
        args: &Args,
        targets: &Targets,
        agents: &mut Agents,
        nodes: &[String],
        image: &str,
        stop: &mut Stop,
    ) -> Result<()> {
        self.summary.sample = args.sample;
        self.probes_wanted = args.probe.probe_count;
        let client = targets
            .cluster
            .as_ref()
            .map(|c| c.client())
            .ok_or_else(|| anyhow!("no API"))?;
        for node in nodes {
            let pod = agents
                .start(node, image, agent_args(args, targets, node), args.duration)
                .await?;
            eprintln!(
                "podtrace: {node}: agent pod {}/{pod} started",
                agents.namespace
            );
            agents::follow(
                client.clone(),
                &agents.namespace,
                node,
                &pod,
                self.heard_tx.clone(),
            );
            self.agents.insert(
                node.clone(),
                Followed {
                    pod,
                    ..Default::default()
                },
            );
        }
        if !self.wait_for_starts(stop).await? {
            return Ok(());
        }
        self.begin(args, targets, nodes)?;
        if args.probe.probe.is_some() {
            agents.say_all_tracing().await?;
        }
        self.stream(args, stop).await
    }

    /// Waits until every agent has said its Start; false on a stop.
    async fn wait_for_starts(&mut self, stop: &mut Stop) -> Result<bool> {
        let until = tokio::time::Instant::now() + START_PATIENCE;
        while self.agents.values().any(|a| a.start.is_none()) {
            tokio::select! {
                heard = self.heard.recv() => {
                    if let Some(heard) = heard { self.hear(heard)?; }
                    if let Some((node, agent)) = self.agents.iter().find(|(_, a)| a.ended && a.start.is_none()) {
                        match &agent.never_started {
                            Some(why) => bail!("the agent on {node} did not start: {why}"),
                            None => bail!("the agent on {node} ended before it began tracing (what it said, if anything, is above)"),
                        }
                    }
                }
                () = stop.recv() => return Ok(false),
                _ = tokio::time::sleep_until(until) => {
                    let late: Vec<&String> = self.agents.iter().filter(|(_, a)| a.start.is_none()).map(|(n, _)| n).collect();
                    bail!("the agents on {late:?} did not start tracing within {} s", START_PATIENCE.as_secs());
                }
            }
        }
        Ok(true)
    }

    /// Every agent traces: the timeline, the correlator, the banner and
    /// the `--write` file.
    fn begin(&mut self, args: &Args, targets: &Targets, nodes: &[String]) -> Result<()> {
        let mut ctx = self.ctx.take().unwrap_or_default();
        for node in nodes {
            if let Some(start) = self.agents.get(node).and_then(|a| a.start.as_ref()) {
                ctx.nodes
                    .insert(start.node.clone(), start.facts.clone().into());
                // Its doctor's failing checks, for the verdicts on its node.
                if !start.doctor.is_empty() {
                    ctx.doctor.insert(start.node.clone(), start.doctor.clone());
                }
                if let Some(why) = &start.rules_unseen {
                    ctx.rules_unseen.insert(start.node.clone(), why.clone());
                }
            }
        }
        self.correlator = correlator_for(&ctx, !args.no_ruleset_changes);
        self.summary.hooks_attached = self
            .agents
            .values()
            .filter_map(|a| a.start.as_ref())
            .map(|s| s.hooks)
            .sum();
        let ends = [&targets.src, &targets.dst].map(|e| {
            (
                e.name().unwrap_or_else(|| e.ip.to_string()),
                Targets::node_of(e),
            )
        });
        if let Some(view) = vantage([(&ends[0].0, ends[0].1), (&ends[1].0, ends[1].1)], nodes) {
            eprintln!("podtrace: {view}");
        }
        if let Some(untraced) = targets.untraced_ipv6() {
            eprintln!("podtrace: {untraced}");
        }
        let starts = self.agents.values().filter_map(|a| a.start.as_ref());
        for start in starts.clone() {
            if let Some(kernel) = start.kernel.as_ref().filter(|k| !k.degraded.is_empty()) {
                eprintln!(
                    "podtrace: {}: kernel {}: {}",
                    start.node,
                    kernel.release,
                    kernel.degraded.join("; ")
                );
            }
        }
        let watched: Vec<String> = starts
            .map(|s| format!("{} ({})", s.node, s.watched))
            .collect();
        eprintln!(
            "podtrace: tracing {} on {} through agent pods; Ctrl-C to stop",
            targets.named_pairs(&ctx),
            watched.join(", ")
        );
        let ends = targets.traced_ipv4_pair();
        let mut teller = new_teller(args, ctx, ends);
        if let Some(out) = self.write.take() {
            // Interfaces are announced as their first packet comes; the
            // hops are on the reference node's timeline.
            let pair = (targets.src.ip, targets.dst.ip);
            let mut pcap = pcap_writer(out, args, &[], pair, &teller.ctx)?;
            pcap.time_by(self.clocks.reference_offset_ns());
            teller.pcap = Some(pcap);
        }
        self.teller = Some(teller);
        Ok(())
    }

    /// Streams until a stop, `--duration`, `--count`, or every agent ended.
    async fn stream(&mut self, args: &Args, stop: &mut Stop) -> Result<()> {
        drive(self, Some(stop), args.duration, ends_with_probes(args)).await?;
        Ok(())
    }

    /// After the pods were deleted: their last records, until each log ends.
    async fn drain(&mut self, agents: &Agents) -> Result<()> {
        self.draining = true;
        if drive(self, None, Some(END_PATIENCE), false).await? == Ended::Deadline {
            eprintln!(
                "podtrace: agents in namespace {} did not end within {} s",
                agents.namespace,
                END_PATIENCE.as_secs()
            );
        }
        self.release(true)
    }

    /// Tells the journeys that are done (`all`: everything, at the end).
    fn release(&mut self, all: bool) -> Result<()> {
        let journeys = self.settle(Instant::now(), all);
        let placed = self.clocks.placements();
        let Some(teller) = &mut self.teller else {
            return Ok(());
        };
        teller.ctx.clock_uncertainty_ns = placed
            .iter()
            .filter_map(|(n, p)| Some((n.clone(), p.uncertainty_ns?)))
            .collect();
        if !teller.tell_all(&journeys)? {
            self.wanted_more = false;
        }
        Ok(())
    }

    /// Places the hops held long enough by `now` on the common timeline,
    /// correlates them, and takes the journeys that are done.
    fn settle(&mut self, now: Instant, all: bool) -> Vec<Journey> {
        let placed = self.clocks.placements();
        while let Some((at, agent, mut hop)) = self.arrivals.next_hop(now, all) {
            // The agent's kernel clock, also for what it saw in other
            // namespaces of its node.
            hop.ktime_ns = self.clocks.common_ns(&placed, &agent, hop.ktime_ns);
            if placed
                .get(&agent)
                .is_some_and(|p| p.uncertainty_ns.is_some())
            {
                let lag = hop.ktime_ns as i64 - self.local_ns(at);
                self.lag_ns = Some(self.lag_ns.map_or(lag, |l| l.max(lag)));
            }
            self.correlator.observe(hop);
        }
        if all {
            return self.correlator.take_all();
        }
        let changes = self.arrivals.check_stalls(now);
        for node in &changes.stalled {
            eprintln!(
                "podtrace: {node}: its agent has sent nothing for {} s: stories are told without waiting for it (a packet that went on to {node} may end as vanished where it left the nodes heard from)",
                STALLED_AGENT.as_secs()
            );
        }
        for node in &changes.resumed {
            eprintln!("podtrace: {node}: its agent is heard again; packets that crossed to {node} while it was silent were told without its hops");
        }
        let delivered = self.arrivals.delivered_ns(&self.clocks, &placed);
        self.correlator
            .take_finished(self.now_common(now).min(delivered))
    }

    fn local_ns(&self, at: Instant) -> i64 {
        at.saturating_duration_since(self.started_at).as_nanos() as i64
    }

    /// `now` on the common timeline, from the hops placed so far.
    fn now_common(&self, now: Instant) -> u64 {
        let local = self.local_ns(now) - HOLD.as_nanos() as i64;
        self.lag_ns.map_or(0, |lag| (local + lag).max(0) as u64)
    }

    /// The summary: the agents' counts, per node and in all; what went
    /// wrong in the stories told.
    fn finish(self, agents: &Agents) -> Result<Seen> {
        let Some(mut teller) = self.teller else {
            return Ok(Seen::default());
        };
        let mut summary = self.summary;
        let placed = self.clocks.placements();
        for (node, agent) in &self.agents {
            agent.add_counts(node, &agents.namespace, placed.get(node), &mut summary);
        }
        teller.tell_probes(self.probe_results, &mut summary)?;
        let seen = teller.finish(summary)?;
        followed::unless_agents_lost(&self.agents).map(|()| seen)
    }
}

/// The agents' logs as a stream loop's source.
impl Source for Session {
    type Event = Heard;

    fn tick_every(&self) -> Duration {
        Duration::from_millis(50)
    }

    async fn next(&mut self) -> Option<Heard> {
        self.heard.recv().await
    }

    async fn take(&mut self, heard: Heard) -> Result<()> {
        self.hear(heard)
    }

    async fn tick(&mut self) -> Result<()> {
        // While draining, what the agents sent while their pods were
        // being deleted is still queued: a tick would find them silent
        // (stalled) and tell stories without their hops. All is told
        // once drained.
        if self.draining {
            return Ok(());
        }
        self.release(false)
    }

    fn over(&self) -> bool {
        // Once drained, what is left to hear is every agent's end, even
        // past `--count`: their summaries count what they saw.
        let told_enough = !self.wanted_more && !self.draining;
        told_enough || self.agents.values().all(|a| a.ended)
    }

    fn probes_done(&self) -> Option<Instant> {
        self.probes_done
    }

    fn stories_under_way(&self) -> bool {
        self.correlator.pending() > 0
    }
}

/// The stories' context: the teller's once it tells, else the one the
/// correlator will be made from (before every agent has started). Takes
/// the two fields, not the session, so the correlator stays borrowable.
fn stories_context<'a>(
    teller: &'a mut Option<Teller<'static>>,
    held: &'a mut Option<Context>,
) -> Option<&'a mut Context> {
    match teller {
        Some(teller) => Some(&mut teller.ctx),
        None => held.as_mut(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        app::{
            story_context::{ARP_PATIENCE, JOURNEY_IDLE, JOURNEY_PATIENCE},
            wire::{Numbering, Record, Start, WireFacts},
        },
        decode::{
            hop::{tests::hop, Direction},
            tests as frames,
        },
        node::{
            interfaces::Role,
            wireguard::{WgDevice, WireGuard},
            NodeFacts,
        },
    };

    const MS: u64 = 1_000_000;

    /// One agent's log, line by line as the front-end hears it.
    struct Agent {
        node: &'static str,
        numbering: Numbering,
    }

    impl Agent {
        fn says(&mut self, session: &mut Session, record: Record) {
            let line = self.numbering.line(record);
            session.hear(Heard::Line(self.node.into(), line)).unwrap();
        }

        /// What its node saw of the ping, then that it read through 3 s.
        fn tells_the_ping(&mut self, session: &mut Session) {
            for record in ping_seen_on(self.node) {
                self.says(session, record);
            }
            self.says(session, Record::ReadThrough { at_ns: 3_000 * MS });
        }
    }

    /// Past every hold and wait, by the wall clock and by any agent that
    /// read through 3 s.
    fn past_every_wait() -> Instant {
        Instant::now() + HOLD + Duration::from_secs(5)
    }

    /// A session whose agents on n1 and n2 (one kernel clock, as in the
    /// lab) have started; `n2_reports`: n2 says how far it has read.
    fn two_agents(n2_reports: bool) -> (Session, Agent, Agent) {
        let mut session = Session::new(Context::default(), Vec::new());
        session.correlator = Correlator::new(Waits {
            idle_ns: JOURNEY_IDLE.as_nanos() as u64,
            patience_ns: JOURNEY_PATIENCE.as_nanos() as u64,
            arp_ns: ARP_PATIENCE.as_nanos() as u64,
            rules_traced: false,
            traced_destinations: vec!["10.244.0.0/16".parse().unwrap()],
        });
        let [mut n1, mut n2] = ["n1", "n2"].map(|node| Agent {
            node,
            numbering: Numbering::default(),
        });
        for (agent, reports_read_through) in [(&mut n1, true), (&mut n2, n2_reports)] {
            session
                .agents
                .insert(agent.node.into(), Followed::default());
            let start = Start {
                node: agent.node.into(),
                realtime_offset_ns: 0,
                watched: String::new(),
                hooks: 0,
                facts: WireFacts::from(&NodeFacts::default()),
                reports_read_through,
                doctor: Vec::new(),
                kernel: None,
                rules_unseen: None,
            };
            agent.says(&mut session, Record::Start(Box::new(start)));
            session.clocks.start(agent.node, 0);
        }
        (session, n1, n2)
    }

    /// What `node` saw of a ping from n1's pod to n2's at 10 ms.
    fn ping_seen_on(node: &str) -> Vec<Record> {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let seen = if node == "n1" {
            [
                (10 * MS, "veth1", Role::PodVeth, Direction::Ingress),
                (10 * MS + 10_000, "eth0", Role::Underlay, Direction::Egress),
            ]
        } else {
            [
                (10 * MS + 30_000, "eth0", Role::Underlay, Direction::Ingress),
                (10 * MS + 40_000, "veth2", Role::PodVeth, Direction::Egress),
            ]
        };
        seen.map(|(t, iface, role, direction)| {
            Record::Hop(Box::new(hop(t, node, iface, role, direction, &frame)))
        })
        .into()
    }

    fn nodes_of(journey: &Journey) -> Vec<&str> {
        journey.hops.iter().map(|h| &*h.node).collect()
    }

    #[test]
    fn a_packet_crossing_to_a_lagging_agent_is_one_story() {
        let (mut session, mut n1, mut n2) = two_agents(true);
        // n2's log is behind: it has told of what it read up to 5 ms.
        n2.says(&mut session, Record::ReadThrough { at_ns: 5 * MS });
        n1.tells_the_ping(&mut session);
        let later = past_every_wait();
        assert!(session.settle(later, false).is_empty());
        n2.tells_the_ping(&mut session);
        let told = session.settle(later, false);
        assert_eq!(told.len(), 1);
        assert_eq!(nodes_of(&told[0]), ["n1", "n1", "n2", "n2"]);
    }

    #[test]
    fn a_free_in_a_pod_both_agents_of_one_kernel_saw_is_told_once() {
        let (mut session, mut n1, mut n2) = two_agents(true);
        let delivered = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 62, 1);
        // Each agent's drop program read the clock itself: 600 ns apart.
        for (agent, t) in [(&mut n1, 10 * MS + 50_000), (&mut n2, 10 * MS + 50_600)] {
            let freed = crate::decode::hop::tests::drop_hop(
                t,
                "pod default/db-0",
                "eth0",
                Role::Other,
                &delivered,
                "NO_SOCKET",
            );
            agent.says(&mut session, Record::Hop(Box::new(freed)));
        }
        n1.tells_the_ping(&mut session);
        n2.tells_the_ping(&mut session);
        let told = session.settle(past_every_wait(), false);
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(
            nodes_of(&told[0]),
            ["n1", "n1", "n2", "n2", "pod default/db-0"]
        );
    }

    #[test]
    fn an_agent_that_ended_holds_nothing_back() {
        let (mut session, mut n1, _n2) = two_agents(true);
        n1.tells_the_ping(&mut session);
        let later = past_every_wait();
        // n2 never said how far it read…
        assert!(session.settle(later, false).is_empty());
        // …until its log ended.
        session.hear(Heard::Ended("n2".into(), None)).unwrap();
        let told = session.settle(later, false);
        assert_eq!(told.len(), 1);
        assert_eq!(nodes_of(&told[0]), ["n1", "n1"]);
    }

    #[test]
    fn a_stalled_agent_holds_stories_back_only_so_long() {
        let (mut session, mut n1, _n2) = two_agents(true);
        n1.tells_the_ping(&mut session);
        // n2 never says how far it read, nor ends.
        assert!(session.settle(past_every_wait(), false).is_empty());
        let much_later = past_every_wait() + STALLED_AGENT;
        let told = session.settle(much_later, false);
        assert_eq!(told.len(), 1);
        assert_eq!(nodes_of(&told[0]), ["n1", "n1"]);
    }

    #[test]
    fn an_agent_heard_again_holds_back_by_its_own_progress() {
        let (mut session, mut n1, mut n2) = two_agents(true);
        n1.tells_the_ping(&mut session);
        let later = past_every_wait() + STALLED_AGENT;
        assert_eq!(session.settle(later, false).len(), 1, "n2 stalled");
        // n2 comes back with its backlog, a hop at a time: its own
        // progress holds again, so the hops it still owes join.
        let mut backlog = ping_seen_on("n2").into_iter();
        n2.says(&mut session, backlog.next().unwrap());
        let after = past_every_wait();
        assert!(
            session.settle(after, false).is_empty(),
            "n2 has not said how far it read"
        );
        n2.says(&mut session, backlog.next().unwrap());
        n2.says(&mut session, Record::ReadThrough { at_ns: 3_000 * MS });
        let told = session.settle(after, false);
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(nodes_of(&told[0]), ["n2", "n2"]);
    }

    #[test]
    fn an_agent_too_old_to_say_how_far_it_read_holds_nothing_back() {
        let (mut session, mut n1, _n2) = two_agents(false);
        n1.tells_the_ping(&mut session);
        assert_eq!(session.settle(past_every_wait(), false).len(), 1);
    }

    #[test]
    fn a_wireguard_state_an_agent_read_again_judges_the_stories_told_next() {
        let (mut session, _n1, mut n2) = two_agents(true);
        let context = session.ctx.as_mut().expect("held until every agent traces");
        context.nodes.insert("n2".into(), NodeFacts::default());
        let narrowed = WireGuard {
            devices: vec![WgDevice {
                name: "wg0".into(),
                peers: vec![Default::default()],
                ..Default::default()
            }],
            read_at: 1_000,
            read_again: true,
            ..Default::default()
        };
        n2.says(&mut session, Record::Wireguard(Box::new(narrowed.clone())));
        let held = &session.ctx.as_ref().unwrap().nodes["n2"];
        assert_eq!(held.view.wireguard, narrowed);
        // And the context made once every agent traces starts from it.
        let start = session.agents["n2"].start.as_ref().unwrap();
        assert_eq!(start.facts.view.wireguard, narrowed);
    }
}
