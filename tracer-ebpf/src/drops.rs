//! Drops: the kernel's kfree_skb tracepoint, filtered to the traced flow
//! and to this instance's network namespace.
//!
//! Without CO-RE, the sk_buff / net_device / net offsets come from
//! userspace (read from the running kernel's BTF) in `LAYOUT`.

use aya_ebpf::{
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, RawTracePointContext},
};
use podtrace_common::{
    counter,
    drops::{KernelLayout, MAX_NODES, NODE_OTHER_NETNS},
    filter,
    packet::{classify_ip, packet_id, socket_header, tunnel_inner_ip, Bytes, Flows},
    packet6::{is_ipv6, pair6_at},
    profile::sampled,
    sighting::{match_kind, sighting_kind, Sighting, SNAPSHOT_LEN},
    transport::{traced_l4, TracedL4},
    FlowKey,
};

use crate::{
    kernel::{global, kernel_read, kernel_read_buf, with_per_cpu, NO_ROUTE_ASKED},
    maps::{
        bump, cluster_tunnel, cluster_tunnel6, filter_keeps, is_traced, node_id, sample,
        tunnel_ports, NodeFlows, SIGHTINGS,
    },
    sighting::Meta,
    wireguard,
};

#[unsafe(no_mangle)]
static LAYOUT: KernelLayout = KernelLayout {
    skb_head: 0,
    skb_network_header: 0,
    skb_dev: 0,
    skb_len: 0,
    skb_tail: 0,
    skb_mark: 0,
    skb_hash: 0,
    dev_ifindex: 0,
    dev_nd_net: 0,
    net_ns_inum: 0,
    skb_sk: 0,
    sk_rcv_saddr: 0,
    sk_daddr: 0,
    sk_num: 0,
    sk_dport: 0,
    sk_protocol: 0,
    sk_net: 0,
};

/// Inode of this instance's network namespace.
#[unsafe(no_mangle)]
static NETNS_INUM: u32 = 0;

/// Inodes of every traced namespace: instance 0 also reports drops in
/// namespaces outside this set (pods), so none of them goes unseen.
#[unsafe(no_mangle)]
static TRACED_NETNS: [u32; MAX_NODES] = [0; MAX_NODES];

/// A Sighting is too large for the eBPF stack; build it here.
#[map(name = "DROP_SCRATCH")]
static SCRATCH: PerCpuArray<Sighting> = PerCpuArray::with_max_entries(1, 0);

/// The skb's network header was never set.
const NO_HEADER: u16 = 0xffff;

/// The node_id of the instance that also reports drops in untraced
/// namespaces.
const FIRST_NODE: u32 = 0;

/// Arguments of the kfree_skb tracepoint.
const ARG_SKB: usize = 0;
const ARG_LOCATION: usize = 1;
const ARG_REASON: usize = 2;

/// The reason of a drop on a kernel that passes none (userspace knows
/// which kernel it loaded into and says so).
const REASON_NOT_PASSED: u32 = 0;

#[btf_tracepoint(function = "kfree_skb")]
pub fn podtrace_kfree_skb(ctx: BtfTracePointContext) -> i32 {
    on_drop(
        ctx.arg(ARG_SKB),
        ctx.arg(ARG_LOCATION),
        ctx.arg::<u64>(ARG_REASON) as u32,
    );
    0
}

/// For kernels whose kfree_skb has no BTF-typed tracepoint.
#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn podtrace_kfree_skb_raw(ctx: RawTracePointContext) -> i32 {
    on_drop(
        ctx.arg(ARG_SKB),
        ctx.arg(ARG_LOCATION),
        ctx.arg::<u64>(ARG_REASON) as u32,
    );
    0
}

// Kernels before 5.17 pass kfree_skb no reason: its third argument does not
// exist, and the verifier refuses a program that reads it (tp_btf at load,
// a raw tracepoint at attach). These read the first two only.

