//! The shared parser and header numbers against frames written out byte by
//! byte: the same code the eBPF programs run, checked on the host where a
//! wrong offset shows up as a failed assertion instead of a silent miss.

use podtrace_common::headers::*;
use podtrace_common::packet::{
    classify, ethernet_payload, ipv4_header_len, socket_header, tunnel_inner_ip, SOCKET_HEADER_LEN,
};
use podtrace_common::sighting::match_kind;
use podtrace_common::{FlowKey, TunnelKey, TunnelPorts, UdpTunnel};

const WELL_KNOWN: TunnelPorts = TunnelPorts::WELL_KNOWN;

const POD_A: [u8; 4] = [10, 244, 1, 5];
const POD_B: [u8; 4] = [10, 244, 2, 7];
const NODE_1: [u8; 4] = [192, 168, 56, 11];
const NODE_2: [u8; 4] = [192, 168, 56, 12];

fn traced(key: &FlowKey) -> bool {
    (key.src, key.dst) == (POD_A, POD_B) || (key.src, key.dst) == (POD_B, POD_A)
}

fn ethernet(ethertype: [u8; 2]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x01, 0x02, 0, 0, 0, 0, 0x02];
    f.extend_from_slice(&ethertype);
    f
}

/// An IPv4 header with `options` (a multiple of 4 bytes) and a zero
/// checksum, which the parser does not look at.
fn ipv4(protocol: u8, src: [u8; 4], dst: [u8; 4], options: &[u8], payload_len: usize) -> Vec<u8> {
    let ihl = (20 + options.len()) / 4;
    let total = (20 + options.len() + payload_len) as u16;
    let mut h = vec![0x40 | ihl as u8, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0x12, 0x34, 0x40, 0x00, 64, protocol, 0, 0]);
    h.extend_from_slice(&src);
    h.extend_from_slice(&dst);
    h.extend_from_slice(options);
    h
}

fn icmp_echo() -> Vec<u8> {
    vec![8, 0, 0, 0, 0, 1, 0, 1, b'p', b'i', b'n', b'g']
}

fn udp(dport: u16, payload_len: usize) -> Vec<u8> {
    let mut h = 41000u16.to_be_bytes().to_vec();
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&((8 + payload_len) as u16).to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h
}

/// The pod-to-pod ICMP packet every tunnel below carries.
fn inner_ip() -> Vec<u8> {
    let icmp = icmp_echo();
    [ipv4(1, POD_A, POD_B, &[], icmp.len()), icmp].concat()
}

fn inner_frame() -> Vec<u8> {
    [ethernet([0x08, 0x00]), inner_ip()].concat()
}

fn vxlan_frame(port: u16) -> Vec<u8> {
    let vxlan = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    let payload = [vxlan, inner_frame()].concat();
    let udp_h = udp(port, payload.len());
    let ip = ipv4(17, NODE_1, NODE_2, &[], udp_h.len() + payload.len());
    [ethernet([0x08, 0x00]), ip, udp_h, payload].concat()
}

