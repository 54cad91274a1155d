//! Correlation: grouping the sightings of one packet into one journey,
//! with the evidence other signals give about it (the netfilter rule that
//! dropped it), so that a journey is complete when it is told.
//!
//! One packet keeps one journey across address translation: a sighting
//! after a DNAT, SNAT or their reverse joins the journey of its sighting
//! before it, through the known translations (`story::nat`, where the
//! design is explained).
//!
//! Pure: it sees only recorded hops, rules and timestamps, so it is tested
//! on recorded event sequences without a kernel. Nothing in it grows
//! without bound: evidence that finds no journey expires.

use std::{
    cmp::Reverse,
    collections::{BTreeSet, VecDeque},
    net::IpAddr,
};

use crate::{
    decode::hop::{Direction, Hop},
    model::netfilter::{NetfilterRule, PacketId},
    model::Translation,
    node::interfaces::Role,
    story::{
        journey::{Journey, PacketKey},
        nat::NatBook,
    },
};

/// Rules waiting for their journey, at most this many.
const MAX_WAITING_RULES: usize = 4096;

/// How many times its patience a journey waits for the netfilter rule
/// that dropped or translated it.
const RULE_WAIT_FACTOR: u64 = 4;

/// How long journeys wait for more hops.
#[derive(Clone, Debug, Default)]
pub struct Waits {
    /// After the last hop of a journey that reached an end.
    pub idle_ns: u64,
    /// After the last hop of a journey still under way.
    pub patience_ns: u64,
    /// After a hop whose route lookup said the next hop's MAC is unknown:
    /// the kernel gives up on ARP after its probes (3 × 1 s by default)
    /// and frees the packet with NEIGH_FAILED.
    pub arp_ns: u64,
    /// Netfilter rules are traced: a netfilter drop waits for its rule.
    pub rules_traced: bool,
    /// Pod subnets a traced node delivers locally: a packet heading
    /// elsewhere that leaves by the underlay is done.
    pub traced_destinations: Vec<ipnet::IpNet>,
}

/// Groups hops into journeys, and hands them over in the order their
/// packets were sent, once each is done (see [`Waits`]). Nothing in it
/// grows without bound: rules that find no journey, and loss windows,
/// expire.
pub struct Correlator {
    open: foldhash::HashMap<PacketKey, Journey>,
    /// The open journeys by when they were first seen: finishing walks
    /// from the oldest and stops at the first still under way, instead of
    /// judging every open journey each time (thousands at line rate).
    by_first_seen: BTreeSet<(u64, PacketKey)>,
    waits: Waits,
    /// Rules that arrived before their journey's first hop: (when, packet,
    /// rule), oldest first.
    waiting_rules: VecDeque<(u64, PacketId, NetfilterRule)>,
    /// Kernel time spans in which records were lost, oldest first.
    losses: VecDeque<(u64, u64)>,
    /// Open journeys keyed as fragments.
    open_in_pieces: usize,
    /// Known address translations, to join a packet's sightings across
    /// them.
    nat: NatBook,
    /// Address pairs traced only to follow the traced pair across a source
    /// translation (a MASQUERADE's address and the peer): other traffic
    /// between them (a node's own, other clients' masqueraded alike) is
    /// not the traced pair's, and its journeys are not told.
    joining_only: foldhash::HashSet<(IpAddr, IpAddr)>,
    /// Journeys closed because their pod sent the same packet again:
    /// whole, waiting only for their turn to be told.
    sent_again: Vec<(Journey, u64)>,
}

impl Correlator {
    pub fn new(waits: Waits) -> Self {
        Self {
            open: Default::default(),
            by_first_seen: BTreeSet::new(),
            waits,
            waiting_rules: VecDeque::new(),
            losses: VecDeque::new(),
            open_in_pieces: 0,
            nat: NatBook::default(),
            joining_only: Default::default(),
            sent_again: Vec::new(),
        }
    }

    /// The translations known so far; more may be learnt later
    /// ([`Self::learn_translation`]).
    pub fn with_nat(mut self, nat: NatBook) -> Self {
        self.nat = nat;
        self
    }

    /// A translation learnt while tracing (from conntrack). Sightings of
    /// a packet after it that arrived before it opened journeys of their
    /// own: they join the packet's journey now.
    pub fn learn_translation(&mut self, t: Translation) {
        if !self.nat.learn(t) {
            return;
        }
        let mut keys: Vec<(u64, PacketKey)> = self
            .open
            .iter()
            .map(|(key, j)| (j.first_seen(), *key))
            .collect();
        // The later-seen half joins the earlier one.
        keys.sort_by_key(|(first, _)| *first);
        for (_, key) in keys.into_iter().rev() {
            let Some(into) = self.other_side(&key) else {
                continue;
            };
            let Some(half) = self.open.remove(&key) else {
                continue;
            };
            self.by_first_seen.remove(&(half.first_seen(), key));
            if key.in_pieces() {
                self.open_in_pieces -= 1;
            }
            if let Some(journey) = self.open.get_mut(&into) {
                let first_before = journey.first_seen();
                for hop in half.hops {
                    let at = journey.hops.partition_point(|h| h.ktime_ns <= hop.ktime_ns);
                    journey.hops.insert(at, hop);
                }
                for rule in half.nat_rules.into_iter().chain(half.rule) {
                    journey.add_rule(rule);
                }
                journey.records_lost |= half.records_lost;
                let first_now = journey.first_seen();
                reindex(&mut self.by_first_seen, into, first_before, first_now);
            }
        }
    }

    /// Traffic between `a` and `b` (both ways) is traced only to join
    /// the traced pair's packets across a source translation.
    pub fn trace_for_joining(&mut self, a: IpAddr, b: IpAddr) {
        self.joining_only.insert((a, b));
        self.joining_only.insert((b, a));
    }

