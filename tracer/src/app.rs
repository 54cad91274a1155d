//! One trace, from arguments to stories: resolve the pods, attach to every
//! traced node, correlate, tell, and detach.

use std::{
    collections::HashMap,
    io::{IsTerminal, Write},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use podtrace_common::{counter, Direction as KernelDirection, FlowKey, Sighting};
use tokio::{signal::unix::SignalKind, sync::mpsc};

use crate::{
    cli::Args,
    decode,
    interfaces::{self, Role, Watched},
    inventory::{Endpoint, Inventory},
    journey::{Correlator, Direction, Hop, Journey},
    link_watch::{self, LinkChange},
    netns,
    node::NodeView,
    profile::Profile,
    render::{Renderer, Summary},
    sightings::NodeProbe,
    story::{self, Context},
};

/// A journey is done once nothing joined it for this long.
const JOURNEY_IDLE: Duration = Duration::from_millis(250);

struct TracedNode {
    name: String,
    underlay: u32,
    probe: NodeProbe,
    interfaces: HashMap<u32, Watched>,
}

impl TracedNode {
    /// A link appeared or vanished on this node during the trace.
    fn link_changed(&mut self, change: LinkChange, summary: &mut Summary) {
        match change {
            LinkChange::Added(link) if !self.interfaces.contains_key(&link.index) => {
                let Some(iface) = interfaces::watch(&link, self.underlay) else {
                    return;
                };
                match self.probe.attach_interface(&iface) {
                    Ok(()) => {
                        eprintln!(
                            "podtrace: {}: new interface {}, now traced",
                            self.name, iface.name
                        );
                        summary.interfaces_added += 1;
                        self.interfaces.insert(iface.index, iface);
                    }
                    Err(e) => eprintln!(
                        "podtrace: {}: new interface {} is not traced: {e:#}",
                        self.name, iface.name
                    ),
                }
            }
            LinkChange::Removed(link) if self.interfaces.contains_key(&link.index) => {
                eprintln!(
                    "podtrace: {}: interface {} vanished during the trace; its hooks went with it",
                    self.name, link.name
                );
                summary.interfaces_vanished += 1;
            }
            _ => {}
        }
    }
}

pub async fn run(args: Args) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("podtrace needs root (CAP_BPF and CAP_NET_ADMIN) to load eBPF programs: run it with sudo");
    }
    let inventory = match &args.pods_file {
        Some(path) => Inventory::load(path)?,
        None => Inventory::default(),
    };
    let src = inventory.resolve(&args.src, &args.namespace)?;
    let dst = inventory.resolve(&args.dst, &args.namespace)?;
    if src.ip == dst.ip {
        bail!("source and destination are the same address ({})", src.ip);
    }
    let flows = flow_keys(&src, &dst);

    let mut ctx = Context::default();
    for pod in &inventory.pods {
        if let Some(ip) = pod.ip {
            ctx.names.insert(ip, pod.qualified());
        }
    }
    for (node, ip) in inventory.nodes() {
        ctx.names.insert(ip, node);
    }

    let (tx, mut rx) = mpsc::unbounded_channel();
    let (link_tx, mut link_rx) = mpsc::unbounded_channel();
    let namespaces: Vec<Option<String>> = if args.netns.is_empty() {
        vec![None]
    } else {
        args.netns.iter().cloned().map(Some).collect()
    };
    let mut nodes = Vec::new();
    for (id, ns) in namespaces.iter().enumerate() {
        let mut node = trace_node(
            id as u32,
            ns.as_deref(),
            &args,
            &inventory,
            &flows,
            &mut ctx,
            link_tx.clone(),
        )
        .await?;
        node.probe.stream(tx.clone())?;
        nodes.push(node);
    }
    drop(tx);

    let mut summary = Summary {
        hooks_attached: nodes.iter().map(|n| n.probe.hooks).sum(),
        ..Default::default()
    };
    eprintln!(
        "podtrace: tracing {} ⇄ {} on {}; Ctrl-C to stop",
        ctx.label(src.ip),
        ctx.label(dst.ip),
        nodes
            .iter()
            .map(|n| format!("{} ({})", n.name, watched_list(&n.interfaces)))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let colour = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal(),
    };
    let mut teller = Teller {
        renderer: Renderer::new(std::io::stdout().lock(), args.output, colour),
        ctx: &ctx,
        profile: args.profile.then(Profile::default),
        limit: args.count,
        told: 0,
    };
    let mut correlator = Correlator::new(JOURNEY_IDLE.as_nanos() as u64);
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
                absorb(&sighting, &nodes, &mut summary, &mut correlator);
            }
            _ = tick.tick() => {
                for journey in correlator.take_finished(monotonic_ns()) {
                    if !teller.tell(&journey)? {
                        break 'trace;
                    }
                }
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
        absorb(&sighting, &nodes, &mut summary, &mut correlator);
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
struct Teller<'a, W: Write> {
    renderer: Renderer<W>,
    ctx: &'a Context,
    profile: Option<Profile>,
    limit: Option<u64>,
    told: u64,
}

