//! `podtrace agent`: node mode on one node, for a cluster-mode front-end.
//!
//! It resolves and attaches exactly as node mode does (the same phases),
//! then, instead of telling stories, writes what it sees as JSON lines
//! (`app::wire`) on stdout: its node's facts, clock and the doctor's
//! failing checks (its files read at `--host-root`) first, then
//! placed hops, how far it has read them (every tick), netfilter rules,
//! loss windows, and its summary last.
//! A writer thread owns stdout, behind a bounded queue: a slow reader
//! costs counted records, never a stalled ring buffer reader. It stops on
//! SIGTERM (its pod deleted), `--duration`, or when the front-end's lease
//! goes stale; then it removes its own pod.

use std::{
    io::Write,
    sync::mpsc::{sync_channel, SyncSender, TrySendError},
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Result;
use kube::Client;
use tokio::sync::mpsc;

use super::{
    connections::of_the_traced_pair,
    follow::follow_connection,
    node_stream::{stream, Consumer},
    probing::{self, ProbeEvent},
    stop::Stop,
    trace::{add_kernel_losses, require_root, resolve_and_attach, Trace},
    wire::{Numbering, Record, Start, WireFacts},
};
use crate::model::conntrack;
use crate::model::netfilter::TracedRule;
use crate::{
    cli::{AgentArgs, Args},
    cluster::{
        access::Access,
        agents::{self, parse_skew, STALE_AFTER},
        api::{Cluster, PodMoved},
    },
    decode::hop::Hop,
    model::Summary,
    node::wireguard_watch::Watch,
    probe::clock::{monotonic_ns, realtime_offset_ns},
};

/// Records queued for stdout at most; more are counted as lost.
const QUEUE: usize = 65_536;

pub async fn run(agent: AgentArgs) -> Result<()> {
    require_root()?;
    let mut args = agent.trace;
    args.kube.agent_on = agent.node.clone();
    let findings_are_the_nodes = where_the_node_is(&mut args);
    let skew = match &args.clock_skew_for_testing {
        Some(text) => parse_skew(text.rsplit('=').next().unwrap_or(text))?,
        None => 0,
    };
    let mut stop = Stop::catch()?;
    let Some(mut trace) = resolve_and_attach(&args, &mut stop).await? else {
        return Ok(());
    };
    let node = agent
        .node
        .clone()
        .unwrap_or_else(|| trace.nodes[0].name.to_string());
    // `--write` on the front-end: the header bytes go with each hop.
    trace.keep_snapshots = agent.send_headers;
    let mut out = Output::start(args.snaplen);
    let facts = trace.ctx.nodes.values().next().map(WireFacts::from);
    out.wireguard = (trace.nodes[0].wireguard_now.take()).map(|reader| {
        let at_start = facts.as_ref().map(|f| f.view.wireguard.clone());
        Watch::new(reader, at_start.unwrap_or_default())
    });
    // The doctor's failing checks, as node mode joins them to its verdicts.
    let doctor = trace
        .ctx
        .doctor
        .get(&*trace.nodes[0].name)
        .filter(|_| findings_are_the_nodes)
        .cloned()
        .unwrap_or_default();
    out.send(Record::Start(Box::new(Start {
        node,
        realtime_offset_ns: realtime_offset_ns() + skew,
        watched: trace.nodes[0].watched_list(),
        hooks: trace.nodes[0].hooks(),
        facts: facts.unwrap_or_else(|| WireFacts::from(&Default::default())),
        reports_read_through: true,
        doctor,
        kernel: Some(trace.kernel_summary.clone()),
        rules_unseen: trace.ctx.rules_unseen.values().next().cloned(),
    })));
    let needed = agent.lease.is_some() || agent.pod.is_some();
    let api = one_api_handle(needed, &args, &trace).await;
    trace.probes = probes_once_all_trace(&args, agent.lease.as_ref(), &trace, api.clone()).await;
    let gone = lease_watch(&args, agent.lease.as_ref(), api.clone());
    let mut summary = Summary {
        hooks_attached: trace.nodes.iter().map(|n| n.hooks()).sum(),
        ..Default::default()
    };
    let lease_lost = stream(&args, &mut trace, &mut stop, &mut out, &mut summary, gone).await?;
    finish(trace, summary, out)?;
    if let Some(lost) = &lease_lost {
        eprintln!("podtrace: {lost}; removing this agent");
    }
    // However it ended, its pod goes with it: a finished pod would stay
    // behind otherwise. The lease goes too when its front-end is gone.
    if agent.pod.is_some() || lease_lost.is_some() {
        // The API may be back if it was away at the start.
        let api = match api {
            Some(client) => Some(client),
            None => (Cluster::connect(&Access::of(&args.kube)).await.ok()).map(|c| c.client()),
        };
        if let Some(client) = api {
            let lease = lease_lost.and(agent.lease.as_deref());
            agents::remove_self(client, &args.agent_namespace, agent.pod.as_deref(), lease).await;
        }
    }
    Ok(())
}

/// One connection to the API serves the agent's resolution, lease,
/// probes and removal: the resolution's where it made one (the front-end
/// hands most agents their pods, so they make none); an agent run by hand
/// (no lease, no pod: not `needed`) needs none.
async fn one_api_handle(needed: bool, args: &Args, trace: &Trace) -> Option<Client> {
    match &trace.targets.cluster {
        Some(resolved_with) => Some(resolved_with.client()),
        None if needed => match Cluster::connect(&Access::of(&args.kube)).await {
            Ok(cluster) => Some(cluster.client()),
            Err(e) => {
                eprintln!("podtrace: cannot reach the API: {e:#}: the front-end's lease is not watched (probes are sent without waiting for the other agents); this agent's pod is removed at its end if the API is back");
                None
            }
        },
        None => None,
    }
}

/// Where the node is, when the kubelet's environment says it better than
/// the agent's arguments (`PODTRACE_NETNS`, `PODTRACE_HOST_ROOT`), into
/// `args`; returns whether the doctor's findings are then the node's.
fn where_the_node_is(args: &mut Args) -> bool {
    // Where the kubelet runs agents outside the node's namespace (the
    // lab), it says which namespace is the node's.
    if let (true, Ok(netns)) = (args.kube.netns.is_empty(), std::env::var("PODTRACE_NETNS")) {
        args.kube.netns.push(netns);
    }
    // Likewise where the node's root filesystem is: the lab's kubelet
    // cannot mount it at the pod's /host, which the agent's arguments
    // name, so its word wins over theirs.
    let mut root_from = "--host-root";
    if let Ok(root) = std::env::var("PODTRACE_HOST_ROOT") {
        args.kube.host_root = vec![root.into()];
        root_from = "PODTRACE_HOST_ROOT";
    }
    // The doctor's findings are the node's only where its files are read
    // from the node's root (or not at all, in a --netns node): otherwise
    // they would be the container's.
    match args.kube.host_root.first() {
        Some(root) if root.is_dir() => true,
        Some(root) => {
            eprintln!("podtrace: {root_from} {:?}: no such directory: the doctor's findings on this node are not sent", root.display().to_string());
            false
        }
        None => !args.kube.netns.is_empty(),
    }
}

/// Resolves with the reason once the front-end's lease goes stale.
fn lease_watch(
    args: &Args,
    lease: Option<&String>,
    api: Option<Client>,
) -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (Some(lease), Some(client)) = (lease.cloned(), api) else {
        return rx;
    };
    let namespace = args.agent_namespace.clone();
    tokio::spawn(async move {
        let why = crate::cluster::lease::lease_lost(client, &namespace, &lease, STALE_AFTER).await;
        let _ = tx.send(why);
    });
    rx
}

