//! The ABI between podtrace's eBPF programs and its userspace.
//!
//! Every type here is `#[repr(C)]`, plain old data, and identical on both
//! sides; the kernel writes them, userspace reads them byte for byte.
#![no_std]

pub mod filter;
pub mod glance;
pub mod headers;
pub mod packet;
pub mod packet6;
pub mod pmtu;
pub mod prefilter;
pub mod transport;
pub mod tunnel;

pub use headers::{GENEVE_PORT, VXLAN_PORT_FLANNEL, VXLAN_PORT_IANA};
pub use tunnel::{TunnelKey, TunnelPorts, UdpTunnel, ANY_VNI, MAX_NODE_VXLAN_PORTS};

/// Bytes of packet header copied into each sighting. Enough for outer
/// Ethernet + IPv6 + UDP + VXLAN (70 B) followed by inner Ethernet and
/// IPv6 and TCP (14 + 40 + 20), with room for IP options, IPv6 extension
/// headers or Geneve options. A power of two, for the tc copy's bound
/// (`Skb::copy_start`).
pub const SNAPSHOT_LEN: usize = 256;

/// Where on the tc hook a packet was seen.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Ingress = 0,
    Egress = 1,
}

/// How the packet matched the traced flow.
pub mod match_kind {
    /// Its own IPv4 header carries a traced address pair.
    pub const PLAIN: u8 = 1;
    /// It is a tunnel packet whose inner IP header carries a traced pair.
    pub const INNER: u8 = 2;
    /// A drop with no IP header yet, matched by its socket's addresses; the
    /// snapshot holds a header built from the socket.
    pub const SOCKET: u8 = 3;
    /// A tunnel packet between two traced addresses (two nodes' own)
    /// that carries another pair's packet: the encapsulation of a story
    /// not traced. The tc programs count it and report nothing.
    pub const CARRIER: u8 = 4;
    /// An IPv4 tunnel packet with an IPv6 packet inside, as a tc hook's
    /// IPv4 program matches it: handed to the hook's IPv6 program, which
    /// reads the inner pair. Never reported.
    pub const HAND_TO_IPV6: u8 = 5;
    /// An ICMP "fragmentation needed" that quotes a traced IPv4 pair's
    /// header: the error sent about a traced packet too big for its path
    /// (by a node, to the packet's sender). Its own pair is not traced.
    /// Only this error, of all ICMP errors: it is what a PMTU black hole
    /// loses. (ICMPv6's "packet too big" is not matched: the IPv6
    /// programs are at 5.10's verifier's bound.)
    pub const ABOUT: u8 = 6;
}

/// What saw the packet.
pub mod sighting_kind {
    /// A tc hook (ingress or egress of an interface).
    pub const TC: u8 = 0;
    /// The kernel's kfree_skb tracepoint: the packet was dropped.
    pub const DROP: u8 = 1;
}

/// `node_id` of a drop in a namespace that no traced node owns (a pod's).
pub const NODE_OTHER_NETNS: u32 = u32::MAX;

/// How many traced namespaces the drop program can tell apart.
pub const MAX_NODES: usize = 8;

/// One packet seen at one place: a tc hook, or the drop tracepoint.
/// Fixed size, so one ring-buffer record per sighting and no allocation on
/// either side.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Sighting {
    /// bpf_ktime_get_ns(): CLOCK_MONOTONIC, shared by all namespaces.
    pub ktime_ns: u64,
    /// Drops: the kernel address that freed the skb.
    pub location: u64,
    /// The device the packet was on (0 for a drop with no device).
    pub ifindex: u32,
    /// skb length: from the L2 header at tc (L3 on L3 devices).
    pub skb_len: u32,
    /// skb mark.
    pub mark: u32,
    /// Which traced node (network namespace) this program instance serves,
    /// set by userspace at load time; [`NODE_OTHER_NETNS`] for drops
    /// elsewhere.
    pub node_id: u32,
    /// Drops: the kernel's `enum skb_drop_reason` value.
    pub reason: u32,
    /// Drops: inode number of the network namespace of the device.
    pub netns_inum: u32,
    /// tc ingress: the kernel's route for the packet (bpf_fib_lookup):
    /// output device and next hop, when `fib_result` is success or no-neigh.
    pub fib_ifindex: u32,
    /// An IPv4 next hop in the first 4 bytes, an IPv6 one in all 16 (the
    /// snapshot's IP version says which).
    pub fib_nexthop: [u8; 16],
    /// A [`Direction`] as u8 (tc only).
    pub direction: u8,
    /// 1 when the snapshot starts with an Ethernet header, 0 when it starts
    /// at the IPv4 header (L3 devices, drops).
    pub has_l2: u8,
    /// One of [`match_kind`].
    pub match_kind: u8,
    /// One of [`sighting_kind`].
    pub kind: u8,
    /// Valid bytes in `snapshot`.
    pub snapshot_len: u16,
    /// A `BPF_FIB_LKUP_RET_*` code, or [`FIB_NOT_LOOKED_UP`].
    pub fib_result: u8,
    pub _pad: u8,
    pub _pad2: [u8; 4],
    pub snapshot: [u8; SNAPSHOT_LEN],
}

