//! tc sightings: which traced packet crossed which hook, and when.

use aya_ebpf::{
    bindings::{bpf_fib_lookup, TC_ACT_UNSPEC},
    helpers::{bpf_fib_lookup, bpf_ktime_get_ns, bpf_skb_load_bytes},
    macros::classifier,
    programs::TcContext,
};
use podtrace_common::{
    counter, match_kind, sighting_kind, Direction, FlowKey, Sighting, FIB_NOT_LOOKED_UP,
    GENEVE_PORT, SNAPSHOT_LEN, VXLAN_PORT_FLANNEL, VXLAN_PORT_IANA,
};

use crate::maps::{bump, is_traced as flow_is_traced, node_id, SIGHTINGS};

const AF_INET: u8 = 2;
const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_TEB: u16 = 0x6558;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_IPIP: u8 = 4;
const UDP_HLEN: usize = 8;
const VXLAN_HLEN: usize = 8;
const GENEVE_HLEN: usize = 8;

#[classifier]
pub fn podtrace_ingress(ctx: TcContext) -> i32 {
    observe(&ctx, Direction::Ingress, true)
}

#[classifier]
pub fn podtrace_egress(ctx: TcContext) -> i32 {
    observe(&ctx, Direction::Egress, true)
}

/// For devices without an Ethernet header (tunl0, wireguard).
#[classifier]
pub fn podtrace_ingress_l3(ctx: TcContext) -> i32 {
    observe(&ctx, Direction::Ingress, false)
}

#[classifier]
pub fn podtrace_egress_l3(ctx: TcContext) -> i32 {
    observe(&ctx, Direction::Egress, false)
}

#[inline(always)]
fn observe(ctx: &TcContext, direction: Direction, has_l2: bool) -> i32 {
    let l3 = if has_l2 {
        ethernet_payload(ctx, 0)
    } else {
        Some(0)
    };
    if let Some(l3) = l3 {
        if let Some(kind) = classify(ctx, l3) {
            report(ctx, direction, has_l2, kind, l3);
        }
    }
    TC_ACT_UNSPEC
}

/// Offset of the IPv4 header behind an Ethernet header at `at`, if any
/// (one 802.1Q tag is skipped).
#[inline(always)]
fn ethernet_payload(ctx: &TcContext, at: usize) -> Option<usize> {
    let mut proto = u16::from_be(ctx.load::<u16>(at + 12).ok()?);
    let mut l3 = at + ETH_HLEN;
    if proto == ETH_P_8021Q {
        proto = u16::from_be(ctx.load::<u16>(at + 16).ok()?);
        l3 += 4;
    }
    (proto == ETH_P_IP).then_some(l3)
}

/// Whether the IPv4 packet at `l3` belongs to the traced flow, directly or
/// through the inner header of a tunnel.
#[inline(always)]
fn classify(ctx: &TcContext, l3: usize) -> Option<u8> {
    if is_traced(ctx, l3)? {
        return Some(match_kind::PLAIN);
    }
    let inner = tunnel_inner_ip(ctx, l3)?;
    is_traced(ctx, inner)?.then_some(match_kind::INNER)
}

#[inline(always)]
fn is_traced(ctx: &TcContext, l3: usize) -> Option<bool> {
    let key: FlowKey = ctx.load(l3 + 12).ok()?;
    Some(flow_is_traced(&key))
}

/// Offset of the inner IPv4 header of a VXLAN, Geneve or IPIP packet.
#[inline(always)]
fn tunnel_inner_ip(ctx: &TcContext, l3: usize) -> Option<usize> {
    let ver_ihl: u8 = ctx.load(l3).ok()?;
    let ihl = ((ver_ihl & 0x0f) as usize) * 4;
    if ver_ihl >> 4 != 4 || ihl < 20 {
        return None;
    }
    let proto: u8 = ctx.load(l3 + 9).ok()?;
    let l4 = l3 + ihl;
    match proto {
        IPPROTO_IPIP => Some(l4),
        IPPROTO_UDP => {
            let dport = u16::from_be(ctx.load::<u16>(l4 + 2).ok()?);
            let payload = l4 + UDP_HLEN;
            match dport {
                VXLAN_PORT_FLANNEL | VXLAN_PORT_IANA => ethernet_payload(ctx, payload + VXLAN_HLEN),
                GENEVE_PORT => {
                    let opt_words: u8 = ctx.load(payload).ok()?;
                    let proto = u16::from_be(ctx.load::<u16>(payload + 2).ok()?);
                    let inner = payload + GENEVE_HLEN + ((opt_words & 0x3f) as usize) * 4;
                    match proto {
                        ETH_P_TEB => ethernet_payload(ctx, inner),
                        ETH_P_IP => Some(inner),
                        _ => None,
                    }
                }
                _ => None,
            }
        }
        _ => None,
    }
}

