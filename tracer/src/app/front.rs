//! Cluster mode's front-end (`kubectl podtrace`, `podtrace --cluster`):
//! no root, no node access, only the API.
//!
//! It resolves the pods as node mode does, starts an agent pod on each
//! node involved (`cluster::agents`), follows their logs, and merges
//! their records into the same journeys, stories and verdicts node mode
//! tells. Each node's kernel times are put on one timeline
//! (`story::clock`): hops are held for [`HOLD`] after they arrive, so that
//! the crossings that place their node's clock (a request's and its
//! reply's) are in before the hop is placed and correlated.

use std::{
    collections::{BTreeMap, HashSet, VecDeque},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Result};
use tokio::sync::mpsc;

use super::{
    context_of, new_teller, stop::Stop, teller::Teller, ARP_PATIENCE, JOURNEY_IDLE,
    JOURNEY_PATIENCE,
};
use crate::{
    cli::Args,
    cluster::{
        agents::{self, Agents, Heard},
        targets::{vantage, Targets},
        wire::{Read, Reader, Record, Start},
    },
    decode::hop::Hop,
    output::{NodeCounts, Summary},
    probe::conntrack,
    story::{
        clock::Clocks,
        journey::{Correlator, Waits},
        Context,
    },
};

/// How long a hop waits before it is placed on the timeline.
const HOLD: Duration = Duration::from_millis(300);
/// How long agents may take to start (image pull, attach).
const START_PATIENCE: Duration = Duration::from_secs(120);
/// How long stopped agents may take to say their summary.
const END_PATIENCE: Duration = Duration::from_secs(15);

pub async fn run(args: Args) -> Result<()> {
    let mut stop = Stop::catch()?;
    let targets = tokio::select! {
        targets = Targets::resolve(&args) => targets?,
        () = stop.recv() => return Ok(()),
    };
    let Some(cluster) = &targets.cluster else {
        bail!("cluster mode needs the Kubernetes API (a kubeconfig), not --pods-file");
    };
    let client = cluster.client();
    let (nodes, untraced) = pick_nodes(&args, &targets)?;
    let image = agents::image(client.clone(), args.image.as_ref(), &args.agent_namespace).await;
    let mut agents = Agents::new(client.clone(), &args.agent_namespace).await?;
    let renewing = agents.renew();
    let mut session = Session::new(&args, &targets, untraced);
    let outcome = session
        .run(&args, &targets, &mut agents, &nodes, &image, &mut stop)
        .await;
    // Whatever happened: the agents go, then the lease.
    agents.stop().await;
    let ended = session.drain(&agents).await;
    agents.wait_gone(Duration::from_secs(5)).await;
    renewing.abort();
    agents.release().await;
    outcome?;
    ended?;
    session.finish(&agents)
}

