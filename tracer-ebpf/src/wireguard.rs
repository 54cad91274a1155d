//! The WireGuard tag (`podtrace_common::wireguard`): written into a
//! traced packet's skb->hash as it goes into a WireGuard device, and read
//! back from the UDP packet that carries it encrypted as that leaves by
//! the underlay. The one thing podtrace changes in a packet: its hash,
//! which WireGuard keeps for queueing and nothing routes by.

use aya_ebpf::helpers::{bpf_get_prandom_u32, bpf_set_hash};
use podtrace_common::wireguard::{may_be_tag, tag};

use crate::{
    kernel::{contains, ktime_ns, Skb},
    maps::{wireguard_tag_prefix, WIREGUARD_DEVICES, WIREGUARD_TAGS},
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
    // SAFETY: helpers on this program's own skb.
    let tag = tag(prefix, unsafe { bpf_get_prandom_u32() });
    unsafe { bpf_set_hash(skb.0.skb.skb, tag) };
    // A full map evicts its oldest tag: that packet's encrypted leg is
    // then not told, never another's.
    let _ = WIREGUARD_TAGS.insert(tag, ktime_ns(), 0);
    tag
}

/// The tag of a packet leaving by the underlay that carries a traced
/// packet WireGuard encrypted; 0 for any other (all but one in 65536
/// are turned away by the hash's prefix alone, without a lookup).
#[inline(always)]
pub fn carried_tag(skb: &Skb) -> u32 {
    // The prefix first: a constant 0 on a node without WireGuard, where
    // the verifier then drops even the hash's load.
    if wireguard_tag_prefix() == 0 {
        return 0;
    }
    known_tag(skb.hash())
}

/// `hash` where it is one of this run's tags the map still knows; else 0.
#[inline(always)]
pub fn known_tag(hash: u32) -> u32 {
    if !may_be_tag(hash, wireguard_tag_prefix()) {
        return 0;
    }
    // SAFETY: a read of the map's value, not kept.
    match unsafe { WIREGUARD_TAGS.get(hash) } {
        Some(_) => hash,
        None => 0,
    }
}
