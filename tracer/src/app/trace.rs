//! One trace's attached state and the steps every mode on a node shares:
//! resolve the targets, attach to every traced node, say what is traced,
//! and finish with the kernel's losses counted.

use std::net::{IpAddr, Ipv4Addr};

use anyhow::{bail, Result};
use podtrace_common::{drops::MAX_NODES, filter::L4Filter};
use tokio::sync::mpsc;

use super::{
    pairs::{self, flow_keys, traced_pairs},
    probing, stop,
    stop::Stop,
    story_context::{context_of, endpoint_nodes},
    targets::{vantage, Targets},
    teller::{Seen, Teller},
    traced::{self, LinkOutcome, Shared, TracedNode},
};
use crate::decode::wireguard_leg::EncryptedLegs;
use crate::model::conntrack;
use crate::model::netfilter::TracedRule;
use crate::{
    cli::Args,
    cluster::inventory::Endpoint,
    doctor,
    model::{KernelSummary, Summary},
    node::{netns::Namespace, pod_netns::OtherNamespaces},
    probe::{
        capabilities::Capabilities, clock::monotonic_ns, iptables::RuleSight,
        link_watch::LinkChange, Batch, Kernel, ReadThrough, BATCHES_QUEUED,
    },
    story::Context,
};

/// The resolve phase, or `None` on a stop meanwhile: nothing is attached
/// yet, so a stop there ends the run, saying so.
pub(super) async fn resolve_unless_stopped(
    args: &Args,
    stop: &mut Stop,
) -> Option<Result<Resolved>> {
    stop::unless_stopped(resolve(args), stop.recv()).await
}

/// The resolve and attach phases, as the agent and profile mode run them;
/// `None` on a stop while resolving.
pub(super) async fn resolve_and_attach(args: &Args, stop: &mut Stop) -> Result<Option<Trace>> {
    match resolve_unless_stopped(args, stop).await {
        Some(resolved) => Ok(Some(attach(args, resolved?).await?)),
        None => Ok(None),
    }
}

pub(super) fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("podtrace needs root (CAP_BPF and CAP_NET_ADMIN) to load eBPF programs: run it with sudo, or use cluster mode (--cluster-mode, or kubectl podtrace)");
    }
    Capabilities::of_this_process().require()
}

/// What the resolve phase learnt: who is traced, where, and the names.
pub(super) struct Resolved {
    pub(super) targets: Targets,
    pub(super) namespaces: Vec<Namespace>,
    pub(super) ctx: Context,
    /// What rule tracing can see on each --netns node.
    pub(super) sight: RuleSight,
    /// The doctor's failing checks per --netns, in order.
    pub(super) doctor: Vec<Vec<crate::model::Finding>>,
    /// Each traced namespace's own addresses, in order, read once: they
    /// resolve a NodePort's node, and find the nodes' underlays at attach
    /// (where a failure to read them is said).
    pub(super) addresses: Result<Vec<Vec<Ipv4Addr>>>,
}

pub(super) async fn resolve(args: &Args) -> Result<Resolved> {
    // A NodePort given as `nodeIP:port` needs no node list to name the
    // node when it is one traced here. (A bad --netns is said after a bad
    // argument, as before.)
    let namespaces = Namespace::all(&args.kube.netns);
    let addresses = match &namespaces {
        Ok(namespaces) => traced::addresses_of(namespaces).await,
        Err(_) => Ok(Vec::new()),
    };
    let traced_addresses: Vec<Ipv4Addr> = match &addresses {
        Ok(addresses) => addresses.iter().flatten().copied().collect(),
        Err(_) => Vec::new(),
    };
    let targets = Targets::resolve(args, &traced_addresses).await?;
    let namespaces = namespaces?;
    if let Ok(addresses) = &addresses {
        no_pods_own_namespace(&namespaces, addresses, [&targets.src, &targets.dst])?;
    }
    let mut ctx = context_of(args, &targets);
    let sight = RuleSight::of(&namespaces, args.no_ruleset_changes)?;
    ctx.why_rule_unnamed = sight.off.unwrap_or(crate::probe::netfilter::UNTRACED_DROP);
    // Profile mode tells no verdict for findings to join: not asked.
    let doctor = if args.in_kernel_profile {
        Vec::new()
    } else {
        let ends = [&targets.src, &targets.dst];
        let pods = (ends.iter().filter_map(|e| e.pod.as_ref()))
            .map(|p| p.qualified())
            .collect();
        let nodes = targets
            .known_nodes()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        doctor::trace::node_findings(args, pods, nodes, targets.cluster.as_ref()).await
    };
    Ok(Resolved {
        targets,
        namespaces,
        ctx,
        sight,
        doctor,
        addresses,
    })
}