#[btf_tracepoint(function = "kfree_skb")]
pub fn podtrace_kfree_skb_noreason(ctx: BtfTracePointContext) -> i32 {
    on_drop(ctx.arg(ARG_SKB), ctx.arg(ARG_LOCATION), REASON_NOT_PASSED);
    0
}

#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn podtrace_kfree_skb_raw_noreason(ctx: RawTracePointContext) -> i32 {
    on_drop(ctx.arg(ARG_SKB), ctx.arg(ARG_LOCATION), REASON_NOT_PASSED);
    0
}

#[inline(always)]
fn on_drop(skb: u64, location: u64, reason: u32) {
    with_per_cpu(&SCRATCH, 0, |s| report(s, skb, location, reason));
}

/// Builds the sighting of a traced drop in `s` and sends it.
#[inline(always)]
fn report(s: &mut Sighting, skb: u64, location: u64, reason: u32) {
    let layout = global(&LAYOUT);
    let head = kernel_read::<u64>(skb, layout.skb_head).unwrap_or(0);
    let network_header = kernel_read::<u16>(skb, layout.skb_network_header).unwrap_or(NO_HEADER);
    let tail = kernel_read::<u32>(skb, layout.skb_tail).unwrap_or(0);
    let copied = linear_from_network_header(network_header, tail);
    let has_header = head != 0
        && copied > 0
        && kernel_read_buf(head + u64::from(network_header), &mut s.snapshot[..copied]);
    let (ifindex, inum) = device_netns(skb, &layout);
    let plain_or_inner = if has_header {
        // Only this node's tunnels are known: elsewhere (a pod's
        // namespace) an encapsulated-looking packet is a payload.
        match classify_snapshot(&s.snapshot, ifindex, is_here(inum)) {
            NOT_MATCHED => None,
            kind => Some(kind),
        }
    } else {
        None
    };
    // Traced between two nodes' own addresses, a tunnel packet carrying
    // another pair is no packet of theirs, here as at tc; elsewhere (the
    // underlay) too, where a bridge's flooded copy of one is dropped as
    // not for that host, while the packet itself went on.
    let carrier = plain_or_inner == Some(match_kind::CARRIER)
        || (plain_or_inner == Some(match_kind::PLAIN) && carries_another_pair(&s.snapshot[..]));
    // The UDP packet WireGuard sent with a traced packet inside: known by
    // the tag in its hash, as at tc; filtered and sampled going in.
    let wireguard_tag = match plain_or_inner {
        None if has_header => {
            wireguard::carried_tag(|| kernel_read(skb, layout.skb_hash).unwrap_or(0))
        }
        _ => 0,
    };
    let (kind, snapshot_len) = match plain_or_inner {
        // `--sample`: the same packets the tc programs keep.
        Some(kind) if !kept(&s.snapshot[..], kind) => return,
        Some(kind) => (kind, copied),
        // Or come from another node, its tag lost on the wire: userspace
        // keeps it only as a leg it saw leave.
        None if wireguard_tag != 0 || (has_header && arrived_encrypted(s, copied, inum)) => {
            (match_kind::ENCRYPTED, copied)
        }
        None => match socket_match(skb, &layout, &mut s.snapshot) {
            Some(len) => (match_kind::SOCKET, len),
            None => return,
        },
    };
    let Some(node) = reporting_node(inum) else {
        return;
    };
    // Judged only by the instance that reports the drop: counted once.
    if carrier {
        bump(counter::CARRIED_OTHER_PAIR);
        return;
    }
    if !kept_by_filter(&s.snapshot[..], kind) {
        return;
    }
    let meta = Meta {
        kind: sighting_kind::DROP,
        match_kind: kind,
        node_id: node,
        ifindex,
        skb_len: kernel_read(skb, layout.skb_len).unwrap_or(0),
        mark: kernel_read(skb, layout.skb_mark).unwrap_or(0),
        location,
        reason,
        netns_inum: inum,
        direction: 0,
        has_l2: 0,
        route: NO_ROUTE_ASKED,
        wireguard_tag,
    };
    meta.write(s, snapshot_len as u16);
    if SIGHTINGS.output::<Sighting>(s, 0).is_err() {
        bump(counter::RINGBUF_FULL);
    }
}

