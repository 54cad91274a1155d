//! Correlation: grouping the sightings of one packet into one journey.
//!
//! Pure: it sees only recorded hops and timestamps, so it is tested on
//! recorded event sequences without a kernel.

use std::{collections::HashMap, net::Ipv4Addr};

use serde::Serialize;

use crate::{
    decode::{Decoded, Transport},
    interfaces::Role,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Ingress,
    Egress,
    /// Not a tc hook: the kernel dropped the packet here.
    Drop,
}

impl Direction {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
            Self::Drop => "drop",
        }
    }
}

/// The kernel's route for a packet as it arrived (bpf_fib_lookup at tc
/// ingress).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KernelRoute {
    /// success, blackhole, unreachable, prohibit, not_forwarded,
    /// forwarding_disabled, no_neighbour, frag_needed, …
    pub result: String,
    /// Output device and next hop, when the lookup found a route.
    pub dev: Option<String>,
    pub via: Option<Ipv4Addr>,
}

impl KernelRoute {
    /// Names a `BPF_FIB_LKUP_RET_*` code (UAPI, stable).
    pub fn result_name(code: u8) -> String {
        const NAMES: [&str; 10] = [
            "success",
            "blackhole",
            "unreachable",
            "prohibit",
            "not_forwarded",
            "forwarding_disabled",
            "unsupported_lwt",
            "no_neighbour",
            "frag_needed",
            "no_source_address",
        ];
        NAMES
            .get(usize::from(code))
            .map_or_else(|| format!("code {code}"), |n| n.to_string())
    }

    pub fn found(&self) -> bool {
        matches!(
            self.result.as_str(),
            "success" | "no_neighbour" | "frag_needed"
        )
    }
}

/// Why and where the kernel dropped a packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DropInfo {
    /// `enum skb_drop_reason` name, without SKB_DROP_REASON_.
    pub reason: String,
    /// The kernel function that freed the packet, `name+0xoff`.
    pub location: String,
    /// The packet had no IP header yet; it was matched by its socket.
    pub by_socket: bool,
}

/// One sighting, placed on its node and interface.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hop {
    pub ktime_ns: u64,
    pub node: String,
    pub iface: String,
    pub role: Role,
    pub direction: Direction,
    pub skb_len: u32,
    pub mark: u32,
    pub packet: Decoded,
    pub drop: Option<DropInfo>,
    pub route: Option<KernelRoute>,
}

/// What stays the same for one packet on every hop, encapsulated or not:
/// addresses, IP ID and the transport identity. TTL and the tunnel are
/// left out because routing and encapsulation change them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PacketKey {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub ip_id: u16,
    pub transport: Transport,
}

