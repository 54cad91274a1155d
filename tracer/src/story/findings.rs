//! Which of the doctor's failing checks bear on an outcome: the ones of
//! the node where it happened, of the families that can cause it.

use super::{Context, Outcome};
use crate::model::Finding;

/// The findings that bear on an outcome of a packet (`ipv6`: an IPv6
/// one), on the node where it happened: a missing route's BGP sessions
/// are the ones of its family (bird6's for IPv6).
pub fn for_outcome(outcome: &Outcome, ctx: &Context, ipv6: bool) -> Vec<Finding> {
    let bgp = if ipv6 { "bgp6" } else { "bgp" };
    let (node, families): (&str, &[&str]) = match outcome {
        Outcome::Dropped { node, .. } => (node, &["firewall", "kernel"]),
        Outcome::NoRoute { check, .. } => (&check.node, &["flannel", "calico", bgp, "kernel"]),
        Outcome::Vanished { node, .. } => (node, &[]),
        _ => return Vec::new(),
    };
    ctx.doctor
        .get(node)
        .into_iter()
        .flatten()
        .filter(|f| families.is_empty() || families.contains(&f.family.as_str()))
        .cloned()
        .collect()
}

/// For a missing route, what BIRD says of the node's BGP sessions (the
/// routes to other nodes' blocks come from them): `; BGP session
/// Mesh_192_0_2_12 with 192.0.2.12 is Active: …`, or nothing.
pub fn bgp_said(outcome: &Outcome, findings: &[Finding]) -> String {
    if !matches!(outcome, Outcome::NoRoute { .. }) {
        return String::new();
    }
    findings
        .iter()
        // The sessions' states; the router id and the rest stay in the
        // doctor's lines.
        .filter(|f| f.family.starts_with("bgp") && f.check.starts_with("BGP session"))
        .map(|f| format!("; {}", f.evidence))
        .collect()
}