/// The nodes to trace (the pods' own, a Service's backends', then
/// `--nodes`), and the cluster's other nodes.
fn pick_nodes(args: &Args, targets: &Targets) -> Result<(Vec<String>, Vec<String>)> {
    let all: Vec<String> = targets.subnets.iter().map(|s| s.node.clone()).collect();
    let mut nodes: Vec<String> = Vec::new();
    // A Service's backends run where its EndpointSlices say.
    let backends = targets
        .service
        .iter()
        .flat_map(|s| &s.backends)
        .filter_map(|b| b.node.as_deref());
    for node in [&targets.src, &targets.dst]
        .into_iter()
        .filter_map(Targets::node_of)
        .chain(backends)
    {
        if !nodes.iter().any(|n| n == node) {
            nodes.push(node.to_string());
        }
    }
    let extra: Vec<String> = match args.nodes.as_deref() {
        Some("all") => all.clone(),
        Some(list) => list
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect(),
        None => Vec::new(),
    };
    for node in extra {
        if !all.is_empty() && !all.contains(&node) {
            bail!(
                "node {node} is not in the cluster (it has {})",
                all.join(", ")
            );
        }
        if !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    if nodes.is_empty() {
        bail!("cluster mode traces the nodes of pods: neither endpoint is a pod with a node; name one with --nodes");
    }
    let untraced = all.into_iter().filter(|n| !nodes.contains(n)).collect();
    Ok((nodes, untraced))
}

/// One agent as the front-end follows it.
#[derive(Default)]
struct Followed {
    pod: String,
    start: Option<Start>,
    reader: Reader,
    summary: Option<Summary>,
    ended: bool,
    lost_kernel: u64,
    lost_agent: u64,
}

/// Everything one cluster-mode trace holds while it runs.
struct Session {
    agents: BTreeMap<String, Followed>,
    heard: mpsc::UnboundedReceiver<Heard>,
    heard_tx: mpsc::UnboundedSender<Heard>,
    clocks: Clocks,
    /// Hops waiting for [`HOLD`]: when they came, from which agent.
    held: VecDeque<(Instant, String, Hop)>,
    /// Sightings in other namespaces (a pod's own stack) that every agent
    /// of a shared kernel reports (the lab): told once.
    foreign: HashSet<(String, u64, String)>,
    correlator: Correlator,
    teller: Option<Teller<'static>>,
    ctx: Option<Context>,
    /// Common time minus local monotonic time, from placed hops.
    lag_ns: Option<i64>,
    started_at: Instant,
    summary: Summary,
    wanted_more: bool,
}

impl Session {
    fn new(args: &Args, targets: &Targets, untraced: Vec<String>) -> Self {
        let (heard_tx, heard) = mpsc::unbounded_channel();
        let mut ctx = context_of(args, targets);
        ctx.why_rule_unnamed = if args.no_ruleset_changes {
            "rule tracing is off (--no-ruleset-changes)"
        } else {
            crate::probe::netfilter::UNTRACED_DROP
        };
        Self {
            agents: BTreeMap::new(),
            heard,
            heard_tx,
            clocks: Clocks::default(),
            held: VecDeque::new(),
            foreign: HashSet::new(),
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
        self.begin(args, targets, nodes);
        self.stream(args, stop).await
    }

    /// Waits until every agent has said its Start; false on a stop.
    async fn wait_for_starts(&mut self, stop: &mut Stop) -> Result<bool> {
        let until = tokio::time::Instant::now() + START_PATIENCE;
        while self.agents.values().any(|a| a.start.is_none()) {
            tokio::select! {
                heard = self.heard.recv() => {
                    if let Some(heard) = heard { self.hear(heard)?; }
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

    /// Every agent traces: the timeline, the correlator and the banner.
    fn begin(&mut self, args: &Args, targets: &Targets, nodes: &[String]) {
        let mut ctx = self.ctx.take().unwrap_or_default();
        for node in nodes {
            if let Some(start) = self.agents.get(node).and_then(|a| a.start.as_ref()) {
                self.clocks.start(&start.node, start.realtime_offset_ns);
                ctx.nodes
                    .insert(start.node.clone(), start.facts.clone().into());
            }
        }
        self.correlator = Correlator::new(Waits {
            idle_ns: JOURNEY_IDLE.as_nanos() as u64,
            patience_ns: JOURNEY_PATIENCE.as_nanos() as u64,
            arp_ns: ARP_PATIENCE.as_nanos() as u64,
            rules_traced: !args.no_ruleset_changes,
            traced_destinations: ctx
                .nodes
                .values()
                .flat_map(|f| f.local_pod_subnets.iter().copied())
                .collect(),
        })
        .with_nat(ctx.nat.clone());
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
        let watched: Vec<String> = self
            .agents
            .values()
            .filter_map(|a| a.start.as_ref())
            .map(|s| format!("{} ({})", s.node, s.watched))
            .collect();
        eprintln!(
            "podtrace: tracing {} ⇄ {} on {} through agent pods; Ctrl-C to stop",
            ctx.label(targets.src.ip),
            ctx.label(targets.dst.ip),
            watched.join(", ")
        );
        self.teller = Some(new_teller(args, ctx));
    }

    /// Streams until a stop, `--duration`, `--count`, or every agent ended.
    async fn stream(&mut self, args: &Args, stop: &mut Stop) -> Result<()> {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let until_deadline = super::until(args.duration);
        tokio::pin!(until_deadline);
        while self.wanted_more && self.agents.values().any(|a| !a.ended) {
            tokio::select! {
                heard = self.heard.recv() => {
                    if let Some(heard) = heard { self.hear(heard)?; }
                }
                _ = tick.tick() => self.release(false)?,
                () = stop.recv() => break,
                _ = &mut until_deadline => break,
            }
        }
        Ok(())
    }

    /// After the pods were deleted: their last records, until each log ends.
    async fn drain(&mut self, agents: &Agents) -> Result<()> {
        let until = tokio::time::Instant::now() + END_PATIENCE;
        while self.agents.values().any(|a| !a.ended) {
            tokio::select! {
                heard = self.heard.recv() => match heard {
                    Some(heard) => self.hear(heard)?,
                    None => break,
                },
                _ = tokio::time::sleep_until(until) => {
                    eprintln!("podtrace: agents in namespace {} did not end within {} s", agents.namespace, END_PATIENCE.as_secs());
                    break;
                }
            }
        }
        self.release(true)
    }

    /// One thing heard from an agent.
    fn hear(&mut self, heard: Heard) -> Result<()> {
        let (node, text) = match heard {
            Heard::Line(node, text) => (node, text),
            Heard::Ended(node, why) => {
                if let Some(why) = why {
                    eprintln!("podtrace: {node}: {why}");
                }
                if let Some(agent) = self.agents.get_mut(&node) {
                    agent.ended = true;
                }
                return Ok(());
            }
        };
        let Some(agent) = self.agents.get_mut(&node) else {
            return Ok(());
        };
        let record = match agent.reader.read(&text) {
            Read::Message(text) => {
                // The agent's own lines often name its node already.
                let text = text.trim_start_matches("podtrace: ");
                let text = text.strip_prefix(&format!("{node}: ")).unwrap_or(text);
                eprintln!("podtrace: {node}: {text}");
                return Ok(());
            }
            Read::Record(record) => record,
        };
        match record {
            Record::Start(start) => agent.start = Some(*start),
            Record::Hop(hop) => {
                let own = agent.start.as_ref().is_some_and(|s| s.node == hop.node);
                if !own
                    && !self.foreign.insert((
                        hop.node.to_string(),
                        hop.ktime_ns,
                        format!("{:?}", hop.drop),
                    ))
                {
                    return Ok(());
                }
                self.clocks.observe(&hop);
                self.held.push_back((Instant::now(), node, *hop));
            }
            Record::Rule {
                src,
                dst,
                ip_id,
                rule,
                ..
            } => {
                let now = self.now_common();
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
            Record::Hooks { .. } => {}
            Record::Summary(summary) => agent.summary = Some(*summary),
        }
        Ok(())
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
        let ctx = match (&mut self.teller, &mut self.ctx) {
            (Some(teller), _) => Some(&mut teller.ctx),
            (None, ctx) => ctx.as_mut(),
        };
        if let Some(ctx) = ctx {
            super::learn_translations(entry, untraced_until_ns, ctx, &mut self.correlator);
        }
    }

    /// Places held hops on the common timeline, correlates them, and tells
    /// the journeys that are done (`all`: everything, at the end).
    fn release(&mut self, all: bool) -> Result<()> {
        let placed = self.clocks.placements();
        while let Some((at, _, _)) = self.held.front() {
            if !all && at.elapsed() < HOLD {
                break;
            }
            let Some((at, agent, mut hop)) = self.held.pop_front() else {
                break;
            };
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
        let journeys = if all {
            self.correlator.take_all()
        } else {
            self.correlator.take_finished(self.now_common())
        };
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

    fn local_ns(&self, at: Instant) -> i64 {
        at.saturating_duration_since(self.started_at).as_nanos() as i64
    }

    /// Now on the common timeline, from the hops placed so far.
    fn now_common(&self) -> u64 {
        let local = self.local_ns(Instant::now()) - HOLD.as_nanos() as i64;
        self.lag_ns.map_or(0, |lag| (local + lag).max(0) as u64)
    }

    /// The summary: the agents' counts, per node and in all.
    fn finish(self, agents: &Agents) -> Result<()> {
        let Some(teller) = self.teller else {
            return Ok(());
        };
        let mut summary = self.summary;
        let placed = self.clocks.placements();
        for (node, agent) in &self.agents {
            let own = agent.summary.clone().unwrap_or_default();
            let lost_kernel = agent
                .lost_kernel
                .max(own.lost_ringbuf_full + own.lost_snapshot);
            let lost_agent = agent.lost_agent.max(own.lost_agent);
            let lost_transport = agent.reader.lost.saturating_sub(lost_agent)
                + u64::from(agent.summary.is_none() && agent.start.is_some());
            summary.sightings += own.sightings;
            summary.lost_ringbuf_full += own.lost_ringbuf_full;
            summary.lost_snapshot += own.lost_snapshot;
            summary.undecodable += own.undecodable;
            summary.unknown_interface += own.unknown_interface;
            summary.interfaces_vanished += own.interfaces_vanished;
            summary.interfaces_added += own.interfaces_added;
            summary.lost_agent += lost_agent;
            summary.lost_transport += lost_transport;
            summary.nodes.push(NodeCounts {
                node: node.clone(),
                agent: format!("{}/{}", agents.namespace, agent.pod),
                sightings: own.sightings,
                lost_kernel,
                lost_agent,
                lost_transport,
                clock: placed.get(node).map(|p| match p.uncertainty_ns {
                    Some(0) => "the reference".into(),
                    Some(u) => format!(
                        "{:+.1} µs ±{:.1} µs against the reference",
                        -(p.correction_ns as f64) / 1e3,
                        u as f64 / 1e3
                    ),
                    None => "unmeasured (no traced packet crossed to it)".into(),
                }),
            });
        }
        teller.finish(summary)?;
        Ok(())
    }
}

/// The agent's arguments: the pods by name (the agent resolves them
/// through the API too) and the trace flags that matter on a node.
fn agent_args(args: &Args, targets: &Targets, node: &str) -> Vec<String> {
    let endpoint = |arg: &str, e: &crate::cluster::inventory::Endpoint| {
        e.pod.as_ref().map_or(arg.to_string(), |p| p.qualified())
    };
    let mut out = vec![
        endpoint(&args.src, &targets.src),
        endpoint(&args.dst, &targets.dst),
        "-n".into(),
        args.kube.namespace.clone(),
    ];
    for cidr in &args.pod_cidr {
        out.extend(["--pod-cidr".into(), cidr.to_string()]);
    }
    out.extend([
        "--attach".into(),
        format!("{:?}", args.attach).to_lowercase(),
    ]);
    if args.no_ruleset_changes {
        out.push("--no-ruleset-changes".into());
    }
    if let Some(skew) = &args.clock_skew_for_testing {
        let (target, value) = match skew.split_once('=') {
            Some((n, v)) => (Some(n), v),
            None => (Targets::node_of(&targets.dst), skew.as_str()),
        };
        if target == Some(node) {
            out.extend(["--clock-skew-for-testing".into(), value.into()]);
        }
    }
    out
}
