//! One trace, from arguments to stories, in four phases:
//! - `resolve`: the pod arguments, names of addresses, the namespaces;
//! - `attach`: every traced node set up (`node::traced`);
//! - `stream`: sightings, rules and link changes into journeys, told as
//!   they finish (`teller`);
//! - `finish`: what is still open, the loss counters, the summary; then
//!   everything attached is dropped.
//!
//! `replay` tells the stories of a `--write` file again (`podtrace read`).

pub mod agent;
pub mod front;
mod losses;
pub mod profile;
mod replay;
mod stop;
mod stream;
pub mod targets;
mod teller;
pub mod traced;
pub mod wire;

pub use replay::replay;
pub use stop::block_signals;

use std::{
    io::{IsTerminal, Write},
    net::Ipv4Addr,
    time::Duration,
};

use anyhow::{bail, Result};
use podtrace_common::{FlowKey, Sighting, MAX_NODES, NODE_OTHER_NETNS};
use tokio::sync::mpsc;

use targets::{vantage, Targets};
use traced::{LinkOutcome, Shared, TracedNode};

use crate::{
    cli::Args,
    cluster::api::PodMoved,
    cni,
    decode::hop::{place, Hop, Unplaced},
    doctor,
    model::Summary,
    node::{netns::Namespace, pod_netns::OtherNamespaces},
    output::{
        self,
        pcapng::{self, Announced, PcapWriter},
    },
    probe::{
        clock::monotonic_ns,
        conntrack,
        link_watch::LinkChange,
        netfilter::{Backend, TracedRule},
        Batch, Kernel, ReadThrough, BATCHES_QUEUED,
    },
    story::{
        journey::{Correlator, Waits},
        profile::Profile,
        Context,
    },
};
use stop::Stop;
use teller::Teller;

/// A journey is done once nothing joined it for this long.
const JOURNEY_IDLE: Duration = Duration::from_millis(250);
/// …or this long, while it is still under way (ARP retries after 1 s).
const JOURNEY_PATIENCE: Duration = Duration::from_millis(1500);
/// …or this long, while it waits for ARP: the kernel frees it with
/// NEIGH_FAILED after its probes (ucast 3 + mcast 3, 1 s apart).
const ARP_PATIENCE: Duration = Duration::from_millis(6500);

pub async fn run(args: Args) -> Result<()> {
    require_root()?;
    // Before anything is attached: a signal from here on ends the trace
    // through the normal drop path.
    let mut stop = Stop::catch()?;
    // Before anything is attached: a path that cannot be written is bad input.
    let write = args.write.as_deref().map(pcapng::open).transpose()?;
    let resolved = tokio::select! {
        resolved = resolve(&args) => resolved,
        () = stop.recv() => return Ok(()),
    };
    let resolved = match resolved {
        Err(e) if format!("{e}").contains("has no IP") => match doctor::trace::no_ip(&args).await {
            Some(finding) => bail!("{finding}"),
            None => return Err(e),
        },
        other => other?,
    };
    let mut trace = attach(&args, resolved).await?;
    trace_masquerade_sources(&mut trace)?;
    let summary = stream_here(&args, &mut trace, &mut stop, write).await?;
    finish(trace, summary)
}

fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("podtrace needs root (CAP_BPF and CAP_NET_ADMIN) to load eBPF programs: run it with sudo, or use cluster mode (--cluster, or kubectl podtrace)");
    }
    Ok(())
}

/// What the resolve phase learnt: who is traced, where, and the names.
struct Resolved {
    targets: Targets,
    namespaces: Vec<Namespace>,
    ctx: Context,
    why_rule_unnamed: Option<&'static str>,
    /// The doctor's failing checks per --netns, in order.
    doctor: Vec<Vec<crate::model::Finding>>,
}

