//! A journey: one packet's sightings (hops) in kernel time order, with
//! what rule tracing said of it, and the key that is the same for the
//! packet on every hop, encapsulated or translated.

use std::net::IpAddr;

use crate::{
    decode::{
        hop::{Direction, DropInfo, Hop, KernelRoute},
        Decoded, Transport, TCP_SYN,
    },
    model::netfilter::{NetfilterRule, PacketId},
    node::interfaces::Role,
    probe::drops::REASON_NOT_NAMED,
    story::rule_text::rule_action,
};

/// The reason name of a drop by an iptables / nftables verdict.
pub const NETFILTER_DROP: &str = "NETFILTER_DROP";

/// Drop reasons a receiving host's TCP gives a segment of a connection it
/// no longer has or wants (a FIN after close, a queue purged at close, an
/// old retransmission): the segment had been delivered to that host's
/// stack (only local delivery leads there). Checksum, memory, buffer and
/// PAWS drops are real drops, and stay so.
const TEARDOWN_REASONS: &[&str] = &[
    "NO_SOCKET",
    "QUEUE_PURGE",
    "SOCKET_CLOSE",
    "TCP_CLOSE",
    "TCP_RESET",
    "TCP_ABORT_ON_DATA",
    "TCP_OLD_DATA",
    "TCP_OLD_ACK",
    "TCP_TOO_OLD_ACK",
    "TCP_OLD_SEQUENCE",
];
/// Why a TCP segment freed by its receiver is no drop on the path.
const AFTER_TEARDOWN: &str =
    "the socket's own doing, such as a connection already closed: not a drop on the path";
/// Why an echo reply freed by `ping_rcv` is no drop on the path.
const NO_PING_SOCKET: &str = "no unprivileged ping socket waited for it; a raw socket, as ping(8) opens, gets its own copy first: not a drop on the path";
const ICMP_ECHO_REPLY: u8 = 0;
const ICMPV6_ECHO_REPLY: u8 = 129;

/// TCP's local-delivery functions, for a kernel that names no reason
/// (NOT_SPECIFIED in tcp_v4_rcv, or before 5.17).
const TCP_RECEIVE_FUNCTIONS: &[&str] = &["tcp_", "inet_csk_destroy_sock", "skb_queue_purge"];

/// What stays the same for one packet on every hop, encapsulated or not:
/// addresses, IP ID and the transport identity. TTL and the tunnel are
/// left out because routing and encapsulation change them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PacketKey {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub ip_id: u16,
    pub transport: Transport,
}

impl PacketKey {
    pub fn of(packet: &Decoded) -> Self {
        let p = &packet.packet;
        // All fragments of a packet share one key: only the first has a
        // transport header to tell them by.
        let transport = if p.fragment {
            Transport::Fragment {
                number: p.transport.protocol(),
                offset: 0,
            }
        } else {
            p.transport
        };
        Self {
            src: p.src,
            dst: p.dst,
            ip_id: p.ip_id,
            transport,
        }
    }

    /// The key's addresses and IP ID in one number (see the `Hash` impl):
    /// exact for IPv4, IPv6's addresses folded (a hash, not an identity).
    pub(super) fn packed_id(&self) -> u128 {
        (u128::from(folded(self.src)) << 48)
            | (u128::from(folded(self.dst)) << 16)
            | u128::from(self.ip_id)
    }

    /// What tells the transport apart, in one number: for packets that
    /// share an IP ID (0 on every unconnected DF datagram and ping).
    pub(super) fn transport_word(&self) -> u64 {
        let (a, b, c) = match self.transport {
            Transport::Icmp {
                icmp_type,
                code,
                id,
                seq,
            }
            | Transport::Icmpv6 {
                icmp_type,
                code,
                id,
                seq,
            } => (u16::from_be_bytes([icmp_type, code]), id, u32::from(seq)),
            Transport::Tcp {
                sport, dport, seq, ..
            } => (sport, dport, seq),
            Transport::Udp { sport, dport } => (sport, dport, 0),
            Transport::Other { number } => (u16::from(number), 0, 0),
            Transport::Fragment { number, offset } => (u16::from(number), offset, 0),
        };
        (u64::from(a) << 48) | (u64::from(b) << 32) | u64::from(c)
    }

    /// The same packet, one key whole and the other in fragments (it was
    /// fragmented on the way, where a route's MTU was smaller).
    pub(super) fn same_packet_in_pieces(&self, other: &Self) -> bool {
        self.id() == other.id()
            && self.transport.protocol() == other.transport.protocol()
            && self.in_pieces() != other.in_pieces()
    }

    /// An IPv6 packet whole (no fragment header, so no ID) that may be
    /// the reassembly of the fragments keyed `pieces`: same addresses and
    /// protocol. Reassembly drops the fragment header and its ID, which
    /// IPv4 keeps; the caller matches the transport header too.
    pub(super) fn may_be_reassembled_from(&self, pieces: &Self) -> bool {
        self.src.is_ipv6()
            && self.ip_id == 0
            && !self.in_pieces()
            && pieces.in_pieces()
            && (self.src, self.dst) == (pieces.src, pieces.dst)
            && self.transport.protocol() == pieces.transport.protocol()
    }