#[test]
fn header_numbers_are_the_wire_format() {
    assert_eq!(ETH_HLEN, 14);
    assert_eq!(ETH_TYPE, 12);
    assert_eq!(VLAN_HLEN, 4);
    assert_eq!((ETH_P_IP, ETH_P_8021Q, ETH_P_TEB), (0x0800, 0x8100, 0x6558));
    assert_eq!(IPV4_HLEN, 20);
    assert_eq!(
        (IPV4_VER_IHL, IPV4_TOS, IPV4_TOT_LEN, IPV4_FRAG_OFF),
        (0, 1, 2, 6)
    );
    assert_eq!((IPV4_PROTOCOL, IPV4_SADDR, IPV4_DADDR), (9, 12, 16));
    assert_eq!(IPV4_VER_IHL_PLAIN, 0x45);
    assert_eq!(
        (IPPROTO_ICMP, IPPROTO_IPIP, IPPROTO_TCP, IPPROTO_UDP),
        (1, 4, 6, 17)
    );
    assert_eq!((L4_SPORT, L4_DPORT, UDP_HLEN), (0, 2, 8));
    assert_eq!((TCP_HLEN, TCP_DOFF, TCP_DOFF_PLAIN), (20, 12, 0x50));
    assert_eq!(
        (VXLAN_PORT_FLANNEL, VXLAN_PORT_IANA, GENEVE_PORT),
        (8472, 4789, 6081)
    );
    assert_eq!((VXLAN_HLEN, VXLAN_FLAGS, VXLAN_FLAG_VNI), (8, 0, 0x08));
    assert_eq!(
        (GENEVE_HLEN, GENEVE_PROTOCOL, GENEVE_OPT_LEN_MASK),
        (8, 2, 0x3f)
    );
    // The root re-exports are the same numbers userspace has always used.
    assert_eq!(podtrace_common::VXLAN_PORT_FLANNEL, 8472);
    assert_eq!(podtrace_common::GENEVE_PORT, 6081);
}

/// Where the inner IPv4 header is, whatever the tunnel.
fn inner_at(b: &[u8], l3: usize) -> Option<usize> {
    tunnel_inner_ip(b, l3, &WELL_KNOWN).map(|(at, _)| at)
}

/// A node that treats every tunnel packet as one.
fn trust_all(_: &FlowKey, _: &TunnelKey) -> bool {
    true
}

#[test]
fn a_vxlan_device_on_its_own_port_is_read_only_with_that_port_known() {
    // flannel's Backend.Port, Calico's vxlanPort: any port a device has.
    let f = vxlan_frame(8475);
    assert_eq!(
        classify(&f[..], ETH_HLEN, &WELL_KNOWN, traced, trust_all),
        None,
        "to the well-known ports alone, UDP to 8475 is a payload"
    );
    let node = TunnelPorts::with_vxlan([8475]);
    assert_eq!(
        classify(&f[..], ETH_HLEN, &node, traced, trust_all),
        Some(match_kind::INNER)
    );
    let (_, key) = tunnel_inner_ip(&f[..], ETH_HLEN, &node).unwrap();
    assert_eq!(key.port, 8475, "the trust checks see the real port");
    assert_eq!(
        classify(&f[..], ETH_HLEN, &node, traced, |_, _| false),
        None,
        "read, not trusted: still only a payload"
    );
}

#[test]
fn a_nodes_vxlan_ports_keep_the_well_known_ones_and_at_most_four_more() {
    let ports = TunnelPorts::with_vxlan([8472, 0, 9000, 9000, 9001, 9002, 9003, 9004]);
    assert_eq!(ports.vxlan, [9000, 9001, 9002, 9003]);
    for port in [VXLAN_PORT_FLANNEL, VXLAN_PORT_IANA, 9003] {
        assert_eq!(ports.udp_tunnel(port), Some(UdpTunnel::Vxlan), "{port}");
    }
    assert_eq!(ports.udp_tunnel(GENEVE_PORT), Some(UdpTunnel::Geneve));
    assert_eq!(ports.udp_tunnel(9004), None);
    assert_eq!(ports.udp_tunnel(0), None);
}

#[test]
fn a_tunnel_is_read_only_where_the_node_would_decapsulate_it() {
    let f = vxlan_frame(VXLAN_PORT_FLANNEL);
    let (_, key) = tunnel_inner_ip(&f[..], ETH_HLEN, &WELL_KNOWN).unwrap();
    assert_eq!((key.port, key.protocol), (VXLAN_PORT_FLANNEL, IPPROTO_UDP));
    // Not the node's tunnel, or not between its addresses: only a payload.
    let untrusted = classify(&f[..], ETH_HLEN, &WELL_KNOWN, traced, |_, _| false);
    assert_eq!(untrusted, None);
    let only_this_vni = |_: &FlowKey, k: &TunnelKey| k.vni == key.vni;
    assert_eq!(
        classify(&f[..], ETH_HLEN, &WELL_KNOWN, traced, only_this_vni),
        Some(match_kind::INNER)
    );
}

