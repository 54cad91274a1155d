//! Maps and globals shared by every podtrace program.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use podtrace_common::{
    counter,
    filter::L4Filter,
    node_addr,
    packet::Flows,
    packet6::FlowKey6,
    prefilter::{TracedPairs, TracedPairs6},
    FlowKey, TunnelKey, TunnelPorts, ANY_VNI,
};

use crate::kernel::{contains, global, lookup, with_array, with_per_cpu};

/// Both directions of every traced pair, with room to spare.
const MAX_FLOWS: u32 = 1024;

/// Tunnel devices on one node, and interfaces they send through.
const MAX_TUNNELS: u32 = 16;

/// Node addresses: the node's own and every other node's.
const MAX_NODE_ADDRS: u32 = 8192;

/// 4 MiB unless userspace says (`--ring-buffer`, 16 MiB by default).
const SIGHTINGS_BYTES: u32 = 1 << 22;

/// Traced (src, dst) pairs; filled by userspace.
#[map(name = "FLOWS")]
pub static FLOWS: HashMap<FlowKey, u8> = HashMap::with_max_entries(MAX_FLOWS, 0);

/// The traced IPv6 pairs, as FLOWS.
#[map(name = "FLOWS6")]
pub static FLOWS6: HashMap<FlowKey6, u8> = HashMap::with_max_entries(MAX_FLOWS, 0);

/// The pre-filter before FLOWS6, as TRACED_PAIRS before FLOWS.
#[map(name = "TRACED_PAIRS6")]
static TRACED_PAIRS6: Array<TracedPairs6> = Array::with_max_entries(1, 0);

/// The pre-filter before FLOWS (`TracedPairs`), one entry: an array
/// lookup the verifier inlines, which answers alone while few pairs are
/// traced.
#[map(name = "TRACED_PAIRS")]
static TRACED_PAIRS: Array<TracedPairs> = Array::with_max_entries(1, 0);

/// `--proto`/`--port`, one entry; read only when `FILTERING` is set.
/// A map, not a constant: a Service's port learnt under way widens it.
#[map(name = "L4_FILTER")]
static L4_FILTER: Array<L4Filter> = Array::with_max_entries(1, 0);

/// The node's tunnels (VXLAN/Geneve port and VNI, IPIP); filled by
/// userspace from the node's devices.
#[map(name = "TUNNELS")]
static TUNNELS: HashMap<TunnelKey, u8> = HashMap::with_max_entries(MAX_TUNNELS, 0);

/// The node's own addresses and its tunnel peers (`node_addr`).
#[map(name = "NODE_ADDRS")]
static NODE_ADDRS: HashMap<[u8; 4], u8> = HashMap::with_max_entries(MAX_NODE_ADDRS, 0);

/// The node's own IPv6 addresses and its IPv6 tunnel peers.
#[map(name = "NODE_ADDRS6")]
static NODE_ADDRS6: HashMap<[u8; 16], u8> = HashMap::with_max_entries(MAX_NODE_ADDRS, 0);

/// Interfaces where encapsulated packets are real: the underlay.
#[map(name = "TUNNEL_HOOKS")]
static TUNNEL_HOOKS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TUNNELS, 0);

#[map(name = "SIGHTINGS")]
pub static SIGHTINGS: RingBuf = RingBuf::with_byte_size(SIGHTINGS_BYTES, 0);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Which traced node (network namespace) this instance serves; userspace
/// sets it at load time, one program instance per namespace.
#[unsafe(no_mangle)]
pub static NODE_ID: u32 = 0;

/// The UDP ports read as tunnels: the well-known ones and the node's own
/// VXLAN devices' (set at load time).
#[unsafe(no_mangle)]
pub static TUNNEL_PORTS: TunnelPorts = TunnelPorts::WELL_KNOWN;

/// `--sample N`: one traced packet in N is reported (0 or 1: all).
#[unsafe(no_mangle)]
pub static SAMPLE: u32 = 0;

/// Records wake userspace only once this many bytes wait in the ring;
/// below, userspace polls on a timer (no wakeup per record at line rate).
#[unsafe(no_mangle)]
pub static WAKE_BYTES: u64 = 0;

/// 1 when a `--proto`/`--port` filter is set: a constant to the
/// verifier, so a trace without one does not even look it up.
#[unsafe(no_mangle)]
pub static FILTERING: u32 = 0;