    /// The open journey a sighting keyed `key` belongs to, through a known
    /// translation, if its own key opens none.
    fn translated(&self, key: &PacketKey) -> Option<PacketKey> {
        if self.open.contains_key(key) {
            return None;
        }
        let known = (!self.nat.translations.is_empty()).then(|| self.other_side(key));
        known.flatten().or_else(|| self.source_translated_anew(key))
    }

    /// A sighting under a pair traced only to join a source translation,
    /// of a translation the book does not know yet (a new source port,
    /// or one conntrack never confirmed: a SNAT that found no free tuple
    /// is dropped at confirm): the open IPv4 journey of the same packet
    /// before it, by IP ID, destination and destination port, whose
    /// source differs.
    fn source_translated_anew(&self, key: &PacketKey) -> Option<PacketKey> {
        if self.joining_only.is_empty()
            || !key.src.is_ipv4()
            || !self.joining_only.contains(&(key.src, key.dst))
        {
            return None;
        }
        let dport = |t: &crate::decode::Transport| match *t {
            crate::decode::Transport::Tcp { dport, .. }
            | crate::decode::Transport::Udp { dport, .. } => Some(dport),
            _ => None,
        };
        let mut same = self.open.keys().filter(|k| {
            k.ip_id == key.ip_id
                && k.dst == key.dst
                && k.src != key.src
                && k.transport.protocol() == key.transport.protocol()
                && dport(&k.transport) == dport(&key.transport)
                && !self.joining_only.contains(&(k.src, k.dst))
        });
        // Only when one journey fits: two would be a guess.
        let found = *same.next()?;
        same.next().is_none().then_some(found)
    }

    /// The open journey of the same packet on the other side of known
    /// translations. A packet may be translated twice on one node
    /// (hairpin: DNAT to the pod itself, and its source MASQUERADEd).
    fn other_side(&self, key: &PacketKey) -> Option<PacketKey> {
        let once = self.nat.alternatives(key);
        let twice = once.iter().flat_map(|alt| self.nat.alternatives(alt));
        once.iter()
            .copied()
            .chain(twice)
            .find(|alt| alt != key && self.open.contains_key(alt))
    }

    pub fn observe(&mut self, hop: Hop) {
        let mut key = PacketKey::of(&hop.packet);
        // Looked for only where fragments are about: a scan per new packet
        // would cost dearly at line rate.
        let may_be_pieces = hop.packet.packet.fragment || self.open_in_pieces > 0;
        if may_be_pieces && !self.open.contains_key(&key) {
            if let Some(whole) = self.open.keys().find(|k| k.same_packet_in_pieces(&key)) {
                key = *whole;
            } else if let Some(pieces) = self.reassembled_from(&key, &hop) {
                key = pieces;
            }
        }
        let Some(hop) = self.joined_sent_again(&key, hop) else {
            return;
        };
        self.close_if_sent_again(&key, &hop);
        if let Some(before) = self.translated(&key) {
            key = before;
        }
        if key.in_pieces() && !self.open.contains_key(&key) {
            self.open_in_pieces += 1;
        }
        let waiting = &mut self.waiting_rules;
        let journey = self.open.entry(key).or_insert_with(|| Journey {
            key,
            // Room for a two-node path without growing.
            hops: Vec::with_capacity(8),
            rule: None,
            nat_rules: Vec::new(),
            records_lost: false,
        });
        let first_before = (!journey.hops.is_empty()).then(|| journey.first_seen());
        // Different CPUs and ring buffers deliver slightly out of order.
        let at = journey.hops.partition_point(|h| h.ktime_ns <= hop.ktime_ns);
        journey.hops.insert(at, hop);
        let first_now = journey.first_seen();
        match first_before {
            None => {
                self.by_first_seen.insert((first_now, key));
            }
            Some(before) => reindex(&mut self.by_first_seen, key, before, first_now),
        }
        // Rules traced before this sighting reached us (a nat rule may
        // have seen the packet half translated: `is_packet`).
        while let Some(at) =
            (waiting.iter()).position(|(_, id, rule)| journey.is_packet(*id) && journey.lacks(rule))
        {
            if let Some((_, _, rule)) = waiting.remove(at) {
                journey.add_rule(rule);
            }
        }
        if !journey.records_lost {
            let (first, last) = (journey.first_seen(), journey.last_seen());
            journey.records_lost = self
                .losses
                .iter()
                .any(|(from, to)| *from <= last && first <= *to);
        }
    }

    /// The open fragments an IPv6 packet seen whole was reassembled from:
    /// the same addresses and protocol, the transport header their first
    /// fragment carried (an echo's id and sequence, ports), and larger than
    /// any of them (a small datagram on the same socket is another one).
    fn reassembled_from(&self, key: &PacketKey, hop: &Hop) -> Option<PacketKey> {
        let (transport, whole_len) = (hop.packet.packet.transport, hop.packet.packet.total_len);
        self.open
            .iter()
            .filter(|(pieces, _)| key.may_be_reassembled_from(pieces))
            .filter(|(_, journey)| {
                (journey.hops.iter()).any(|h| h.packet.packet.transport == transport)
                    && (journey.hops.iter()).all(|h| h.packet.packet.total_len < whole_len)
            })
            .min_by_key(|(_, journey)| journey.first_seen())
            .map(|(pieces, _)| *pieces)
    }