#[test]
fn offsets_read_the_fields_of_a_real_header() {
    let f = [ethernet([0x08, 0x00]), inner_ip()].concat();
    let ip = &f[ETH_HLEN..];
    assert_eq!(f[ETH_TYPE..ETH_TYPE + 2], [0x08, 0x00]);
    assert_eq!(ip[IPV4_VER_IHL], IPV4_VER_IHL_PLAIN);
    assert_eq!(ip[IPV4_PROTOCOL], IPPROTO_ICMP);
    assert_eq!(ip[IPV4_SADDR..IPV4_SADDR + 4], POD_A);
    assert_eq!(ip[IPV4_DADDR..IPV4_DADDR + 4], POD_B);
    assert_eq!(ip[IPV4_FRAG_OFF], 0x40, "don't fragment");
    assert_eq!(
        u16::from_be_bytes([ip[IPV4_TOT_LEN], ip[IPV4_TOT_LEN + 1]]) as usize,
        ip.len()
    );
    let v = vxlan_frame(VXLAN_PORT_IANA);
    let udp = &v[ETH_HLEN + IPV4_HLEN..];
    assert_eq!(
        u16::from_be_bytes([udp[L4_DPORT], udp[L4_DPORT + 1]]),
        VXLAN_PORT_IANA
    );
    assert_eq!(udp[UDP_HLEN + VXLAN_FLAGS], VXLAN_FLAG_VNI);
}

#[test]
fn plain_ethernet_ipv4_icmp() {
    let f = [ethernet([0x08, 0x00]), inner_ip()].concat();
    let l3 = ethernet_payload(&f[..], 0).unwrap();
    assert_eq!(l3, ETH_HLEN);
    assert_eq!(
        classify(&f[..], l3, &WELL_KNOWN, traced, trust_all),
        Some(match_kind::PLAIN)
    );
    assert_eq!(inner_at(&f[..], l3), None, "ICMP is no tunnel");
    assert_eq!(
        classify(&f[..], l3, &WELL_KNOWN, |_| false, trust_all),
        None
    );
}

/// An ICMP error of `icmp_type`/`code` from `from` to `to`, quoting
/// `quoted` (an IP header and 8 bytes after it), with next-hop MTU 1450.
fn icmp_error(from: [u8; 4], to: [u8; 4], icmp_type: u8, code: u8, quoted: &[u8]) -> Vec<u8> {
    let icmp = [&[icmp_type, code, 0, 0, 0, 0, 0x05, 0xaa][..], quoted].concat();
    let ip = ipv4(IPPROTO_ICMP, from, to, &[], icmp.len());
    [ethernet([0x08, 0x00]), ip, icmp].concat()
}

/// The node's "fragmentation needed" to a traced pod about its packet is
/// matched by the header it quotes; the other ICMP errors, and a frag
/// needed about another pair, are not.
#[test]
fn a_fragmentation_needed_about_a_traced_packet_is_matched_by_its_quote() {
    let gateway = [10, 244, 1, 1];
    let too_big = &inner_ip()[..28];
    let about = |f: &[u8]| classify(f, ETH_HLEN, &WELL_KNOWN, traced, trust_all);
    let frag_needed = icmp_error(gateway, POD_A, 3, 4, too_big);
    assert_eq!(about(&frag_needed), Some(match_kind::ABOUT));
    assert_eq!(about(&icmp_error(gateway, POD_A, 3, 1, too_big)), None);
    assert_eq!(about(&icmp_error(gateway, POD_A, 11, 0, too_big)), None);
    let other = [ipv4(1, POD_A, NODE_2, &[], 8), icmp_echo()[..8].to_vec()].concat();
    assert_eq!(about(&icmp_error(gateway, POD_A, 3, 4, &other)), None);
    // Cut inside the quoted header: nothing to match.
    assert_eq!(about(&frag_needed[..frag_needed.len() - 14]), None);
}

