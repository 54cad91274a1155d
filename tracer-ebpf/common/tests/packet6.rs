//! The IPv6 walk against headers written out byte by byte: every
//! extension header kind, fragments, and the bounds a hostile packet may
//! push on.

use podtrace_common::headers::*;
use podtrace_common::packet6::{
    pair6_at, transport6, Fragment6, Transport6, MAX_EXTENSION_HEADERS,
};

const POD_A: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 5];
const POD_B: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 7];

/// A fixed IPv6 header naming `next`, then `rest`.
fn ipv6(next: u8, rest: &[u8]) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&(rest.len() as u16).to_be_bytes());
    h.extend_from_slice(&[next, 64]);
    h.extend_from_slice(&POD_A);
    h.extend_from_slice(&POD_B);
    h.extend_from_slice(rest);
    h
}

/// An options-style extension header (hop-by-hop, routing, destination
/// options) of `units` 8-byte units past its first 8.
fn options(next: u8, units: u8) -> Vec<u8> {
    let mut h = vec![next, units];
    h.resize(8 * (units as usize + 1), 0);
    h
}

fn fragment(next: u8, offset_units: u16, more: bool, id: u32) -> Vec<u8> {
    let mut h = vec![next, 0];
    h.extend_from_slice(&((offset_units << 3) | more as u16).to_be_bytes());
    h.extend_from_slice(&id.to_be_bytes());
    h
}

fn tcp() -> Vec<u8> {
    let mut h = vec![0x1f, 0x90, 0x00, 0x50];
    h.resize(TCP_HLEN, 0);
    h
}

#[test]
fn a_plain_tcp_packet_has_its_transport_right_after_the_header() {
    let p = ipv6(IPPROTO_TCP, &tcp());
    assert_eq!(
        transport6(p.as_slice(), 0),
        Some(Transport6 {
            protocol: IPPROTO_TCP,
            at: IPV6_HLEN,
            fragment: None
        })
    );
    let pair = pair6_at(p.as_slice(), 0).unwrap();
    assert_eq!((pair.src, pair.dst), (POD_A, POD_B));
}

#[test]
fn every_extension_header_kind_is_walked_by_its_own_length() {
    let mut rest = options(IPV6_DEST_OPTS, 0); // hop-by-hop, 8 bytes
    rest.extend(options(IPV6_ROUTING, 1)); // destination options, 16
    rest.extend(options(IPV6_AUTH, 2)); // routing, 24
    let mut auth = vec![IPPROTO_ICMPV6, 4]; // authentication: (4 + 2) * 4
    auth.resize(24, 0);
    rest.extend(auth);
    rest.extend([128, 0, 0, 0, 0, 1, 0, 1]); // an echo request
    let p = ipv6(IPV6_HOP_BY_HOP, &rest);
    let t = transport6(p.as_slice(), 0).unwrap();
    assert_eq!(t.protocol, IPPROTO_ICMPV6);
    assert_eq!(t.at, IPV6_HLEN + 8 + 16 + 24 + 24);
    assert_eq!(p[t.at], 128, "the echo request's type");
    assert!(t.is_present());
}

#[test]
fn behind_an_ethernet_header_offsets_start_at_its_end() {
    let mut frame = vec![0; ETH_HLEN];
    frame[ETH_TYPE..ETH_TYPE + 2].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
    frame.extend(ipv6(IPPROTO_UDP, &[0x00, 0x35, 0x30, 0x39, 0, 8, 0, 0]));
    let t = transport6(frame.as_slice(), ETH_HLEN).unwrap();
    assert_eq!((t.protocol, t.at), (IPPROTO_UDP, ETH_HLEN + IPV6_HLEN));
}

#[test]
fn a_first_fragment_carries_its_transport_and_its_identity() {
    let mut rest = fragment(IPPROTO_UDP, 0, true, 0xdead_beef);
    rest.extend([0x00, 0x35, 0x30, 0x39, 0x05, 0xdc, 0, 0]);
    let p = ipv6(IPV6_FRAGMENT, &rest);
    let t = transport6(p.as_slice(), 0).unwrap();
    assert_eq!(
        t,
        Transport6 {
            protocol: IPPROTO_UDP,
            at: IPV6_HLEN + IPV6_FRAGMENT_HLEN,
            fragment: Some(Fragment6 {
                id: 0xdead_beef,
                offset: 0,
                more: true
            }),
        }
    );
    assert!(t.is_present());
}

