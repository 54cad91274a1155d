//! The ABI between podtrace's eBPF programs and its userspace.
//!
//! Every type here is `#[repr(C)]`, plain old data, and identical on both
//! sides; the kernel writes them, userspace reads them byte for byte.
//!
//! The records of each event family have the family's name, as its
//! kernel and userspace files do (docs/how-it-works.md, "Event
//! families"): `sighting` (the record every sighting travels in), `tc`,
//! `drops`, `profile`. The packet parser they share is `packet` and its
//! neighbours; what every program shares (the flow key, counters, names)
//! is here.
#![no_std]

pub mod drops;
pub mod filter;
pub mod glance;
pub mod headers;
pub mod packet;
pub mod packet6;
pub mod pmtu;
pub mod prefilter;
pub mod profile;
pub mod sighting;
pub mod tc;
pub mod transport;
pub mod tunnel;
pub mod wireguard;

use drops::{KernelLayout, MAX_NODES};
use profile::{Histogram, PacketId, Stamp, HIST_LINEAR_US, HIST_LOG2};
use sighting::{Sighting, SNAPSHOT_LEN};

pub use headers::{GENEVE_PORT, VXLAN_PORT_FLANNEL, VXLAN_PORT_IANA};
pub use tunnel::{TunnelKey, TunnelPorts, UdpTunnel, ANY_VNI, MAX_NODE_VXLAN_PORTS};

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
    /// A tc sighting of a [`super::sighting::match_kind::CARRIER`] packet.
    pub const CARRIED_OTHER_PAIR: u32 = 4;
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
    /// Global: the high bits of the run's WireGuard tags (0: none).
    pub const WIREGUARD_TAG_PREFIX: &str = "WIREGUARD_TAG_PREFIX";
    pub const WIREGUARD_DEVICES: &str = "WIREGUARD_DEVICES";
    pub const TC_INGRESS: &str = "podtrace_ingress";
    pub const TC_EGRESS: &str = "podtrace_egress";
    pub const TC_TO_POD: &str = "podtrace_to_pod";
    pub const TC_INGRESS_L3: &str = "podtrace_ingress_l3";
    pub const TC_EGRESS_L3: &str = "podtrace_egress_l3";
    /// The IPv6 twins, by `ipv6_program` slot.
    pub const TC_IPV6: [&str; super::tc::ipv6_program::COUNT as usize] = [
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
const _: () = assert!(core::mem::size_of::<KernelLayout>() == 17 * 4);
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
    unsafe impl aya::Pod for super::sighting::Sighting {}
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::TunnelKey {}
    unsafe impl aya::Pod for super::TunnelPorts {}
    unsafe impl aya::Pod for super::filter::L4Filter {}
    unsafe impl<K: aya::Pod> aya::Pod for super::prefilter::TracedPairsOf<K> {}
    unsafe impl aya::Pod for super::packet6::FlowKey6 {}
    unsafe impl aya::Pod for super::drops::KernelLayout {}
    unsafe impl aya::Pod for super::profile::StepKey {}
    unsafe impl aya::Pod for super::profile::Histogram {}
}
