//! One timeline for several nodes' kernel clocks (cluster mode).
//!
//! Each node stamps its sightings with its own CLOCK_MONOTONIC. An agent
//! says (CLOCK_REALTIME − CLOCK_MONOTONIC) when it starts, which puts its
//! times on its wall clock; wall clocks differ between nodes too (NTP
//! keeps them within milliseconds, a broken one is off by seconds), which
//! would reorder hops and give cross-node steps absurd latencies. So the
//! traced packets themselves are the reference: a packet leaving node A
//! by the underlay at a_out and arriving at node B at b_in gives
//! d_ab = b_in − a_out = delay + θ (θ: B's clock minus A's); the reply,
//! d_ba = delay − θ. With the one-way delays assumed equal,
//! θ = (d_ab − d_ba) / 2. The least-delayed crossings each way are used
//! (queueing only adds delay); the residual is how far the exchanges'
//! own estimates spread around it, or, with one exchange, the one-way
//! delay (the true θ lies within it, since no delay is negative).
//!
//! Pure: fed with hops, tested on recorded crossings.

use std::collections::{HashMap, VecDeque};

use crate::{
    decode::hop::{Direction, Hop},
    model::Name,
    node::interfaces::Role,
    story::journey::PacketKey,
};

/// Crossings waiting for their other end, at most this many.
const MAX_PENDING: usize = 4096;
/// Exchanges kept per pair of nodes.
const MAX_EXCHANGES: usize = 64;

/// One node's clock as placed on the common timeline.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Placement {
    /// Added to the node's wall time (kernel time + realtime offset) to
    /// get the reference node's wall time.
    pub correction_ns: i64,
    /// How far off that may be, when packets measured it.
    pub uncertainty_ns: Option<u64>,
}

/// One direction's crossings between two nodes.
#[derive(Default, Debug)]
struct Pair {
    /// Least one-way measure (ns, in the nodes' wall times), each way:
    /// [low → high name, high → low name].
    least: [Option<i64>; 2],
    /// Last measure each way, to pair exchanges.
    last: [Option<i64>; 2],
    /// θ of each exchange (high's clock minus low's).
    exchanges: VecDeque<i64>,
}

#[derive(Default)]
pub struct Clocks {
    /// The node every other is placed against (the first to start).
    reference: Option<String>,
    realtime_offset: HashMap<String, i64>,
    /// Underlay crossings seen at one end: (packet, egress?) → (node, wall).
    pending: HashMap<(PacketKey, bool), (Name, i64)>,
    order: VecDeque<(PacketKey, bool)>,
    pairs: HashMap<(String, String), Pair>,
}

impl Clocks {
    /// A node's agent started: its (realtime − monotonic) offset.
    pub fn start(&mut self, node: &str, realtime_offset_ns: i64) {
        self.reference.get_or_insert_with(|| node.to_string());
        self.realtime_offset.insert(node.into(), realtime_offset_ns);
    }

    /// The node's kernel time on its own wall clock.
    fn wall(&self, node: &str, ktime_ns: u64) -> i64 {
        ktime_ns as i64 + self.realtime_offset.get(node).copied().unwrap_or(0)
    }

    /// Learns from a hop (in its node's kernel time) if it crosses the wire.
    pub fn observe(&mut self, hop: &Hop) {
        if hop.role != Role::Underlay || hop.direction == Direction::Drop {
            return;
        }
        let egress = hop.direction == Direction::Egress;
        let key = PacketKey::of(&hop.packet);
        let wall = self.wall(&hop.node, hop.ktime_ns);
        match self.pending.remove(&(key, !egress)) {
            Some((other, other_wall)) if other != hop.node => {
                let (from, out, to, arrived) = if egress {
                    (hop.node.clone(), wall, other, other_wall)
                } else {
                    (other, other_wall, hop.node.clone(), wall)
                };
                self.crossed(&from, &to, arrived - out);
            }
            _ => {
                if self.pending.len() >= MAX_PENDING {
                    if let Some(old) = self.order.pop_front() {
                        self.pending.remove(&old);
                    }
                }
                self.pending.insert((key, egress), (hop.node.clone(), wall));
                self.order.push_back((key, egress));
            }
        }
    }

    /// A packet went `from` → `to` and measured `d` (delay + θ).
    fn crossed(&mut self, from: &str, to: &str, d: i64) {
        let (low, high, way) = if from < to {
            (from, to, 0)
        } else {
            (to, from, 1)
        };
        let pair = self.pairs.entry((low.into(), high.into())).or_default();
        pair.least[way] = Some(pair.least[way].map_or(d, |l| l.min(d)));
        pair.last[way] = Some(d);
        if let [Some(up), Some(down)] = pair.last {
            pair.exchanges.push_back((up - down) / 2);
            pair.last[1 - way] = None;
            if pair.exchanges.len() > MAX_EXCHANGES {
                pair.exchanges.pop_front();
            }
        }
    }

