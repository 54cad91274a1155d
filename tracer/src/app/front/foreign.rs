//! Sightings in namespaces no agent's node owns (a pod's own stack):
//! where agents share a kernel (the lab), every agent's drop program sees
//! the same free, and each reports it. Told once.
//!
//! Each program reads the clock itself, so the copies differ by the
//! time between the programs' runs: a copy is the same packet freed the
//! same way within [`SAME_FREE_NS`], not the same timestamp.

use std::{collections::HashMap, net::IpAddr};

use crate::decode::hop::Hop;

/// Programs attached to one tracepoint run one after another for one
/// event: microseconds apart. A packet (its IP id) is not freed twice
/// the same way within a millisecond.
const SAME_FREE_NS: u64 = 1_000_000;

/// Copies come from agents that may lag each other by their logs, never
/// by this much of the kernel's time: older sightings are forgotten.
const REMEMBERED_NS: u64 = 120 * 1_000_000_000;

/// The packet and how it was freed (or seen): what every copy shares.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Freed {
    src: IpAddr,
    dst: IpAddr,
    ip_id: u16,
    drop: Option<(String, String)>,
}

#[derive(Default)]
pub(super) struct ForeignSightings {
    /// Kernel times each packet was seen freed at.
    seen: HashMap<Freed, Vec<u64>>,
    newest_ns: u64,
    /// Forget old sightings when this many are remembered (doubles).
    forget_at: usize,
}

impl ForeignSightings {
    /// Whether `hop` is news: not another agent's copy of a sighting
    /// already taken.
    pub(super) fn first_sight(&mut self, hop: &Hop) -> bool {
        let p = &hop.packet.packet;
        let key = Freed {
            src: p.src,
            dst: p.dst,
            ip_id: p.ip_id,
            drop: hop
                .drop
                .as_ref()
                .map(|d| (d.reason.clone(), d.location.clone())),
        };
        let times = self.seen.entry(key).or_default();
        if times
            .iter()
            .any(|t| t.abs_diff(hop.ktime_ns) <= SAME_FREE_NS)
        {
            return false;
        }
        times.push(hop.ktime_ns);
        self.newest_ns = self.newest_ns.max(hop.ktime_ns);
        if self.seen.len() >= self.forget_at {
            self.forget_old();
        }
        true
    }

    fn forget_old(&mut self) {
        let horizon = self.newest_ns.saturating_sub(REMEMBERED_NS);
        self.seen.retain(|_, times| {
            times.retain(|&t| t >= horizon);
            !times.is_empty()
        });
        self.forget_at = (self.seen.len() * 2).max(1024);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode::tests as frames, node::interfaces::Role};

    fn freed(t: u64, label: &str, ip_id: u16) -> Hop {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 62, 1);
        let mut hop =
            crate::decode::hop::tests::drop_hop(t, label, "eth0", Role::Other, &frame, "NO_SOCKET");
        hop.packet.packet.ip_id = ip_id;
        hop
    }

    #[test]
    fn each_agents_copy_of_one_free_is_taken_once() {
        let mut foreign = ForeignSightings::default();
        // Two agents' programs read the clock 700 ns apart.
        assert!(foreign.first_sight(&freed(5_000_000, "pod default/db-0", 1)));
        assert!(!foreign.first_sight(&freed(5_000_700, "pod default/db-0", 1)));
        // Another packet, and the same one freed again much later, are news.
        assert!(foreign.first_sight(&freed(5_000_700, "pod default/db-0", 2)));
        assert!(foreign.first_sight(&freed(900_000_000, "pod default/db-0", 1)));
    }

    #[test]
    fn old_sightings_are_forgotten() {
        let mut foreign = ForeignSightings::default();
        for i in 0..2_000u64 {
            assert!(foreign.first_sight(&freed(i * 1_000_000_000, "pod default/db-0", i as u16)));
        }
        assert!(foreign.seen.len() < 2_000, "{}", foreign.seen.len());
    }
}
