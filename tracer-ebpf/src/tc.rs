//! tc sightings: which traced packet crossed which hook, and when.

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, TC_ACT_UNSPEC},
    macros::{classifier, map},
    maps::ProgramArray,
    programs::TcContext,
};
use podtrace_common::{
    counter,
    filter::{self, L4Filter},
    glance,
    headers::{IPV4_PROTOCOL, IPV4_TOS, IPV4_VERSION, IPV6_DADDR, IPV6_NEXT_HEADER, IPV6_SADDR},
    packet::{classify4, classify6, classify6_in4, ethernet_payload, ip_version, packet_id, Bytes},
    packet6::is_ipv6,
    profile::{hook_id, sampled, PacketId},
    sighting::{match_kind, sighting_kind, Sighting, SNAPSHOT_LEN},
    tc::{ipv6_program, Direction},
    transport::{traced_l4, TracedL4},
};

use crate::{
    kernel::{submit_with, Linear, Route, Skb, NO_ROUTE_ASKED},
    maps::{
        bump, filter_keeps, filtering, node_id, sample, traced_pairs, traced_pairs6, tunnel_ports,
        wake_bytes, NodeFlows, NodeFlows4, SIGHTINGS,
    },
    profile,
    sighting::Meta,
    wireguard,
};

/// Each hook's IPv6 program, by `ipv6_program` index; userspace fills it.
#[map(name = "IPV6_PROGRAMS")]
static IPV6_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(ipv6_program::COUNT, 0);

/// bpf_fib_lookup's address families.
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

// Each hook runs an IPv4 program, which hands an IPv6 packet to its IPv6
// twin by a tail call (`IPV6_PROGRAMS`), and so an IPv4 tunnel packet
// with an IPv6 packet inside. Two programs, each verified on its own: one
// that read both families was too complex for 5.10's verifier (over a
// million instructions processed), and an IPv4 packet pays for no IPv6
// code on its way.

// Each IPv4 program is a glance at the packet in the entry itself (no
// call for the packets it turns away, most of a node's), then a call to
// the rest of its hook (`look_closer`), in a frame of its own as the
// verifiers took it before the glance.

#[classifier]
#[inline(always)]
pub fn podtrace_ingress(ctx: TcContext) -> i32 {
    hook::<true, true, false>(ctx)
}

#[classifier]
#[inline(always)]
pub fn podtrace_egress(ctx: TcContext) -> i32 {
    hook::<true, false, false>(ctx)
}

/// Egress of a pod's own interface (the host side of its veth): the
/// packet is handed to the pod, the last hook of its path. (A program
/// name has 15 characters at most.)
#[classifier]
#[inline(always)]
pub fn podtrace_to_pod(ctx: TcContext) -> i32 {
    hook::<true, false, true>(ctx)
}

/// For devices without an Ethernet header (tunl0, wireguard).
#[classifier]
#[inline(always)]
pub fn podtrace_ingress_l3(ctx: TcContext) -> i32 {
    hook::<false, true, false>(ctx)
}

#[classifier]
#[inline(always)]
pub fn podtrace_egress_l3(ctx: TcContext) -> i32 {
    hook::<false, false, false>(ctx)
}

/// An IPv4 program's body: `HAS_L2`, an Ethernet header; `INGRESS`, the
/// hook's direction; `TO_POD`, the egress that hands packets to a pod.
#[inline(always)]
fn hook<const HAS_L2: bool, const INGRESS: bool, const TO_POD: bool>(ctx: TcContext) -> i32 {
    if HAS_L2 && !INGRESS && !TO_POD {
        let tag = wireguard::carried_tag(|| Skb(&ctx).hash());
        if tag != 0 {
            return encrypted_leg(&ctx, tag);
        }
    }
    if untraced_at_a_glance(&ctx, HAS_L2) || !kept_at_a_glance(&ctx, HAS_L2) {
        return TC_ACT_UNSPEC;
    }
    look_closer::<HAS_L2, INGRESS, TO_POD>(ctx)
}

