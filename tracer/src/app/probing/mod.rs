//! `--probe`: podtrace sends the test traffic itself, from the source
//! pod's own network namespace (no exec into its container, no tool in its
//! image), traces exactly those packets, and ends with each probe's result
//! beside the verdict of the packet that failed. It sends nothing but the
//! probes, to the destination named, at most every 100 ms, and closes
//! every socket it opens.

mod about;
mod icmp;
mod send;
mod watch;

use std::{
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    time::Duration,
};

use anyhow::{anyhow, bail, Result};
use tokio::sync::mpsc;

pub(super) use watch::ProbeWatch;

use about::Sent;

use super::targets::Targets;
use crate::{
    cli::Args,
    cluster::argument::Target,
    model::{ProbeKind, ProbeResult},
    node::{
        netns::{self, Namespace},
        pod_netns,
    },
    story::Context,
};

/// The probes to send, checked before anything is attached.
pub(super) struct Probing {
    kind: ProbeKind,
    /// The source pod's network namespace, and its address.
    netns: PathBuf,
    src: Ipv4Addr,
    dst: Ipv4Addr,
    count: u32,
    interval: Duration,
    timeout: Duration,
}

/// What the sending thread says.
pub(super) enum ProbeEvent {
    /// A probe goes out on this flow (source port, or echo identifier).
    Sending(u16),
    Done(ProbeResult),
}

/// Whether `--probe` can be told with the other flags (bad input, before
/// anything is resolved or attached, in every mode).
pub(in crate::app) fn check(args: &Args) -> Result<()> {
    let dst_port = Target::parse(&args.dst, args.kube.namespace())
        .ok()
        .and_then(|t| t.port());
    args.probe.check(&args.filter, dst_port)
}

/// The probes `args` ask for, once it is known they can be sent: the
/// source is a pod whose namespace is on this node. A probe that cannot
/// be sent is bad input: nothing is attached, nothing sent.
pub(super) async fn prepare(
    args: &Args,
    targets: &Targets,
    ctx: &Context,
    nodes: &[Namespace],
) -> Result<Option<Probing>> {
    let Some(kind) = args.probe.probe else {
        return Ok(None);
    };
    let Some((src, dst)) = targets.traced_ipv4_pair() else {
        bail!(
            "--probe {kind}: probes are sent over IPv4, and {} is traced over IPv6 alone (trace the pair's IPv4, or send with a client of your own)",
            targets.named_pairs(ctx)
        );
    };
    let Some(pod) = pod_netns::of_pod_on(src.into(), nodes).await else {
        bail!(
            "--probe {kind}: {} is behind no pod veth of the traced node{}: podtrace sends probes from the source pod's own namespace (found behind its veth, not by its address alone), so trace the source's node (or use kubectl podtrace)",
            ctx.label(src),
            if nodes.len() == 1 { "" } else { "s" }
        );
    };
    let netns = pod.path;
    Ok(Some(Probing {
        kind,
        netns,
        src,
        dst,
        count: args.probe.probe_count,
        interval: args.probe.probe_interval,
        timeout: args.probe.probe_timeout,
    }))
}

/// Sends the probes on a thread of its own (a namespace is entered per
/// thread), one every interval; the channel closes after the last.
pub(super) fn start(probing: Probing) -> mpsc::UnboundedReceiver<ProbeEvent> {
    let (tx, rx) = mpsc::unbounded_channel();
    send_on_a_thread(probing, tx);
    rx
}

/// An agent's probes: sent once `every_agent_traces` says no hook on
/// their way is still being attached; if it never says so, one result
/// says why none was sent.
pub(super) fn start_after(
    every_agent_traces: impl std::future::Future<Output = bool> + Send + 'static,
    probing: Probing,
) -> mpsc::UnboundedReceiver<ProbeEvent> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        if every_agent_traces.await {
            send_on_a_thread(probing, tx);
        } else {
            let never = not_sent(
                &probing,
                "the other agents did not all start tracing".into(),
            );
            let _ = tx.send(ProbeEvent::Done(never));
        }
    });
    rx
}

/// A probe that could not be sent, as its result.
pub(super) fn not_sent(probing: &Probing, why: String) -> ProbeResult {
    could_not_send(probing.kind, probing.dst.into(), why)
}

/// A probe of `kind` to `dst` that could not be sent, as its result.
pub(super) fn could_not_send(kind: ProbeKind, dst: IpAddr, why: String) -> ProbeResult {
    ProbeResult {
        kind: kind.to_string(),
        target: target_of(kind, dst),
        seq: 1,
        answered: false,
        silent: false,
        rtt_ms: None,
        result: format!("not sent: {why}"),
        flow_id: 0,
    }
}

/// `10.244.2.2:8080`, or the bare address for ICMP.
fn target_of(kind: ProbeKind, dst: impl Into<IpAddr>) -> String {
    let dst = dst.into();
    match kind.port() {
        Some(port) => std::net::SocketAddr::new(dst, port).to_string(),
        None => dst.to_string(),
    }
}

fn send_on_a_thread(probing: Probing, tx: mpsc::UnboundedSender<ProbeEvent>) {
    std::thread::spawn(move || {
        if let Err(e) = send_all(&probing, &tx) {
            let _ = tx.send(ProbeEvent::Done(not_sent(&probing, format!("{e:#}"))));
        }
    });
}

fn send_all(probing: &Probing, tx: &mpsc::UnboundedSender<ProbeEvent>) -> Result<()> {
    let _inside = netns::enter(&probing.netns)?;
    // One identifier per run, for ICMP: its sequence numbers count the
    // probes.
    let echo_id = ((std::process::id() as u16) ^ 0x7074).max(1);
    for seq in 1..=probing.count {
        if seq > 1 {
            std::thread::sleep(probing.interval);
        }
        let socket = send::socket(probing.kind)
            .map_err(|e| anyhow!("cannot open a socket in the pod: {e}"))?;
        // A ping socket's identifier is its port, the kernel's choice.
        let flow = match probing.kind {
            ProbeKind::Icmp if send::is_raw(&socket) => echo_id,
            _ => send::local_port(&socket),
        };
        if tx.send(ProbeEvent::Sending(flow)).is_err() {
            return Ok(());
        }
        let sent = Sent {
            src: probing.src,
            dst: probing.dst,
            kind: probing.kind,
            flow,
            seq: seq as u16,
        };
        let answer = send::send(socket, &sent, probing.timeout);
        if tx
            .send(ProbeEvent::Done(result_of(probing, seq, flow, answer)))
            .is_err()
        {
            return Ok(());
        }
    }
    Ok(())
}

fn result_of(probing: &Probing, seq: u32, flow_id: u16, answer: send::Answer) -> ProbeResult {
    ProbeResult {
        kind: probing.kind.to_string(),
        target: target_of(probing.kind, probing.dst),
        seq,
        answered: answer.answered,
        silent: answer.silent,
        rtt_ms: answer.rtt.map(|rtt| rtt.as_secs_f64() * 1e3),
        result: answer.result,
        flow_id,
    }
}
