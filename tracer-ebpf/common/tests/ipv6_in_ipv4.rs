//! An IPv6 pod packet inside a VXLAN tunnel over an IPv4 underlay (one
//! tunnel device for both families, as Antrea, OVN-Kubernetes and Cilium
//! have): the IPv4 programs hand it on unread, the IPv6 programs match it
//! by its inner pair, through a tunnel the node would decapsulate only,
//! and the drop program (which reads both families) matches it alone.

use podtrace_common::headers::*;
use podtrace_common::packet::{classify4, classify6_in4, classify_ip, Flows};
use podtrace_common::packet6::FlowKey6;
use podtrace_common::sighting::match_kind;
use podtrace_common::transport::traced_l4;
use podtrace_common::{FlowKey, TunnelKey, TunnelPorts};

const PORTS: TunnelPorts = TunnelPorts::WELL_KNOWN;

const POD_A6: [u8; 16] = [0xfd, 0, 0, 0x10, 2, 0x44, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2];
const POD_B6: [u8; 16] = [0xfd, 0, 0, 0x10, 2, 0x44, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3];
const POD_A: [u8; 4] = [10, 244, 1, 2];
const POD_B: [u8; 4] = [10, 244, 2, 3];
const NODE_1: [u8; 4] = [192, 0, 2, 11];
const NODE_2: [u8; 4] = [192, 0, 2, 12];

/// The node's maps as a test sets them: which pairs are traced, whether
/// the tunnel is one the node decapsulates. `ELSEWHERE`: the IPv4 tc
/// programs' view (IPv6 read by their twins), else the IPv6 programs' and
/// the drop program's (both families read).
struct Node<const ELSEWHERE: bool> {
    traced4: Vec<FlowKey>,
    traced6: Vec<FlowKey6>,
    trusted: bool,
}

impl<const ELSEWHERE: bool> Flows for Node<ELSEWHERE> {
    const IPV6_ELSEWHERE: bool = ELSEWHERE;
    fn traced(&self, key: &FlowKey) -> bool {
        self.traced4.contains(key)
    }
    fn traced6(&self, key: &FlowKey6) -> bool {
        !ELSEWHERE && self.traced6.contains(key)
    }
    fn trusted(&self, outer: &FlowKey, _: &TunnelKey) -> bool {
        self.trusted && (outer.src, outer.dst) == (NODE_1, NODE_2)
    }
    fn trusted6(&self, _: &FlowKey6, _: &TunnelKey) -> bool {
        false
    }
}

/// The pod pair traced over both families, the tunnel trusted or not.
fn node<const ELSEWHERE: bool>(trusted: bool) -> Node<ELSEWHERE> {
    Node {
        traced4: vec![FlowKey {
            src: POD_A,
            dst: POD_B,
        }],
        traced6: vec![FlowKey6 {
            src: POD_A6,
            dst: POD_B6,
        }],
        trusted,
    }
}

fn ethernet(ethertype: u16) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

fn ipv4(protocol: u8, src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let total = (20 + payload.len()) as u16;
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0x12, 0x34, 0x40, 0x00, 64, protocol, 0, 0]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    [h, payload.to_vec()].concat()
}

/// An ICMPv6 echo request from `src` to `dst`.
fn ipv6_echo(src: [u8; 16], dst: [u8; 16]) -> Vec<u8> {
    let echo = [128, 0, 0, 0, 0x12, 0x34, 0, 7];
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&(echo.len() as u16).to_be_bytes());
    h.extend_from_slice(&[IPPROTO_ICMPV6, 63]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    [h, echo.to_vec()].concat()
}

/// `inner` (an IP packet) in VXLAN VNI 1 to UDP `port`, from `src` to
/// `dst`, on Ethernet.
fn vxlan(src: [u8; 4], dst: [u8; 4], port: u16, inner: &[u8]) -> Vec<u8> {
    let ethertype = if inner[0] >> 4 == 6 {
        ETH_P_IPV6
    } else {
        ETH_P_IP
    };
    let payload = [
        vec![0x08, 0, 0, 0, 0, 0, 1, 0],
        ethernet(ethertype),
        inner.to_vec(),
    ]
    .concat();
    let mut udp = 41000u16.to_be_bytes().to_vec();
    udp.extend_from_slice(&port.to_be_bytes());
    udp.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    let outer = ipv4(IPPROTO_UDP, src, dst, &[udp, payload].concat());
    [ethernet(ETH_P_IP), outer].concat()
}

fn pods_ipv6_in_the_tunnel() -> Vec<u8> {
    vxlan(NODE_1, NODE_2, 8472, &ipv6_echo(POD_A6, POD_B6))
}

const L3: usize = ETH_HLEN;

#[test]
fn the_ipv4_programs_hand_an_ipv6_packet_in_an_ipv4_tunnel_on_unread() {
    let frame = pods_ipv6_in_the_tunnel();
    // Whatever its inner pair and trust: the IPv6 program judges both.
    for trusted in [true, false] {
        assert_eq!(
            classify4(frame.as_slice(), L3, &PORTS, &node::<true>(trusted)),
            Some(match_kind::HAND_TO_IPV6)
        );
    }
    let other = vxlan(NODE_1, NODE_2, 8472, &ipv6_echo(POD_B6, [0xfd; 16]));
    assert_eq!(
        classify4(other.as_slice(), L3, &PORTS, &node::<true>(true)),
        Some(match_kind::HAND_TO_IPV6)
    );
}

