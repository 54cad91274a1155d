//! Drops: the kernel's kfree_skb tracepoint, filtered to the traced flow
//! and to this instance's network namespace.
//!
//! Without CO-RE, the sk_buff / net_device / net offsets come from
//! userspace (read from the running kernel's BTF) in `LAYOUT`.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_buf},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, RawTracePointContext},
};
use podtrace_common::{
    counter, match_kind, sighting_kind, FlowKey, KernelLayout, Sighting, FIB_NOT_LOOKED_UP,
    GENEVE_PORT, MAX_NODES, NODE_OTHER_NETNS, VXLAN_PORT_FLANNEL, VXLAN_PORT_IANA,
};

use crate::maps::{bump, is_traced, node_id, SIGHTINGS};

#[unsafe(no_mangle)]
static LAYOUT: KernelLayout = KernelLayout {
    skb_head: 0,
    skb_network_header: 0,
    skb_dev: 0,
    skb_len: 0,
    skb_mark: 0,
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

#[btf_tracepoint(function = "kfree_skb")]
pub fn podtrace_kfree_skb(ctx: BtfTracePointContext) -> i32 {
    on_drop(ctx.arg(0), ctx.arg(1), ctx.arg::<u64>(2) as u32);
    0
}

/// For kernels whose kfree_skb has no BTF-typed tracepoint.
#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn podtrace_kfree_skb_raw(ctx: RawTracePointContext) -> i32 {
    on_drop(ctx.arg(0), ctx.arg(1), ctx.arg::<u64>(2) as u32);
    0
}

#[inline(always)]
unsafe fn read<T>(base: *const u8, offset: u32) -> Option<T> {
    unsafe { bpf_probe_read_kernel(base.add(offset as usize).cast::<T>()).ok() }
}

#[inline(always)]
fn on_drop(skb: *const u8, location: u64, reason: u32) {
    let layout = unsafe { core::ptr::read_volatile(&LAYOUT) };
    let Some(scratch) = SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let s = unsafe { &mut *scratch };
    let head = unsafe { read::<u64>(skb, layout.skb_head) }.unwrap_or(0);
    let network_header =
        unsafe { read::<u16>(skb, layout.skb_network_header) }.unwrap_or(NO_HEADER);
    let has_header = head != 0
        && network_header != NO_HEADER
        && unsafe {
            bpf_probe_read_kernel_buf(
                (head + u64::from(network_header)) as *const u8,
                &mut s.snapshot,
            )
        }
        .is_ok();
    let kind = if has_header {
        classify(&s.snapshot)
    } else {
        None
    };
    let Some(kind) = kind.or_else(|| socket_match(skb, &layout, &mut s.snapshot)) else {
        return;
    };

    let dev = unsafe { read::<u64>(skb, layout.skb_dev) }.unwrap_or(0) as *const u8;
    let (ifindex, net) = if dev.is_null() {
        // No device yet: a local sender's socket knows its namespace.
        let sk = unsafe { read::<u64>(skb, layout.skb_sk) }.unwrap_or(0) as *const u8;
        let net = if sk.is_null() || layout.sk_net == 0 {
            0
        } else {
            unsafe { read::<u64>(sk, layout.sk_net) }.unwrap_or(0)
        };
        (0, net as *const u8)
    } else {
        let ifindex = unsafe { read::<u32>(dev, layout.dev_ifindex) }.unwrap_or(0);
        let net = unsafe { read::<u64>(dev, layout.dev_nd_net) }.unwrap_or(0);
        (ifindex, net as *const u8)
    };
    let inum = if net.is_null() {
        0
    } else {
        unsafe { read::<u32>(net, layout.net_ns_inum) }.unwrap_or(0)
    };
    let node = if inum != 0 && inum == unsafe { core::ptr::read_volatile(&NETNS_INUM) } {
        node_id()
    } else if node_id() == 0 && !is_traced_netns(inum) {
        NODE_OTHER_NETNS
    } else {
        return;
    };

    s.ktime_ns = unsafe { bpf_ktime_get_ns() };
    s.location = location;
    s.ifindex = ifindex;
    s.skb_len = unsafe { read::<u32>(skb, layout.skb_len) }.unwrap_or(0);
    s.mark = unsafe { read::<u32>(skb, layout.skb_mark) }.unwrap_or(0);
    s.node_id = node;
    s.reason = reason;
    s.netns_inum = inum;
    s.direction = 0;
    s.has_l2 = 0;
    s.match_kind = kind;
    s.kind = sighting_kind::DROP;
    s.snapshot_len = if kind == match_kind::SOCKET {
        SOCKET_HEADER_LEN as u16
    } else {
        s.snapshot.len() as u16
    };
    s.fib_ifindex = 0;
    s.fib_nexthop = [0; 4];
    s.fib_result = FIB_NOT_LOOKED_UP;
    s._pad = 0;
    if SIGHTINGS.output::<Sighting>(&*s, 0).is_err() {
        bump(counter::RINGBUF_FULL);
    }
}