    pub(super) fn in_pieces(&self) -> bool {
        matches!(self.transport, Transport::Fragment { .. })
    }

    pub(super) fn id(&self) -> PacketId {
        (self.src, self.dst, self.ip_id)
    }
}

/// An address as 32 bits: an IPv4 one whole, an IPv6 one folded.
fn folded(ip: IpAddr) -> u32 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4),
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            (bits as u32) ^ ((bits >> 32) as u32) ^ ((bits >> 64) as u32) ^ ((bits >> 96) as u32)
        }
    }
}

/// Hashes the key in two writes: a derived hash wrote every field apart,
/// a good part of what correlating a sighting cost. (Equal keys still hash
/// equal: the words are made of their fields.)
impl std::hash::Hash for PacketKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u128(self.packed_id());
        state.write_u64(self.transport_word());
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Journey {
    pub key: PacketKey,
    /// In kernel time order.
    pub hops: Vec<Hop>,
    /// The netfilter rule that dropped it, from rule tracing.
    pub rule: Option<NetfilterRule>,
    /// The nat rules that translated it (DNAT, SNAT, MASQUERADE), in the
    /// order they were traced.
    pub nat_rules: Vec<NetfilterRule>,
    /// The kernel could not report some records while this packet was in
    /// flight (ring buffer full): its hops may have gaps.
    pub records_lost: bool,
}

impl Journey {
    /// A journey of recorded hops (in kernel time order), with no rule.
    pub fn new(hops: Vec<Hop>) -> Self {
        Self {
            key: PacketKey::of(&hops[0].packet),
            hops,
            rule: None,
            nat_rules: Vec::new(),
            records_lost: false,
        }
    }

    /// Whether packet `id` is this one: one of its sightings, or half
    /// translated between two of them (a rule traced after a DNAT and
    /// before a MASQUERADE shares the IP ID and one address with each).
    pub(super) fn is_packet(&self, id: PacketId) -> bool {
        self.packet_match(id).is_some()
    }

    /// How surely evidence for packet `id` is this journey's: 2 when its
    /// key or one of its sightings has that pair and IP ID, 1 when only
    /// one address matches (a nat rule may have seen the packet half
    /// translated), `None` when it is another packet's.
    pub(super) fn packet_match(&self, id: PacketId) -> Option<u8> {
        let (src, dst, ip_id) = id;
        // The nft trace gives an IPv6 packet no ID (0); its fragments
        // carry their fragment header's.
        let same_id = |p_id: u16| p_id == ip_id || (src.is_ipv6() && ip_id == 0);
        let same = |both: bool| {
            self.hops.iter().any(|h| {
                let p = &h.packet.packet;
                let (s, d) = (p.src == src, p.dst == dst);
                same_id(p.ip_id) && if both { s && d } else { s || d }
            })
        };
        if self.key.id() == id || same(true) {
            Some(2)
        } else {
            same(false).then_some(1)
        }
    }

    /// Whether `rule` is evidence this journey still lacks: a packet meets
    /// one translation per nat hook and one final DROP. IPv6 packets carry
    /// no IP ID, so the rules of one pair's packets are told apart by this
    /// and by their order.
    pub(super) fn lacks(&self, rule: &NetfilterRule) -> bool {
        if rule_action(rule).is_some() {
            // Only a connection's first packet meets the nat table: a TCP
            // segment past the SYN never does.
            let past_the_syn = matches!(self.key.transport, Transport::Tcp { .. })
                && !self.key.transport.opens_a_connection();
            !past_the_syn
                && !(self.nat_rules.iter()).any(|r| r.table == rule.table && r.hook == rule.hook)
        } else {
            self.rule.is_none()
        }
    }

    /// Evidence from rule tracing: a nat rule that translated it, or the
    /// rule that dropped it.
    pub(super) fn add_rule(&mut self, rule: NetfilterRule) {
        if rule_action(&rule).is_some() {
            if !self.nat_rules.contains(&rule) {
                self.nat_rules.push(rule);
            }
        } else {
            self.rule = Some(rule);
        }
    }

    pub(super) fn first_seen(&self) -> u64 {
        self.hops.first().map_or(0, |h| h.ktime_ns)
    }

    pub(super) fn last_seen(&self) -> u64 {
        self.hops.last().map_or(0, |h| h.ktime_ns)
    }

    /// Where the packet was first handed to a pod other than its sender.
    pub fn delivered_at(&self) -> Option<usize> {
        self.hops.iter().position(|h| self.hands_to_a_pod(h))
    }