#[inline(always)]
fn report(ctx: &TcContext, direction: Direction, has_l2: bool, kind: u8, l3: usize) {
    // Where the kernel will route this packet, asked as it arrives.
    let route = if direction == Direction::Ingress && kind == match_kind::PLAIN {
        route_lookup(ctx, l3)
    } else {
        None
    };
    let Some(mut entry) = SIGHTINGS.reserve::<Sighting>(0) else {
        bump(counter::RINGBUF_FULL);
        return;
    };
    let skb = unsafe { &*ctx.skb.skb };
    let sighting = entry.as_mut_ptr();
    // Fill in place: a Sighting is too large for the eBPF stack.
    unsafe {
        (*sighting).ktime_ns = bpf_ktime_get_ns();
        (*sighting).location = 0;
        (*sighting).ifindex = skb.ifindex;
        (*sighting).skb_len = skb.len;
        (*sighting).mark = skb.mark;
        (*sighting).node_id = node_id();
        (*sighting).reason = 0;
        (*sighting).netns_inum = 0;
        (*sighting).direction = direction as u8;
        (*sighting).has_l2 = has_l2 as u8;
        (*sighting).match_kind = kind;
        (*sighting).kind = sighting_kind::TC;
        let (fib_result, fib_ifindex, fib_nexthop) =
            route.unwrap_or((FIB_NOT_LOOKED_UP, 0, [0; 4]));
        (*sighting).fib_result = fib_result;
        (*sighting).fib_ifindex = fib_ifindex;
        (*sighting).fib_nexthop = fib_nexthop;
        (*sighting)._pad = 0;
        let copied = copy_headers(ctx, &mut (*sighting).snapshot, skb.len);
        if copied == 0 {
            bump(counter::SNAPSHOT_FAILED);
        }
        (*sighting).snapshot_len = copied;
    }
    entry.submit(0);
}

/// bpf_fib_lookup for the IPv4 packet at `l3`, as arriving on this
/// interface: (BPF_FIB_LKUP_RET_*, output ifindex, next hop).
#[inline(always)]
fn route_lookup(ctx: &TcContext, l3: usize) -> Option<(u8, u32, [u8; 4])> {
    let tos: u8 = ctx.load(l3 + 1).ok()?;
    let total_len = u16::from_be(ctx.load::<u16>(l3 + 2).ok()?);
    let protocol: u8 = ctx.load(l3 + 9).ok()?;
    let src: u32 = ctx.load(l3 + 12).ok()?;
    let dst: u32 = ctx.load(l3 + 16).ok()?;
    let mut params: bpf_fib_lookup = unsafe { core::mem::zeroed() };
    params.family = AF_INET;
    params.l4_protocol = protocol;
    params.__bindgen_anon_1.tot_len = total_len;
    params.ifindex = unsafe { (*ctx.skb.skb).ifindex };
    params.__bindgen_anon_2.tos = tos;
    params.__bindgen_anon_3.ipv4_src = src;
    params.__bindgen_anon_4.ipv4_dst = dst;
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb.cast(),
            &mut params,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            0,
        )
    };
    if rc < 0 {
        return None;
    }
    let nexthop = unsafe { params.__bindgen_anon_4.ipv4_dst }.to_ne_bytes();
    Some((rc as u8, params.ifindex, nexthop))
}

/// Copies the first min(len, SNAPSHOT_LEN) bytes of the packet; returns how
/// many were copied (0 on failure).
#[inline(always)]
fn copy_headers(ctx: &TcContext, dst: &mut [u8; SNAPSHOT_LEN], skb_len: u32) -> u16 {
    let mut want = skb_len as usize;
    if want > SNAPSHOT_LEN {
        want = SNAPSHOT_LEN;
    }
    // The verifier needs a provably non-zero, bounded length.
    if want == 0 || want > SNAPSHOT_LEN {
        return 0;
    }
    let ret =
        unsafe { bpf_skb_load_bytes(ctx.skb.skb.cast(), 0, dst.as_mut_ptr().cast(), want as u32) };
    if ret == 0 {
        want as u16
    } else {
        0
    }
}