/// Whether `--proto`/`--port` keeps the dropped packet starting
/// `snapshot`; an encrypted leg's was judged going into WireGuard.
#[inline(always)]
fn kept_by_filter(snapshot: &[u8], kind: u8) -> bool {
    kind == match_kind::ENCRYPTED
        || filter_keeps(|f| {
            filter::judge::<_, false>(snapshot, &traced_l4_of(snapshot, kind)?.l4, f)
        })
}

/// How many bytes of the packet lie in the skb's linear data from its
/// network header on, at most a snapshot's: 0 when the header was never
/// set. The copy reads no further, so no byte past the packet (a freed
/// skb's tail room, another packet's data) reaches userspace.
#[inline(always)]
fn linear_from_network_header(network_header: u16, tail: u32) -> usize {
    if network_header == NO_HEADER || tail <= u32::from(network_header) {
        return 0;
    }
    let mut linear = (tail - u32::from(network_header)) as usize;
    if linear > SNAPSHOT_LEN {
        linear = SNAPSHOT_LEN;
    }
    linear
}

/// What [`classify_snapshot`] says of a packet it does not match.
const NOT_MATCHED: u8 = 0;

/// How the IP packet starting `snapshot` matches the traced flow (a
/// `match_kind`), or [`NOT_MATCHED`]. A function of its own, not inlined:
/// inlined, LLVM left a register undefined on one path of the IPv6 walk
/// and computed on it anyway, which the verifier refuses where that
/// register held a pointer; a call returns a defined value.
#[inline(never)]
fn classify_snapshot(snapshot: &[u8; SNAPSHOT_LEN], ifindex: u32, here: bool) -> u8 {
    let flows = NodeFlows { ifindex, here };
    classify_ip(&snapshot[..], 0, &tunnel_ports(), &flows).unwrap_or(NOT_MATCHED)
}

/// Whether the IP packet starting `snapshot`, of a traced pair, is one
/// of the cluster's tunnel packets with another pair inside.
#[inline(always)]
fn carries_another_pair(snapshot: &[u8]) -> bool {
    let Some((inner, tunnel)) = tunnel_inner_ip(snapshot, 0, &tunnel_ports()) else {
        return false;
    };
    // Asked of the maps as a drop anywhere asks them: no tunnel trusted.
    let flows = NodeFlows {
        ifindex: 0,
        here: false,
    };
    let inner_traced = if is_ipv6(snapshot, inner) {
        pair6_at(snapshot, inner).is_some_and(|p| flows.traced6(&p))
    } else {
        snapshot.pair_at(inner).is_some_and(|p| flows.traced(&p))
    };
    if inner_traced {
        return false;
    }
    if is_ipv6(snapshot, 0) {
        pair6_at(snapshot, 0).is_some_and(|outer| cluster_tunnel6(&outer, &tunnel))
    } else {
        snapshot
            .pair_at(0)
            .is_some_and(|outer| cluster_tunnel(&outer, &tunnel))
    }
}

/// Whether `--sample` keeps the packet whose IP header starts
/// `snapshot` (always, without it).
#[inline(always)]
fn kept(snapshot: &[u8], kind: u8) -> bool {
    let n = sample();
    if n <= 1 {
        return true;
    }
    // Unread (an IPv6 header: see `traced_l4_of`) is kept: nothing is
    // left out unseen.
    match traced_l4_of(snapshot, kind) {
        Some(t) => packet_id(snapshot, t.ip, &t.l4).is_some_and(|id| sampled(&id, n)),
        None => true,
    }
}

/// The traced header of the IP packet starting `snapshot`, and its
/// transport: what the filter and `--sample` read. IPv4 only: the walk
/// of IPv6's extension headers over the snapshot made 5.10's verifier
/// lose track of the snapshot's pointer and refuse the program, so a
/// dropped IPv6 packet is kept by `--proto`/`--port` and `--sample`
/// alike (its tc sightings are judged).
#[inline(always)]
fn traced_l4_of(snapshot: &[u8], kind: u8) -> Option<TracedL4> {
    traced_l4::<_, false>(snapshot, 0, kind, &tunnel_ports())
}

