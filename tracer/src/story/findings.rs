//! Which of the doctor's failing checks bear on an outcome: the ones of
//! the node where it happened, of the families that can cause it.

use super::{Context, Outcome};
use crate::model::Finding;

/// The findings that bear on an outcome, on the node where it happened.
pub fn for_outcome(outcome: &Outcome, ctx: &Context) -> Vec<Finding> {
    let (node, families): (&str, &[&str]) = match outcome {
        Outcome::Dropped { node, .. } => (node, &["firewall", "kernel"]),
        Outcome::NoRoute { check, .. } => (&check.node, &["flannel", "calico", "kernel"]),
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
