//! The WireGuard tag (`podtrace_common::wireguard`): written into a
//! traced packet's skb->hash as it goes into a WireGuard device, and read
//! back from the UDP packet that carries it encrypted as that leaves by
//! the underlay. The one thing podtrace changes in a packet: its hash,
//! which may steer the encrypted packet to another transmit queue,
//! sch_fq flow or bond link, and nothing else of its fate.

use aya_ebpf::helpers::{bpf_get_smp_processor_id, bpf_set_hash};
use podtrace_common::wireguard::{is_data_message, may_be_tag, tag, TAG_LIFE_NS};

use crate::{
    kernel::{contains, ktime_ns, with_per_cpu, Skb},
    maps::{wireguard_tag_prefix, WIREGUARD_COUNT, WIREGUARD_DEVICES, WIREGUARD_TAGS},
};

/// Tags the traced packet leaving by `skb`'s device into WireGuard, and
/// returns the tag; 0 where the device is not a WireGuard one (or the
/// node has none: a constant then).
#[inline(always)]
pub fn tag_going_in(skb: &Skb) -> u32 {
    let prefix = wireguard_tag_prefix();
    if prefix == 0 || !contains(&WIREGUARD_DEVICES, &skb.ifindex()) {
        return 0;
    }
    let count = with_per_cpu(&WIREGUARD_COUNT, 0, |count| {
        *count = count.wrapping_add(1);
        *count
    })
    .unwrap_or(0);
    // SAFETY: helpers on this program's own skb.
    let tag = tag(prefix, unsafe { bpf_get_smp_processor_id() }, count);
    unsafe { bpf_set_hash(skb.0.skb.skb, tag) };
    // A full map evicts its oldest tag: that packet's encrypted leg is
    // then not told, never another's.
    let _ = WIREGUARD_TAGS.insert(tag, ktime_ns(), 0);
    tag
}

/// The tag of a packet leaving by the underlay (or dropped) that carries
/// a traced packet WireGuard encrypted, its skb hash read by `hash`; 0
/// for any other. The prefix first: a constant 0 on a node without
/// WireGuard, where the verifier then drops even the hash's read. All
/// but one in 256 others are turned away by the prefix alone, without a
/// lookup; a tag is believed for `TAG_LIFE_NS` only (an older one may be
/// a natural hash that happens to equal it).
#[inline(always)]
pub fn carried_tag(hash: impl FnOnce() -> u32) -> u32 {
    let prefix = wireguard_tag_prefix();
    if prefix == 0 {
        return 0;
    }
    let hash = hash();
    if !may_be_tag(hash, prefix) {
        return 0;
    }
    // SAFETY: a read of the map's value, copied.
    match unsafe { WIREGUARD_TAGS.get(hash) }.copied() {
        Some(tagged) if ktime_ns().wrapping_sub(tagged) < TAG_LIFE_NS => hash,
        _ => 0,
    }
}

/// Whether a dropped IP packet starting `snapshot` may be an encrypted
/// leg from another node whose tag the wire lost (a WireGuard data
/// message): reported only on a node with a WireGuard device (a constant
/// elsewhere, where the verifier drops the check), for userspace to pair
/// by its receiver index and counter or leave untold.
#[inline(always)]
pub fn may_carry_traced(snapshot: &[u8]) -> bool {
    wireguard_tag_prefix() != 0 && data_message(snapshot)
}

/// A call of its own: inlined into the drop program, its reads grew that
/// program's frame past 5.10's limit on the stack of a chain of calls.
#[inline(never)]
fn data_message(snapshot: &[u8]) -> bool {
    is_data_message(snapshot, 0)
}