#[inline(never)]
fn look_closer<const HAS_L2: bool, const INGRESS: bool, const TO_POD: bool>(ctx: TcContext) -> i32 {
    let direction = if INGRESS {
        Direction::Ingress
    } else {
        Direction::Egress
    };
    to_ipv6(&ctx, HAS_L2, ipv6_twin(direction, HAS_L2, TO_POD));
    observe::<false>(&ctx, direction, HAS_L2, TO_POD)
}

// The IPv6 programs' bodies are inlined into the entry the macro writes:
// a frame of their own put the entry's 32 bytes on top of theirs, and
// `--sample`'s call on top of that passed 5.10's and 6.1's 512-byte
// combined stack. (The IPv4 ones tail-call, and a call frame keeps that
// as the verifiers took it.)
#[classifier]
#[inline(always)]
pub fn podtrace_ingress6(ctx: TcContext) -> i32 {
    observe::<true>(&ctx, Direction::Ingress, true, false)
}

#[classifier]
#[inline(always)]
pub fn podtrace_egress6(ctx: TcContext) -> i32 {
    observe::<true>(&ctx, Direction::Egress, true, false)
}

#[classifier]
#[inline(always)]
pub fn podtrace_to_pod6(ctx: TcContext) -> i32 {
    observe::<true>(&ctx, Direction::Egress, true, true)
}

#[classifier]
#[inline(always)]
pub fn podtrace_in_l3_6(ctx: TcContext) -> i32 {
    observe::<true>(&ctx, Direction::Ingress, false, false)
}

#[classifier]
#[inline(always)]
pub fn podtrace_eg_l3_6(ctx: TcContext) -> i32 {
    observe::<true>(&ctx, Direction::Egress, false, false)
}

/// Whether the packet is certainly not traced, nor carrying a traced pair,
/// by its fixed-offset headers alone (`glance`): most packets on a node,
/// turned away with a few checks before the classifier reads them (and,
/// for IPv6, before the tail call to the IPv6 program).
#[inline(always)]
fn untraced_at_a_glance(ctx: &TcContext, has_l2: bool) -> bool {
    let linear = Linear::new(ctx);
    // No entry: nothing is traced, but the classifier says so as ever.
    let untraced4 = traced_pairs().is_some_and(|pairs| {
        glance::untraced(&linear, has_l2, tunnel_ports, |pair| pairs.maybe(pair))
    });
    untraced4
        || traced_pairs6().is_some_and(|pairs| {
            glance::untraced6(&linear, has_l2, tunnel_ports, |pair| pairs.maybe(pair))
        })
}

/// Whether `--proto`/`--port` keeps the packet, where the glance can
/// judge it (`glance::filter_verdict`: a plain TCP or UDP header); a
/// pair's packets the filter leaves out then cost no classifier lookups.
/// Without a filter, a constant `true`.
#[inline(always)]
fn kept_at_a_glance(ctx: &TcContext, has_l2: bool) -> bool {
    let linear = Linear::new(ctx);
    let maybe_traced = |pair: &_| traced_pairs().is_none_or(|pairs| pairs.maybe(pair));
    filter_keeps(|f| glance::filter_verdict(&linear, has_l2, tunnel_ports, maybe_traced, f))
}

/// Hands an IPv6 packet to the hook's IPv6 program (`index`); returns
/// only for another packet, or if that program is not loaded (a kernel
/// that refused it: its IPv4 program then leaves IPv6 packets alone).
/// Inlined into the program's own body: a tail call from a function of
/// its own would bound the caller's stack to 256 bytes.
#[inline(always)]
fn to_ipv6(ctx: &TcContext, has_l2: bool, index: u32) {
    let linear = Linear::new(ctx);
    let ipv6 = if has_l2 {
        ethernet_payload(&linear, 0).is_some_and(|l3| is_ipv6(&linear, l3))
    } else {
        is_ipv6(&linear, 0)
    };
    if ipv6 {
        // SAFETY: `ctx` is this program's own context.
        unsafe { IPV6_PROGRAMS.tail_call(ctx, index) };
    }
}