#[test]
fn vlan_tag_is_skipped() {
    let f = [ethernet([0x81, 0x00]), vec![0, 42, 0x08, 0x00], inner_ip()].concat();
    assert_eq!(ethernet_payload(&f[..], 0), Some(ETH_HLEN + VLAN_HLEN));
    let arp = ethernet([0x08, 0x06]);
    assert_eq!(ethernet_payload(&arp[..], 0), None);
}

/// Traced between the two nodes' own addresses, a VXLAN packet of theirs
/// is the carrier of the pod pair inside, not a packet of the node pair;
/// one the node would not decapsulate is the node pair's own UDP.
#[test]
fn a_tunnel_packet_between_traced_node_addresses_is_a_carrier() {
    let nodes = |key: &FlowKey| [key.src, key.dst] == [NODE_1, NODE_2];
    let f = vxlan_frame(VXLAN_PORT_FLANNEL);
    assert_eq!(
        classify(&f[..], ETH_HLEN, &WELL_KNOWN, nodes, trust_all),
        Some(match_kind::CARRIER)
    );
    assert_eq!(
        classify(
            &f[..],
            ETH_HLEN,
            &WELL_KNOWN,
            |k| nodes(k) || traced(k),
            trust_all
        ),
        Some(match_kind::INNER),
        "both pairs traced: the inner one's story"
    );
    assert_eq!(
        classify(&f[..], ETH_HLEN, &WELL_KNOWN, nodes, |_, _| false),
        Some(match_kind::PLAIN)
    );
}

#[test]
fn vxlan_on_both_ports() {
    for port in [VXLAN_PORT_FLANNEL, VXLAN_PORT_IANA] {
        let f = vxlan_frame(port);
        let l3 = ethernet_payload(&f[..], 0).unwrap();
        let inner = ETH_HLEN + IPV4_HLEN + UDP_HLEN + VXLAN_HLEN + ETH_HLEN;
        assert_eq!(inner_at(&f[..], l3), Some(inner));
        assert_eq!(f[inner + IPV4_SADDR..inner + IPV4_SADDR + 4], POD_A);
        assert_eq!(
            classify(&f[..], l3, &WELL_KNOWN, traced, trust_all),
            Some(match_kind::INNER)
        );
    }
    let other = vxlan_frame(4790);
    assert_eq!(inner_at(&other[..], ETH_HLEN), None);
}

#[test]
fn ipip() {
    let inner = inner_ip();
    let f = [ipv4(4, NODE_1, NODE_2, &[], inner.len()), inner].concat();
    assert_eq!(inner_at(&f[..], 0), Some(IPV4_HLEN));
    assert_eq!(
        classify(&f[..], 0, &WELL_KNOWN, traced, trust_all),
        Some(match_kind::INNER)
    );
}

#[test]
fn geneve_with_options() {
    // One 8-byte option (class, type, length 1 word, 4 bytes of data):
    // option length field = 2 words.
    let option = [0x01, 0x02, 0x80, 0x01, 0xde, 0xad, 0xbe, 0xef];
    let mut geneve = vec![0x02, 0x00, 0x65, 0x58, 0, 0, 9, 0];
    geneve.extend_from_slice(&option);
    let payload = [geneve, inner_frame()].concat();
    let udp_h = udp(GENEVE_PORT, payload.len());
    let ip = ipv4(17, NODE_1, NODE_2, &[], udp_h.len() + payload.len());
    let f = [ethernet([0x08, 0x00]), ip, udp_h, payload].concat();
    let inner = ETH_HLEN + IPV4_HLEN + UDP_HLEN + GENEVE_HLEN + option.len() + ETH_HLEN;
    assert_eq!(inner_at(&f[..], ETH_HLEN), Some(inner));
    assert_eq!(
        classify(&f[..], ETH_HLEN, &WELL_KNOWN, traced, trust_all),
        Some(match_kind::INNER)
    );

    // Geneve carrying IPv4 directly, without an inner Ethernet header.
    let geneve_ip = [vec![0, 0, 0x08, 0x00, 0, 0, 9, 0], inner_ip()].concat();
    let udp_ip = udp(GENEVE_PORT, geneve_ip.len());
    let ip = ipv4(17, NODE_1, NODE_2, &[], udp_ip.len() + geneve_ip.len());
    let f = [ip, udp_ip, geneve_ip].concat();
    assert_eq!(
        inner_at(&f[..], 0),
        Some(IPV4_HLEN + UDP_HLEN + GENEVE_HLEN)
    );
}