#[test]
fn the_ipv4_programs_still_read_ipv4_inside_and_plain_ipv4_themselves() {
    let flows = node::<true>(true);
    let inner4 = ipv4(IPPROTO_ICMP, POD_A, POD_B, &[8, 0, 0, 0, 0, 1, 0, 1]);
    let tunnelled = vxlan(NODE_1, NODE_2, 8472, &inner4);
    assert_eq!(
        classify4(tunnelled.as_slice(), L3, &PORTS, &flows),
        Some(match_kind::INNER)
    );
    let plain = [ethernet(ETH_P_IP), inner4].concat();
    assert_eq!(
        classify4(plain.as_slice(), L3, &PORTS, &flows),
        Some(match_kind::PLAIN)
    );
    let untraced = ipv4(IPPROTO_ICMP, POD_B, NODE_1, &[8, 0, 0, 0, 0, 1, 0, 1]);
    let untraced = [ethernet(ETH_P_IP), untraced].concat();
    assert_eq!(classify4(untraced.as_slice(), L3, &PORTS, &flows), None);
}

#[test]
fn the_ipv6_programs_match_it_by_its_inner_pair_through_a_trusted_tunnel() {
    let frame = pods_ipv6_in_the_tunnel();
    assert_eq!(
        classify6_in4(frame.as_slice(), L3, &PORTS, &node::<false>(true)),
        Some(match_kind::INNER)
    );
    // Where the filter and the identity read it: the inner ICMPv6 echo.
    let t = traced_l4::<_, true>(frame.as_slice(), L3, match_kind::INNER, &PORTS).unwrap();
    let inner = L3 + 20 + UDP_HLEN + VXLAN_HLEN + ETH_HLEN;
    assert_eq!(t.ip, inner);
    assert!(t.l4.ipv6 && t.l4.present);
    assert_eq!(
        (t.l4.protocol, t.l4.at),
        (IPPROTO_ICMPV6, inner + IPV6_HLEN)
    );
    // Another pair inside: nothing of the trace's.
    let other = vxlan(NODE_1, NODE_2, 8472, &ipv6_echo(POD_B6, [0xfd; 16]));
    assert_eq!(
        classify6_in4(other.as_slice(), L3, &PORTS, &node::<false>(true)),
        None
    );
}

#[test]
fn a_pods_payload_that_looks_like_such_a_tunnel_forges_no_story() {
    // The traced pair's IPv6 inside VXLAN-looking bytes, where the node
    // decapsulates nothing (a pod's UDP/8472 payload, or not between
    // nodes on the underlay): not the inner pair's packet.
    let forged = pods_ipv6_in_the_tunnel();
    assert_eq!(
        classify6_in4(forged.as_slice(), L3, &PORTS, &node::<false>(false)),
        None
    );
    assert_eq!(
        classify_ip(forged.as_slice(), L3, &PORTS, &node::<false>(false)),
        None
    );
    // Sent by a traced pod, such a packet is its own: PLAIN in the IPv4
    // program, never handed on.
    let sent = vxlan(POD_A, POD_B, 8472, &ipv6_echo(POD_A6, POD_B6));
    assert_eq!(
        classify4(sent.as_slice(), L3, &PORTS, &node::<true>(false)),
        Some(match_kind::PLAIN)
    );
}

#[test]
fn a_trusted_tunnel_between_traced_addresses_carrying_another_pair_is_a_carrier() {
    let mut flows = node::<false>(true);
    flows.traced4.push(FlowKey {
        src: NODE_1,
        dst: NODE_2,
    });
    let other = vxlan(NODE_1, NODE_2, 8472, &ipv6_echo(POD_B6, [0xfd; 16]));
    assert_eq!(
        classify6_in4(other.as_slice(), L3, &PORTS, &flows),
        Some(match_kind::CARRIER)
    );
    let ours = pods_ipv6_in_the_tunnel();
    assert_eq!(
        classify6_in4(ours.as_slice(), L3, &PORTS, &flows),
        Some(match_kind::INNER)
    );
    // The IPv4 program hands both on once it trusts the tunnel.
    let mut flows4 = node::<true>(true);
    flows4.traced4 = flows.traced4.clone();
    assert_eq!(
        classify4(other.as_slice(), L3, &PORTS, &flows4),
        Some(match_kind::HAND_TO_IPV6)
    );
}

#[test]
fn ipv4_inside_or_no_tunnel_is_not_the_ipv6_programs() {
    let flows = node::<false>(true);
    let inner4 = ipv4(IPPROTO_ICMP, POD_A, POD_B, &[8, 0, 0, 0, 0, 1, 0, 1]);
    let tunnelled = vxlan(NODE_1, NODE_2, 8472, &inner4);
    assert_eq!(
        classify6_in4(tunnelled.as_slice(), L3, &PORTS, &flows),
        None
    );
    let plain = [ethernet(ETH_P_IP), inner4].concat();
    assert_eq!(classify6_in4(plain.as_slice(), L3, &PORTS, &flows), None);
    let not_a_vxlan_port = vxlan(NODE_1, NODE_2, 9999, &ipv6_echo(POD_A6, POD_B6));
    assert_eq!(
        classify6_in4(not_a_vxlan_port.as_slice(), L3, &PORTS, &flows),
        None
    );
}

#[test]
fn the_drop_program_reads_both_families_and_matches_it_alone() {
    let frame = pods_ipv6_in_the_tunnel();
    assert_eq!(
        classify_ip(frame.as_slice(), L3, &PORTS, &node::<false>(true)),
        Some(match_kind::INNER)
    );
    let other = vxlan(NODE_1, NODE_2, 8472, &ipv6_echo(POD_B6, [0xfd; 16]));
    assert_eq!(
        classify_ip(other.as_slice(), L3, &PORTS, &node::<false>(true)),
        None
    );
}
