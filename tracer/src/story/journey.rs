//! Correlation: grouping the sightings of one packet into one journey,
//! with the evidence other signals give about it (the netfilter rule that
//! dropped it), so that a journey is complete when it is told.
//!
//! Pure: it sees only recorded hops, rules and timestamps, so it is tested
//! on recorded event sequences without a kernel. Nothing in it grows
//! without bound: evidence that finds no journey expires.

use std::{
    collections::{HashMap, VecDeque},
    net::Ipv4Addr,
};

use crate::{
    decode::{
        hop::{Direction, Hop},
        Decoded, Transport,
    },
    node::interfaces::Role,
    probe::netfilter::{NetfilterRule, PacketId},
};

/// The reason name of a drop by an iptables / nftables verdict.
pub const NETFILTER_DROP: &str = "NETFILTER_DROP";

/// Rules waiting for their journey, at most this many.
const MAX_WAITING_RULES: usize = 4096;

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

    fn id(&self) -> PacketId {
        (self.src, self.dst, self.ip_id)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Journey {
    pub key: PacketKey,
    /// In kernel time order.
    pub hops: Vec<Hop>,
    /// The netfilter rule that dropped it, from rule tracing.
    pub rule: Option<NetfilterRule>,
}

impl Journey {
    /// A journey of recorded hops (in kernel time order), with no rule.
    pub fn new(hops: Vec<Hop>) -> Self {
        Self {
            key: PacketKey::of(&hops[0].packet),
            hops,
            rule: None,
        }
    }

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

    /// Ended in a netfilter drop whose rule has not arrived yet.
    fn awaits_rule(&self) -> bool {
        self.rule.is_none()
            && self
                .hops
                .last()
                .is_some_and(|h| h.drop.as_ref().is_some_and(|d| d.reason == NETFILTER_DROP))
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
    /// Whether netfilter rules are traced: a netfilter drop then waits for
    /// its rule as long as a journey under way would.
    rules_traced: bool,
    /// Rules that arrived before their journey's first hop: (when, packet,
    /// rule), oldest first.
    waiting_rules: VecDeque<(u64, PacketId, NetfilterRule)>,
}

impl Correlator {
    pub fn new(idle_ns: u64, patience_ns: u64) -> Self {
        Self {
            open: HashMap::new(),
            idle_ns,
            patience_ns,
            rules_traced: false,
            waiting_rules: VecDeque::new(),
        }
    }

    /// Netfilter drops will be named by rule tracing: wait for the rule.
    pub fn expect_rules(mut self) -> Self {
        self.rules_traced = true;
        self
    }

    pub fn observe(&mut self, hop: Hop) {
        let key = PacketKey::of(&hop.packet);
        let waiting = &mut self.waiting_rules;
        let journey = self.open.entry(key).or_insert_with(|| Journey {
            key,
            hops: Vec::new(),
            rule: waiting
                .iter()
                .position(|(_, id, _)| *id == key.id())
                .and_then(|at| waiting.remove(at))
                .map(|(_, _, rule)| rule),
        });
        // Different CPUs and ring buffers deliver slightly out of order.
        let at = journey.hops.partition_point(|h| h.ktime_ns <= hop.ktime_ns);
        journey.hops.insert(at, hop);
    }

    /// The rule that dropped packet `id` (netfilter tracing), seen at
    /// `now_ns`: it joins the packet's journey, now or when it opens.
    pub fn observe_rule(&mut self, id: PacketId, rule: NetfilterRule, now_ns: u64) {
        if let Some(journey) = self.open.values_mut().find(|j| j.key.id() == id) {
            journey.rule = Some(rule);
            return;
        }
        if self.waiting_rules.len() == MAX_WAITING_RULES {
            self.waiting_rules.pop_front();
        }
        self.waiting_rules.push_back((now_ns, id, rule));
    }

    /// Journeys that are done by `now_ns`, oldest first.
    pub fn take_finished(&mut self, now_ns: u64) -> Vec<Journey> {
        let expired = now_ns.saturating_sub(self.patience_ns);
        while self
            .waiting_rules
            .front()
            .is_some_and(|(at, _, _)| *at < expired)
        {
            self.waiting_rules.pop_front();
        }
        let rules_traced = self.rules_traced;
        let keys: Vec<_> = self
            .open
            .iter()
            .filter(|(_, j)| {
                let wait = if j.reached_an_end() && !(rules_traced && j.awaits_rule()) {
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

    /// Rules still waiting for their journey.
    pub fn waiting_rules(&self) -> usize {
        self.waiting_rules.len()
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
    use crate::decode::{
        hop::tests::{drop_hop, hop},
        tests as frames,
    };

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

    fn rule() -> NetfilterRule {
        NetfilterRule {
            table: "filter".into(),
            chain: "FORWARD".into(),
            hook: "FORWARD".into(),
            rule: "-A FORWARD -j DROP".into(),
        }
    }

    #[test]
    fn a_netfilter_rule_joins_its_journey_before_or_after_the_drop_and_expires_alone() {
        let echo = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let id =
            PacketKey::of(&hop(0, "n1", "cni0", Role::Bridge, Direction::Ingress, &echo).packet)
                .id();
        let mut c = Correlator::new(1_000, 50_000).expect_rules();
        // The rule first, then the packet's hops.
        c.observe_rule(id, rule(), 0);
        c.observe(hop(
            10,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &echo,
        ));
        c.observe(drop_hop(
            20,
            "n1",
            "cni0",
            Role::Bridge,
            &echo,
            NETFILTER_DROP,
        ));
        let done = c.take_finished(2_000);
        assert_eq!(done[0].rule, Some(rule()));
        assert_eq!(c.waiting_rules(), 0);

        // The drop first: it waits for its rule, which then joins it.
        c.observe(drop_hop(
            3_000,
            "n1",
            "cni0",
            Role::Bridge,
            &echo,
            NETFILTER_DROP,
        ));
        assert!(c.take_finished(5_000).is_empty(), "waits for the rule");
        c.observe_rule(id, rule(), 5_000);
        let done = c.take_finished(60_000);
        assert_eq!(done[0].rule, Some(rule()));

        // A rule whose packet never shows up expires.
        c.observe_rule(id, rule(), 100_000);
        assert_eq!(c.waiting_rules(), 1);
        c.take_finished(200_000);
        assert_eq!(c.waiting_rules(), 0);
    }
}