/// The high bits of this run's WireGuard tags (`podtrace_common::wireguard`),
/// set at load time; 0 on a node without a WireGuard device, a constant
/// to the verifier that leaves the tagging out.
#[unsafe(no_mangle)]
pub static WIREGUARD_TAG_PREFIX: u32 = 0;

/// The node's WireGuard devices (ifindex), whose egress tags traced
/// packets; filled by userspace.
#[map(name = "WIREGUARD_DEVICES")]
pub static WIREGUARD_DEVICES: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TUNNELS, 0);

/// Each CPU's count of packets it tagged (`podtrace_common::wireguard::tag`).
#[map(name = "WIREGUARD_COUNT")]
pub static WIREGUARD_COUNT: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// Tags written into traced packets going into a WireGuard device, and
/// when: the underlay's egress hook trusts a hash only if it is here.
#[map(name = "WIREGUARD_TAGS")]
pub static WIREGUARD_TAGS: LruHashMap<u32, u64> = LruHashMap::with_max_entries(MAX_FLOWS, 0);

/// Whether a `--proto`/`--port` filter is set.
#[inline(always)]
pub fn filtering() -> bool {
    global(&FILTERING) != 0
}

/// Whether `--proto`/`--port` keeps the packet: `judge` applies the
/// filter to the packet's bytes (`None`: they could not be read). Counts
/// what it leaves out.
#[inline(always)]
pub fn filter_keeps(judge: impl Fn(&L4Filter) -> Option<bool>) -> bool {
    if !filtering() {
        return true;
    }
    // Unreadable bytes keep the packet: userspace then tells it whole.
    let keep = with_array(&L4_FILTER, 0, |f| judge(f).unwrap_or(true)).unwrap_or(true);
    if !keep {
        bump(counter::FILTERED);
    }
    keep
}

#[inline(always)]
pub fn wireguard_tag_prefix() -> u32 {
    global(&WIREGUARD_TAG_PREFIX)
}

#[inline(always)]
pub fn tunnel_ports() -> TunnelPorts {
    global(&TUNNEL_PORTS)
}

#[inline(always)]
pub fn sample() -> u32 {
    global(&SAMPLE)
}

#[inline(always)]
pub fn wake_bytes() -> u64 {
    global(&WAKE_BYTES)
}

#[inline(always)]
pub fn node_id() -> u32 {
    global(&NODE_ID)
}

#[inline(always)]
pub fn is_traced(key: &FlowKey) -> bool {
    match with_array(&TRACED_PAIRS, 0, |pairs| pairs.answer(key)) {
        Some(Some(known)) => known,
        Some(None) => contains(&FLOWS, key),
        None => false,
    }
}

/// The IPv4 pre-filter's entry (`None`: there is none, and then no pair
/// is traced). Looked up once by a caller that asks it of several pairs,
/// before it reads them: the lookup is a call to LLVM, which would
/// otherwise keep the packet's bytes on the stack across it.
#[inline(always)]
pub fn traced_pairs() -> Option<&'static TracedPairs> {
    TRACED_PAIRS.get(0)
}

/// The IPv6 pre-filter's entry, as [`traced_pairs`].
#[inline(always)]
pub fn traced_pairs6() -> Option<&'static TracedPairs6> {
    TRACED_PAIRS6.get(0)
}

/// Whether an IPv6 pair is traced: the address bits turn most untraced
/// packets away, and FLOWS6 decides the rest (its exact list is left to
/// IPv4: comparing 32-byte keys in place cost more stack than the eBPF
/// call chain has).
#[inline(always)]
pub fn is_traced6(key: &FlowKey6) -> bool {
    with_array(&TRACED_PAIRS6, 0, |pairs| pairs.maybe(key)).unwrap_or(false)
        && contains(&FLOWS6, key)
}

/// The node's maps, as the classifier asks them, for a packet seen on
/// `ifindex`; `here`: in the namespace whose tunnels the maps hold (a
/// drop elsewhere trusts no tunnel).
pub struct NodeFlows {
    pub ifindex: u32,
    pub here: bool,
}