impl<W: Write> Teller<'_, W> {
    fn limit_reached(&self) -> bool {
        self.limit.is_some_and(|n| self.told >= n)
    }

    /// Tells the journey's story; false once no more stories are wanted.
    fn tell(&mut self, journey: &Journey) -> std::io::Result<bool> {
        if self.limit_reached() {
            return Ok(false);
        }
        let story = story::tell(journey, self.ctx);
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
    let (a, b) = (src.ip.octets(), dst.ip.octets());
    vec![FlowKey { src: a, dst: b }, FlowKey { src: b, dst: a }]
}

async fn trace_node(
    id: u32,
    ns: Option<&str>,
    args: &Args,
    inventory: &Inventory,
    flows: &[FlowKey],
    ctx: &mut Context,
    link_tx: mpsc::UnboundedSender<(u32, LinkChange)>,
) -> Result<TracedNode> {
    let netns_path = ns.map(netns::resolve);
    let _entered = netns_path.as_deref().map(netns::enter).transpose()?;
    let view = NodeView::read().await?;
    // The node is the inventory node whose IP this namespace holds.
    let known = inventory
        .nodes()
        .into_iter()
        .find(|(_, ip)| view.link_with_address(*ip).is_some());
    let node_ip = args.node_ip.or(known.as_ref().map(|(_, ip)| *ip));
    let name = match (&known, ns) {
        (Some((name, _)), _) => name.clone(),
        (None, Some(ns)) => ns.rsplit('/').next().unwrap_or(ns).to_string(),
        (None, None) => hostname(),
    };
    let watched = interfaces::select(&view, node_ip).with_context(|| format!("node {name}"))?;
    for route in &view.routes {
        let delivers_locally = route
            .oif
            .and_then(|oif| watched.iter().find(|w| w.index == oif))
            .is_some_and(|w| matches!(w.role, Role::Bridge | Role::PodVeth));
        if delivers_locally && route.destination.prefix_len() > 0 && route.gateway.is_none() {
            ctx.traced_destinations.push(route.destination);
        }
    }
    let probe = NodeProbe::attach(id, netns_path.as_deref(), &watched, flows, args.attach)
        .with_context(|| format!("node {name}"))?;
    // The subscription socket stays bound to the namespace it was opened in.
    link_watch::watch(id, link_tx)?;
    let underlay = watched
        .iter()
        .find(|w| w.role == Role::Underlay)
        .map_or(0, |w| w.index);
    Ok(TracedNode {
        name,
        underlay,
        probe,
        interfaces: watched.into_iter().map(|w| (w.index, w)).collect(),
    })
}

fn absorb(s: &Sighting, nodes: &[TracedNode], summary: &mut Summary, correlator: &mut Correlator) {
    summary.sightings += 1;
    if let Some(hop) = place(s, nodes, summary) {
        correlator.observe(hop);
    }
}

/// Turns a raw sighting into a hop on a known node and interface.
fn place(s: &Sighting, nodes: &[TracedNode], summary: &mut Summary) -> Option<Hop> {
    let node = nodes.get(s.node_id as usize)?;
    let Some(iface) = node.interfaces.get(&s.ifindex) else {
        summary.unknown_interface += 1;
        return None;
    };
    let snapshot = &s.snapshot[..usize::from(s.snapshot_len).min(s.snapshot.len())];
    let packet = match decode::decode(snapshot, s.has_l2 != 0) {
        Ok(packet) => packet,
        Err(_) => {
            summary.undecodable += 1;
            return None;
        }
    };
    Some(Hop {
        ktime_ns: s.ktime_ns,
        node: node.name.clone(),
        iface: iface.name.clone(),
        role: iface.role,
        direction: if s.direction == KernelDirection::Egress as u8 {
            Direction::Egress
        } else {
            Direction::Ingress
        },
        skb_len: s.skb_len,
        mark: s.mark,
        packet,
    })
}

fn watched_list(interfaces: &HashMap<u32, Watched>) -> String {
    let mut named: Vec<&Watched> = interfaces
        .values()
        .filter(|w| w.role != Role::PodVeth)
        .collect();
    named.sort_by_key(|w| w.index);
    let veths = interfaces.len() - named.len();
    let mut parts: Vec<String> = named.iter().map(|w| w.name.clone()).collect();
    parts.push(format!("{veths} pod veths"));
    parts.join(", ")
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

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this-node".into())
}
