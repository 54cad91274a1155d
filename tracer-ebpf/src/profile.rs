//! Profile mode (`podtrace profile`): the latency of every hook-to-hook
//! step aggregated in the kernel, so that a flow at line rate costs no
//! record per packet. The first hook that sees a packet stamps it (STAMPS,
//! keyed by what identifies the packet on its way); each later hook adds
//! the time since the last stamp to the per-CPU histogram of that step
//! (STEPS) and stamps it again. Userspace reads STEPS. Where nodes share
//! one kernel (and so one clock), userspace gives every node's instance
//! the same STAMPS map (pinned in a bpffs private to podtrace), and the
//! step from one node's underlay to the next's is the wire.

use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray, PerCpuHashMap},
};
use podtrace_common::{
    counter,
    profile::{
        packet_hash, Histogram, PacketId, Stamp, StampBucket, StampSlot, StepKey, HIST_LINEAR_US,
        HIST_LOG2, STAMP_BUCKETS, STAMP_BUCKET_BITS, STAMP_WAYS,
    },
};

use crate::{
    kernel::{global, ktime_ns, step_histogram},
    maps::bump,
};

/// Hook pairs of one node.
const MAX_STEPS: u32 = 1024;
/// A "step" longer than this is a new packet with an old identity.
const STALE_NS: u64 = 1_000_000_000;
/// Longer than any packet takes between two hooks of one kernel: a stamp
/// idle for this long belongs to a packet that is gone.
const IN_FLIGHT_NS: u64 = 10_000_000;

/// Packets in flight, in buckets chosen by a hash of their identity: an
/// array, so finding a packet is arithmetic and a lookup the verifier
/// inlines. (An LRU hash map cost a third of a profiled hook: a hash
/// walk on every hook, its lock and LRU lists on every insert and delete.)
#[map(name = "STAMPS")]
static STAMPS: Array<StampBucket> = Array::with_max_entries(STAMP_BUCKETS, 0);

#[map(name = "STEPS")]
pub static STEPS: PerCpuHashMap<StepKey, Histogram> = PerCpuHashMap::with_max_entries(MAX_STEPS, 0);

/// A zeroed histogram to insert from: too large for the eBPF stack.
#[map(name = "HIST_ZERO")]
pub static HIST_ZERO: PerCpuArray<Histogram> = PerCpuArray::with_max_entries(1, 0);

/// Non-zero in profile mode; userspace sets it at load time.
#[unsafe(no_mangle)]
pub static PROFILE: u32 = 0;

#[inline(always)]
pub fn enabled() -> bool {
    global(&PROFILE) != 0
}

/// Packet `id` seen at `hook` with `skb_len` bytes: one more sample of the
/// step from where it was last seen, and a new stamp (none after its
/// last hook, where it is handed to its pod, which frees its slot).
#[inline(always)]
pub fn record(id: &PacketId, hook: u32, skb_len: u32, to_pod: bool) {
    let now = Stamp {
        ktime_ns: ktime_ns(),
        hook,
        skb_len,
    };
    let hash = packet_hash(id);
    // The bucket by the hash's high bits: `--sample` keeps packets by its
    // low ones.
    let Some(bucket) = STAMPS.get_ptr_mut(hash >> (32 - STAMP_BUCKET_BITS)) else {
        return;
    };
    // Other CPUs may write these slots meanwhile: each is read and
    // written whole through its pointer (volatile: one copy, judged by its
    // seal, never re-read field by field), never through a reference.
    let slot_at = |way: usize| -> *mut StampSlot {
        // SAFETY: a map value, valid while the program runs; `way` is
        // below STAMP_WAYS.
        unsafe { core::ptr::addr_of_mut!((*bucket).slots[way]) }
    };
    // The packet's own slot, else the one to take: free, else the one
    // idle longest.
    let mut take = 0;
    let mut take_idle = 0;
    for way in 0..STAMP_WAYS {
        // SAFETY: as above.
        let slot = unsafe { core::ptr::read_volatile(slot_at(way)) };
        if slot.holds(id, hash) {
            step(&slot.stamp, &now);
            let next = if to_pod {
                StampSlot::FREE
            } else {
                StampSlot::sealed(id, hash, &now)
            };
            // SAFETY: as above.
            unsafe { core::ptr::write_volatile(slot_at(way), next) };
            return;
        }
        let idle = match slot.stamp.ktime_ns {
            0 => u64::MAX,
            // Stamped by another CPU after this run read the clock.
            t => now.ktime_ns.saturating_sub(t),
        };
        if idle > take_idle {
            take_idle = idle;
            take = way;
        }
    }
    if to_pod {
        return;
    }
    // A packet stamped this recently is still on its way: its next step
    // goes unmeasured. An older stamp is a packet done with this kernel's
    // hooks by another way than a pod (it left for an untraced node, was
    // dropped, was delivered to the host): nothing is lost with it.
    if take_idle < IN_FLIGHT_NS {
        bump(counter::STAMP_EVICTED);
    }
    if take < STAMP_WAYS {
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(slot_at(take), StampSlot::sealed(id, hash, &now)) };
    }
}

/// One more sample of the step from `last` to `now`, unless it is the same
/// hook again or too old to be the same packet.
#[inline(always)]
fn step(last: &Stamp, now: &Stamp) {
    let elapsed = now.ktime_ns.wrapping_sub(last.ktime_ns);
    if last.hook == now.hook || elapsed >= STALE_NS {
        return;
    }
    let key = StepKey {
        from: last.hook,
        to: now.hook,
    };
    let added = u64::from(now.skb_len).wrapping_sub(u64::from(last.skb_len));
    step_histogram(&STEPS, &HIST_ZERO, &key, |h| add(h, elapsed, added));
}

#[inline(always)]
fn add(h: &mut Histogram, ns: u64, bytes_added: u64) {
    h.count += 1;
    h.sum_ns += ns;
    if ns > h.max_ns {
        h.max_ns = ns;
    }
    h.bytes_added = h.bytes_added.wrapping_add(bytes_added);
    let us = (ns / 1000) as usize;
    if us < HIST_LINEAR_US {
        h.linear[us] += 1;
    } else {
        let k = log2(ns);
        if k < HIST_LOG2 {
            h.log2[k] += 1;
        }
    }
}

/// ⌊log2(n)⌋ for n ≥ 1, by halving steps the verifier follows.
#[inline(always)]
fn log2(mut n: u64) -> usize {
    let mut k = 0;
    for shift in [32, 16, 8, 4, 2, 1] {
        if n >> shift != 0 {
            n >>= shift;
            k += shift;
        }
    }
    k
}