/// `--probe` (the front-end asks it of the source's node only): sent once
/// the front-end says every agent traces. One that cannot be sent is one
/// result saying why, so that the front-end is not left waiting.
async fn probes_once_all_trace(
    args: &Args,
    lease: Option<&String>,
    trace: &Trace,
    api: Option<Client>,
) -> Option<mpsc::UnboundedReceiver<ProbeEvent>> {
    let kind = args.probe.probe?;
    let probing =
        match probing::prepare(args, &trace.targets, &trace.ctx, &trace.namespaces()).await {
            Ok(probing) => probing?,
            Err(e) => {
                let (tx, rx) = mpsc::unbounded_channel();
                let result = probing::could_not_send(kind, trace.targets.dst.ip, format!("{e:#}"));
                let _ = tx.send(ProbeEvent::Done(result));
                return Some(rx);
            }
        };
    let gate = match (lease, api) {
        (Some(lease), Some(client)) => {
            let (namespace, lease) = (args.agent_namespace.clone(), lease.clone());
            futures::future::Either::Left(async move {
                crate::cluster::lease::all_tracing(
                    client,
                    &namespace,
                    &lease,
                    agents::START_PATIENCE,
                )
                .await
            })
        }
        // Run by hand, without a front-end: nothing to wait for.
        _ => futures::future::Either::Right(std::future::ready(true)),
    };
    Some(probing::start_after(gate, probing))
}

/// The kernel's counters, detach, then the summary as the last record.
fn finish(trace: Trace, mut summary: Summary, mut out: Output) -> Result<()> {
    add_kernel_losses(&trace.nodes, &mut summary)?;
    drop(trace);
    summary.lost_agent = out.lost_total + out.take_lost();
    out.send(Record::Summary(Box::new(summary)));
    out.close();
    Ok(())
}