    /// θ and its residual for `high` relative to `low`, once both ways
    /// were measured.
    fn estimate(pair: &Pair) -> Option<(i64, u64)> {
        let [Some(up), Some(down)] = pair.least else {
            return None;
        };
        let theta = (up - down) / 2;
        let residual = if pair.exchanges.len() < 2 {
            ((up + down) / 2).unsigned_abs()
        } else {
            pair.exchanges
                .iter()
                .map(|t| (t - theta).unsigned_abs())
                .max()
                .unwrap_or(0)
        };
        Some((theta, residual.max(1_000)))
    }

    /// Where each node's clock stands against the reference: directly, or
    /// through nodes already placed.
    pub fn placements(&self) -> HashMap<String, Placement> {
        let mut placed = HashMap::new();
        let Some(reference) = &self.reference else {
            return placed;
        };
        placed.insert(
            reference.clone(),
            Placement {
                correction_ns: 0,
                uncertainty_ns: Some(0),
            },
        );
        let mut grew = true;
        while grew {
            grew = false;
            for ((low, high), pair) in &self.pairs {
                let Some((theta, residual)) = Self::estimate(pair) else {
                    continue;
                };
                let (known, new, sign) = match (placed.get(low), placed.get(high)) {
                    (Some(p), None) => (*p, high, 1),
                    (None, Some(p)) => (*p, low, -1),
                    _ => continue,
                };
                placed.insert(
                    new.clone(),
                    Placement {
                        correction_ns: known.correction_ns - sign * theta,
                        uncertainty_ns: known.uncertainty_ns.map(|u| u + residual),
                    },
                );
                grew = true;
            }
        }
        for node in self.realtime_offset.keys() {
            placed.entry(node.clone()).or_default();
        }
        placed
    }

    /// The reference node's (realtime − monotonic) offset: the common
    /// timeline on its wall clock.
    pub fn reference_offset_ns(&self) -> i64 {
        self.reference
            .as_ref()
            .and_then(|r| self.realtime_offset.get(r))
            .copied()
            .unwrap_or(0)
    }

    /// A kernel time of `node` on the reference node's kernel timeline.
    pub fn common_ns(
        &self,
        placements: &HashMap<String, Placement>,
        node: &str,
        ktime_ns: u64,
    ) -> u64 {
        let correction = placements.get(node).map_or(0, |p| p.correction_ns);
        (self.wall(node, ktime_ns) + correction - self.reference_offset_ns()).max(0) as u64
    }
}

/// A span of kernel time in microseconds, to a tenth, as stories show it.
pub(super) fn micros(ns: u64) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{hop::tests::hop, tests as frames};

    fn crossing(c: &mut Clocks, seq: u16, a_out: u64, b_in: u64, reply: bool) {
        let (src, dst) = if reply {
            ([10, 244, 2, 2], [10, 244, 1, 2])
        } else {
            ([10, 244, 1, 2], [10, 244, 2, 2])
        };
        let frame = frames::icmp_echo(src, dst, 63, seq);
        let (from, to) = if reply { ("n2", "n1") } else { ("n1", "n2") };
        // The arrival is observed first: agents' lines come in any order.
        c.observe(&hop(
            b_in,
            to,
            "eth0",
            Role::Underlay,
            Direction::Ingress,
            &frame,
        ));
        c.observe(&hop(
            a_out,
            from,
            "eth0",
            Role::Underlay,
            Direction::Egress,
            &frame,
        ));
    }

    #[test]
    fn a_skew_of_seconds_is_measured_from_request_and_reply_crossings() {
        let mut c = Clocks::default();
        c.start("n1", 1_000);
        // n2's wall clock is 3 s ahead; one-way delays 20 µs and 24 µs.
        c.start("n2", 1_000 + 3_000_000_000);
        crossing(&mut c, 1, 100_000, 120_000, false);
        crossing(&mut c, 1, 150_000, 174_000, true);
        let placed = c.placements();
        let n2 = placed["n2"];
        // Measured: 3 s + 20 µs one way, 24 µs − 3 s back: θ = 3 s − 2 µs.
        assert_eq!(n2.correction_ns, -3_000_000_000 + 2_000);
        // One exchange: the residual is the one-way delay.
        assert_eq!(n2.uncertainty_ns, Some(22_000));
        // The arrival: 22 µs after the egress at 100 µs on n1's clock.
        assert_eq!(c.common_ns(&placed, "n2", 120_000), 122_000);
    }

    #[test]
    fn more_exchanges_narrow_the_residual_to_their_spread() {
        let mut c = Clocks::default();
        c.start("n1", 0);
        c.start("n2", -500_000_000);
        for (seq, jitter) in [(1u16, 0u64), (2, 4_000), (3, 1_000)] {
            let t = u64::from(seq) * 1_000_000;
            crossing(&mut c, seq, t, t + 20_000 + jitter, false);
            crossing(&mut c, seq, t + 500_000, t + 520_000, true);
        }
        let n2 = c.placements()["n2"];
        assert_eq!(n2.correction_ns, 500_000_000);
        assert_eq!(n2.uncertainty_ns, Some(2_000));
    }

    #[test]
    fn a_node_with_no_crossing_yet_keeps_its_wall_clock() {
        let mut c = Clocks::default();
        c.start("n1", 0);
        c.start("n3", 7);
        let placed = c.placements();
        assert_eq!(placed["n3"], Placement::default());
        assert_eq!(placed["n1"].uncertainty_ns, Some(0));
    }
}
