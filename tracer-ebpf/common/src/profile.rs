//! Profile mode's records: a packet's identity and stamp, the stamp
//! table's buckets, the steps between hooks and their latency histograms.
//! The identity's hash also picks the packets `--sample` keeps, in every
//! mode.

use crate::{drops::MAX_NODES, FlowKey};

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

/// Buckets of profile mode's `STAMPS` table: 2^STAMP_BUCKET_BITS. Few
/// enough (80 KiB of slots) to stay in a CPU's cache: a new packet's
/// bucket is a random one, and with 4096 buckets (640 KiB) its first hook
/// paid a cache miss for it, about a ninth of a profiled ingress hook's
/// time under iperf3 (279 → 248 ns/run by bpf_stats). 2048 slots still hold
/// every packet in flight of a line-rate flow (`steps_unmeasured` 0).
pub const STAMP_BUCKET_BITS: u32 = 9;
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
