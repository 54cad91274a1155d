//! The one ICMP error traced for its quote: a "fragmentation needed"
//! about a traced IPv4 packet, which a PMTU black hole loses. (ICMPv6's
//! "packet too big" is not: the IPv6 programs are at 5.10's verifier's
//! bound, and one more branch there had one of them refused.)

use crate::headers::{ICMP_FRAG_NEEDED, ICMP_QUOTE, IPPROTO_ICMP, IPV4_PROTOCOL};
use crate::packet::{ipv4_header_len, Bytes, Flows};
use crate::sighting::match_kind;

/// [`match_kind::ABOUT`] for an ICMP "fragmentation needed" at `l3` whose
/// quoted IPv4 header is a traced pair's (the kernel believes such an
/// error from anyone, as the story then does: it says who sent it).
#[inline(always)]
pub fn too_big_about4<B: Bytes + ?Sized, F: Flows>(b: &B, l3: usize, flows: &F) -> Option<u8> {
    if b.u8_at(l3 + IPV4_PROTOCOL)? != IPPROTO_ICMP {
        return None;
    }
    let l4 = l3 + ipv4_header_len(b, l3)?;
    if b.u16_at(l4)? != ICMP_FRAG_NEEDED {
        return None;
    }
    let quoted = l4 + ICMP_QUOTE;
    ipv4_header_len(b, quoted)?;
    flows
        .traced(&b.pair_at(quoted)?)
        .then_some(match_kind::ABOUT)
}