async fn resolve(args: &Args) -> Result<Resolved> {
    let targets = Targets::resolve(args).await?;
    let namespaces = Namespace::all(&args.kube.netns)?;
    let mut ctx = context_of(args, &targets);
    let why_rule_unnamed = match (args.no_ruleset_changes, Backend::detect()) {
        (true, _) => Some("rule tracing is off (--no-ruleset-changes)"),
        (false, Backend::Legacy) => {
            Some("this node uses iptables-legacy, which has no rule tracing")
        }
        (false, Backend::Missing) => Some("iptables is not installed here"),
        (false, Backend::Nft) => None,
    };
    ctx.why_rule_unnamed = why_rule_unnamed.unwrap_or(crate::probe::netfilter::UNTRACED_DROP);
    Ok(Resolved {
        targets,
        namespaces,
        ctx,
        why_rule_unnamed,
        // Profile mode tells no verdict for findings to join: not asked.
        doctor: if args.in_kernel_profile {
            Vec::new()
        } else {
            doctor::trace::node_findings(args).await
        },
    })
}

/// What the targets tell of names and subnets, for the stories.
fn context_of(args: &Args, targets: &Targets) -> Context {
    let mut ctx = Context::default();
    for pod in &targets.inventory.pods {
        if let Some(ip) = pod.ip {
            ctx.names.insert(ip, pod.qualified());
        }
    }
    for endpoint in [&targets.src, &targets.dst] {
        if let Some(name) = endpoint.name() {
            ctx.names.insert(endpoint.ip, name);
        }
    }
    for (node, ip) in targets.known_nodes() {
        ctx.names.insert(ip, node);
    }
    for t in &targets.nat.translations {
        if let Some(pod) = &t.backend {
            ctx.names.entry(t.back.ip).or_insert_with(|| pod.clone());
        }
    }
    ctx.nat = targets.nat.clone();
    ctx.subnets = targets.subnets.clone();
    ctx.pod_cidrs = args.pod_cidr.clone();
    ctx.pod_cidrs.extend(cni::subnet_env_network());
    ctx
}

/// A trace under way: the attached nodes and the channels they feed.
struct Trace {
    targets: Targets,
    nodes: Vec<TracedNode>,
    kernel: Kernel,
    ctx: Context,
    rules_traced: bool,
    /// `--write`: hops keep the header bytes the kernel copied.
    keep_snapshots: bool,
    sightings: mpsc::Receiver<Batch>,
    /// How far each node's ring reader has read.
    read_through: Vec<ReadThrough>,
    links: mpsc::UnboundedReceiver<(u32, LinkChange)>,
    rules: mpsc::UnboundedReceiver<(u32, TracedRule)>,
    conntrack: mpsc::UnboundedReceiver<(u32, conntrack::Entry)>,
    /// Pairs traced because conntrack translated the traced pair to them,
    /// or because a MASQUERADE may (`trace_masquerade_sources`).
    learnt_flows: Vec<FlowKey>,
    /// Pairs traced only to join the traced pair's packets across a
    /// source translation: no story of their own.
    joining_only: Vec<(Ipv4Addr, Ipv4Addr)>,
    /// Namespaces no traced node owns (pods), named on first sight.
    others: OtherNamespaces,
}

impl Trace {
    /// The batches queued now, not those the readers send meanwhile:
    /// under a flow faster than stories can be told, emptying the queue
    /// would never end (and Ctrl-C would wait for it).
    fn take_queued(&mut self) -> Vec<Batch> {
        let queued = self.sightings.len();
        (0..queued)
            .map_while(|_| self.sightings.try_recv().ok())
            .collect()
    }

    /// The slowest ring reader's progress: records stamped before it are
    /// all sent (see `ReadThrough`).
    fn read_through(&self) -> u64 {
        self.read_through
            .iter()
            .map(ReadThrough::get)
            .min()
            .unwrap_or(u64::MAX)
    }
}