impl PacketKey {
    pub fn of(packet: &Decoded) -> Self {
        let p = &packet.packet;
        Self {
            src: p.src,
            dst: p.dst,
            ip_id: p.ip_id,
            transport: p.transport,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Journey {
    pub key: PacketKey,
    /// In kernel time order.
    pub hops: Vec<Hop>,
}

impl Journey {
    fn last_seen(&self) -> u64 {
        self.hops.last().map_or(0, |h| h.ktime_ns)
    }

    /// Where the packet was first handed to a pod other than its sender.
    pub fn delivered_at(&self) -> Option<usize> {
        let first = self.hops.first()?;
        self.hops.iter().position(|h| {
            h.role == Role::PodVeth
                && h.direction == Direction::Egress
                && !(h.node == first.node && h.iface == first.iface)
        })
    }

    /// Delivered or dropped: nothing on the path is still to come.
    fn reached_an_end(&self) -> bool {
        self.delivered_at().is_some()
            || self
                .hops
                .last()
                .is_some_and(|h| h.direction == Direction::Drop)
    }
}

/// Groups hops into journeys. A journey that reached an end (delivered or
/// dropped) is finished once no hop has joined it for `idle_ns`; one still
/// under way gets `patience_ns`, since a first packet may wait for ARP on
/// the way (the kernel retries after a second).
pub struct Correlator {
    open: HashMap<PacketKey, Journey>,
    idle_ns: u64,
    patience_ns: u64,
}

impl Correlator {
    pub fn new(idle_ns: u64, patience_ns: u64) -> Self {
        Self {
            open: HashMap::new(),
            idle_ns,
            patience_ns,
        }
    }

    pub fn observe(&mut self, hop: Hop) {
        let key = PacketKey::of(&hop.packet);
        let journey = self.open.entry(key).or_insert_with(|| Journey {
            key,
            hops: Vec::new(),
        });
        // Different CPUs and ring buffers deliver slightly out of order.
        let at = journey.hops.partition_point(|h| h.ktime_ns <= hop.ktime_ns);
        journey.hops.insert(at, hop);
    }

    /// Journeys that are done by `now_ns`, oldest first.
    pub fn take_finished(&mut self, now_ns: u64) -> Vec<Journey> {
        let keys: Vec<_> = self
            .open
            .iter()
            .filter(|(_, j)| {
                let wait = if j.reached_an_end() {
                    self.idle_ns
                } else {
                    self.patience_ns
                };
                j.last_seen().saturating_add(wait) < now_ns
            })
            .map(|(k, _)| *k)
            .collect();
        self.drain(keys)
    }

    /// Every open journey, oldest first (at exit).
    pub fn take_all(&mut self) -> Vec<Journey> {
        let keys: Vec<_> = self.open.keys().copied().collect();
        self.drain(keys)
    }

    pub fn pending(&self) -> usize {
        self.open.len()
    }

    fn drain(&mut self, keys: Vec<PacketKey>) -> Vec<Journey> {
        let mut out: Vec<_> = keys.iter().filter_map(|k| self.open.remove(k)).collect();
        out.sort_by_key(|j| j.hops.first().map_or(0, |h| h.ktime_ns));
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::decode::{decode, tests as frames};

    pub(crate) fn hop(
        t: u64,
        node: &str,
        iface: &str,
        role: Role,
        dir: Direction,
        frame: &[u8],
    ) -> Hop {
        Hop {
            ktime_ns: t,
            node: node.into(),
            iface: iface.into(),
            role,
            direction: dir,
            skb_len: frame.len() as u32,
            mark: 0,
            packet: decode(&frame[..frame.len().min(128)], true).unwrap(),
            drop: None,
            route: None,
        }
    }

    /// A drop of `frame` at `iface`, freed in nf_hook_slow+0x9c.
    pub(crate) fn drop_hop(
        t: u64,
        node: &str,
        iface: &str,
        role: Role,
        frame: &[u8],
        reason: &str,
    ) -> Hop {
        let mut h = hop(t, node, iface, role, Direction::Drop, frame);
        h.drop = Some(DropInfo {
            reason: reason.into(),
            location: "nf_hook_slow+0x9c".into(),
            by_socket: false,
        });
        h
    }

    #[test]
    fn encapsulated_copies_join_the_inner_packet_and_others_stay_apart() {
        let req1 = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let req1_routed = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
        let req2 = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 2);
        let mut c = Correlator::new(1_000_000, 1_000_000);
        c.observe(hop(
            100,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &req1,
        ));
        c.observe(hop(
            300,
            "n1",
            "eth0",
            Role::Underlay,
            Direction::Egress,
            &frames::vxlan(&req1_routed, 1),
        ));
        // Out of order across CPUs: still sorted by kernel time.
        c.observe(hop(
            200,
            "n1",
            "flannel.1",
            Role::Tunnel,
            Direction::Egress,
            &req1_routed,
        ));
        c.observe(hop(
            5_000,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &req2,
        ));
        assert_eq!(c.pending(), 2);
        assert!(c.take_finished(1_000_100).is_empty());
        let done = c.take_finished(1_000_301);
        assert_eq!(done.len(), 1);
        let times: Vec<_> = done[0].hops.iter().map(|h| h.ktime_ns).collect();
        assert_eq!(times, [100, 200, 300]);
        assert!(done[0].hops[2].packet.tunnel.is_some());
        let rest = c.take_all();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].hops.len(), 1);
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn a_journey_under_way_waits_longer_than_one_that_ended() {
        let out = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let back = frames::icmp_echo([10, 244, 2, 2], [10, 244, 1, 2], 64, 1);
        let mut c = Correlator::new(1_000, 50_000);
        // Left node-1, not yet seen on node-2 (say, waiting for ARP there).
        c.observe(hop(
            0,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &out,
        ));
        c.observe(hop(
            10,
            "n1",
            "eth0",
            Role::Underlay,
            Direction::Egress,
            &out,
        ));
        // Delivered: done.
        c.observe(hop(
            0,
            "n2",
            "veth2",
            Role::PodVeth,
            Direction::Ingress,
            &back,
        ));
        c.observe(hop(
            20,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Egress,
            &back,
        ));
        let done = c.take_finished(2_000);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].hops[0].node, "n2");
        assert!(c.take_finished(40_000).is_empty());
        c.observe(hop(
            45_000,
            "n2",
            "veth2",
            Role::PodVeth,
            Direction::Egress,
            &out,
        ));
        let done = c.take_finished(47_000);
        assert_eq!(
            done[0].hops.len(),
            3,
            "the late hops joined the same journey"
        );
    }
}