/// A namespace that holds an end pod's own address is that pod's, not a
/// node's: its hooks see none of the node's path (no veths, bridge or
/// tunnel), so a trace there would tell nothing true of it. Said before
/// anything is attached.
fn no_pods_own_namespace(
    namespaces: &[Namespace],
    addresses: &[Vec<Ipv4Addr>],
    ends: [&Endpoint; 2],
) -> Result<()> {
    for (namespace, held) in namespaces.iter().zip(addresses) {
        let Some(pod) = ends
            .iter()
            .filter_map(|end| end.pod.as_ref())
            .find(|pod| !pod.host_network && pod.ip.is_some_and(|ip| held.contains(&ip)))
        else {
            continue;
        };
        let node = pod.node.as_deref().unwrap_or("its node");
        let ip = pod.ip.map(|ip| ip.to_string()).unwrap_or_default();
        match &namespace.arg {
            Some(arg) => bail!(
                "--netns {arg} is {}'s own network namespace (it holds {ip}), not a node's: give {node}'s",
                pod.qualified()
            ),
            None => bail!(
                "podtrace runs in {}'s own network namespace (it holds {ip}), not a node's: run it on {node} (kubectl debug node/{node}, or kubectl podtrace)",
                pod.qualified()
            ),
        }
    }
    Ok(())
}

/// A trace under way: the attached nodes and the channels they feed.
pub(super) struct Trace {
    /// The kernel, and what this run does without (the summary says it).
    pub(super) kernel_summary: KernelSummary,
    pub(super) targets: Targets,
    pub(super) nodes: Vec<TracedNode>,
    pub(super) kernel: Kernel,
    pub(super) ctx: Context,
    pub(super) rules_traced: bool,
    /// `--write`: hops keep the header bytes the kernel copied.
    pub(super) keep_snapshots: bool,
    pub(super) sightings: mpsc::Receiver<Batch>,
    /// How far each node's ring reader has read.
    pub(super) read_through: Vec<ReadThrough>,
    pub(super) links: mpsc::UnboundedReceiver<(u32, LinkChange)>,
    pub(super) rules: mpsc::UnboundedReceiver<(u32, TracedRule)>,
    pub(super) conntrack: mpsc::UnboundedReceiver<(u32, conntrack::Entry)>,
    /// Pairs traced because conntrack translated the traced pair to them,
    /// or because a MASQUERADE may (`trace_masquerade_sources`).
    pub(super) learnt_pairs: Vec<(IpAddr, IpAddr)>,
    /// Pairs traced only to join the traced pair's packets across a
    /// source translation: no story of their own.
    pub(super) joining_only: Vec<(Ipv4Addr, Ipv4Addr)>,
    /// Namespaces no traced node owns (pods), named on first sight.
    pub(super) others: OtherNamespaces,
    /// Traced packets gone into WireGuard, which their encrypted legs
    /// are told as.
    pub(super) encrypted_legs: EncryptedLegs,
    /// `--proto`/`--port` as every node's kernel has it (widened as
    /// Services' ports are learnt).
    pub(super) l4_filter: Option<L4Filter>,
    /// `--probe`: what the sending thread says, until it is done.
    pub(super) probes: Option<mpsc::UnboundedReceiver<probing::ProbeEvent>>,
    /// When the last traced node was attached (kernel time): a packet
    /// seen before then may have crossed hooks not attached yet, and
    /// would be told as vanished where it went on unseen.
    pub(super) armed_ns: u64,
}

impl Trace {
    /// The traced nodes' namespaces, in node id order.
    pub(super) fn namespaces(&self) -> Vec<Namespace> {
        self.nodes.iter().map(|n| n.netns.clone()).collect()
    }

    /// The batches queued now, not those the readers send meanwhile:
    /// under a flow faster than stories can be told, emptying the queue
    /// would never end (and Ctrl-C would wait for it).
    pub(super) fn take_queued(&mut self) -> Vec<Batch> {
        let queued = self.sightings.len();
        (0..queued)
            .map_while(|_| self.sightings.try_recv().ok())
            .collect()
    }

    /// The slowest ring reader's progress: records stamped before it are
    /// all sent (see `ReadThrough`).
    pub(super) fn read_through(&self) -> u64 {
        self.read_through
            .iter()
            .map(ReadThrough::get)
            .min()
            .unwrap_or(u64::MAX)
    }
}