/// `fib_result` of a sighting where no route lookup was made.
pub const FIB_NOT_LOOKED_UP: u8 = 0xff;

/// Kernel layout the drop program needs, read from BTF by userspace (Rust
/// eBPF has no CO-RE). Byte offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLayout {
    pub skb_head: u32,
    pub skb_network_header: u32,
    pub skb_dev: u32,
    pub skb_len: u32,
    /// `sk_buff.tail`: where the linear data ends, as an offset from
    /// `head` (64-bit kernels). A drop's copy stops there: past it lies
    /// other memory, never the packet's.
    pub skb_tail: u32,
    pub skb_mark: u32,
    pub dev_ifindex: u32,
    pub dev_nd_net: u32,
    pub net_ns_inum: u32,
    /// Socket fields, to match a drop that has no IP header yet (a local
    /// sender's packet dropped before ip_queue_xmit built it). All zero
    /// when the kernel's layout could not be read: then such drops are
    /// not matched.
    pub skb_sk: u32,
    pub sk_rcv_saddr: u32,
    pub sk_daddr: u32,
    pub sk_num: u32,
    pub sk_dport: u32,
    pub sk_protocol: u32,
    pub sk_net: u32,
}

/// Key of the flow filter map: an IPv4 source and destination, each in
/// network byte order exactly as they sit in the header. Userspace inserts
/// both directions of every traced pair.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src: [u8; 4],
    pub dst: [u8; 4],
}

/// Values of the `NODE_ADDRS` map: what an address is to this node.
pub mod node_addr {
    /// One of the node's own addresses.
    pub const LOCAL: u8 = 1;
    /// Another node's address (a tunnel peer).
    pub const PEER: u8 = 2;
    /// Key 0.0.0.0 with PEER: no peers are known, any address may be one.
    pub const ANY: [u8; 4] = [0; 4];
    /// The same in `NODE_ADDRS6` (::).
    pub const ANY6: [u8; 16] = [0; 16];
}

/// Key of profile mode's `STAMPS`: one packet (`packet::packet_id`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PacketId {
    pub pair: FlowKey,
    pub ip_id: u16,
    pub protocol: u8,
    pub _pad: u8,
    pub l4: u32,
}

/// Where and when profile mode last saw a packet.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    pub ktime_ns: u64,
    /// [`hook_id`] of the hook.
    pub hook: u32,
    pub skb_len: u32,
}

/// `--sample N`: whether packet `id` is one of the 1 in `n` kept. The
/// same on every hook, so a sampled packet keeps all its hops.
#[inline(always)]
pub fn sampled(id: &PacketId, n: u32) -> bool {
    n <= 1 || packet_hash(id).is_multiple_of(n)
}

/// A hash of the packet's identity: the same on every hook and node.
#[inline(always)]
pub fn packet_hash(id: &PacketId) -> u32 {
    let words = [
        u32::from_ne_bytes(id.pair.src),
        u32::from_ne_bytes(id.pair.dst),
        u32::from(id.ip_id) << 8 | u32::from(id.protocol),
        id.l4,
    ];
    let mut h: u32 = 0x811c_9dc5;
    for w in words {
        h = (h ^ w).wrapping_mul(0x0100_0193);
        h ^= h >> 15;
    }
    h
}

/// Buckets of profile mode's `STAMPS` table: 2^STAMP_BUCKET_BITS.
pub const STAMP_BUCKET_BITS: u32 = 12;
pub const STAMP_BUCKETS: u32 = 1 << STAMP_BUCKET_BITS;
/// Packets in flight one bucket holds.
pub const STAMP_WAYS: usize = 4;