/// The `ipv6_program` slot of the IPv6 twin of the hook's program.
#[inline(always)]
fn ipv6_twin(direction: Direction, has_l2: bool, to_pod: bool) -> u32 {
    match (has_l2, direction) {
        (true, Direction::Ingress) => ipv6_program::INGRESS,
        (true, Direction::Egress) if to_pod => ipv6_program::TO_POD,
        (true, Direction::Egress) => ipv6_program::EGRESS,
        (false, Direction::Ingress) => ipv6_program::INGRESS_L3,
        (false, Direction::Egress) => ipv6_program::EGRESS_L3,
    }
}

/// `to_pod`: the hook hands the packet to a pod; profile mode then forgets
/// its stamp, so that a new packet's stamp takes a free slot instead of
/// evicting the oldest (an LRU eviction is most of what stamping costs).
#[inline(always)]
fn observe<const IPV6: bool>(
    ctx: &TcContext,
    direction: Direction,
    has_l2: bool,
    to_pod: bool,
) -> i32 {
    let skb = Skb(ctx);
    let ifindex = skb.ifindex();
    // The linear head, read directly; through the helper only when the
    // headers run on past it (paged data), which is rare at tc.
    let linear = Linear::new(ctx);
    let mut found = matched::<_, IPV6>(&linear, has_l2, ifindex);
    if found.is_none() && linear.was_short() {
        found = matched::<_, IPV6>(&skb, has_l2, ifindex);
    }
    if let Some((kind, l3)) = found {
        if !IPV6 && kind == match_kind::HAND_TO_IPV6 {
            // In the program's own body, as `to_ipv6`'s; returns only if
            // the IPv6 programs are not loaded, which leaves it alone.
            // SAFETY: `ctx` is this program's own context.
            unsafe { IPV6_PROGRAMS.tail_call(ctx, ipv6_twin(direction, has_l2, to_pod)) };
            return TC_ACT_UNSPEC;
        }
        if kind == match_kind::CARRIER {
            bump(counter::CARRIED_OTHER_PAIR);
            return TC_ACT_UNSPEC;
        }
        // Read once for the filter and the identity, and only for them
        // (constants to the verifier: a plain trace has no such path).
        let traced = if filtering() || profile::enabled() || sample() > 1 {
            let ports = tunnel_ports();
            traced_l4::<_, IPV6>(&linear, l3, kind, &ports)
                .or_else(|| traced_l4::<_, IPV6>(&skb, l3, kind, &ports))
        } else {
            None
        };
        if !filter_keeps(|f| judged::<IPV6>(&linear, &skb, traced.as_ref()?, f)) {
            return TC_ACT_UNSPEC;
        }
        if profile::enabled() {
            if let Some(id) = identify(&linear, &skb, traced.as_ref()) {
                let hook = hook_id(node_id(), ifindex, direction as u8);
                profile::record(&id, hook, skb.len(), to_pod);
            }
        } else if kept(&linear, &skb, traced.as_ref()) {
            report::<IPV6>(&skb, direction, has_l2, kind, l3);
        }
    }
    TC_ACT_UNSPEC
}

// `IPV6` below: the program's family. The IPv4 programs trace IPv4
// headers only (`NodeFlows4`), so they are built without a path that
// reads IPv6 ones.

/// `--proto`/`--port` on the traced pair's header: read from the linear
/// head, and through the skb where the head ends first.
#[inline(always)]
fn judged<const IPV6: bool>(
    linear: &Linear,
    skb: &Skb,
    traced: &TracedL4,
    f: &L4Filter,
) -> Option<bool> {
    filter::judge::<_, IPV6>(linear, &traced.l4, f)
        .or_else(|| filter::judge::<_, IPV6>(skb, &traced.l4, f))
}