    /// Its last hop is a free by the receiving host's own transport
    /// layer (a FIN for a connection already closed, a queue purged at
    /// close), after it was seen on the way: it reached its destination's
    /// stack, and the socket's own teardown freed it; not a drop on the
    /// path. The sender's own frees have no IP header yet (`by_socket`);
    /// a tunnel's outer packet freed there (no VXLAN socket on the node)
    /// never brought the packet to its destination: a drop on the path.
    pub fn freed_by_receiver(&self) -> Option<(&DropInfo, &'static str)> {
        let (last, before) = self.hops.split_last()?;
        let drop = last.drop.as_ref()?;
        if last.packet.tunnel.is_some() || drop.by_socket {
            return None;
        }
        let function = drop.function();
        let unnamed = drop.reason == "NOT_SPECIFIED" || drop.reason == REASON_NOT_NAMED;
        let why = match last.packet.packet.transport {
            // A SYN nobody takes is a refusal, not a teardown; UDP has no
            // connection to tear down.
            Transport::Tcp { flags, .. } if flags & TCP_SYN == 0 => {
                let teardown = TEARDOWN_REASONS.contains(&drop.reason.as_str())
                    || (unnamed
                        && TCP_RECEIVE_FUNCTIONS
                            .iter()
                            .any(|f| function.starts_with(f)));
                teardown.then_some(AFTER_TEARDOWN)
            }
            // An echo reply reaches the host's raw sockets (ping(8)'s) as
            // a copy first; ping_rcv then frees the original when no
            // unprivileged ping socket waits for it.
            Transport::Icmp {
                icmp_type: ICMP_ECHO_REPLY,
                ..
            }
            | Transport::Icmpv6 {
                icmp_type: ICMPV6_ECHO_REPLY,
                ..
            } => {
                let no_ping_socket = drop.reason == "NO_SOCKET" || unnamed;
                (no_ping_socket && function.starts_with("ping_")).then_some(NO_PING_SOCKET)
            }
            _ => None,
        }?;
        let seen_on_the_way = before.iter().any(|h| h.direction != Direction::Drop);
        seen_on_the_way.then_some((drop, why))
    }

    /// The last hop hands the packet to a pod other than its sender.
    pub fn ends_delivered(&self) -> bool {
        self.hops.last().is_some_and(|h| self.hands_to_a_pod(h))
    }

    /// `hop` hands the packet to a pod: out of a pod veth that is not the
    /// one it was sent from, or back out of that one to another address
    /// (hairpin: a Service sent the pod's packet to the pod itself).
    pub(super) fn hands_to_a_pod(&self, hop: &Hop) -> bool {
        let Some(first) = self.hops.first() else {
            return false;
        };
        if hop.role != Role::PodVeth || hop.direction != Direction::Egress {
            return false;
        }
        let sent_from_here = first.direction == Direction::Ingress
            && hop.node == first.node
            && hop.iface == first.iface;
        let sent_back = hop.packet.packet.dst != first.packet.packet.dst;
        !sent_from_here || sent_back
    }

    /// Ended in a netfilter drop (a rule's, or conntrack's own verdict).
    pub fn ends_in_a_netfilter_drop(&self) -> bool {
        self.hops
            .last()
            .is_some_and(|h| h.drop.as_ref().is_some_and(|d| d.reason == NETFILTER_DROP))
    }

    /// Ended in a netfilter drop whose rule has not arrived yet.
    pub(super) fn awaits_rule(&self) -> bool {
        let dropped_by_a_rule = self.rule.is_none() && self.ends_in_a_netfilter_drop();
        dropped_by_a_rule || self.awaits_nat_rule()
    }

    /// A connection's first packet (a TCP SYN) whose addresses changed on
    /// the way: a nat rule translated it, and rule tracing names that rule
    /// unless its event is still on its way (`nft monitor` may lag the
    /// ring buffer on a busy or slow node). Later packets of the
    /// connection are translated by conntrack and name no rule, so only
    /// the SYN waits.
    fn awaits_nat_rule(&self) -> bool {
        let first = &self.hops[0].packet.packet;
        let translated = self.hops.iter().any(|h| {
            let p = &h.packet.packet;
            p.src != first.src || p.dst != first.dst
        });
        first.transport.opens_a_connection() && translated && self.nat_rules.is_empty()
    }

    /// Waiting for the next hop's MAC: the kernel said so when asked for
    /// the route, and queues the packet until ARP answers or gives up.
    pub(super) fn waits_for_arp(&self) -> bool {
        self.hops.last().is_some_and(|h| {
            h.route
                .as_ref()
                .is_some_and(|r| r.result == KernelRoute::NO_NEIGHBOUR)
        })
    }

    /// Left the last traced node toward one that is not traced: nothing
    /// more of it can be seen. Judged by the destination the packet has
    /// when it leaves, not the one it was sent to: after a DNAT, a
    /// ClusterIP is in no node's pod subnet, but its backend may be on a
    /// traced node, whose hops are still to come.
    pub(super) fn left_the_traced_nodes(&self, traced_destinations: &[ipnet::IpNet]) -> bool {
        self.hops.last().is_some_and(|h| {
            h.role == Role::Underlay
                && h.direction == Direction::Egress
                && !traced_destinations
                    .iter()
                    .any(|net| net.contains(&h.packet.packet.dst))
        })
    }

    /// Delivered or dropped: nothing on the path is still to come.
    pub(super) fn reached_an_end(&self) -> bool {
        self.delivered_at().is_some()
            || self
                .hops
                .last()
                .is_some_and(|h| h.direction == Direction::Drop)
    }
}