/// One packet in flight in `STAMPS`: its identity, where and when it was
/// last seen, and a seal over both. Slots are written in place without a
/// lock, so a reader checks the seal: a slot that two packets' writes
/// interleaved in is no packet's, not a wrong time for one.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StampSlot {
    pub id: PacketId,
    /// `ktime_ns` 0: free.
    pub stamp: Stamp,
    pub seal: u64,
}

impl StampSlot {
    /// A slot that holds no packet.
    pub const FREE: Self = Self {
        id: PacketId {
            pair: FlowKey {
                src: [0; 4],
                dst: [0; 4],
            },
            ip_id: 0,
            protocol: 0,
            _pad: 0,
            l4: 0,
        },
        stamp: Stamp {
            ktime_ns: 0,
            hook: 0,
            skb_len: 0,
        },
        seal: 0,
    };

    /// The slot for packet `id` (whose [`packet_hash`] is `hash`) at `stamp`.
    #[inline(always)]
    pub fn sealed(id: &PacketId, hash: u32, stamp: &Stamp) -> Self {
        Self {
            id: *id,
            stamp: *stamp,
            seal: seal(id, hash, stamp),
        }
    }

    /// Whether the slot holds packet `id` (hash `hash`), whole.
    #[inline(always)]
    pub fn holds(&self, id: &PacketId, hash: u32) -> bool {
        self.stamp.ktime_ns != 0 && self.id.same(id) && self.seal == seal(id, hash, &self.stamp)
    }
}

/// The seal over a slot: every field of its packet's identity and of its
/// stamp, so that a slot two packets' writes interleaved in (one's
/// identity, the other's stamp) is told apart by all but chance.
#[inline(always)]
fn seal(id: &PacketId, hash: u32, stamp: &Stamp) -> u64 {
    let (pair, rest) = id.words();
    let words = [
        pair,
        rest,
        u64::from(hash) << 32 | u64::from(stamp.hook),
        stamp.ktime_ns,
        u64::from(stamp.skb_len),
    ];
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for w in words {
        h = (h ^ w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
    }
    h
}

/// A bucket of `STAMPS`: the packets in flight whose hash selects it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct StampBucket {
    pub slots: [StampSlot; STAMP_WAYS],
}

impl PacketId {
    /// Equality as two words each side (no byte-wise compare loop).
    #[inline(always)]
    pub fn same(&self, other: &PacketId) -> bool {
        self.words() == other.words()
    }

    #[inline(always)]
    fn words(&self) -> (u64, u64) {
        (
            u64::from(u32::from_ne_bytes(self.pair.src)) << 32
                | u64::from(u32::from_ne_bytes(self.pair.dst)),
            u64::from(self.ip_id) << 48 | u64::from(self.protocol) << 32 | u64::from(self.l4),
        )
    }
}

/// A hook as profile mode names it: node, ifindex and direction. The node
/// is in it because nodes that share a kernel (the lab's namespaces) share
/// the stamps too, so that a step may start on another node: the wire.
#[inline(always)]
pub const fn hook_id(node: u32, ifindex: u32, direction: u8) -> u32 {
    node << HOOK_NODE_SHIFT | (ifindex & HOOK_IFINDEX_MASK) << 1 | direction as u32
}

/// (node, ifindex, direction) of a [`hook_id`].
pub const fn hook_parts(hook: u32) -> (u32, u32, u8) {
    (
        hook >> HOOK_NODE_SHIFT,
        hook >> 1 & HOOK_IFINDEX_MASK,
        (hook & 1) as u8,
    )
}

/// Room for [`MAX_NODES`] nodes above 2^23 ifindexes (a namespace's
/// ifindexes count up from 1).
const HOOK_NODE_SHIFT: u32 = 24;
const HOOK_IFINDEX_MASK: u32 = (1 << (HOOK_NODE_SHIFT - 1)) - 1;
const _: () = assert!(MAX_NODES <= 1 << (32 - HOOK_NODE_SHIFT));

/// Key of profile mode's `STEPS`: from one hook to the next (on one node,
/// or from another node's hook across the wire), as recorded on the node
/// of `to`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StepKey {
    pub from: u32,
    pub to: u32,
}

/// Linear buckets of one µs each, below this many µs.
pub const HIST_LINEAR_US: usize = 100;
/// Log2 buckets of ns, at and above `HIST_LINEAR_US`: bucket k holds
/// [2^k, 2^(k+1)) ns.
pub const HIST_LOG2: usize = 40;

