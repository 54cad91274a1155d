//! Following the traced pair as it changes under way: a connection
//! translated (conntrack), a pod that comes back with a new IP (the API).

use std::net::Ipv4Addr;

use anyhow::Result;
use tokio::sync::mpsc;

use super::{
    connections::{learn_translations, of_the_traced_pair},
    pairs::{flow_ips, flow_keys, flow_keys6, traced_pairs},
    trace::Trace,
};
use crate::model::conntrack;
use crate::{
    cli::widen,
    cluster::api::PodMoved,
    probe::clock::monotonic_ns,
    story::{correlator::Correlator, Context},
};

/// A conntrack entry of a node (node mode): if it is the traced pair's,
/// its translated addresses traced and its translations learnt.
pub(super) async fn learn_connection(
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

/// The addresses a connection of the traced pair is translated to,
/// traced on every node from now on, and a backend's pod veth watched
/// where it is local (node mode, and each agent of cluster mode).
/// Returns whether they were not traced before.
pub(super) async fn follow_connection(entry: &conntrack::Entry, trace: &mut Trace) -> Result<bool> {
    if entry.dnat() {
        widen_filter(entry, trace)?;
    }
    // The connection as the peer sees it, both ways: what the kernel
    // filter must now let through (either family's).
    let (a, b) = (entry.reply.src, entry.reply.dst);
    let new = [(a, b), (b, a)];
    let traced = traced_pairs(&trace.targets);
    if (a, b) == (entry.orig.dst, entry.orig.src)
        || traced.contains(&(b, a))
        || trace.learnt_pairs.iter().any(|p| new.contains(p))
    {
        return Ok(false);
    }
    // Every node's kernel filter first, microseconds apart: the packets
    // of the connection go on while podtrace reads a node's links to
    // watch the backend's veth (milliseconds), and one that crossed to a
    // node not yet told would look lost there.
    let (flows, flows6) = (flow_keys(&new), flow_keys6(&new));
    for node in &mut trace.nodes {
        node.probe.replace_flows(&[], &flows)?;
        node.probe.add_flows6(&flows6)?;
    }
    for node in &mut trace.nodes {
        node.follow_rules(&new)?;
        if entry.dnat() {
            node.watch_pod(a).await?;
        }
    }
    trace.learnt_pairs.extend(new);
    Ok(true)
}

/// `--port` keeps a Service port: its backend's port is now kept too, on
/// every node (the packets after the DNAT carry only that one).
fn widen_filter(entry: &conntrack::Entry, trace: &mut Trace) -> Result<()> {
    let Some(filter) = &mut trace.l4_filter else {
        return Ok(());
    };
    let (front, back) = (entry.orig.dport, entry.reply.sport);
    match widen(filter, entry.orig.protocol, front, back) {
        Ok(true) => {
            for node in &mut trace.nodes {
                node.probe.replace_l4_filter(filter)?;
            }
        }
        Ok(false) => {}
        Err(e) => {
            // Once: every later connection to those backends meets it too.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!("podtrace: {e:#}: the packets of {front}'s backends on port {back} (and any later target port) are left out in the kernel, so their stories end where the DNAT happens");
            });
        }
    }
    Ok(())
}

/// Watches the traced pods through the API, when names came from it: a
/// pod that comes back with a new IP is said on the channel.
pub(super) fn watch_moves(trace: &Trace) -> mpsc::UnboundedReceiver<PodMoved> {
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

/// A traced pod came back with a new IP: trace the new pair everywhere.
pub(super) fn follow_move(
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