    /// A pod sent the same bytes again (identical datagrams: IPv6 ones
    /// carry no ID): the earlier packet's journey ends where this sighting
    /// starts another. A packet leaves its sender's veth once; a hairpin
    /// comes back out of it, the other way. Nodes' sightings arrive in
    /// their own order, so the journey is split by kernel time: its hops
    /// from this one on are the new packet's.
    fn close_if_sent_again(&mut self, key: &PacketKey, hop: &Hop) {
        if hop.role != Role::PodVeth || hop.direction != Direction::Ingress {
            return;
        }
        let sent_again = self.open.get(key).is_some_and(|journey| {
            journey.hops.iter().any(|h| {
                (&h.node, &h.iface, h.direction) == (&hop.node, &hop.iface, hop.direction)
                    && h.packet.packet.transport == hop.packet.packet.transport
                    && h.ktime_ns < hop.ktime_ns
            })
        });
        if !sent_again {
            return;
        }
        let Some(mut earlier) = self.open.remove(key) else {
            return;
        };
        self.by_first_seen.remove(&(earlier.first_seen(), *key));
        if key.in_pieces() {
            self.open_in_pieces -= 1;
        }
        let at = earlier.hops.partition_point(|h| h.ktime_ns < hop.ktime_ns);
        let later = earlier.hops.split_off(at);
        self.sent_again.push((earlier, hop.ktime_ns));
        for hop in later {
            self.observe(hop);
        }
    }

    /// A sighting that arrived late for a packet sent before its pod sent
    /// the same bytes again: it joins that earlier packet's journey.
    fn joined_sent_again(&mut self, key: &PacketKey, hop: Hop) -> Option<Hop> {
        let earlier = (self.sent_again.iter_mut())
            .filter(|(j, until)| j.key == *key && hop.ktime_ns < *until)
            .min_by_key(|(_, until)| *until);
        match earlier {
            Some((journey, _)) => {
                let at = journey.hops.partition_point(|h| h.ktime_ns <= hop.ktime_ns);
                journey.hops.insert(at, hop);
                None
            }
            None => Some(hop),
        }
    }

    /// The rule that dropped packet `id` (netfilter tracing), seen at
    /// `now_ns`: it joins the packet's journey, now or when it opens.
    /// Of the journeys it may be, the one that lacks such a rule, whose
    /// sightings match it best, oldest first (the nat rules of a pair's
    /// packets come in the order the packets were sent).
    pub fn observe_rule(&mut self, id: PacketId, rule: NetfilterRule, now_ns: u64) {
        let best = (self.by_first_seen.iter())
            .filter_map(|(_, key)| {
                let journey = self.open.get(key)?;
                let matched = journey.packet_match(id)?;
                Some((Reverse(journey.lacks(&rule)), Reverse(matched), *key))
            })
            .min_by_key(|(lacks, matched, _)| (*lacks, *matched));
        if let Some(journey) = best.and_then(|(_, _, key)| self.open.get_mut(&key)) {
            journey.add_rule(rule);
            return;
        }
        if self.waiting_rules.len() == MAX_WAITING_RULES {
            self.waiting_rules.pop_front();
        }
        self.waiting_rules.push_back((now_ns, id, rule));
    }

    /// The kernel lost records between `from_ns` and `to_ns`: every
    /// packet in flight then may have gaps, and one that opens later but
    /// was sent in that span too.
    pub fn observe_loss(&mut self, from_ns: u64, to_ns: u64) {
        for journey in self.open.values_mut() {
            if journey.first_seen() <= to_ns {
                journey.records_lost = true;
            }
        }
        self.losses.push_back((from_ns, to_ns));
    }

    /// Journeys that are done by `now_ns`, in the order their packets were
    /// sent: one that is done waits for every earlier one.
    pub fn take_finished(&mut self, now_ns: u64) -> Vec<Journey> {
        self.expire(now_ns);
        let mut keys = Vec::new();
        // Done ones up to the oldest still under way, and those first seen
        // at that same instant.
        // A journey closed because its pod sent the same bytes again holds
        // back later ones too while it still waits.
        let mut oldest_under_way = (self.sent_again.iter())
            .filter(|(j, _)| !self.is_done(j, now_ns))
            .map(|(j, _)| j.first_seen())
            .min();
        for &(first, key) in &self.by_first_seen {
            if oldest_under_way.is_some_and(|t| first > t) {
                break;
            }
            let Some(journey) = self.open.get(&key) else {
                debug_assert!(false, "the index names a journey that is not open");
                continue;
            };
            if self.is_done(journey, now_ns) {
                keys.push(key);
            } else {
                oldest_under_way = Some(oldest_under_way.map_or(first, |t| t.min(first)));
            }
        }
        let turn = oldest_under_way.unwrap_or(u64::MAX);
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.sent_again)
            .into_iter()
            .partition(|(j, _)| j.first_seen() < turn && self.is_done(j, now_ns));
        self.sent_again = later;
        self.drain_with(keys, due.into_iter().map(|(j, _)| j).collect())
    }

    fn is_done(&self, journey: &Journey, now_ns: u64) -> bool {
        let waits = &self.waits;
        let wait = if journey.waits_for_arp() {
            waits.arp_ns
        } else if waits.rules_traced && journey.awaits_rule() {
            // The rule comes through nft's trace, another process: under
            // load (a busy node, a slow VM) it lags the kernel's records.
            waits.patience_ns.saturating_mul(RULE_WAIT_FACTOR)
        } else if super::pmtu::too_big(journey).is_some() {
            // Finished with the ICMP error sent about it (`pmtu::pair`).
            (waits.patience_ns.saturating_mul(RULE_WAIT_FACTOR)).saturating_add(waits.idle_ns)
        } else if journey.reached_an_end()
            || journey.left_the_traced_nodes(&waits.traced_destinations)
        {
            waits.idle_ns
        } else {
            waits.patience_ns
        };
        journey.last_seen().saturating_add(wait) < now_ns
    }

    /// Evidence older than any wait can no longer find its journey.
    fn expire(&mut self, now_ns: u64) {
        let horizon = now_ns.saturating_sub(self.waits.patience_ns.max(self.waits.arp_ns));
        while self
            .waiting_rules
            .front()
            .is_some_and(|(at, _, _)| *at < horizon)
        {
            self.waiting_rules.pop_front();
        }
        let oldest_open = self.by_first_seen.first().map(|(first, _)| *first);
        while self
            .losses
            .front()
            .is_some_and(|(_, to)| *to < horizon && oldest_open.is_none_or(|t| *to < t))
        {
            self.losses.pop_front();
        }
    }

    /// Every open journey, oldest first (at exit).
    pub fn take_all(&mut self) -> Vec<Journey> {
        let keys: Vec<_> = self.open.keys().copied().collect();
        let closed = std::mem::take(&mut self.sent_again);
        self.drain_with(keys, closed.into_iter().map(|(j, _)| j).collect())
    }

    pub fn pending(&self) -> usize {
        self.open.len() + self.sent_again.len()
    }

    /// Rules still waiting for their journey.
    pub fn waiting_rules(&self) -> usize {
        self.waiting_rules.len()
    }

    /// The open journeys of `keys`, with `closed` ones (no longer open),
    /// in the order their packets were sent.
    fn drain_with(&mut self, keys: Vec<PacketKey>, closed: Vec<Journey>) -> Vec<Journey> {
        let mut out: Vec<_> = keys.iter().filter_map(|k| self.open.remove(k)).collect();
        for journey in &out {
            self.by_first_seen
                .remove(&(journey.first_seen(), journey.key));
        }
        self.open_in_pieces -= out.iter().filter(|j| j.key.in_pieces()).count();
        out.extend(closed);
        out.retain(|j| !self.only_for_joining(j));
        out.sort_by_key(Journey::first_seen);
        out
    }

    /// Every hop of the journey is between addresses traced only to join
    /// (and it joined nothing).
    fn only_for_joining(&self, journey: &Journey) -> bool {
        !self.joining_only.is_empty()
            && journey.hops.iter().all(|h| {
                let p = &h.packet.packet;
                self.joining_only.contains(&(p.src, p.dst))
            })
    }
}

