//! IPv6 headers: the address pair, and where the transport header is past
//! the extension headers (hop-by-hop, routing, fragment, destination
//! options, authentication).
//!
//! The walk the tc programs, the drop program and the host tests all run,
//! written over [`Bytes`] like the IPv4 parser. The walk is bounded ([`MAX_EXTENSION_HEADERS`]) so
//! that the verifier sees a loop with a known end, and a packet with more
//! headers than that is not judged rather than misread.

use crate::headers::*;
use crate::packet::Bytes;
use crate::FlowKey;

/// Extension headers walked at most before the transport header.
pub const MAX_EXTENSION_HEADERS: usize = 8;

/// An IPv6 source and destination, as they sit in the header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey6 {
    pub src: [u8; 16],
    pub dst: [u8; 16],
}

impl FlowKey6 {
    /// Word `i` of the 32 bytes, read in place (no copy on the eBPF stack).
    #[inline(always)]
    fn word(&self, i: usize) -> u64 {
        let p = (self as *const Self).cast::<u64>();
        // SAFETY: i < 4 words of a 32-byte plain struct; unaligned read.
        unsafe { core::ptr::read_unaligned(p.add(i)) }
    }

    /// Equality four words at a time (no byte-wise compare loop).
    #[inline(always)]
    pub fn same(&self, other: &Self) -> bool {
        self.word(0) == other.word(0)
            && self.word(1) == other.word(1)
            && self.word(2) == other.word(2)
            && self.word(3) == other.word(3)
    }
}

/// An IPv6 address folded to 32 bits (xor of its words): a hash input,
/// never an address to show.
#[inline(always)]
pub fn fold_addr(a: &[u8; 16]) -> [u8; 4] {
    let mut out = [0u8; 4];
    let mut i = 0;
    while i < 16 {
        out[i % 4] ^= a[i];
        i += 1;
    }
    out
}

/// An IPv6 pair folded to an IPv4 key's width, for hashes of a packet's
/// identity (profile mode, `--sample`).
#[inline(always)]
pub fn fold6(key: &FlowKey6) -> FlowKey {
    FlowKey {
        src: fold_addr(&key.src),
        dst: fold_addr(&key.dst),
    }
}

/// Where an IPv6 packet's transport header is, and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transport6 {
    /// The next-header value of the last header walked (6 TCP, 17 UDP, 58
    /// ICMPv6, 59 no next header, 50 ESP...).
    pub protocol: u8,
    /// Offset of that header.
    pub at: usize,
    /// The fragment header, if the packet is a fragment.
    pub fragment: Option<Fragment6>,
}

impl Transport6 {
    /// Whether the transport header is in this packet: not a later
    /// fragment, whose bytes past the fragment header are mid-payload.
    pub fn is_present(&self) -> bool {
        self.fragment.is_none_or(|f| f.offset == 0)
    }
}

/// An IPv6 fragment header's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment6 {
    pub id: u32,
    /// In 8-byte units, as in the header.
    pub offset: u16,
    pub more: bool,
}

/// Whether the header at `l3` is an IPv6 header.
#[inline(always)]
pub fn is_ipv6<B: Bytes + ?Sized>(b: &B, l3: usize) -> bool {
    b.u8_at(l3).is_some_and(|v| v >> 4 == IPV6_VERSION)
}

/// The (source, destination) pair of the IPv6 header at `l3`.
#[inline(always)]
pub fn pair6_at<B: Bytes + ?Sized>(b: &B, l3: usize) -> Option<FlowKey6> {
    let both = b.bytes_at::<32>(l3 + IPV6_SADDR)?;
    // SAFETY: FlowKey6 is two 16-byte arrays, 32 plain bytes in order.
    Some(unsafe { core::mem::transmute::<[u8; 32], FlowKey6>(both) })
}

/// The transport header of the IPv6 packet at `l3`, past at most
/// [`MAX_EXTENSION_HEADERS`] extension headers; `None` if it is not IPv6,
/// a header cannot be read, or there are more.
#[inline(always)]
pub fn transport6<B: Bytes + ?Sized>(b: &B, l3: usize) -> Option<Transport6> {
    if !is_ipv6(b, l3) {
        return None;
    }
    let mut next = b.u8_at(l3 + IPV6_NEXT_HEADER)?;
    let mut at = l3 + IPV6_HLEN;
    // Written whole before the walk, not an Option filled on the way:
    // LLVM copied the empty Option's unwritten payload, and verifiers
    // before 6.x's newest (5.10's, 6.1's) refuse a read of stack never
    // written.
    let mut this_fragment = Fragment6 {
        id: 0,
        offset: 0,
        more: false,
    };
    let mut fragmented = false;
    let mut walked = 0;
    // One more turn than headers: the last finds the transport header.
    while walked <= MAX_EXTENSION_HEADERS {
        let len = match next {
            // Hop-by-hop options come first or not at all (RFC 8200).
            IPV6_HOP_BY_HOP if walked == 0 => (b.u8_at(at + IPV6_EXT_LEN)? as usize + 1) * 8,
            IPV6_ROUTING | IPV6_DEST_OPTS => (b.u8_at(at + IPV6_EXT_LEN)? as usize + 1) * 8,
            IPV6_AUTH => (b.u8_at(at + IPV6_EXT_LEN)? as usize + 2) * 4,
            IPV6_FRAGMENT => {
                let h = b.bytes_at::<IPV6_FRAGMENT_HLEN>(at)?;
                let off = u16::from_be_bytes([h[IPV6_FRAG_OFF], h[IPV6_FRAG_OFF + 1]]);
                let this = Fragment6 {
                    id: u32::from_be_bytes([
                        h[IPV6_FRAG_ID],
                        h[IPV6_FRAG_ID + 1],
                        h[IPV6_FRAG_ID + 2],
                        h[IPV6_FRAG_ID + 3],
                    ]),
                    offset: off >> 3,
                    more: off & IPV6_FRAG_MORE != 0,
                };
                this_fragment = this;
                fragmented = true;
                if this.offset != 0 {
                    // A later fragment: what follows is mid-payload, even
                    // where the next header names another extension.
                    return Some(Transport6 {
                        protocol: h[IPV6_EXT_NEXT],
                        at: at + IPV6_FRAGMENT_HLEN,
                        fragment: Some(this),
                    });
                }
                IPV6_FRAGMENT_HLEN
            }
            // The transport header, or a misplaced hop-by-hop header
            // (told as what it is: not walked).
            protocol => {
                return Some(Transport6 {
                    protocol,
                    at,
                    fragment: fragmented.then_some(this_fragment),
                })
            }
        };
        // The whole header is in the packet, not only its first bytes.
        b.u8_at(at + len - 1)?;
        next = b.u8_at(at + IPV6_EXT_NEXT)?;
        at += len;
        walked += 1;
    }
    None
}