/// stdout, owned by a thread behind a bounded queue.
struct Output {
    numbering: Numbering,
    queue: Option<SyncSender<String>>,
    writer: Option<JoinHandle<()>>,
    lost: u64,
    lost_total: u64,
    /// What is sent of each hop's header bytes, when they are kept.
    snaplen: u32,
    /// The node's WireGuard devices, where it has some: read again every
    /// tick (one generic netlink dump per device) and sent when a story
    /// would be judged otherwise by them, so that the front-end judges a
    /// story ending into a WireGuard device by the state of then, as node
    /// mode does.
    wireguard: Option<Watch>,
}

/// An agent's consumer: every event onto the wire, for the front-end's
/// correlator.
impl Consumer for Output {
    fn tick_every(&self) -> Duration {
        Duration::from_millis(100)
    }

    fn hop(&mut self, mut hop: Hop) {
        hop.snapshot.truncate(self.snaplen);
        self.send(Record::Hop(Box::new(hop)));
    }

    fn tick(&mut self, read_through: u64, now: u64, loss: Option<(u64, u64, u64)>) -> Result<bool> {
        // Before the progress mark: the state read now judges the packets
        // it lets the front-end tell.
        let wireguard = (self.wireguard.as_mut())
            .and_then(|watch| watch.refresh().then(|| watch.state().clone()));
        if let Some(state) = wireguard {
            self.send(Record::Wireguard(Box::new(state)));
        }
        self.send(Record::ReadThrough {
            at_ns: read_through,
        });
        let agent = self.take_lost();
        if loss.is_some() || agent > 0 {
            let (from_ns, to_ns, kernel) = loss.unwrap_or((now, now, 0));
            self.send(Record::Loss {
                from_ns,
                to_ns,
                kernel,
                agent,
            });
        }
        Ok(true)
    }

    fn moved(&mut self, _moved: &PodMoved) {}

    fn rule(&mut self, drop: TracedRule, at_ns: u64) {
        self.send(Record::Rule {
            src: drop.src,
            dst: drop.dst,
            ip_id: drop.ip_id,
            rule: drop.rule,
            at_ns,
        });
    }

    async fn conntrack(&mut self, entry: conntrack::Entry, trace: &mut Trace) -> Result<()> {
        if of_the_traced_pair(&entry, &trace.targets) {
            let untraced_until_ns = if follow_connection(&entry, trace).await? {
                monotonic_ns()
            } else {
                0
            };
            self.send(Record::Conntrack {
                entry,
                untraced_until_ns,
            });
        }
        Ok(())
    }

    fn hooks(&mut self, hooks: usize) {
        self.send(Record::Hooks { hooks });
    }

    fn ends_with_probes(&self) -> bool {
        // The front-end says when the trace ends, not the last probe.
        false
    }

    fn probe(&mut self, event: ProbeEvent) {
        self.send(match event {
            ProbeEvent::Sending(flow) => Record::ProbeSending { flow },
            ProbeEvent::Done(result) => Record::Probe {
                flow: result.flow_id,
                result: Box::new(result),
            },
        });
    }
}

impl Output {
    fn start(snaplen: u32) -> Self {
        let (queue, lines) = sync_channel::<String>(QUEUE);
        let writer = std::thread::spawn(move || {
            let mut stdout = std::io::stdout().lock();
            while let Ok(line) = lines.recv() {
                if writeln!(stdout, "{line}").is_err() {
                    return;
                }
                // Flush when nothing more is waiting: lines go out at once.
                if lines
                    .try_recv()
                    .map(|more| writeln!(stdout, "{more}"))
                    .is_err()
                {
                    let _ = stdout.flush();
                }
            }
            let _ = stdout.flush();
        });
        Self {
            numbering: Numbering::default(),
            queue: Some(queue),
            writer: Some(writer),
            lost: 0,
            lost_total: 0,
            snaplen,
            wireguard: None,
        }
    }

    fn send(&mut self, record: Record) {
        // The records the front-end cannot do without wait for room: a
        // summary lost to a full queue would read as the agent's death, a
        // probe's result as a run that never ends, a WireGuard state as
        // the old one still holding.
        let must_arrive = matches!(
            record,
            Record::Summary(_)
                | Record::Probe { .. }
                | Record::ProbeSending { .. }
                | Record::Wireguard(_)
        );
        let line = self.numbering.line(record);
        let Some(queue) = &self.queue else { return };
        if must_arrive {
            if queue.send(line).is_err() {
                self.lost += 1;
            }
        } else if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) =
            queue.try_send(line)
        {
            self.lost += 1;
        }
    }

    fn take_lost(&mut self) -> u64 {
        self.lost_total += self.lost;
        std::mem::take(&mut self.lost)
    }

    fn close(mut self) {
        self.queue = None;
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}