#[test]
fn ipv4_options_move_the_l4_header() {
    // Record-route option (7), 8 bytes long, padded to 12 with NOPs/EOL.
    let options = [7, 8, 4, 0, 0, 0, 0, 0, 1, 1, 1, 0];
    let vxlan = vxlan_frame(VXLAN_PORT_FLANNEL);
    let tunnel = &vxlan[ETH_HLEN + IPV4_HLEN..];
    let ip = ipv4(17, NODE_1, NODE_2, &options, tunnel.len());
    let f = [ip, tunnel.to_vec()].concat();
    assert_eq!(ipv4_header_len(&f[..], 0), Some(IPV4_HLEN + options.len()));
    assert_eq!(
        inner_at(&f[..], 0),
        Some(IPV4_HLEN + options.len() + UDP_HLEN + VXLAN_HLEN + ETH_HLEN)
    );
    assert_eq!(
        classify(&f[..], 0, &WELL_KNOWN, traced, trust_all),
        Some(match_kind::INNER)
    );
}

#[test]
fn not_ipv4_and_truncated() {
    let mut v6 = inner_ip();
    v6[0] = 0x60;
    assert_eq!(
        classify(&v6[..], 0, &WELL_KNOWN, |_| true, trust_all),
        None,
        "IPv6 is not parsed"
    );
    let mut short_ihl = inner_ip();
    short_ihl[0] = 0x44;
    assert_eq!(ipv4_header_len(&short_ihl[..], 0), None);
    // Cut before the end of the inner addresses: no match and no panic.
    let f = vxlan_frame(VXLAN_PORT_FLANNEL);
    let pair_end = ETH_HLEN + IPV4_HLEN + UDP_HLEN + VXLAN_HLEN + ETH_HLEN + IPV4_DADDR + 4;
    for len in 0..pair_end {
        assert_eq!(
            classify(&f[..len], ETH_HLEN, &WELL_KNOWN, traced, trust_all),
            None,
            "cut at {len}"
        );
    }
    assert_eq!(
        classify(&f[..pair_end], ETH_HLEN, &WELL_KNOWN, traced, trust_all),
        Some(match_kind::INNER)
    );
}

#[test]
fn socket_header_decodes_as_ipv4_and_tcp() {
    let mut b = [0xaa; 64];
    let pair = FlowKey {
        src: POD_A,
        dst: POD_B,
    };
    let len = socket_header(&mut b, IPPROTO_TCP, &pair, 43210, 80u16.to_be_bytes()).unwrap();
    assert_eq!(len, SOCKET_HEADER_LEN);
    assert_eq!(b[0], 0x45);
    assert_eq!(b[2..4], [0, 40]);
    assert_eq!(b[9], 6);
    assert_eq!(b[12..16], POD_A);
    assert_eq!(b[16..20], POD_B);
    assert_eq!(b[20..22], 43210u16.to_be_bytes());
    assert_eq!(b[22..24], [0, 80]);
    assert_eq!(b[32], 0x50);
    assert!(b[24..32].iter().all(|&x| x == 0));
    assert!(
        b[40..].iter().all(|&x| x == 0xaa),
        "nothing past the header"
    );
    assert_eq!(
        classify(&b[..len], 0, &WELL_KNOWN, traced, trust_all),
        Some(match_kind::PLAIN)
    );
    assert_eq!(socket_header(&mut [0; 39], 6, &pair, 1, [0, 2]), None);
}
