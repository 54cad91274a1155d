//! Wire-format numbers of the headers podtrace reads: one definition for
//! both eBPF programs, userspace and the host tests, so that no program
//! spells an offset as a bare number.
//!
//! Offsets are in bytes from the start of their own header; multi-byte
//! fields are big-endian on the wire.

/// Ethernet: destination and source MAC, then the ethertype.
pub const ETH_HLEN: usize = 14;
pub const ETH_TYPE: usize = 12;
/// An 802.1Q tag sits before the real ethertype and adds this much.
pub const VLAN_HLEN: usize = 4;

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const ETH_P_8021Q: u16 = 0x8100;
/// Transparent Ethernet bridging: a Geneve payload that is a whole frame.
pub const ETH_P_TEB: u16 = 0x6558;

/// IPv4 header without options.
pub const IPV4_HLEN: usize = 20;
/// Version in the high nibble, header length in 32-bit words in the low.
pub const IPV4_VER_IHL: usize = 0;
pub const IPV4_TOS: usize = 1;
pub const IPV4_TOT_LEN: usize = 2;
pub const IPV4_ID: usize = 4;
pub const IPV4_FRAG_OFF: usize = 6;
/// The fragment offset's bits of `frag_off`.
pub const IPV4_OFFSET_MASK: u16 = 0x1fff;
pub const IPV4_PROTOCOL: usize = 9;
pub const IPV4_SADDR: usize = 12;
pub const IPV4_DADDR: usize = 16;
// The flow key is read as one 8-byte run from the source address on.
const _: () = assert!(IPV4_DADDR == IPV4_SADDR + 4);
pub const IPV4_VERSION: u8 = 4;
pub const IPV4_IHL_MASK: u8 = 0x0f;
/// Version 4, five words: a header without options.
pub const IPV4_VER_IHL_PLAIN: u8 = (IPV4_VERSION << 4) | (IPV4_HLEN / 4) as u8;

/// IPv6's fixed header; extension headers may follow it.
pub const IPV6_HLEN: usize = 40;
pub const IPV6_VERSION: u8 = 6;
pub const IPV6_NEXT_HEADER: usize = 6;
pub const IPV6_SADDR: usize = 8;
pub const IPV6_DADDR: usize = 24;
// The pair is read as one 32-byte run from the source address on.
const _: () = assert!(IPV6_DADDR == IPV6_SADDR + 16);

/// IPv6 extension headers (next-header values) that a packet's transport
/// header may sit behind.
pub const IPV6_HOP_BY_HOP: u8 = 0;
pub const IPV6_ROUTING: u8 = 43;
pub const IPV6_FRAGMENT: u8 = 44;
pub const IPV6_AUTH: u8 = 51;
pub const IPV6_DEST_OPTS: u8 = 60;
/// Every extension header starts with the next header and, but for the
/// fragment header, its length: in 8-byte units past the first 8 (the
/// authentication header's in 4-byte units past the first 8).
pub const IPV6_EXT_NEXT: usize = 0;
pub const IPV6_EXT_LEN: usize = 1;
pub const IPV6_FRAGMENT_HLEN: usize = 8;
/// Fragment offset (13 bits, in 8-byte units) above two reserved bits and
/// the more-fragments flag.
pub const IPV6_FRAG_OFF: usize = 2;
pub const IPV6_FRAG_MORE: u16 = 1;
pub const IPV6_FRAG_ID: usize = 4;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_IPIP: u8 = 4;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;

/// ICMP's type and code, as one big-endian word: destination unreachable,
/// fragmentation needed (the path MTU is too small for a DF packet).
pub const ICMP_FRAG_NEEDED: u16 = 0x0304;
/// Where an ICMP or ICMPv6 error quotes the offending packet's header.
pub const ICMP_QUOTE: usize = 8;

/// TCP and UDP both start with the source and destination ports.
pub const L4_SPORT: usize = 0;
pub const L4_DPORT: usize = 2;

pub const UDP_HLEN: usize = 8;
/// UDP's length field: its header and payload.
pub const UDP_LEN: usize = 4;

pub const TCP_HLEN: usize = 20;
/// TCP sequence number; ICMP echo id and sequence sit at the same offset.
pub const L4_SEQ: usize = 4;
/// Data offset in 32-bit words, in the high nibble.
pub const TCP_DOFF: usize = 12;
/// Data offset 5: a header without options.
pub const TCP_DOFF_PLAIN: u8 = ((TCP_HLEN / 4) as u8) << 4;

/// Well-known UDP ports of the overlays podtrace looks inside.
pub const VXLAN_PORT_FLANNEL: u16 = 8472;
pub const VXLAN_PORT_IANA: u16 = 4789;
pub const GENEVE_PORT: u16 = 6081;

pub const VXLAN_HLEN: usize = 8;
/// The VNI's 3 bytes, in both VXLAN and Geneve headers.
pub const TUNNEL_VNI: usize = 4;
pub const VXLAN_FLAGS: usize = 0;
/// The "VNI is valid" flag, set in every VXLAN header Linux sends.
pub const VXLAN_FLAG_VNI: u8 = 0x08;

/// Geneve's fixed header; its options follow it.
pub const GENEVE_HLEN: usize = 8;
/// Version (2 bits) and option length in 32-bit words (6 bits).
pub const GENEVE_VER_OPT_LEN: usize = 0;
pub const GENEVE_OPT_LEN_MASK: u8 = 0x3f;
pub const GENEVE_PROTOCOL: usize = 2;