/// Moves `key` in the index when a hop seen earlier changed when its
/// journey was first seen.
fn reindex(index: &mut BTreeSet<(u64, PacketKey)>, key: PacketKey, before: u64, now: u64) {
    if before != now {
        index.remove(&(before, key));
        index.insert((now, key));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        decode::{
            hop::{
                tests::{drop_hop, hop},
                Direction, KernelRoute,
            },
            tests as frames,
        },
        model::Frontend,
        node::interfaces::Role,
        story::{journey::NETFILTER_DROP, nat},
    };
    use std::net::Ipv4Addr;

    fn waits(idle_ns: u64, patience_ns: u64) -> Waits {
        Waits {
            idle_ns,
            patience_ns,
            arp_ns: patience_ns * 4,
            rules_traced: false,
            // The tests' pods are all on traced nodes.
            traced_destinations: vec!["10.244.0.0/16".parse().unwrap()],
        }
    }

    #[test]
    fn a_drop_after_a_source_nat_the_book_does_not_know_joins_its_packet() {
        // web-0:41001's SYN, masqueraded to node-1's 10.244.1.0:40000 (a
        // port another connection holds) and dropped at confirm: conntrack
        // never reports that translation.
        let sent = frames::tcp_syn([10, 244, 1, 2], [10, 244, 2, 2], 41001, 8080);
        let masqueraded = frames::tcp_syn([10, 244, 1, 0], [10, 244, 2, 2], 40000, 8080);
        let elsewhere = frames::tcp_syn([10, 244, 1, 0], [10, 244, 2, 2], 40000, 9090);
        let mut c = Correlator::new(waits(1_000_000, 1_000_000));
        c.trace_for_joining([10, 244, 1, 0].into(), [10, 244, 2, 2].into());
        let at = |t, frame: &[u8]| hop(t, "n1", "vethA", Role::PodVeth, Direction::Ingress, frame);
        c.observe(at(100, &sent));
        c.observe(drop_hop(
            300,
            "n1",
            "flannel.1",
            Role::Tunnel,
            &masqueraded,
            NETFILTER_DROP,
        ));
        // Another destination port: not this packet, and told nowhere.
        c.observe(drop_hop(
            400,
            "n1",
            "flannel.1",
            Role::Tunnel,
            &elsewhere,
            NETFILTER_DROP,
        ));
        let told = c.take_all();
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].hops.len(), 2);
        assert_eq!(
            told[0].hops[1].packet.packet.src,
            Ipv4Addr::new(10, 244, 1, 0)
        );
    }

    #[test]
    fn traffic_traced_only_to_join_a_masquerade_is_not_told_on_its_own() {
        // web-0 hairpinned to itself: after DNAT and MASQUERADE the packet
        // is bridge address → web-0, a pair traced only to join it.
        let sent = frames::tcp_syn([10, 244, 1, 2], [10, 96, 7, 8], 40000, 80);
        let back = frames::tcp_syn([10, 244, 1, 1], [10, 244, 1, 2], 25020, 8080);
        let probe = frames::tcp_syn([10, 244, 1, 1], [10, 244, 1, 2], 33000, 8080);
        let mut c = Correlator::new(waits(1_000_000, 1_000_000));
        c.trace_for_joining([10, 244, 1, 1].into(), [10, 244, 1, 2].into());
        let mut book = NatBook::default();
        let hairpin = crate::model::conntrack::Entry {
            orig: nat::tests::tuple([10, 244, 1, 2], [10, 96, 7, 8], 40000, 80),
            reply: nat::tests::tuple([10, 244, 1, 2], [10, 244, 1, 1], 8080, 25020),
            status: (1 << 4) | (1 << 5),
            zone: 0,
            mark: 0,
        };
        for t in book.learn_connection(&hairpin, |_| None, 0) {
            c.learn_translation(t);
        }
        c.observe(hop(
            100,
            "n1",
            "vethA",
            Role::PodVeth,
            Direction::Ingress,
            &sent,
        ));
        c.observe(hop(
            200,
            "n1",
            "vethA",
            Role::PodVeth,
            Direction::Egress,
            &back,
        ));
        // The node's own probe of web-0, from the bridge address.
        c.observe(hop(
            300,
            "n1",
            "vethA",
            Role::PodVeth,
            Direction::Egress,
            &probe,
        ));
        let told = c.take_all();
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].hops.len(), 2);
    }

    /// A TCP segment to port 80 over IPv6 (no IP ID), `flags` 0x02 (SYN)
    /// or 0x10.
    fn tcp6(src: u16, dst: u16, sport: u16, seq: u32, flags: u8) -> Vec<u8> {
        let dport = 80;
        let ip =
            |last: u16| std::net::Ipv6Addr::new(0xfd00, 0x10, 0x244, 0, 0, 0, 0, last).octets();
        let mut out = Vec::new();
        let builder = etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv6(ip(src), ip(dst), 64)
            .tcp(sport, dport, seq, 64240);
        let builder = if flags == 0x02 {
            builder.syn()
        } else {
            builder.ack(1)
        };
        builder.write(&mut out, &[]).unwrap();
        out
    }

    /// IPv6 packets have no IP ID: a DNAT rule traced after the pair's
    /// next packet opened its journey still goes to the SYN, the one
    /// packet of the connection that met the nat table.
    #[test]
    fn an_ipv6_nat_rule_joins_the_oldest_packet_of_its_pair_that_lacks_one() {
        let mut c = Correlator::new(Waits {
            rules_traced: true,
            ..waits(1_000, 50_000)
        });
        let (syn, ack) = (
            tcp6(2, 0x99, 40000, 1000, 0x02),
            tcp6(2, 0x99, 40000, 1001, 0x10),
        );
        for (at, frame) in [(100, &syn), (300, &ack)] {
            c.observe(hop(
                at,
                "n1",
                "vethA",
                Role::PodVeth,
                Direction::Ingress,
                frame,
            ));
        }
        let id =
            PacketKey::of(&hop(0, "n1", "x", Role::Bridge, Direction::Ingress, &syn).packet).id();
        let dnat = NetfilterRule {
            table: "nat".into(),
            chain: "KUBE-SEP-X".into(),
            hook: "PREROUTING".into(),
            rule: "-A KUBE-SEP-X -p tcp -j DNAT --to-destination [fd00:10:244::3]:8080".into(),
            path: Vec::new(),
        };
        c.observe_rule(id, dnat.clone(), 400);
        // A second connection's SYN, while the first's ACK is still open:
        // its rule is its own, not the older ACK's (no ACK meets nat).
        let syn2 = tcp6(2, 0x99, 40001, 5000, 0x02);
        c.observe(hop(
            500,
            "n1",
            "vethA",
            Role::PodVeth,
            Direction::Ingress,
            &syn2,
        ));
        c.observe_rule(id, dnat.clone(), 600);
        let told = c.take_all();
        assert_eq!(told.len(), 3, "{told:?}");
        let with_rule: Vec<u32> = told
            .iter()
            .filter(|j| !j.nat_rules.is_empty())
            .map(|j| match j.key.transport {
                crate::decode::Transport::Tcp { seq, .. } => seq,
                _ => 0,
            })
            .collect();
        assert_eq!(with_rule, [1000, 5000], "each SYN's rule");
    }

    #[test]
    fn a_translated_syn_waits_for_its_nat_rule_where_rules_are_traced() {
        let pre = frames::tcp_syn([10, 244, 1, 2], [10, 96, 7, 7], 40000, 80);
        let post = frames::tcp_syn([10, 244, 1, 2], [10, 244, 2, 3], 40000, 8080);
        let mut c = Correlator::new(Waits {
            rules_traced: true,
            ..waits(1_000, 50_000)
        });
        c.learn_translation(crate::story::nat::tests::book().translations[1].clone());
        c.observe(hop(
            100,
            "n1",
            "vethA",
            Role::PodVeth,
            Direction::Ingress,
            &pre,
        ));
        c.observe(hop(
            200,
            "n2",
            "vethB",
            Role::PodVeth,
            Direction::Egress,
            &post,
        ));
        assert!(
            c.take_finished(5_000).is_empty(),
            "delivered, but its DNAT rule may still be on its way"
        );
        let id =
            PacketKey::of(&hop(0, "n1", "x", Role::Bridge, Direction::Ingress, &pre).packet).id();
        let dnat = NetfilterRule {
            table: "nat".into(),
            chain: "KUBE-SEP-X".into(),
            hook: "PREROUTING".into(),
            rule: "-A KUBE-SEP-X -p tcp -j DNAT --to-destination 10.244.2.3:8080".into(),
            path: Vec::new(),
        };
        c.observe_rule(id, dnat.clone(), 5_000);
        let done = c.take_finished(5_000);
        assert_eq!(done.len(), 1, "told once its rule joined it");
        assert_eq!(done[0].nat_rules, [dnat]);
        // Without its rule, it is told after the longer wait all the same.
        c.observe(hop(
            60_000,
            "n1",
            "vethA",
            Role::PodVeth,
            Direction::Ingress,
            &pre,
        ));
        c.observe(hop(
            60_100,
            "n2",
            "vethB",
            Role::PodVeth,
            Direction::Egress,
            &post,
        ));
        // Past the journey's patience (50 µs here), still waiting for it…
        assert!(c.take_finished(62_000).is_empty());
        assert!(c.take_finished(111_000).is_empty());
        // …for longer, as nft's trace lags under load, then told.
        assert_eq!(
            c.take_finished(60_100 + 50_000 * RULE_WAIT_FACTOR + 1)
                .len(),
            1
        );
    }

    #[test]
    fn sightings_after_a_translation_learnt_late_join_their_packet() {
        let pre = frames::tcp_syn([10, 244, 1, 2], [10, 96, 7, 7], 40000, 80);
        let post = frames::tcp_syn([10, 244, 1, 2], [10, 244, 2, 3], 40000, 8080);
        let mut c = Correlator::new(waits(1_000_000, 1_000_000));
        c.observe(hop(
            100,
            "n1",
            "vethA",
            Role::PodVeth,
            Direction::Ingress,
            &pre,
        ));
        // conntrack's word arrives after the translated sighting.
        c.observe(hop(
            200,
            "n1",
            "cni0",
            Role::Bridge,
            Direction::Ingress,
            &post,
        ));
        assert_eq!(c.pending(), 2);
        let learnt = crate::story::nat::tests::book().translations[1].clone();
        c.learn_translation(learnt);
        // The joined half left the index with its journey.
        assert_eq!(c.by_first_seen.len(), c.open.len());
        let journeys = c.take_all();
        assert_eq!(journeys.len(), 1);
        let ifaces: Vec<&str> = journeys[0].hops.iter().map(|h| &*h.iface).collect();
        assert_eq!(ifaces, ["vethA", "cni0"]);
        assert_eq!(journeys[0].key.dst, std::net::Ipv4Addr::new(10, 96, 7, 7));
    }

    #[test]
    fn encapsulated_copies_join_the_inner_packet_and_others_stay_apart() {
        let req1 = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let req1_routed = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
        let req2 = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 2);
        let mut c = Correlator::new(waits(1_000_000, 1_000_000));
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
    fn a_hop_seen_earlier_arriving_late_moves_its_journey_ahead() {
        let a = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let b = frames::icmp_echo([10, 244, 1, 3], [10, 244, 2, 3], 64, 1);
        let mut c = Correlator::new(waits(1_000, 1_000_000));
        // A's delivery on node-2 reaches us first, B (under way) next,
        // then A's first hop on node-1, from a reader that lagged.
        let seen = [
            (600, "n2", "veth2", Direction::Egress, &a),
            (300, "n1", "veth3", Direction::Ingress, &b),
            (100, "n1", "veth1", Direction::Ingress, &a),
        ];
        for (t, node, iface, direction, frame) in seen {
            c.observe(hop(t, node, iface, Role::PodVeth, direction, frame));
        }
        assert_eq!(c.by_first_seen.len(), c.open.len());
        // A was sent before B and is done: it does not wait for B.
        let done = c.take_finished(2_000);
        assert_eq!(done.len(), 1, "{done:?}");
        assert_eq!(done[0].key.src, std::net::Ipv4Addr::new(10, 244, 1, 2));
        assert_eq!(done[0].hops.len(), 2);
        assert_eq!((c.pending(), c.by_first_seen.len()), (1, 1));
        assert_eq!(c.take_all().len(), 1);
        assert!(c.by_first_seen.is_empty());
    }

    #[test]
    fn a_journey_under_way_waits_longer_than_one_that_ended() {
        let out = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let back = frames::icmp_echo([10, 244, 2, 2], [10, 244, 1, 2], 64, 1);
        let mut c = Correlator::new(waits(1_000, 50_000));
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
            path: Vec::new(),
        }
    }

    #[test]
    fn a_netfilter_rule_joins_its_journey_before_or_after_the_drop_and_expires_alone() {
        let echo = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let id =
            PacketKey::of(&hop(0, "n1", "cni0", Role::Bridge, Direction::Ingress, &echo).packet)
                .id();
        let mut c = Correlator::new(Waits {
            rules_traced: true,
            ..waits(1_000, 50_000)
        });
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
        c.take_finished(400_000);
        assert_eq!(c.waiting_rules(), 0);
    }

    #[test]
    fn stories_come_in_the_order_their_packets_were_sent() {
        let first = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let second = frames::icmp_echo([10, 244, 2, 2], [10, 244, 1, 2], 64, 1);
        let mut c = Correlator::new(waits(1_000, 50_000));
        // The first is under way (left node-1, not yet seen on node-2)…
        c.observe(hop(
            0,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &first,
        ));
        c.observe(hop(
            10,
            "n1",
            "eth0",
            Role::Underlay,
            Direction::Egress,
            &first,
        ));
        // …while the second, sent later, is delivered at once.
        c.observe(hop(
            20,
            "n2",
            "veth2",
            Role::PodVeth,
            Direction::Ingress,
            &second,
        ));
        c.observe(hop(
            30,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Egress,
            &second,
        ));
        assert!(
            c.take_finished(5_000).is_empty(),
            "the second waits for the first"
        );
        let done = c.take_finished(60_000);
        let order: Vec<_> = done.iter().map(|j| j.key.src).collect();
        assert_eq!(
            order,
            [Ipv4Addr::new(10, 244, 1, 2), Ipv4Addr::new(10, 244, 2, 2)]
        );
    }

    #[test]
    fn a_packet_that_left_for_an_untraced_node_is_done_at_once() {
        let out = frames::icmp_echo([10, 244, 1, 2], [10, 245, 2, 2], 64, 1);
        let mut c = Correlator::new(waits(1_000, 50_000));
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
        assert_eq!(c.take_finished(2_000).len(), 1);
    }

    #[test]
    fn a_dnatted_packet_leaving_toward_a_traced_node_waits_for_its_hops_there() {
        // Sent to a ClusterIP (in no traced subnet), DNATed to a backend
        // on a traced node: the journey is not done when it leaves.
        let sent = frames::tcp_syn([10, 244, 1, 2], [10, 96, 7, 7], 40000, 80);
        let dnatted = frames::tcp_syn([10, 244, 1, 2], [10, 244, 2, 2], 40000, 8080);
        let book = NatBook {
            translations: vec![Translation {
                protocol: 6,
                front: Frontend {
                    ip: [10, 96, 7, 7].into(),
                    port: 80,
                },
                back: Frontend {
                    ip: [10, 244, 2, 2].into(),
                    port: 8080,
                },
                service: None,
                backend: None,
                source: false,
            }],
            ..NatBook::default()
        };
        let mut c = Correlator::new(waits(1_000, 50_000)).with_nat(book);
        c.observe(hop(
            0,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &sent,
        ));
        c.observe(hop(
            10,
            "n1",
            "eth0",
            Role::Underlay,
            Direction::Egress,
            &dnatted,
        ));
        assert!(
            c.take_finished(2_000).is_empty(),
            "its backend's node is traced"
        );
        c.observe(hop(
            3_000,
            "n2",
            "veth2",
            Role::PodVeth,
            Direction::Egress,
            &dnatted,
        ));
        let told = c.take_all();
        assert_eq!(told.len(), 1, "{told:?}");
        assert_eq!(told[0].hops.len(), 3);
    }

    #[test]
    fn a_packet_waiting_for_arp_waits_for_the_kernel_to_give_up() {
        let out = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let mut c = Correlator::new(waits(1_000, 50_000));
        let mut at_bridge = hop(0, "n1", "cni0", Role::Bridge, Direction::Ingress, &out);
        at_bridge.route = Some(KernelRoute {
            result: KernelRoute::NO_NEIGHBOUR.into(),
            dev: Some("eth0".into()),
            via: Some(Ipv4Addr::new(192, 0, 2, 254).into()),
        });
        c.observe(at_bridge);
        assert!(
            c.take_finished(100_000).is_empty(),
            "still within ARP's time"
        );
        c.observe(drop_hop(
            150_000,
            "n1",
            "eth0",
            Role::Underlay,
            &out,
            "NEIGH_FAILED",
        ));
        let done = c.take_finished(160_000);
        assert_eq!(done[0].hops.len(), 2);
    }

    #[test]
    fn packets_in_flight_while_records_were_lost_say_so() {
        let a = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let b = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 2);
        let c_ = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 3);
        let mut c = Correlator::new(waits(1_000, 50_000));
        c.observe(hop(0, "n1", "veth1", Role::PodVeth, Direction::Ingress, &a));
        c.observe_loss(100, 200);
        // Seen after the loss was noticed, but sent within it.
        c.observe(hop(
            150,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &b,
        ));
        // Sent after it.
        c.observe(hop(
            500,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &c_,
        ));
        let lost: Vec<bool> = c.take_all().iter().map(|j| j.records_lost).collect();
        assert_eq!(lost, [true, true, false]);
    }

    /// Ethernet + IPv6 from fd00::`src` to fd00::`dst`, `next` header.
    fn ipv6(src: u8, dst: u8, next: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 40];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14] = 0x60;
        f[18..20].copy_from_slice(&(payload.len() as u16).to_be_bytes());
        f[20] = next;
        f[21] = 64;
        f[22..24].copy_from_slice(&[0xfd, 0x00]);
        f[37] = src;
        f[38..40].copy_from_slice(&[0xfd, 0x00]);
        f[53] = dst;
        f.extend_from_slice(payload);
        f
    }

    /// An IPv6 fragment of an ICMPv6 message: `at` bytes in, fragment ID 7.
    fn fragment6(src: u8, dst: u8, at: u16, more: bool, data: &[u8]) -> Vec<u8> {
        let mut payload = vec![58, 0];
        payload.extend_from_slice(&((at / 8) << 3 | u16::from(more)).to_be_bytes());
        payload.extend_from_slice(&7u32.to_be_bytes());
        payload.extend_from_slice(data);
        ipv6(src, dst, 44, &payload)
    }

    #[test]
    fn an_ipv6_reply_freed_after_reassembly_is_its_fragments_story_and_delivered() {
        // ping -6 -s 3000: the echo reply arrives in fragments and is
        // reassembled in web-0, which loses the fragment header and its
        // ID; ping_rcv then frees it (NO_SOCKET) although ping got it.
        let mut reply = vec![129, 0, 0, 0, 0x4a, 0x1d, 0, 2];
        reply.resize(3008, 0xab);
        let first = fragment6(2, 1, 0, true, &reply[..1448]);
        let last = fragment6(2, 1, 1448, false, &reply[1448..]);
        let whole = ipv6(2, 1, 58, &reply);
        let mut c = Correlator::new(waits(1_000, 50_000));
        let to_web_0 =
            |t: u64, frame: &[u8]| hop(t, "n1", "veth1", Role::PodVeth, Direction::Egress, frame);
        c.observe(to_web_0(10, &first));
        c.observe(to_web_0(11, &last));
        let mut freed = drop_hop(20, "n1", "eth0", Role::Other, &whole, "NO_SOCKET");
        freed.drop.as_mut().unwrap().location = "ping_rcv+0xb3".into();
        c.observe(freed);
        // The same echo header in a packet no larger than a fragment: not
        // their reassembly.
        let mut small = reply[..64].to_vec();
        c.observe(to_web_0(25, &ipv6(2, 1, 58, &small)));
        // Another echo reply of the pair, whole: not the same packet.
        small[7] = 3;
        let other = small;
        c.observe(to_web_0(30, &ipv6(2, 1, 58, &other)));
        let journeys = c.take_all();
        assert_eq!(journeys.len(), 3, "{journeys:#?}");
        assert_eq!(journeys[0].hops.len(), 3);
        assert!(journeys[0].freed_by_receiver().is_some());
        assert_eq!((journeys[1].hops.len(), journeys[2].hops.len()), (1, 1));
    }

    #[test]
    fn identical_ipv6_packets_sent_apart_are_a_story_each() {
        // Three identical datagrams (here echo requests, as a client's
        // repeated UDP query alike), 300 ms apart: IPv6 gives them no ID,
        // so only their sender's veth tells them apart. Each node has its
        // own ring: node-2's sightings of one packet may arrive after
        // node-1 saw the next one sent, and node-1's after node-2's.
        let datagram = ipv6(1, 2, 58, &[128, 0, 0, 0, 0, 9, 0, 1, 0xab, 0xcd]);
        let sent = [0u64, 300_000_000, 600_000_000];
        let at_node = |t: u64, node: &str, iface: &str, role: Role, dir: Direction| {
            hop(t, node, iface, role, dir, &datagram)
        };
        let mut c = Correlator::new(waits(1_000_000_000, 2_000_000_000));
        for (i, t) in sent.iter().enumerate() {
            c.observe(at_node(
                *t,
                "n1",
                "veth1",
                Role::PodVeth,
                Direction::Ingress,
            ));
            if i > 0 {
                let before = sent[i - 1];
                c.observe(at_node(
                    before + 9_000,
                    "n2",
                    "veth2",
                    Role::PodVeth,
                    Direction::Egress,
                ));
            }
            c.observe(at_node(
                *t + 5_000,
                "n1",
                "eth0",
                Role::Underlay,
                Direction::Egress,
            ));
        }
        c.observe(at_node(
            sent[2] + 9_000,
            "n2",
            "veth2",
            Role::PodVeth,
            Direction::Egress,
        ));
        // The first two are whole and in order before the third is done.
        let told = c.take_finished(700_000_000 + 1_000_000_000);
        let all: Vec<_> = told.into_iter().chain(c.take_all()).collect();
        assert_eq!(all.len(), 3, "{all:#?}");
        for (journey, sent) in all.iter().zip(sent) {
            let times: Vec<u64> = journey.hops.iter().map(|h| h.ktime_ns - sent).collect();
            assert_eq!(times, [0, 5_000, 9_000]);
        }
    }

    #[test]
    fn a_packet_sent_again_still_waiting_holds_back_later_stories() {
        // Sent at 0 and again at 100 (same bytes): the first is closed but
        // still under way (last seen leaving its veth). Another packet,
        // sent at 50 and delivered, is done first, but is told after it.
        let same = ipv6(1, 2, 58, &[128, 0, 0, 0, 0, 9, 0, 1]);
        let other = ipv6(1, 2, 58, &[128, 0, 0, 0, 0, 9, 0, 2]);
        let mut c = Correlator::new(waits(1_000, 1_000_000));
        let at = |t: u64, iface: &str, dir: Direction, frame: &[u8]| {
            hop(t, "n1", iface, Role::PodVeth, dir, frame)
        };
        c.observe(at(0, "veth1", Direction::Ingress, &same));
        c.observe(at(50, "veth1", Direction::Ingress, &other));
        c.observe(at(60, "veth2", Direction::Egress, &other));
        c.observe(at(100, "veth1", Direction::Ingress, &same));
        assert!(c.take_finished(10_000).is_empty());
        let told: Vec<u64> = c
            .take_finished(2_000_000)
            .iter()
            .map(|j| j.first_seen())
            .collect();
        assert_eq!(told, [0, 50, 100]);
    }

    /// `frame` (Ethernet + IPv4) as a fragment at `offset` bytes, with
    /// payload bytes that would read as ICMP type 136 code 137.
    fn fragment(frame: &[u8], offset: u16, more: bool) -> Vec<u8> {
        let mut f = frame.to_vec();
        let flags_offset = (u16::from(more) << 13) | (offset / 8);
        f[20..22].copy_from_slice(&flags_offset.to_be_bytes());
        if offset > 0 {
            f[34] = 136;
            f[35] = 137;
        }
        f
    }

    #[test]
    fn fragments_are_one_story_with_the_packet_and_invent_no_transport() {
        let whole = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 64, 1);
        let first = fragment(&whole, 0, true);
        let second = fragment(&whole, 1480, false);
        let later = hop(
            30,
            "n1",
            "flannel.1",
            Role::Tunnel,
            Direction::Egress,
            &second,
        );
        assert!(matches!(
            later.packet.packet.transport,
            crate::decode::Transport::Fragment {
                number: 1,
                offset: 1480
            }
        ));
        let mut c = Correlator::new(waits(1_000, 50_000));
        // Whole at the pod's veth, fragmented where the MTU is smaller.
        c.observe(hop(
            0,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &whole,
        ));
        c.observe(hop(
            20,
            "n1",
            "flannel.1",
            Role::Tunnel,
            Direction::Egress,
            &first,
        ));
        c.observe(later);
        let journeys = c.take_all();
        assert_eq!(journeys.len(), 1, "one packet, one story");
        assert_eq!(journeys[0].hops.len(), 3);
        // Fragments from the start (the sender fragmented) are one too.
        c.observe(hop(
            100,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &first,
        ));
        c.observe(hop(
            110,
            "n1",
            "veth1",
            Role::PodVeth,
            Direction::Ingress,
            &second,
        ));
        assert_eq!(c.take_all().len(), 1);
        assert_eq!(c.open_in_pieces, 0);
    }
}
