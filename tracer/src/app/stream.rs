//! The one stream loop ([`drive`], pwru's read → decode → hand over), and
//! what it hears from: a traced node's kernel (`node_stream`, node mode
//! and the agent), or the agents' logs (the front-end's `Session`).
//! Profile mode's live progress runs on it too.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::{
    stop::Stop,
    story_context::{ARP_PATIENCE, JOURNEY_IDLE, JOURNEY_PATIENCE},
};
use crate::{
    cli::Args,
    story::{
        correlator::{Correlator, Waits},
        Context,
    },
};

/// The correlator for a trace told with `ctx`, node mode's and the
/// front-end's alike.
pub(super) fn correlator_for(ctx: &Context, rules_traced: bool) -> Correlator {
    Correlator::new(Waits {
        idle_ns: JOURNEY_IDLE.as_nanos() as u64,
        patience_ns: JOURNEY_PATIENCE.as_nanos() as u64,
        arp_ns: ARP_PATIENCE.as_nanos() as u64,
        rules_traced,
        // The traced nodes' pods, and the nodes themselves: a packet sent
        // to a traced node's own address is seen again when it arrives.
        traced_destinations: ctx
            .nodes
            .values()
            .flat_map(|facts| {
                let own = facts
                    .view
                    .own_addresses()
                    .map(|ip| ipnet::IpNet::from(std::net::IpAddr::V4(ip)));
                facts.local_pod_subnets.iter().copied().chain(own)
            })
            .collect(),
    })
    .with_nat(ctx.nat.clone())
}

/// How long after the last probe its stories may take to be told (the
/// journey's patience, and its drop's rule).
pub(super) const PROBE_STORIES: Duration = JOURNEY_PATIENCE;
/// …and at most this long while one is still under way: a packet that
/// waits for ARP is freed by the kernel after its probes, and ending
/// before then told it `vanished`.
const PROBE_STORIES_AT_MOST: Duration = ARP_PATIENCE.saturating_add(JOURNEY_PATIENCE);

/// Whether the last probe's stories have had their time: each told, or
/// as long as the slowest may take.
fn probes_told(done: Option<Instant>, stories_under_way: bool) -> bool {
    done.is_some_and(|at| {
        let waited = at.elapsed();
        waited >= PROBE_STORIES && (!stories_under_way || waited >= PROBE_STORIES_AT_MOST)
    })
}

/// What a stream loop hears from, and does with what it hears: a traced
/// node's kernel ([`NodeStream`]: node mode and the agent), or the agents'
/// logs (the front-end).
pub(super) trait Source {
    type Event;
    /// How often [`Source::tick`] runs.
    fn tick_every(&self) -> Duration;
    /// The next thing heard; `None` once nothing more will come. Must be
    /// cancel-safe: the loop drops it whenever another arm wins.
    async fn next(&mut self) -> Option<Self::Event>;
    /// One thing heard.
    async fn take(&mut self, event: Self::Event) -> Result<()>;
    /// The periodic step: what is done is told or handed on.
    async fn tick(&mut self) -> Result<()>;
    /// Whether the trace is over (`--count` reached, every agent ended, a
    /// lease lost).
    fn over(&self) -> bool {
        false
    }
    /// When `--probe`'s last probe ended, once it has.
    fn probes_done(&self) -> Option<Instant> {
        None
    }
    /// Whether a story is still under way (not told yet).
    fn stories_under_way(&self) -> bool {
        false
    }
}

/// Why a stream loop ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ended {
    /// The source said the trace is over, or went quiet for good.
    Over,
    /// Ctrl-C or SIGTERM.
    Stopped,
    /// `--duration`, or the loop's own deadline.
    Deadline,
    /// The last probe's stories were told.
    Probed,
}

/// The one stream loop (pwru's read → decode → hand over): everything
/// `source` hears, handed back to it as it comes, and its tick, until it
/// is over, `stop` (when given), `deadline`, or (`end_with_probes`) the
/// last probe's stories have had their time.
pub(super) async fn drive(
    source: &mut impl Source,
    mut stop: Option<&mut Stop>,
    deadline: Option<Duration>,
    end_with_probes: bool,
) -> Result<Ended> {
    let mut tick = tokio::time::interval(source.tick_every());
    let until_deadline = until(deadline);
    tokio::pin!(until_deadline);
    while !source.over() {
        tokio::select! {
            event = source.next() => match event {
                Some(event) => source.take(event).await?,
                None => return Ok(Ended::Over),
            },
            _ = tick.tick() => {
                source.tick().await?;
                if end_with_probes && probes_told(source.probes_done(), source.stories_under_way()) {
                    return Ok(Ended::Probed);
                }
            }
            () = stopped(&mut stop) => return Ok(Ended::Stopped),
            _ = &mut until_deadline => return Ok(Ended::Deadline),
        }
    }
    Ok(Ended::Over)
}

/// Resolves after `--duration`, or never.
pub(super) async fn until(duration: Option<Duration>) {
    match duration {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Whether a trace without `--count` or `--duration` ends once its probes'
/// stories are told.
pub(super) fn ends_with_probes(args: &Args) -> bool {
    args.count.is_none() && args.duration.is_none()
}

async fn stopped(stop: &mut Option<&mut Stop>) {
    match stop {
        Some(stop) => stop.recv().await,
        None => std::future::pending().await,
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decode::{
            hop::{tests::hop, Direction},
            tests as frames,
        },
        node::{interfaces::Role, NodeFacts},
    };

    #[test]
    fn a_packet_sent_to_a_traced_nodes_own_address_waits_for_its_arrival() {
        let mut ctx = Context::default();
        let mut node_2 = NodeFacts::default();
        node_2.view.addresses = vec![(2, "192.0.2.12".parse().unwrap())];
        ctx.nodes.insert("node-2".into(), node_2);
        let mut correlator = correlator_for(&ctx, false);
        let frame = frames::icmp_echo([10, 244, 1, 2], [192, 0, 2, 12], 63, 1);
        let leaving = hop(
            0,
            "node-1",
            "eth0",
            Role::Underlay,
            Direction::Egress,
            &frame,
        );
        correlator.observe(leaving);
        let idle = JOURNEY_IDLE.as_nanos() as u64;
        assert!(correlator.take_finished(idle + 1).is_empty());
        let patience = JOURNEY_PATIENCE.as_nanos() as u64;
        assert_eq!(correlator.take_finished(patience + 1).len(), 1);
    }
}