/// The packet's identity (profile mode, `--sample`), read as `judged`.
#[inline(always)]
fn identify(linear: &Linear, skb: &Skb, traced: Option<&TracedL4>) -> Option<PacketId> {
    let t = traced?;
    packet_id(linear, t.ip, &t.l4).or_else(|| packet_id(skb, t.ip, &t.l4))
}

/// Whether `--sample` keeps this packet (always, without it).
#[inline(always)]
fn kept(linear: &Linear, skb: &Skb, traced: Option<&TracedL4>) -> bool {
    let n = sample();
    n <= 1 || traced.is_some_and(|t| sample_keeps(linear, skb, t, n))
}

/// Whether `--sample n` keeps the packet whose traced header is `t`. A
/// call of its own, not inlined: inlined into a `--sample` trace without
/// a filter, LLVM merged a read of the linear head with another path's
/// and added a packet pointer to a packet pointer, which the verifier
/// refuses.
#[inline(never)]
fn sample_keeps(linear: &Linear, skb: &Skb, t: &TracedL4, n: u32) -> bool {
    identify(linear, skb, Some(t)).is_some_and(|id| sampled(&id, n))
}

/// How the packet (of the program's family: in the IPv6 programs, an
/// IPv4 tunnel packet with an IPv6 one inside too) matches the traced
/// flow, and where its IP header is.
#[inline(always)]
fn matched<B: Bytes, const IPV6: bool>(b: &B, has_l2: bool, ifindex: u32) -> Option<(u8, usize)> {
    let l3 = if has_l2 { ethernet_payload(b, 0)? } else { 0 };
    let flows = NodeFlows {
        ifindex,
        here: true,
    };
    let kind = if IPV6 && ip_version(b, l3)? == IPV4_VERSION {
        classify6_in4(b, l3, &tunnel_ports(), &flows)?
    } else if IPV6 {
        classify6(b, l3, &tunnel_ports(), &flows)?
    } else {
        classify4(b, l3, &tunnel_ports(), &NodeFlows4(flows))?
    };
    Some((kind, l3))
}

#[inline(always)]
fn report<const IPV6: bool>(skb: &Skb, direction: Direction, has_l2: bool, kind: u8, l3: usize) {
    // Where the kernel will route this packet, asked as it arrives.
    let route = if direction == Direction::Ingress && kind == match_kind::PLAIN {
        route_lookup::<IPV6>(skb, l3)
    } else {
        NO_ROUTE_ASKED
    };
    // Into WireGuard: tagged, so that its encrypted leg is known.
    let wireguard_tag = if !has_l2 && direction == Direction::Egress && kind == match_kind::PLAIN {
        wireguard::tag_going_in(skb)
    } else {
        0
    };
    send(
        skb,
        &tc_meta(skb, kind, direction, has_l2, route, wireguard_tag),
    );
}

/// The UDP packet WireGuard sent with a traced packet inside, leaving by
/// the underlay (`tag`: the traced packet's, `wireguard.rs`). Not
/// filtered nor sampled again: the traced packet was, going in.
#[inline(never)]
fn encrypted_leg(ctx: &TcContext, tag: u32) -> i32 {
    let skb = Skb(ctx);
    let kind = match_kind::ENCRYPTED;
    send(
        &skb,
        &tc_meta(&skb, kind, Direction::Egress, true, NO_ROUTE_ASKED, tag),
    );
    TC_ACT_UNSPEC
}

/// A tc sighting's fields, the packet's own read from `skb`.
#[inline(always)]
fn tc_meta(
    skb: &Skb,
    match_kind: u8,
    direction: Direction,
    has_l2: bool,
    route: Route,
    wireguard_tag: u32,
) -> Meta {
    Meta {
        kind: sighting_kind::TC,
        match_kind,
        node_id: node_id(),
        ifindex: skb.ifindex(),
        skb_len: skb.len(),
        mark: skb.mark(),
        location: 0,
        reason: 0,
        netns_inum: 0,
        direction: direction as u8,
        has_l2: has_l2 as u8,
        route,
        wireguard_tag,
    }
}

