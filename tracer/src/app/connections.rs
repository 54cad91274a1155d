//! What a translated connection of the traced pair (a conntrack entry)
//! teaches the stories: in node mode, on every agent, and in the
//! front-end alike.

use super::targets::Targets;
use crate::model::conntrack;
use crate::story::{correlator::Correlator, Context};

/// Whether a conntrack entry is a connection of the traced pair, in a
/// family traced.
pub(super) fn of_the_traced_pair(entry: &conntrack::Entry, targets: &Targets) -> bool {
    targets.traced_pair_per_family().any(|(a, b)| {
        let traced = [a, b];
        traced.contains(&entry.orig.src) && traced.contains(&entry.orig.dst)
    })
}

/// A translated connection of the traced pair, from conntrack, told to
/// the stories' context and the correlator (node mode, and the front-end
/// of cluster mode); its translated addresses were not traced until
/// `untraced_until_ns` (0: always were).
pub(super) fn learn_translations(
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