/// The drop's device (0 if none) and the inode of its network namespace
/// (0 if unknown).
#[inline(always)]
fn device_netns(skb: u64, layout: &KernelLayout) -> (u32, u32) {
    let dev = kernel_read::<u64>(skb, layout.skb_dev).unwrap_or(0);
    let (ifindex, net) = if dev == 0 {
        // No device yet: a local sender's socket knows its namespace.
        let sk = kernel_read::<u64>(skb, layout.skb_sk).unwrap_or(0);
        let net = if sk == 0 || layout.sk_net == 0 {
            0
        } else {
            kernel_read::<u64>(sk, layout.sk_net).unwrap_or(0)
        };
        (0, net)
    } else {
        let ifindex = kernel_read::<u32>(dev, layout.dev_ifindex).unwrap_or(0);
        let net = kernel_read::<u64>(dev, layout.dev_nd_net).unwrap_or(0);
        (ifindex, net)
    };
    let inum = if net == 0 {
        0
    } else {
        kernel_read::<u32>(net, layout.net_ns_inum).unwrap_or(0)
    };
    (ifindex, inum)
}

/// A drop with no IP header (yet): its socket's addresses may still be the
/// traced pair. If so, writes an IPv4 + L4 header built from the socket
/// and returns its length.
#[inline(always)]
fn socket_match(skb: u64, layout: &KernelLayout, b: &mut [u8; SNAPSHOT_LEN]) -> Option<usize> {
    if layout.sk_daddr == 0 || layout.skb_sk == 0 {
        return None;
    }
    let sk = kernel_read::<u64>(skb, layout.skb_sk)?;
    if sk == 0 {
        return None;
    }
    let pair = FlowKey {
        src: kernel_read(sk, layout.sk_rcv_saddr)?,
        dst: kernel_read(sk, layout.sk_daddr)?,
    };
    if !is_traced(&pair) {
        return None;
    }
    let protocol = kernel_read::<u16>(sk, layout.sk_protocol).unwrap_or(0) as u8;
    let local_port = kernel_read::<u16>(sk, layout.sk_num).unwrap_or(0);
    let remote_port = kernel_read::<[u8; 2]>(sk, layout.sk_dport).unwrap_or([0; 2]);
    socket_header(b, protocol, &pair, local_port, remote_port)
}

/// Whether the dropped packet, `copied` bytes of it in `s`, may be an
/// encrypted leg come to this node from another.
#[inline(always)]
fn arrived_encrypted(s: &Sighting, copied: usize, inum: u32) -> bool {
    is_here(inum) && wireguard::may_carry_traced(&s.snapshot[..copied])
}

/// The node a drop in namespace `inum` is reported as by this instance:
/// its own node's, or, by the first instance only, another namespace
/// (a pod's); `None` where another instance reports it.
#[inline(always)]
fn reporting_node(inum: u32) -> Option<u32> {
    if is_here(inum) {
        Some(node_id())
    } else if node_id() == FIRST_NODE && !is_traced_netns(inum) {
        Some(NODE_OTHER_NETNS)
    } else {
        None
    }
}

/// Whether the namespace `inum` is this instance's node's. Asked again
/// where it is needed, not held in a variable: held across the report's
/// calls, it grew the drop program's frame past 5.10's stack limit.
#[inline(always)]
fn is_here(inum: u32) -> bool {
    inum != 0 && inum == global(&NETNS_INUM)
}

#[inline(always)]
fn is_traced_netns(inum: u32) -> bool {
    let traced = global(&TRACED_NETNS);
    let mut i = 0;
    while i < MAX_NODES {
        if traced[i] != 0 && traced[i] == inum {
            return true;
        }
        i += 1;
    }
    false
}