async fn attach(args: &Args, resolved: Resolved) -> Result<Trace> {
    let Resolved {
        targets,
        namespaces,
        mut ctx,
        why_rule_unnamed,
        doctor,
    } = resolved;
    let (src, dst) = (&targets.src, &targets.dst);
    let pairs = traced_pairs(&targets);
    let flows: Vec<FlowKey> = pairs
        .iter()
        .map(|(a, b)| FlowKey {
            src: a.octets(),
            dst: b.octets(),
        })
        .collect();
    let kernel = Kernel::read()?;
    let mut traced_netns = [0; MAX_NODES];
    for (slot, ns) in traced_netns.iter_mut().zip(&namespaces) {
        *slot = ns.inum;
    }
    let (tx, sightings) = mpsc::channel(BATCHES_QUEUED);
    let (link_tx, links) = mpsc::unbounded_channel();
    let (netfilter_tx, rules) = mpsc::unbounded_channel();
    let (conntrack_tx, conntrack) = mpsc::unbounded_channel();
    let typed_btf = Kernel::typed_btf()?;
    let known_nodes = targets.known_nodes();
    let shared = Shared {
        kernel: &kernel,
        btf: &typed_btf,
        known_nodes: &known_nodes,
        subnets: &targets.subnets,
        flows: &flows,
        traced_netns,
        mode: args.attach,
        ring_bytes: args.ring_buffer,
        profile: args.in_kernel_profile,
        shared_stamps: args.shared_stamps.as_deref(),
        sample: args.sample,
        link_tx,
        conntrack_tx,
        netfilter_tx: why_rule_unnamed.is_none().then_some(netfilter_tx),
        pairs,
        endpoint_nodes: [src, dst]
            .iter()
            .filter_map(|e| Some((e.ip, Targets::node_of(e)?.to_string())))
            .collect(),
        node_ips: &args.node_ip,
        single_node: namespaces.len() == 1,
    };
    let mut nodes = Vec::new();
    let mut read_through = Vec::new();
    for (id, ns) in namespaces.iter().enumerate() {
        let (mut node, facts) = TracedNode::trace(id as u32, ns, &shared).await?;
        for (ip, iface) in &facts.pod_interfaces {
            eprintln!(
                "podtrace: {}: {} is behind {iface}",
                node.name,
                ctx.label(*ip)
            );
        }
        read_through.push(node.probe.stream(tx.clone())?);
        ctx.nodes.insert(node.name.to_string(), facts);
        if let Some(findings) = doctor.get(id) {
            ctx.doctor.insert(node.name.to_string(), findings.clone());
        }
        nodes.push(node);
    }
    drop(shared);
    drop(typed_btf);
    // Hand the parsed BTF's memory back: podtrace may run for hours.
    // SAFETY: no preconditions.
    unsafe { libc::malloc_trim(0) };
    announce(&targets, &nodes, &ctx);
    Ok(Trace {
        others: OtherNamespaces::new(ctx.names.clone()),
        targets,
        nodes,
        kernel,
        ctx,
        rules_traced: why_rule_unnamed.is_none(),
        keep_snapshots: args.write.is_some(),
        sightings,
        read_through,
        links,
        rules,
        conntrack,
        learnt_flows: Vec::new(),
        joining_only: Vec::new(),
    })
}

/// At most this many (node address, peer) pairs are traced ahead of a
/// MASQUERADE: the kernel filter holds 1024 pairs.
const MAX_MASQUERADE_PAIRS: usize = 128;