pub(super) async fn attach(args: &Args, resolved: Resolved) -> Result<Trace> {
    let Resolved {
        targets,
        namespaces,
        mut ctx,
        sight,
        doctor,
        addresses,
    } = resolved;
    let pairs = traced_pairs(&targets);
    let flows = flow_keys(&pairs);
    let flows6 = pairs::flow_keys6(&pairs);
    let kernel = Kernel::read()?;
    let traced_netns = netns_inums(&namespaces);
    let (tx, sightings) = mpsc::channel(BATCHES_QUEUED);
    let (link_tx, links) = mpsc::unbounded_channel();
    let (netfilter_tx, rules) = mpsc::unbounded_channel();
    let (conntrack_tx, conntrack) = mpsc::unbounded_channel();
    let typed_btf = Kernel::typed_btf()?;
    let known_nodes = targets.known_nodes();
    let known_nodes6 = targets.known_nodes6();
    let mode = kernel.features.attach_mode(args.attach)?;
    let l4_filter = args.filter.kernel_filter(&targets.nat.translations)?;
    let shared = Shared {
        kernel: &kernel,
        btf: &typed_btf,
        known_nodes: &known_nodes,
        known_nodes6: &known_nodes6,
        subnets: &targets.subnets,
        flows: &flows,
        flows6: &flows6,
        traced_netns,
        mode,
        ring_bytes: args.ring_buffer,
        profile: args.in_kernel_profile,
        shared_stamps: args.shared_stamps.as_deref(),
        sample: args.sample,
        l4_filter,
        link_tx,
        conntrack_tx,
        netfilter_tx: sight.off.is_none().then_some(netfilter_tx),
        pairs,
        endpoint_nodes: endpoint_nodes(&targets),
        node_ips: &args.node_ip,
        traced_addresses: addresses?,
        single_node: namespaces.len() == 1,
    };
    let (nodes, read_through) =
        trace_nodes(&namespaces, &shared, &tx, &mut ctx, &doctor, &sight.unseen).await?;
    let armed_ns = monotonic_ns();
    drop(shared);
    drop(typed_btf);
    // Hand the parsed BTF's memory back: podtrace may run for hours.
    // SAFETY: no preconditions.
    unsafe { libc::malloc_trim(0) };
    let kernel_summary = kernel.say_degraded(mode, nodes.first().map(|n| n.probe.drop_hook));
    announce(&targets, &nodes, &ctx);
    Ok(Trace {
        kernel_summary,
        others: OtherNamespaces::new(ctx.names.clone()),
        encrypted_legs: EncryptedLegs::default(),
        targets,
        nodes,
        kernel,
        ctx,
        rules_traced: sight.off.is_none(),
        keep_snapshots: args.write.is_some(),
        sightings,
        read_through,
        armed_ns,
        l4_filter,
        probes: None,
        links,
        rules,
        conntrack,
        learnt_pairs: Vec::new(),
        joining_only: Vec::new(),
    })
}

/// The traced namespaces' inode numbers, in node id order.
pub(super) fn netns_inums(namespaces: &[Namespace]) -> [u32; MAX_NODES] {
    let mut traced_netns = [0; MAX_NODES];
    for (slot, ns) in traced_netns.iter_mut().zip(namespaces) {
        *slot = ns.inum;
    }
    traced_netns
}

/// Sets up every node, each streaming its records into `tx`; what each
/// is (and the doctor's failing checks there, and why its rules may be
/// unseen) goes into `ctx`.
pub(super) async fn trace_nodes(
    namespaces: &[Namespace],
    shared: &Shared<'_>,
    tx: &mpsc::Sender<Batch>,
    ctx: &mut Context,
    doctor: &[Vec<crate::model::Finding>],
    unseen: &[Option<String>],
) -> Result<(Vec<TracedNode>, Vec<ReadThrough>)> {
    let mut nodes = Vec::new();
    let mut read_through = Vec::new();
    for (id, ns) in namespaces.iter().enumerate() {
        let (mut node, facts) = TracedNode::trace(id as u32, ns, shared).await?;
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
        if let Some(Some(why)) = unseen.get(id) {
            ctx.rules_unseen.insert(node.name.to_string(), why.clone());
        }
        nodes.push(node);
    }
    Ok((nodes, read_through))
}

/// Says what the traced nodes can see, and that the trace has started.
pub(super) fn announce(targets: &Targets, nodes: &[TracedNode], ctx: &Context) {
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
    if let Some(untraced) = targets.untraced_ipv6() {
        eprintln!("podtrace: {untraced}");
    }
    eprintln!(
        "podtrace: tracing {} on {}; Ctrl-C to stop",
        targets.named_pairs(ctx),
        nodes
            .iter()
            .map(|n| format!("{} ({})", n.name, n.watched_list()))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// An interface came or went on a node: attach to it, and keep the
/// summary's hook count current.
pub(super) fn link_changed(
    trace: &mut Trace,
    node: u32,
    change: LinkChange,
    summary: &mut Summary,
) {
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
pub(super) fn add_kernel_losses(nodes: &[TracedNode], summary: &mut Summary) -> Result<()> {
    for node in nodes {
        let (ringbuf_full, snapshot) = node.probe.losses()?;
        summary.lost_ringbuf_full += ringbuf_full;
        summary.lost_snapshot += snapshot;
        let (filtered, carriers) = node.probe.left_out()?;
        summary.filtered_in_kernel += filtered;
        summary.other_pairs_encapsulated += carriers;
    }
    Ok(())
}

/// Adds the kernel's loss counters, detaches, and prints the summary;
/// what went wrong in what was told.
pub(super) fn finish(
    trace: Trace,
    (mut summary, teller): (Summary, Teller<'static>),
) -> Result<Seen> {
    add_kernel_losses(&trace.nodes, &mut summary)?;
    drop(trace);
    Ok(teller.finish(summary)?)
}
