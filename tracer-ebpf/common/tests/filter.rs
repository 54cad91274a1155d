//! `--proto`/`--port` as the kernel judges a packet, on headers written
//! out byte by byte: the very code the eBPF programs run.

use podtrace_common::filter::{judge, protocol_bit, L4Filter, MAX_FILTER_PORTS};
use podtrace_common::headers::*;
use podtrace_common::transport::l4_of;

const POD_A: [u8; 4] = [10, 244, 1, 5];
const POD_B: [u8; 4] = [10, 244, 2, 7];

fn ipv4(protocol: u8, fragment_offset: u16, payload: &[u8]) -> Vec<u8> {
    let total = (20 + payload.len()) as u16;
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&[0x12, 0x34]);
    h.extend_from_slice(&fragment_offset.to_be_bytes());
    h.extend_from_slice(&[64, protocol, 0, 0]);
    h.extend_from_slice(&POD_A);
    h.extend_from_slice(&POD_B);
    h.extend_from_slice(payload);
    h
}

fn ports(sport: u16, dport: u16) -> Vec<u8> {
    let mut l4 = sport.to_be_bytes().to_vec();
    l4.extend_from_slice(&dport.to_be_bytes());
    l4.extend_from_slice(&[0; 16]);
    l4
}

fn tcp(sport: u16, dport: u16) -> Vec<u8> {
    ipv4(IPPROTO_TCP, 0, &ports(sport, dport))
}

fn udp(sport: u16, dport: u16) -> Vec<u8> {
    ipv4(IPPROTO_UDP, 0, &ports(sport, dport))
}

fn ping() -> Vec<u8> {
    ipv4(IPPROTO_ICMP, 0, &[8, 0, 0, 0, 0, 1, 0, 1])
}

/// An ICMP error (`icmp_type`) quoting `quoted`'s header and 8 bytes.
fn icmp_error(icmp_type: u8, quoted: &[u8]) -> Vec<u8> {
    let mut l4 = vec![icmp_type, 3, 0, 0, 0, 0, 0, 0];
    l4.extend_from_slice(&quoted[..28]);
    ipv4(IPPROTO_ICMP, 0, &l4)
}

fn filter(protocols: u32, ports: &[u16]) -> L4Filter {
    let mut f = L4Filter {
        protocols,
        ports_len: ports.len() as u32,
        ports: [0; MAX_FILTER_PORTS],
    };
    f.ports[..ports.len()].copy_from_slice(ports);
    f
}

/// The filter's answer as the kernel reads it: the transport header
/// first, then the judge.
fn judged(packet: &[u8], f: &L4Filter) -> Option<bool> {
    judge::<_, true>(packet, &l4_of::<_, true>(packet, 0)?, f)
}

fn keeps(f: &L4Filter, packet: &[u8]) -> bool {
    judged(packet, f).expect("readable")
}

#[test]
fn a_port_matches_either_side() {
    let f = filter(0, &[8080]);
    assert!(keeps(&f, &tcp(41000, 8080)));
    assert!(keeps(&f, &tcp(8080, 41000)), "the reply");
    assert!(keeps(&f, &udp(41000, 8080)));
    assert!(!keeps(&f, &tcp(41000, 8081)));
}

#[test]
fn a_port_filter_leaves_out_pings_unless_icmp_is_named() {
    assert!(!keeps(&filter(0, &[8080]), &ping()));
    let f = filter(protocol_bit::ICMP | protocol_bit::TCP, &[8080]);
    assert!(keeps(&f, &ping()));
    assert!(keeps(&f, &tcp(41000, 8080)));
    assert!(!keeps(&f, &tcp(41000, 22)));
    assert!(!keeps(&f, &udp(41000, 8080)), "UDP was not named");
}

#[test]
fn a_protocol_filter_keeps_only_its_protocols() {
    let f = filter(protocol_bit::UDP, &[]);
    assert!(keeps(&f, &udp(1, 53)));
    assert!(!keeps(&f, &tcp(1, 53)));
    assert!(!keeps(&f, &ping()));
    assert!(!keeps(&f, &ipv4(47, 0, &[0; 8])), "GRE");
}

#[test]
fn an_icmp_error_is_judged_by_the_packet_it_quotes() {
    let unreachable = icmp_error(3, &udp(41000, 5354));
    assert!(keeps(&filter(protocol_bit::UDP, &[]), &unreachable));
    assert!(keeps(&filter(0, &[5354]), &unreachable));
    assert!(!keeps(&filter(0, &[53]), &unreachable));
    assert!(!keeps(&filter(protocol_bit::ICMP, &[]), &unreachable));
    // Time exceeded and an echo reply are not mixed up: a reply quotes
    // nothing.
    assert!(keeps(&filter(0, &[8080]), &icmp_error(11, &tcp(1, 8080))));
    let reply = ipv4(IPPROTO_ICMP, 0, &[0, 0, 0, 0, 0, 1, 0, 1]);
    assert!(keeps(&filter(protocol_bit::ICMP, &[]), &reply));
}

#[test]
fn a_later_fragment_has_no_ports_to_match() {
    let later = ipv4(IPPROTO_UDP, 185, &ports(41000, 8080));
    assert!(!keeps(&filter(0, &[8080]), &later), "its bytes are payload");
    assert!(keeps(&filter(protocol_bit::UDP, &[8080]), &later));
}

#[test]
fn only_the_ports_set_count() {
    // ports_len 1: the zeros after it are not port 0.
    let f = filter(0, &[8080]);
    assert!(!keeps(&f, &tcp(0, 1)));
}

#[test]
fn a_header_cut_short_is_unreadable_not_left_out() {
    let f = filter(0, &[8080]);
    let packet = tcp(41000, 8080);
    assert_eq!(judged(&packet[..21], &f), None);
}