/// Where a MASQUERADE of the traced pair may take it, traced from the
/// start, so that its first packet is seen after the translation too: a
/// MASQUERADE takes an address of the node (the way out's), the peer is a
/// Service backend (hairpin, a NodePort from another node) or the
/// destination outside the cluster. Only to join: traffic between them is
/// told only as part of the traced pair's (conntrack then says which
/// port). Node mode; cluster mode learns these from conntrack.
fn trace_masquerade_sources(trace: &mut Trace) -> Result<()> {
    let (targets, ctx) = (&trace.targets, &trace.ctx);
    let node_addresses: Vec<Ipv4Addr> = ctx
        .nodes
        .values()
        .flat_map(|facts| facts.view.own_addresses())
        .filter(|ip| !ip.is_loopback())
        .collect();
    let dst = targets.dst.ip;
    let in_the_cluster = |ip: Ipv4Addr| {
        ctx.expects_arrival(ip)
            || ctx
                .subnets
                .iter()
                .any(|s| s.subnet.contains(&ip) || s.node_ip == ip)
            || ctx.pod_cidrs.iter().any(|net| net.contains(&ip))
            || node_addresses.contains(&ip)
    };
    let outside = targets.dst.pod.is_none() && targets.service.is_none() && !in_the_cluster(dst);
    let mut peers: Vec<Ipv4Addr> = targets
        .nat
        .translations
        .iter()
        .filter(|t| !t.source)
        .map(|t| t.back.ip)
        .chain(outside.then_some(dst))
        .collect();
    peers.sort();
    peers.dedup();
    let pairs: Vec<(Ipv4Addr, Ipv4Addr)> = node_addresses
        .iter()
        .flat_map(|a| peers.iter().map(move |p| (*a, *p)))
        .filter(|(a, p)| a != p)
        .collect();
    if pairs.is_empty() || pairs.len() > MAX_MASQUERADE_PAIRS {
        return Ok(());
    }
    let flows: Vec<FlowKey> = pairs.iter().flat_map(|pair| flow_ips(*pair)).collect();
    for node in &mut trace.nodes {
        node.probe.replace_flows(&[], &flows)?;
    }
    trace.learnt_flows.extend(flows);
    trace.joining_only.extend(pairs);
    Ok(())
}

