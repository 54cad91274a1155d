//! The sighting: one fixed-size record per packet seen, at a tc hook or
//! by the drop tracepoint, and the codes it carries.

/// Bytes of packet header copied into each sighting. Enough for outer
/// Ethernet + IPv6 + UDP + VXLAN (70 B) followed by inner Ethernet and
/// IPv6 and TCP (14 + 40 + 20), with room for IP options, IPv6 extension
/// headers or Geneve options. A power of two, for the tc copy's bound
/// (`Skb::copy_start`).
pub const SNAPSHOT_LEN: usize = 256;

/// How the packet matched the traced flow.
pub mod match_kind {
    /// Its own IPv4 header carries a traced address pair.
    pub const PLAIN: u8 = 1;
    /// It is a tunnel packet whose inner IP header carries a traced pair.
    pub const INNER: u8 = 2;
    /// A drop with no IP header yet, matched by its socket's addresses; the
    /// snapshot holds a header built from the socket.
    pub const SOCKET: u8 = 3;
    /// A tunnel packet between two traced addresses (two nodes' own)
    /// that carries another pair's packet: the encapsulation of a story
    /// not traced. The tc programs count it and report nothing.
    pub const CARRIER: u8 = 4;
    /// An IPv4 tunnel packet with an IPv6 packet inside, as a tc hook's
    /// IPv4 program matches it: handed to the hook's IPv6 program, which
    /// reads the inner pair. Never reported.
    pub const HAND_TO_IPV6: u8 = 5;
    /// An ICMP "fragmentation needed" that quotes a traced IPv4 pair's
    /// header: the error sent about a traced packet too big for its path
    /// (by a node, to the packet's sender). Its own pair is not traced.
    /// Only this error, of all ICMP errors: it is what a PMTU black hole
    /// loses. (ICMPv6's "packet too big" is not matched: the IPv6
    /// programs are at 5.10's verifier's bound.)
    pub const ABOUT: u8 = 6;
    /// A UDP packet WireGuard sent, carrying a traced packet it
    /// encrypted: known by the tag the WireGuard device's egress hook
    /// wrote into the traced packet's skb->hash, which WireGuard keeps
    /// across encryption ([`crate::wireguard`]). Its snapshot is the
    /// outer packet; `wireguard_tag` names the plaintext sighting.
    pub const ENCRYPTED: u8 = 7;
}

/// What saw the packet.
pub mod sighting_kind {
    /// A tc hook (ingress or egress of an interface).
    pub const TC: u8 = 0;
    /// The kernel's kfree_skb tracepoint: the packet was dropped.
    pub const DROP: u8 = 1;
}

/// One packet seen at one place: a tc hook, or the drop tracepoint.
/// Fixed size, so one ring-buffer record per sighting and no allocation on
/// either side.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Sighting {
    /// bpf_ktime_get_ns(): CLOCK_MONOTONIC, shared by all namespaces.
    pub ktime_ns: u64,
    /// Drops: the kernel address that freed the skb.
    pub location: u64,
    /// The device the packet was on (0 for a drop with no device).
    pub ifindex: u32,
    /// skb length: from the L2 header at tc (L3 on L3 devices).
    pub skb_len: u32,
    /// skb mark.
    pub mark: u32,
    /// Which traced node (network namespace) this program instance serves,
    /// set by userspace at load time;
    /// [`NODE_OTHER_NETNS`](crate::drops::NODE_OTHER_NETNS) for drops
    /// elsewhere.
    pub node_id: u32,
    /// Drops: the kernel's `enum skb_drop_reason` value.
    pub reason: u32,
    /// Drops: inode number of the network namespace of the device.
    pub netns_inum: u32,
    /// tc ingress: the kernel's route for the packet (bpf_fib_lookup):
    /// output device and next hop, when `fib_result` is success or no-neigh.
    pub fib_ifindex: u32,
    /// An IPv4 next hop in the first 4 bytes, an IPv6 one in all 16 (the
    /// snapshot's IP version says which).
    pub fib_nexthop: [u8; 16],
    /// A [`Direction`](crate::tc::Direction) as u8 (tc only).
    pub direction: u8,
    /// 1 when the snapshot starts with an Ethernet header, 0 when it starts
    /// at the IPv4 header (L3 devices, drops).
    pub has_l2: u8,
    /// One of [`match_kind`].
    pub match_kind: u8,
    /// One of [`sighting_kind`].
    pub kind: u8,
    /// Valid bytes in `snapshot`.
    pub snapshot_len: u16,
    /// A `BPF_FIB_LKUP_RET_*` code, or [`FIB_NOT_LOOKED_UP`].
    pub fib_result: u8,
    pub _pad: u8,
    /// The WireGuard tag (`crate::wireguard`) of a traced packet going
    /// into a WireGuard device, and of the encrypted packet carrying it
    /// (`match_kind::ENCRYPTED`); 0 for every other sighting.
    pub wireguard_tag: u32,
    pub snapshot: [u8; SNAPSHOT_LEN],
}

/// `fib_result` of a sighting where no route lookup was made.
pub const FIB_NOT_LOOKED_UP: u8 = 0xff;