/// The latency histogram of one step, per CPU; userspace sums the CPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Histogram {
    pub count: u64,
    pub sum_ns: u64,
    pub max_ns: u64,
    /// Sum of (skb length at `to` − at `from`), two's complement: the
    /// encapsulation's bytes, or a decapsulation's as negative.
    pub bytes_added: u64,
    pub linear: [u64; HIST_LINEAR_US],
    pub log2: [u64; HIST_LOG2],
}

/// Indexes into the per-CPU counter array.
pub mod counter {
    /// A matching packet found the ring buffer full and was not reported.
    pub const RINGBUF_FULL: u32 = 0;
    /// A matching packet whose header bytes could not be copied.
    pub const SNAPSHOT_FAILED: u32 = 1;
    /// Profile mode: a packet in flight lost its stamp to another packet
    /// (its bucket was full), so its next step was not measured.
    pub const STAMP_EVICTED: u32 = 2;
    /// A sighting of the traced pair that `--proto`/`--port` left out
    /// (one per hook the packet crossed, not one per packet).
    pub const FILTERED: u32 = 3;
    /// A tc sighting of a [`super::match_kind::CARRIER`] packet.
    pub const CARRIED_OTHER_PAIR: u32 = 4;
    pub const COUNT: u32 = 5;
}

/// Slots of the `IPV6_PROGRAMS` tail-call table: each tc program's IPv6
/// twin.
pub mod ipv6_program {
    pub const INGRESS: u32 = 0;
    pub const EGRESS: u32 = 1;
    pub const TO_POD: u32 = 2;
    pub const INGRESS_L3: u32 = 3;
    pub const EGRESS_L3: u32 = 4;
    pub const COUNT: u32 = 5;
}

/// Map, global and program names, shared so that neither side spells them
/// twice.
pub mod names {
    pub const FLOWS: &str = "FLOWS";
    pub const FLOWS6: &str = "FLOWS6";
    pub const TRACED_PAIRS: &str = "TRACED_PAIRS";
    pub const TRACED_PAIRS6: &str = "TRACED_PAIRS6";
    pub const L4_FILTER: &str = "L4_FILTER";
    /// Global: 1 when a `--proto`/`--port` filter is set (0 prunes it).
    pub const FILTERING: &str = "FILTERING";
    pub const PROFILE: &str = "PROFILE";
    pub const SAMPLE: &str = "SAMPLE";
    pub const WAKE_BYTES: &str = "WAKE_BYTES";
    pub const STEPS: &str = "STEPS";
    pub const STAMPS: &str = "STAMPS";
    pub const SIGHTINGS: &str = "SIGHTINGS";
    pub const COUNTERS: &str = "COUNTERS";
    pub const NODE_ID: &str = "NODE_ID";
    pub const LAYOUT: &str = "LAYOUT";
    pub const NETNS_INUM: &str = "NETNS_INUM";
    pub const TRACED_NETNS: &str = "TRACED_NETNS";
    pub const TUNNELS: &str = "TUNNELS";
    pub const NODE_ADDRS: &str = "NODE_ADDRS";
    pub const NODE_ADDRS6: &str = "NODE_ADDRS6";
    pub const TUNNEL_HOOKS: &str = "TUNNEL_HOOKS";
    /// Global: the node's [`super::TunnelPorts`].
    pub const TUNNEL_PORTS: &str = "TUNNEL_PORTS";
    pub const TC_INGRESS: &str = "podtrace_ingress";
    pub const TC_EGRESS: &str = "podtrace_egress";
    pub const TC_TO_POD: &str = "podtrace_to_pod";
    pub const TC_INGRESS_L3: &str = "podtrace_ingress_l3";
    pub const TC_EGRESS_L3: &str = "podtrace_egress_l3";
    /// The IPv6 twins, by `ipv6_program` slot.
    pub const TC_IPV6: [&str; super::ipv6_program::COUNT as usize] = [
        "podtrace_ingress6",
        "podtrace_egress6",
        "podtrace_to_pod6",
        "podtrace_in_l3_6",
        "podtrace_eg_l3_6",
    ];
    pub const IPV6_PROGRAMS: &str = "IPV6_PROGRAMS";
    pub const DROPS: &str = "podtrace_kfree_skb";
    pub const DROPS_RAW: &str = "podtrace_kfree_skb_raw";
    /// The same, on kernels whose kfree_skb passes no reason (< 5.17).
    pub const DROPS_NO_REASON: &str = "podtrace_kfree_skb_noreason";
    pub const DROPS_RAW_NO_REASON: &str = "podtrace_kfree_skb_raw_noreason";
}