/// Says what the traced nodes can see, and that the trace has started.
fn announce(targets: &Targets, nodes: &[TracedNode], ctx: &Context) {
    let traced_names: Vec<String> = nodes.iter().map(|n| n.name.to_string()).collect();
    let ends = [&targets.src, &targets.dst].map(|e| {
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
        ctx.label(targets.src.ip),
        ctx.label(targets.dst.ip),
        nodes
            .iter()
            .map(|n| format!("{} ({})", n.name, n.watched_list()))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Streams until Ctrl-C, SIGTERM, `--duration` or `--count`; returns the
/// summary so far and a teller holding what is still to be told.
async fn stream_here(
    args: &Args,
    trace: &mut Trace,
    stop: &mut Stop,
    write: Option<Box<dyn Write>>,
) -> Result<(Summary, Teller<'static>)> {
    let mut teller = new_teller(args, std::mem::take(&mut trace.ctx));
    if let Some(out) = write {
        teller.pcap = Some(pcap_writer(out, args, trace, &teller.ctx)?);
    }
    let mut summary = Summary {
        hooks_attached: trace.nodes.iter().map(TracedNode::hooks).sum(),
        sample: args.sample,
        ..Default::default()
    };
    let mut correlator = correlator_for(&teller.ctx, trace.rules_traced);
    for (a, b) in &trace.joining_only {
        correlator.trace_for_joining(*a, *b);
    }
    let mut local = stream::Local { teller, correlator };
    // Node mode has no lease to lose.
    let (_, no_lease) = mpsc::unbounded_channel();
    stream::stream(args, trace, stop, &mut local, &mut summary, no_lease).await?;
    let stream::Local {
        mut teller,
        mut correlator,
    } = local;
    teller.tell_all(&correlator.take_all())?;
    Ok((summary, teller))
}

/// The correlator for a trace told with `ctx`, node mode's and the
/// front-end's alike.
fn correlator_for(ctx: &Context, rules_traced: bool) -> Correlator {
    Correlator::new(Waits {
        idle_ns: JOURNEY_IDLE.as_nanos() as u64,
        patience_ns: JOURNEY_PATIENCE.as_nanos() as u64,
        arp_ns: ARP_PATIENCE.as_nanos() as u64,
        rules_traced,
        traced_destinations: ctx
            .nodes
            .values()
            .flat_map(|facts| facts.local_pod_subnets.iter().copied())
            .collect(),
    })
    .with_nat(ctx.nat.clone())
}

/// A conntrack entry of a node (node mode): if it is the traced pair's,
/// its translated addresses traced and its translations learnt.
async fn learn_connection(
    entry: &conntrack::Entry,
    trace: &mut Trace,
    ctx: &mut Context,
    correlator: &mut Correlator,
) -> Result<()> {
    if of_the_traced_pair(entry, &trace.targets) {
        let newly_traced = follow_connection(entry, trace).await?;
        let untraced_until = if newly_traced { monotonic_ns() } else { 0 };
        learn_translations(entry, untraced_until, ctx, correlator);
    }
    Ok(())
}

/// Whether a conntrack entry is a connection of the traced pair.
fn of_the_traced_pair(entry: &conntrack::Entry, targets: &Targets) -> bool {
    let traced = [targets.src.ip, targets.dst.ip];
    traced.contains(&entry.orig.src) && traced.contains(&entry.orig.dst)
}

/// A translated connection of the traced pair, from conntrack, told to
/// the stories' context and the correlator (node mode, and the front-end
/// of cluster mode); its translated addresses were not traced until
/// `untraced_until_ns` (0: always were).
fn learn_translations(
    entry: &conntrack::Entry,
    untraced_until_ns: u64,
    ctx: &mut Context,
    correlator: &mut Correlator,
) {
    let names = ctx.names.clone();
    let learnt = ctx
        .nat
        .learn_connection(entry, |ip| names.get(&ip).cloned(), untraced_until_ns);
    for t in learnt {
        correlator.learn_translation(t);
    }
    if entry.snat() {
        correlator.trace_for_joining(entry.reply.src, entry.reply.dst);
    }
}

/// The addresses a connection of the traced pair is translated to,
/// traced on every node from now on, and a backend's pod veth watched
/// where it is local (node mode, and each agent of cluster mode).
/// Returns whether they were not traced before.
async fn follow_connection(entry: &conntrack::Entry, trace: &mut Trace) -> Result<bool> {
    // The connection as the peer sees it, both ways: what the kernel
    // filter must now let through.
    let (a, b) = (entry.reply.src, entry.reply.dst);
    let new = flow_ips((a, b));
    let traced = traced_pairs(&trace.targets);
    if (a, b) == (entry.orig.dst, entry.orig.src)
        || traced.contains(&(b, a))
        || trace.learnt_flows.iter().any(|k| new.contains(k))
    {
        return Ok(false);
    }
    for node in &mut trace.nodes {
        node.follow(&[], &new)?;
        if entry.dnat() {
            node.watch_pod(a).await?;
        }
    }
    trace.learnt_flows.extend(new);
    Ok(true)
}

/// Watches the traced pods through the API, when names came from it: a
/// pod that comes back with a new IP is said on the channel.
fn watch_moves(trace: &Trace) -> mpsc::UnboundedReceiver<PodMoved> {
    let (moved_tx, moved_rx) = mpsc::unbounded_channel::<PodMoved>();
    if let Some(cluster) = &trace.targets.cluster {
        for pod in [&trace.targets.src, &trace.targets.dst]
            .into_iter()
            .filter_map(|e| e.pod.as_ref())
        {
            cluster.watch(pod, moved_tx.clone());
        }
    }
    moved_rx
}

/// Resolves after `--duration`, or never.
async fn until(duration: Option<Duration>) {
    match duration {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

fn new_teller(args: &Args, ctx: Context) -> Teller<'static> {
    // `-w -` puts the packets on stdout: the stories go to stderr.
    let (out, terminal): (Box<dyn Write>, bool) = if args.write.as_deref() == Some("-") {
        (buffered(std::io::stderr()), std::io::stderr().is_terminal())
    } else {
        (buffered(std::io::stdout()), std::io::stdout().is_terminal())
    };
    let colour = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => terminal,
    };
    Teller {
        sink: output::sink(args.output, out, colour),
        ctx,
        profile: args.profile.then(Profile::default),
        limit: args.count,
        told: 0,
        pcap: None,
    }
}

/// Stories are written a batch at a time (`Teller::tell_all` flushes).
fn buffered(out: impl Write + 'static) -> Box<dyn Write> {
    Box::new(std::io::BufWriter::with_capacity(1 << 16, out))
}

/// The `--write` file, with every watched interface announced.
fn pcap_writer(
    out: Box<dyn Write>,
    args: &Args,
    trace: &Trace,
    ctx: &Context,
) -> std::io::Result<PcapWriter> {
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
    let title = format!(
        "podtrace {} ⇄ {}",
        ctx.label(trace.targets.src.ip),
        ctx.label(trace.targets.dst.ip)
    );
    PcapWriter::create(out, args.snaplen, title, &watched, ctx)
}

/// A traced pod came back with a new IP: trace the new pair everywhere.
fn follow_move(
    trace: &mut Trace,
    traced_ips: &mut (Ipv4Addr, Ipv4Addr),
    moved: &PodMoved,
) -> Result<()> {
    let old = flow_ips(*traced_ips);
    if traced_ips.0 == moved.old {
        traced_ips.0 = moved.new;
    }
    if traced_ips.1 == moved.old {
        traced_ips.1 = moved.new;
    }
    eprintln!(
        "podtrace: {} moved from {} to {}; now tracing its new IP",
        moved.pod, moved.old, moved.new
    );
    for node in &mut trace.nodes {
        node.follow(&old, &flow_ips(*traced_ips))?;
    }
    Ok(())
}

/// An interface came or went on a node: attach to it, and keep the
/// summary's hook count current.
fn link_changed(trace: &mut Trace, node: u32, change: LinkChange, summary: &mut Summary) {
    let Some(node) = trace.nodes.get_mut(node as usize) else {
        return;
    };
    match node.link_changed(change) {
        LinkOutcome::Added => summary.interfaces_added += 1,
        LinkOutcome::Vanished => summary.interfaces_vanished += 1,
        LinkOutcome::Ignored => {}
    }
    summary.hooks_attached = trace.nodes.iter().map(TracedNode::hooks).sum();
}

/// Adds what every node's probe could not report to the summary.
fn add_kernel_losses(nodes: &[TracedNode], summary: &mut Summary) -> Result<()> {
    for node in nodes {
        let (ringbuf_full, snapshot) = node.probe.losses()?;
        summary.lost_ringbuf_full += ringbuf_full;
        summary.lost_snapshot += snapshot;
    }
    Ok(())
}

/// Adds the kernel's loss counters, detaches, and prints the summary.
fn finish(trace: Trace, (mut summary, teller): (Summary, Teller<'static>)) -> Result<()> {
    add_kernel_losses(&trace.nodes, &mut summary)?;
    drop(trace);
    teller.finish(summary)?;
    Ok(())
}

/// Every traced pair, both directions: SRC ⇄ DST, and SRC ⇄ each backend
/// DST's Service translates to (so the packet is seen after the DNAT).
fn traced_pairs(targets: &Targets) -> Vec<(Ipv4Addr, Ipv4Addr)> {
    let (src, dst) = (targets.src.ip, targets.dst.ip);
    let mut pairs = vec![(src, dst), (dst, src)];
    for t in &targets.nat.translations {
        for pair in [(src, t.back.ip), (t.back.ip, src)] {
            if !pairs.contains(&pair) && t.back.ip != src {
                pairs.push(pair);
            }
        }
    }
    pairs
}

/// Both directions of the traced pair, as the kernel filter wants them.
fn flow_ips((a, b): (Ipv4Addr, Ipv4Addr)) -> Vec<FlowKey> {
    let (a, b) = (a.octets(), b.octets());
    vec![FlowKey { src: a, dst: b }, FlowKey { src: b, dst: a }]
}

/// A sighting as a hop on its node and interface (a pod's namespace is
/// named on first sight), or counted in the summary as why not.
async fn to_hop(s: &Sighting, trace: &mut Trace, summary: &mut Summary) -> Option<Hop> {
    summary.sightings += 1;
    if s.node_id == NODE_OTHER_NETNS {
        trace.others.learn(s.netns_inum).await;
    }
    let keep = trace.keep_snapshots;
    match place(s, &trace.nodes, &trace.others, &trace.kernel, keep) {
        Ok(hop) => Some(hop),
        Err(Unplaced::UnknownInterface) => {
            summary.unknown_interface += 1;
            None
        }
        Err(Unplaced::Undecodable) => {
            summary.undecodable += 1;
            None
        }
    }
}
