//! One trace, from arguments to stories: resolve the pods, attach to every
//! traced node, correlate, tell, and detach.

use std::{
    collections::HashMap,
    io::{IsTerminal, Write},
    net::Ipv4Addr,
    time::Duration,
};

use anyhow::{bail, Result};
use podtrace_common::{counter, FlowKey, Sighting, MAX_NODES};
use tokio::{signal::unix::SignalKind, sync::mpsc};

use crate::{
    cli::Args,
    inventory::{self, Endpoint},
    journey::{Correlator, Journey},
    netfilter::{Backend, NetfilterRule, PacketId},
    profile::Profile,
    render::{Renderer, Summary},
    story::{self, Context},
    targets::{vantage, Targets},
    traced::{place, Kernel, Namespace, Shared, TracedNode},
};

/// A journey is done once nothing joined it for this long.
const JOURNEY_IDLE: Duration = Duration::from_millis(250);
/// …or this long, while it is still under way (ARP retries after 1 s).
const JOURNEY_PATIENCE: Duration = Duration::from_millis(1500);

pub async fn run(args: Args) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("podtrace needs root (CAP_BPF and CAP_NET_ADMIN) to load eBPF programs: run it with sudo");
    }
    let targets = Targets::resolve(&args).await?;
    let (src, dst) = (&targets.src, &targets.dst);
    let flows = flow_keys(src, dst);

    let mut ctx = Context::default();
    for pod in &targets.inventory.pods {
        if let Some(ip) = pod.ip {
            ctx.names.insert(ip, pod.qualified());
        }
    }
    for endpoint in [src, dst] {
        if let Some(name) = endpoint.name() {
            ctx.names.insert(endpoint.ip, name);
        }
    }
    let known_nodes = targets.known_nodes();
    for (node, ip) in &known_nodes {
        ctx.names.insert(*ip, node.clone());
    }
    ctx.subnets = targets.subnets.clone();
    ctx.pod_cidrs = args.pod_cidr.clone();
    ctx.pod_cidrs.extend(inventory::flannel_network());

    let kernel = Kernel::read()?;
    let namespaces = Namespace::all(&args.netns)?;
    let mut traced_netns = [0; MAX_NODES];
    for (slot, ns) in traced_netns.iter_mut().zip(&namespaces) {
        *slot = ns.inum;
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (link_tx, mut link_rx) = mpsc::unbounded_channel();
    let (netfilter_tx, mut netfilter_rx) = mpsc::unbounded_channel();
    let why_unnamed = match (args.no_ruleset_changes, Backend::detect()) {
        (true, _) => Some("rule tracing is off (--no-ruleset-changes)"),
        (false, Backend::Legacy) => {
            Some("this node uses iptables-legacy, which has no rule tracing")
        }
        (false, Backend::Missing) => Some("iptables is not installed here"),
        (false, Backend::Nft) => None,
    };
    let typed_btf = Kernel::typed_btf()?;
    let shared = Shared {
        kernel: &kernel,
        btf: &typed_btf,
        known_nodes: &known_nodes,
        flows: &flows,
        traced_netns,
        node_ip: args.node_ip,
        mode: args.attach,
        link_tx,
        netfilter_tx: why_unnamed.is_none().then_some(netfilter_tx),
        pairs: vec![(src.ip, dst.ip), (dst.ip, src.ip)],
    };
    let mut nodes = Vec::new();
    for (id, ns) in namespaces.iter().enumerate() {
        let mut node = TracedNode::trace(id as u32, ns, &shared, &mut ctx).await?;
        node.probe.stream(tx.clone())?;
        nodes.push(node);
    }
    drop(tx);
    drop(shared);
    drop(typed_btf);
    // Hand the parsed BTF's memory back: podtrace may run for hours.
    // SAFETY: no preconditions.
    unsafe { libc::malloc_trim(0) };

    let mut summary = Summary {
        hooks_attached: nodes.iter().map(|n| n.probe.hooks).sum(),
        ..Default::default()
    };
    let traced_names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let ends = [src, dst].map(|e| {
        (
            e.name().unwrap_or_else(|| e.ip.to_string()),
            Targets::node_of(e),
        )
    });
    if let Some(view) = vantage(
        [(&ends[0].0, ends[0].1), (&ends[1].0, ends[1].1)],
        &traced_names,
    ) {
        eprintln!("podtrace: {view}");
    }
    eprintln!(
        "podtrace: tracing {} ⇄ {} on {}; Ctrl-C to stop",
        ctx.label(src.ip),
        ctx.label(dst.ip),
        nodes
            .iter()
            .map(|n| format!("{} ({})", n.name, n.watched_list()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let (moved_tx, mut moved_rx) = mpsc::unbounded_channel();
    if let Some(cluster) = &targets.cluster {
        for pod in [src, dst].into_iter().filter_map(|e| e.pod.as_ref()) {
            cluster.watch(pod, moved_tx.clone());
        }
    }
    let mut traced_ips = (src.ip, dst.ip);

    let colour = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal(),
    };
    let mut teller = Teller {
        renderer: Renderer::new(std::io::stdout().lock(), args.output, colour),
        ctx,
        profile: args.profile.then(Profile::default),
        limit: args.count,
        told: 0,
        rules: HashMap::new(),
        why_unnamed: why_unnamed.unwrap_or("no DROP verdict was traced for this packet"),
    };
    let mut correlator = Correlator::new(
        JOURNEY_IDLE.as_nanos() as u64,
        JOURNEY_PATIENCE.as_nanos() as u64,
    );
    let mut tick = tokio::time::interval(JOURNEY_IDLE / 2);
    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(SignalKind::interrupt())?;
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let until_deadline = async {
        match deadline {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until_deadline);

    'trace: loop {
        tokio::select! {
            sighting = rx.recv() => {
                let Some(sighting) = sighting else { break };
                absorb(&sighting, &nodes, &kernel, &mut summary, &mut correlator);
            }
            _ = tick.tick() => {
                for journey in correlator.take_finished(monotonic_ns()) {
                    if !teller.tell(&journey)? {
                        break 'trace;
                    }
                }
            }
            Some(moved) = moved_rx.recv() => {
                let old = flow_ips(traced_ips);
                if traced_ips.0 == moved.old { traced_ips.0 = moved.new; }
                if traced_ips.1 == moved.old { traced_ips.1 = moved.new; }
                eprintln!("podtrace: {} moved from {} to {}; now tracing its new IP", moved.pod, moved.old, moved.new);
                teller.ctx.names.insert(moved.new, moved.pod.clone());
                for node in &mut nodes {
                    node.follow(&old, &flow_ips(traced_ips))?;
                }
            }
            Some((_node, drop)) = netfilter_rx.recv() => {
                teller.rules.insert((drop.src, drop.dst, drop.ip_id), drop.rule);
            }
            Some((node, change)) = link_rx.recv() => {
                if let Some(node) = nodes.get_mut(node as usize) {
                    node.link_changed(change, &mut summary);
                }
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = &mut until_deadline => break,
        }
    }
    // Let the ring readers hand over what they have read, then take it.
    tokio::task::yield_now().await;
    while let Ok(sighting) = rx.try_recv() {
        absorb(&sighting, &nodes, &kernel, &mut summary, &mut correlator);
    }
    for journey in correlator.take_all() {
        if !teller.tell(&journey)? {
            break;
        }
    }
    for node in &nodes {
        let counters = node.probe.counters()?;
        summary.lost_ringbuf_full += counters[counter::RINGBUF_FULL as usize];
        summary.lost_snapshot += counters[counter::SNAPSHOT_FAILED as usize];
    }
    drop(nodes);
    teller.finish(summary)?;
    Ok(())
}

/// Turns finished journeys into output, up to the `--count` limit.
struct Teller<W: Write> {
    renderer: Renderer<W>,
    ctx: Context,
    profile: Option<Profile>,
    limit: Option<u64>,
    told: u64,
    /// Netfilter DROP verdicts by (src, dst, IP ID), from rule tracing.
    rules: HashMap<PacketId, NetfilterRule>,
    why_unnamed: &'static str,
}

impl<W: Write> Teller<W> {
    fn limit_reached(&self) -> bool {
        self.limit.is_some_and(|n| self.told >= n)
    }

    /// Tells the journey's story; false once no more stories are wanted.
    fn tell(&mut self, journey: &Journey) -> std::io::Result<bool> {
        if self.limit_reached() {
            return Ok(false);
        }
        let mut story = story::tell(journey, &self.ctx);
        if story.netfilter_drop() {
            let rule = self.rules.remove(&(story.src, story.dst, story.ip_id));
            story.name_rule(rule.as_ref(), self.why_unnamed);
        }
        self.renderer.story(&story)?;
        if let Some(profile) = &mut self.profile {
            profile.add(&story);
        }
        self.told += 1;
        Ok(!self.limit_reached())
    }

    fn finish(mut self, mut summary: Summary) -> std::io::Result<()> {
        if let Some(profile) = &self.profile {
            self.renderer.profile(&profile.latencies())?;
        }
        summary.stories = self.told;
        self.renderer.summary(&summary)
    }
}

/// Both directions of the traced pair, as the kernel filter wants them.
fn flow_keys(src: &Endpoint, dst: &Endpoint) -> Vec<FlowKey> {
    flow_ips((src.ip, dst.ip))
}

fn flow_ips((a, b): (Ipv4Addr, Ipv4Addr)) -> Vec<FlowKey> {
    let (a, b) = (a.octets(), b.octets());
    vec![FlowKey { src: a, dst: b }, FlowKey { src: b, dst: a }]
}

fn absorb(
    s: &Sighting,
    nodes: &[TracedNode],
    kernel: &Kernel,
    summary: &mut Summary,
    correlator: &mut Correlator,
) {
    summary.sightings += 1;
    if let Some(hop) = place(s, nodes, kernel, summary) {
        correlator.observe(hop);
    }
}

/// CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