// The ABI, checked where it is defined: the kernel side and userspace copy
// these byte for byte, so a field added or moved must fail the build here.
const _: () = assert!(core::mem::size_of::<Sighting>() == 72 + SNAPSHOT_LEN);
const _: () = assert!(core::mem::align_of::<Sighting>() == 8);
const _: () = assert!(core::mem::offset_of!(Sighting, snapshot) == 72);
const _: () = assert!(core::mem::size_of::<KernelLayout>() == 16 * 4);
const _: () = assert!(core::mem::size_of::<FlowKey>() == 8);
const _: () = assert!(core::mem::size_of::<PacketId>() == 16);
const _: () = assert!(core::mem::size_of::<Stamp>() == 16);
const _: () = assert!(core::mem::size_of::<Histogram>() == 8 * (4 + HIST_LINEAR_US + HIST_LOG2));
const _: () = assert!(core::mem::size_of::<TunnelKey>() == 8);
const _: () = assert!(core::mem::size_of::<TunnelPorts>() == 2 * MAX_NODE_VXLAN_PORTS);
const _: () = assert!(
    core::mem::size_of::<prefilter::TracedPairs>()
        == 8 + 8 * prefilter::EXACT_PAIRS + 8 * prefilter::ADDR_BITS_WORDS
);
const _: () = assert!(
    core::mem::size_of::<prefilter::TracedPairs6>()
        == 8 + 32 * prefilter::EXACT_PAIRS + 8 * prefilter::ADDR_BITS_WORDS
);
const _: () = assert!(core::mem::size_of::<packet6::FlowKey6>() == 32);
const _: () = assert!(core::mem::size_of::<filter::L4Filter>() == 8 + 2 * filter::MAX_FILTER_PORTS);
const _: () = assert!(core::mem::size_of::<[u32; MAX_NODES]>() == 32);
const _: () = assert!(packet::SOCKET_HEADER_LEN <= SNAPSHOT_LEN);

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain #[repr(C)] data with explicit padding and no pointers.
    unsafe impl aya::Pod for super::Sighting {}
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::TunnelKey {}
    unsafe impl aya::Pod for super::TunnelPorts {}
    unsafe impl aya::Pod for super::filter::L4Filter {}
    unsafe impl<K: aya::Pod> aya::Pod for super::prefilter::TracedPairsOf<K> {}
    unsafe impl aya::Pod for super::packet6::FlowKey6 {}
    unsafe impl aya::Pod for super::KernelLayout {}
    unsafe impl aya::Pod for super::StepKey {}
    unsafe impl aya::Pod for super::Histogram {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(ip_id: u16) -> PacketId {
        PacketId {
            pair: FlowKey {
                src: [10, 244, 1, 2],
                dst: [10, 244, 2, 2],
            },
            ip_id,
            protocol: 6,
            _pad: 0,
            l4: 0x1234_5678,
        }
    }

    fn stamp(ktime_ns: u64) -> Stamp {
        Stamp {
            ktime_ns,
            hook: hook_id(1, 7, 0),
            skb_len: 1500,
        }
    }

    #[test]
    fn a_stamp_slot_holds_its_packet_whole_or_not_at_all() {
        let (a, b) = (packet(1), packet(2));
        let (ha, hb) = (packet_hash(&a), packet_hash(&b));
        let slot = StampSlot::sealed(&a, ha, &stamp(100));
        assert!(slot.holds(&a, ha));
        assert!(!slot.holds(&b, hb));
        // Two packets' writes interleaved: a's identity, b's stamp and
        // seal; or a's identity and stamp, b's seal.
        let other = StampSlot::sealed(&b, hb, &stamp(200));
        let torn = StampSlot { id: a, ..other };
        assert!(!torn.holds(&a, ha));
        let torn = StampSlot {
            seal: other.seal,
            ..slot
        };
        assert!(!torn.holds(&a, ha));
        // Freed where the packet was handed to its pod.
        let mut freed = slot;
        freed.stamp.ktime_ns = 0;
        assert!(!freed.holds(&a, ha));
    }

    #[test]
    fn sampling_keeps_about_one_packet_in_n() {
        assert!(sampled(&packet(9), 1));
        let kept = (0..10_000u16).filter(|&i| sampled(&packet(i), 100)).count();
        assert!((50..=200).contains(&kept), "{kept} of 10000 kept");
    }
}