/// Sends the sighting of `meta` with the packet's first bytes.
#[inline(always)]
fn send(skb: &Skb, meta: &Meta) {
    // Filled in place: a Sighting is too large for the eBPF stack.
    let sent = submit_with(&SIGHTINGS, wake_bytes(), |s: &mut Sighting| {
        let copied = copy_headers(skb, &mut s.snapshot);
        if copied == 0 {
            bump(counter::SNAPSHOT_FAILED);
        }
        meta.write(s, copied);
    });
    if !sent {
        bump(counter::RINGBUF_FULL);
    }
}

/// bpf_fib_lookup for the IP packet at `l3`, as arriving on this
/// interface (NO_ROUTE_ASKED where its header cannot be read). One
/// parameter block for both families: the eBPF stack is small.
#[inline(always)]
fn route_lookup<const IPV6: bool>(skb: &Skb, l3: usize) -> Route {
    let mut params: FibParams = unsafe { core::mem::zeroed() };
    let ipv6 = IPV6;
    let filled = if ipv6 {
        ask6(skb, l3, &mut params)
    } else {
        ask4(skb, l3, &mut params)
    };
    match filled {
        Some(()) => skb.fib_lookup(ipv6, &mut params),
        None => NO_ROUTE_ASKED,
    }
}

/// The lookup's question for the IPv4 packet at `l3`.
#[inline(always)]
fn ask4(skb: &Skb, l3: usize, params: &mut FibParams) -> Option<()> {
    let pair = skb.pair_at(l3)?;
    params.family = AF_INET;
    params.l4_protocol = skb.u8_at(l3 + IPV4_PROTOCOL)?;
    // No tot_len: the kernel then checks the skb itself against the
    // MTU of the device the route leaves by (GSO-aware, so a TCP
    // super-segment is not "too big"), and still names that device
    // and next hop when the answer is FRAG_NEEDED.
    params.__bindgen_anon_1.tot_len = 0;
    params.__bindgen_anon_2.tos = skb.u8_at(l3 + IPV4_TOS)?;
    params.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(pair.src);
    params.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(pair.dst);
    Some(())
}

/// The lookup's question for the IPv6 packet at `l3`: its addresses and
/// next header (as for IPv4, the kernel checks the MTU itself).
#[inline(always)]
fn ask6(skb: &Skb, l3: usize, params: &mut FibParams) -> Option<()> {
    params.family = AF_INET6;
    params.l4_protocol = skb.u8_at(l3 + IPV6_NEXT_HEADER)?;
    params.__bindgen_anon_1.tot_len = 0;
    // Straight into the block: no copy of the addresses on the stack.
    let src = unsafe { &mut params.__bindgen_anon_3.ipv6_src };
    let dst = unsafe { &mut params.__bindgen_anon_4.ipv6_dst };
    let mut i = 0;
    while i < 4 {
        src[i] = u32::from_ne_bytes(skb.bytes_at::<4>(l3 + IPV6_SADDR + 4 * i)?);
        dst[i] = u32::from_ne_bytes(skb.bytes_at::<4>(l3 + IPV6_DADDR + 4 * i)?);
        i += 1;
    }
    Some(())
}

/// Copies the first min(len, SNAPSHOT_LEN) bytes of the packet; returns how
/// many were copied (0 on failure).
#[inline(always)]
fn copy_headers(skb: &Skb, dst: &mut [u8; SNAPSHOT_LEN]) -> u16 {
    let mut want = skb.len() as usize;
    if want > SNAPSHOT_LEN {
        want = SNAPSHOT_LEN;
    }
    if skb.copy_start(dst, want) {
        want as u16
    } else {
        0
    }
}