/// IPv4 header + the first 20 bytes of L4, built from a socket.
const SOCKET_HEADER_LEN: usize = 40;

/// A drop with no IP header (yet): its socket's addresses may still be the
/// traced pair. If so, writes an IPv4 + L4 header built from the socket.
#[inline(always)]
fn socket_match(
    skb: *const u8,
    layout: &KernelLayout,
    b: &mut [u8; podtrace_common::SNAPSHOT_LEN],
) -> Option<u8> {
    if layout.sk_daddr == 0 || layout.skb_sk == 0 {
        return None;
    }
    let sk = unsafe { read::<u64>(skb, layout.skb_sk) }? as *const u8;
    if sk.is_null() {
        return None;
    }
    let src = unsafe { read::<[u8; 4]>(sk, layout.sk_rcv_saddr) }?;
    let dst = unsafe { read::<[u8; 4]>(sk, layout.sk_daddr) }?;
    if !is_traced(&FlowKey { src, dst }) {
        return None;
    }
    let protocol = unsafe { read::<u16>(sk, layout.sk_protocol) }.unwrap_or(0) as u8;
    let local_port = unsafe { read::<u16>(sk, layout.sk_num) }
        .unwrap_or(0)
        .to_be_bytes();
    let remote_port = unsafe { read::<[u8; 2]>(sk, layout.sk_dport) }.unwrap_or([0; 2]);
    let mut i = 0;
    while i < SOCKET_HEADER_LEN {
        b[i] = 0;
        i += 1;
    }
    b[0] = 0x45;
    b[3] = SOCKET_HEADER_LEN as u8;
    b[9] = protocol;
    b[12..16].copy_from_slice(&src);
    b[16..20].copy_from_slice(&dst);
    b[20..22].copy_from_slice(&local_port);
    b[22..24].copy_from_slice(&remote_port);
    // TCP data offset 5 (20 bytes), so that the header decodes.
    b[32] = 0x50;
    Some(match_kind::SOCKET)
}

#[inline(always)]
fn is_traced_netns(inum: u32) -> bool {
    let traced = unsafe { core::ptr::read_volatile(&TRACED_NETNS) };
    let mut i = 0;
    while i < MAX_NODES {
        if traced[i] != 0 && traced[i] == inum {
            return true;
        }
        i += 1;
    }
    false
}

#[inline(always)]
fn key_at(b: &[u8; podtrace_common::SNAPSHOT_LEN], at: usize) -> FlowKey {
    FlowKey {
        src: [b[at], b[at + 1], b[at + 2], b[at + 3]],
        dst: [b[at + 4], b[at + 5], b[at + 6], b[at + 7]],
    }
}

/// Whether the IPv4 header at the start of `b`, or the inner header of a
/// VXLAN / Geneve / IPIP packet (outer header without options), is traced.
#[inline(always)]
fn classify(b: &[u8; podtrace_common::SNAPSHOT_LEN]) -> Option<u8> {
    if b[0] >> 4 != 4 {
        return None;
    }
    if is_traced(&key_at(b, 12)) {
        return Some(match_kind::PLAIN);
    }
    if b[0] & 0x0f != 5 {
        return None;
    }
    // Outer IPv4 (20) + UDP (8) + VXLAN/Geneve (8) + inner Ethernet (14).
    const INNER_AFTER_UDP: usize = 20 + 8 + 8 + 14;
    let inner = match b[9] {
        4 => 20,
        17 => {
            let dport = u16::from_be_bytes([b[22], b[23]]);
            let geneve_plain =
                dport == GENEVE_PORT && b[28] & 0x3f == 0 && b[30] == 0x65 && b[31] == 0x58;
            if dport == VXLAN_PORT_FLANNEL || dport == VXLAN_PORT_IANA || geneve_plain {
                INNER_AFTER_UDP
            } else {
                return None;
            }
        }
        _ => return None,
    };
    is_traced(&key_at(b, inner + 12)).then_some(match_kind::INNER)
}
