//! One agent as the front-end follows it, and what it counted, for the
//! summary.

use crate::{
    app::wire::{Reader, Start},
    model::{NodeCounts, Summary},
    story::clock::Placement,
};

/// One agent as the front-end follows it.
#[derive(Default)]
pub(super) struct Followed {
    pub pod: String,
    pub start: Option<Start>,
    pub reader: Reader,
    pub summary: Option<Summary>,
    pub ended: bool,
    pub lost_kernel: u64,
    pub lost_agent: u64,
}

impl Followed {
    /// Adds its counts to `summary`, in all and as its node's line
    /// (`placement`: its clock on the common timeline, if measured).
    pub(super) fn add_counts(
        &self,
        node: &str,
        agents_namespace: &str,
        placement: Option<&Placement>,
        summary: &mut Summary,
    ) {
        let own = self.summary.clone().unwrap_or_default();
        let lost_kernel = self
            .lost_kernel
            .max(own.lost_ringbuf_full + own.lost_snapshot);
        let lost_agent = self.lost_agent.max(own.lost_agent);
        let lost_transport = self.reader.lost.saturating_sub(lost_agent)
            + u64::from(self.summary.is_none() && self.start.is_some());
        summary.sightings += own.sightings;
        summary.lost_ringbuf_full += own.lost_ringbuf_full;
        summary.lost_snapshot += own.lost_snapshot;
        summary.undecodable += own.undecodable;
        summary.unknown_interface += own.unknown_interface;
        summary.interfaces_vanished += own.interfaces_vanished;
        summary.interfaces_added += own.interfaces_added;
        summary.lost_agent += lost_agent;
        summary.lost_transport += lost_transport;
        summary.nodes.push(NodeCounts {
            node: node.to_string(),
            agent: format!("{agents_namespace}/{}", self.pod),
            kernel: self.start.as_ref().and_then(|s| s.kernel.clone()),
            sightings: own.sightings,
            lost_kernel,
            lost_agent,
            lost_transport,
            clock: placement.map(|p| match p.uncertainty_ns {
                Some(0) => "the reference".into(),
                Some(u) => format!(
                    "{:+.1} µs ±{:.1} µs against the reference",
                    -(p.correction_ns as f64) / 1e3,
                    u as f64 / 1e3
                ),
                None => "unmeasured (no traced packet crossed to it)".into(),
            }),
        });
    }
}
