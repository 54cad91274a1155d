//! A sighting as a hop: placed on its node and interface, or counted in
//! the summary as why not (before the trace was armed, in a namespace
//! that is not the pair's, on an unknown interface, undecodable).

use podtrace_common::{drops::NODE_OTHER_NETNS, sighting::Sighting};

use super::trace::Trace;
use crate::{
    decode::{
        hop::Hop,
        sighting::{place, Unplaced},
    },
    model::Summary,
    story::pmtu::dropped_too_big,
};

/// A sighting as a hop on its node and interface (a pod's namespace is
/// named on first sight), or counted in the summary as why not.
pub(super) async fn to_hop(s: &Sighting, trace: &mut Trace, summary: &mut Summary) -> Option<Hop> {
    // Before every hook was attached: not part of the trace.
    if s.ktime_ns < trace.armed_ns {
        return None;
    }
    summary.sightings += 1;
    if s.node_id == NODE_OTHER_NETNS {
        if s.netns_inum == 0 {
            summary.drops_without_netns += 1;
            return None;
        }
        let a_traced_pods = trace
            .nodes
            .iter()
            .any(|n| n.pod_namespaces.contains(&s.netns_inum));
        if !a_traced_pods {
            summary.drops_elsewhere += 1;
            return None;
        }
        trace.others.learn(s.netns_inum).await;
    }
    let keep = trace.keep_snapshots;
    let placed = place(
        s,
        &trace.nodes,
        &trace.others,
        &trace.kernel,
        keep,
        &mut trace.encrypted_legs,
    );
    match placed {
        Ok(hop) => {
            follow_errors_about(&hop, trace);
            Some(hop)
        }
        Err(Unplaced::UnknownInterface) => {
            summary.unknown_interface += 1;
            None
        }
        Err(Unplaced::Undecodable) => {
            summary.undecodable += 1;
            None
        }
        Err(Unplaced::EncryptedLegUntold) => {
            summary.wireguard_legs_untold += 1;
            None
        }
        // Handed over once its leg is read (`paired_drops`).
        Err(Unplaced::AwaitingLeg) => None,
    }
}

/// A traced packet too big for its path: the ICMP error its node sends
/// its sender is rule-traced from now on, so that a firewall that drops
/// it (a PMTU black hole) is named.
fn follow_errors_about(hop: &Hop, trace: &mut Trace) {
    if !dropped_too_big(hop) {
        return;
    }
    let sender = hop.packet.packet.src;
    if let Some(node) = trace.nodes.iter_mut().find(|n| n.name == hop.node) {
        if let Err(e) = node.follow_errors_to(sender) {
            eprintln!(
                "podtrace: {}: cannot trace the ICMP errors to {sender} through the rules: {e:#}",
                hop.node
            );
        }
    }
}