impl Flows for NodeFlows {
    #[inline(always)]
    fn traced(&self, key: &FlowKey) -> bool {
        is_traced(key)
    }
    #[inline(always)]
    fn traced6(&self, key: &FlowKey6) -> bool {
        is_traced6(key)
    }
    #[inline(always)]
    fn trusted(&self, outer: &FlowKey, tunnel: &TunnelKey) -> bool {
        self.here && trusted_tunnel(self.ifindex, outer, tunnel)
    }
    #[inline(always)]
    fn trusted6(&self, outer: &FlowKey6, tunnel: &TunnelKey) -> bool {
        self.here
            && contains(&TUNNEL_HOOKS, &self.ifindex)
            && between_nodes_in(&NODE_ADDRS6, &outer.src, &outer.dst, node_addr::ANY6)
            && node_has(tunnel)
    }
}

/// [`NodeFlows`] as the IPv4 programs ask them: an IPv6 pair inside an
/// IPv4 tunnel is not theirs to read but the IPv6 programs'
/// (`IPV6_ELSEWHERE`, which hands such a packet on), and `traced6` is a
/// constant, so that the compiler leaves that reading out: with it,
/// 5.10's verifier gave up on the IPv4 programs (a million instructions
/// processed).
pub struct NodeFlows4(pub NodeFlows);

impl Flows for NodeFlows4 {
    const IPV6_ELSEWHERE: bool = true;
    #[inline(always)]
    fn traced(&self, key: &FlowKey) -> bool {
        self.0.traced(key)
    }
    #[inline(always)]
    fn traced6(&self, _: &FlowKey6) -> bool {
        false
    }
    #[inline(always)]
    fn trusted(&self, outer: &FlowKey, tunnel: &TunnelKey) -> bool {
        self.0.trusted(outer, tunnel)
    }
    #[inline(always)]
    fn trusted6(&self, _: &FlowKey6, _: &TunnelKey) -> bool {
        false
    }
}

#[inline(always)]
pub fn bump(index: u32) {
    with_per_cpu(&COUNTERS, index, |count| *count += 1);
}

/// Whether this node's kernel treats a packet with outer pair `outer` and
/// tunnel `tunnel`, seen on `ifindex`, as encapsulated: on the underlay,
/// between one of its addresses and a peer node's, on a tunnel it has.
/// Anything else is a payload, which a pod may have crafted.
#[inline(always)]
pub fn trusted_tunnel(ifindex: u32, outer: &FlowKey, tunnel: &TunnelKey) -> bool {
    contains(&TUNNEL_HOOKS, &ifindex) && cluster_tunnel(outer, tunnel)
}

/// Whether a packet with outer pair `outer` and tunnel `tunnel` is one of
/// the cluster's tunnel packets wherever it is seen: between this node and
/// a peer, on a port and VNI this node's tunnels use.
#[inline(always)]
pub fn cluster_tunnel(outer: &FlowKey, tunnel: &TunnelKey) -> bool {
    between_nodes(outer) && node_has(tunnel)
}

/// Whether an IPv6 tunnel packet with outer pair `outer` is the cluster's
/// wherever it is seen, as [`cluster_tunnel`].
#[inline(always)]
pub fn cluster_tunnel6(outer: &FlowKey6, tunnel: &TunnelKey) -> bool {
    between_nodes_in(&NODE_ADDRS6, &outer.src, &outer.dst, node_addr::ANY6) && node_has(tunnel)
}

#[inline(always)]
fn between_nodes(outer: &FlowKey) -> bool {
    between_nodes_in(&NODE_ADDRS, &outer.src, &outer.dst, node_addr::ANY)
}

/// Whether one of `src`, `dst` is the node's own address and the other a
/// peer's, in the family of `addrs` (whose key `any` says every address
/// may be a peer).
#[inline(always)]
fn between_nodes_in<K: Copy>(addrs: &HashMap<K, u8>, src: &K, dst: &K, any: K) -> bool {
    let what = |ip: &K| lookup(addrs, ip).unwrap_or(0);
    // The key on the stack: a reference to the constant itself points
    // into .rodata, which the map lookup does not read as a key here.
    let any = core::hint::black_box(any);
    let any_peer = what(&any) & node_addr::PEER != 0;
    let (src, dst) = (what(src), what(dst));
    let peer = |flags: u8| any_peer || flags & node_addr::PEER != 0;
    (src & node_addr::LOCAL != 0 && peer(dst)) || (dst & node_addr::LOCAL != 0 && peer(src))
}

#[inline(always)]
fn node_has(tunnel: &TunnelKey) -> bool {
    let any_vni = TunnelKey {
        vni: ANY_VNI,
        ..*tunnel
    };
    contains(&TUNNELS, tunnel) || contains(&TUNNELS, &any_vni)
}