#[test]
fn a_later_fragment_is_not_read_as_headers_even_where_it_names_one() {
    // Its fragmentable part began with destination options: the bytes
    // after this fragment header are mid-payload, not that header.
    let mut rest = fragment(IPV6_DEST_OPTS, 185, false, 7);
    rest.extend([IPV6_ROUTING, 200, 0, 0, 0, 0, 0, 0]);
    let p = ipv6(IPV6_FRAGMENT, &rest);
    let t = transport6(p.as_slice(), 0).unwrap();
    assert_eq!(t.protocol, IPV6_DEST_OPTS);
    assert_eq!(t.at, IPV6_HLEN + IPV6_FRAGMENT_HLEN);
    assert_eq!(t.fragment.map(|f| (f.offset, f.more)), Some((185, false)));
    assert!(!t.is_present());
}

#[test]
fn more_extension_headers_than_the_bound_are_not_judged() {
    let chain = |count: usize| {
        let mut rest = Vec::new();
        for _ in 1..count {
            rest.extend(options(IPV6_DEST_OPTS, 0));
        }
        rest.extend(options(IPPROTO_TCP, 0));
        rest.extend(tcp());
        ipv6(IPV6_DEST_OPTS, &rest)
    };
    let at_bound = chain(MAX_EXTENSION_HEADERS);
    let t = transport6(at_bound.as_slice(), 0).unwrap();
    assert_eq!(t.protocol, IPPROTO_TCP);
    assert_eq!(t.at, IPV6_HLEN + 8 * MAX_EXTENSION_HEADERS);
    let past = chain(MAX_EXTENSION_HEADERS + 1);
    assert_eq!(transport6(past.as_slice(), 0), None);
}

#[test]
fn a_header_cut_short_or_not_ipv6_is_not_read() {
    let p = ipv6(IPV6_HOP_BY_HOP, &options(IPPROTO_TCP, 3));
    assert!(transport6(p.as_slice(), 0).is_some(), "whole, it walks");
    let whole = p.len();
    for cut in [
        1,
        IPV6_NEXT_HEADER,
        IPV6_HLEN,
        IPV6_HLEN + 1,
        IPV6_HLEN + 8,
        whole - 1,
    ] {
        assert_eq!(transport6(&p[..cut], 0), None, "cut at {cut}");
    }
    assert_eq!(pair6_at(&p[..IPV6_DADDR + 15], 0), None);
    let mut v4 = p.clone();
    v4[0] = 0x45;
    assert_eq!(transport6(v4.as_slice(), 0), None);
}

#[test]
fn hop_by_hop_options_are_walked_only_first() {
    let mut rest = options(IPV6_HOP_BY_HOP, 0);
    rest.extend(options(IPPROTO_TCP, 0));
    rest.extend(tcp());
    let p = ipv6(IPV6_DEST_OPTS, &rest);
    let t = transport6(p.as_slice(), 0).unwrap();
    assert_eq!(
        (t.protocol, t.at),
        (IPV6_HOP_BY_HOP, IPV6_HLEN + 8),
        "a misplaced hop-by-hop header is where the walk stops"
    );
}

#[test]
fn an_ipv6_packets_identity_is_its_folded_pair_fragment_id_and_l4_word() {
    use podtrace_common::packet::packet_id;
    use podtrace_common::packet6::{fold6, FlowKey6};
    use podtrace_common::transport::l4_of;
    let mut rest = fragment(IPPROTO_TCP, 0, true, 0x0001_2345);
    rest.extend_from_slice(&tcp());
    let p = ipv6(IPV6_FRAGMENT, &rest);
    let l4 = l4_of::<_, true>(p.as_slice(), 0).unwrap();
    let id = packet_id(p.as_slice(), 0, &l4).unwrap();
    let pair = FlowKey6 {
        src: POD_A,
        dst: POD_B,
    };
    assert_eq!(id.pair, fold6(&pair), "folded word by word as fold6 does");
    assert_eq!(id.ip_id, 0x2345, "the fragment ID's low bits");
    assert_eq!(id.protocol, IPPROTO_TCP);
    assert_eq!(id.l4, 0, "the TCP sequence (zero in this header)");
}
