//! A first glance at a packet, before the classifier reads it: most
//! packets on a node are IPv4 with a plain 20-byte header, between
//! untraced addresses, in no tunnel or in a VXLAN one whose inner pair is
//! untraced too. Their headers sit at fixed offsets, so the glance reads
//! each header with one bounds check (`Fixed`) where the classifier,
//! which follows any layout (VLAN tags, IP options, Geneve options, IPv6),
//! checks every field it reads.
//!
//! The glance only ever turns a packet away that the classifier would
//! turn away too (`classify4` answers `None`): anything it cannot judge
//! from its fixed offsets it hands on whole. The pair test is the
//! pre-filter's address bits (`TracedPairs::maybe`), which the
//! classifier's own first test is.

use crate::{
    filter::L4Filter,
    headers::{
        ETH_HLEN, ETH_P_IP, ETH_P_IPV6, ETH_TYPE, ICMP_FRAG_NEEDED, IPPROTO_ICMP, IPPROTO_IPIP,
        IPPROTO_TCP, IPPROTO_UDP, IPV4_FRAG_OFF, IPV4_HLEN, IPV4_OFFSET_MASK, IPV4_PROTOCOL,
        IPV4_SADDR, IPV4_VERSION, IPV4_VER_IHL, IPV4_VER_IHL_PLAIN, IPV6_DADDR, IPV6_HLEN,
        IPV6_NEXT_HEADER, IPV6_SADDR, IPV6_VERSION, L4_DPORT, L4_SPORT, UDP_HLEN, VXLAN_HLEN,
    },
    packet6::FlowKey6,
    tunnel::{TunnelPorts, UdpTunnel},
    FlowKey,
};

/// Reads a fixed-size span of a packet with one bounds check.
pub trait Fixed {
    /// The `N` bytes at `at`, if the packet (its linear head, in the
    /// kernel) holds them.
    fn fixed<const N: usize>(&self, at: usize) -> Option<&[u8; N]>;
}

impl Fixed for [u8] {
    #[inline(always)]
    fn fixed<const N: usize>(&self, at: usize) -> Option<&[u8; N]> {
        self.get(at..at.checked_add(N)?)?.try_into().ok()
    }
}

/// The inner Ethernet and IPv4 headers of a VXLAN packet, read as one.
const INNER_SPAN: usize = ETH_HLEN + IPV4_HLEN;

/// Whether the packet whose IP header would be at `l3` (behind an
/// Ethernet header where `has_l2`) is certainly neither a traced pair's
/// nor carrying one: `maybe_traced` is false for its pair, and for the
/// inner pair of a VXLAN packet. `false` means only "look closer".
/// `ports` is asked only for a UDP packet's.
#[inline(always)]
pub fn untraced<B: Fixed + ?Sized>(
    b: &B,
    has_l2: bool,
    ports: impl FnOnce() -> TunnelPorts,
    maybe_traced: impl Fn(&FlowKey) -> bool,
) -> bool {
    let Some((ip, l3)) = ip_header::<IPV4_HLEN, _>(b, has_l2, ETH_P_IP) else {
        return false;
    };
    // Options move every later header: the classifier's to read.
    if ip[IPV4_VER_IHL] != IPV4_VER_IHL_PLAIN || maybe_traced(&pair(ip, 0)) {
        return false;
    }
    let l4 = l3 + IPV4_HLEN;
    match ip[IPV4_PROTOCOL] {
        IPPROTO_UDP => {}
        // IPIP carries a pair the glance does not read.
        IPPROTO_IPIP => return false,
        // A fragmentation needed quotes a pair the glance does not read.
        IPPROTO_ICMP => return b.fixed::<2>(l4) != Some(&ICMP_FRAG_NEEDED.to_be_bytes()),
        _ => return true,
    }
    let Some(udp) = b.fixed::<UDP_HLEN>(l4) else {
        return false;
    };
    match ports().udp_tunnel(dport(udp)) {
        None => true,
        // Geneve's options move its inner header: the classifier's.
        Some(UdpTunnel::Geneve) => false,
        Some(UdpTunnel::Vxlan) => {
            let inner = l4 + UDP_HLEN + VXLAN_HLEN;
            b.fixed::<INNER_SPAN>(inner)
                .is_some_and(|eth_ip| inner_untraced(eth_ip, &maybe_traced))
        }
    }
}

/// [`untraced`] of an IPv6 packet (`maybe_traced` of IPv6 pairs): its
/// pair not traced, and in no tunnel (a UDP tunnel's port, or IPIP). A
/// tunnel's inner header, and any extension header, is the classifier's
/// (which reads no tunnel past one: nothing to look closer at there).
#[inline(always)]
pub fn untraced6<B: Fixed + ?Sized>(
    b: &B,
    has_l2: bool,
    ports: impl FnOnce() -> TunnelPorts,
    maybe_traced: impl Fn(&FlowKey6) -> bool,
) -> bool {
    let Some((ip, l3)) = ip_header::<IPV6_HLEN, _>(b, has_l2, ETH_P_IPV6) else {
        return false;
    };
    if ip[0] >> 4 != IPV6_VERSION || maybe_traced(&pair6(ip)) {
        return false;
    }
    match ip[IPV6_NEXT_HEADER] {
        IPPROTO_UDP => b
            .fixed::<UDP_HLEN>(l3 + IPV6_HLEN)
            .is_some_and(|udp| ports().udp_tunnel(dport(udp)).is_none()),
        IPPROTO_IPIP => false,
        _ => true,
    }
}

/// `--proto`/`--port`'s verdict on a packet whose traced header's
/// transport the glance finds at a fixed offset: TCP or UDP right after a
/// 20-byte IPv4 header (not a later fragment) or a 40-byte IPv6 one, UDP
/// to no tunnel port; or inside VXLAN over IPv4, the same after a plain
/// inner Ethernet and IPv4 header, where the outer pair is not
/// `maybe_traced`. `Some(keep)`: where the packet is traced at all, the
/// classifier traces it by that very header (`match_kind::PLAIN`, or
/// `INNER` through VXLAN) and the filter judges those ports as here, so a
/// packet left out skips the classifier's lookups and trust checks and
/// costs about what an untraced one does. `None`: look closer.
#[inline(always)]
pub fn filter_verdict<B: Fixed + ?Sized>(
    b: &B,
    has_l2: bool,
    ports: impl FnOnce() -> TunnelPorts,
    maybe_traced: impl Fn(&FlowKey) -> bool,
    filter: &L4Filter,
) -> Option<bool> {
    let ipv4 = ip_header::<IPV4_HLEN, _>(b, has_l2, ETH_P_IP)
        .and_then(|(ip, l3)| Some((transport4(ip, l3)?, pair(ip, 0))));
    let ((protocol, l4), outer) = match ipv4 {
        Some((transport, outer)) => (transport, Some(outer)),
        None => {
            let (ip, l3) = ip_header::<IPV6_HLEN, _>(b, has_l2, ETH_P_IPV6)?;
            if ip[0] >> 4 != IPV6_VERSION {
                return None;
            }
            (transported(ip[IPV6_NEXT_HEADER], l3 + IPV6_HLEN)?, None)
        }
    };
    let header = b.fixed::<UDP_HLEN>(l4)?;
    if protocol == IPPROTO_UDP {
        match ports().udp_tunnel(dport(header)) {
            None => {}
            // A traced outer pair is traced by its outer header: the
            // classifier's to say.
            Some(UdpTunnel::Vxlan) if outer.is_some_and(|o| !maybe_traced(&o)) => {
                return inner_verdict(b, l4 + UDP_HLEN + VXLAN_HLEN, filter);
            }
            Some(_) => return None,
        }
    }
    Some(keeps(filter, protocol, header))
}

/// [`filter_verdict`] of the inner packet of a VXLAN one, at `inner`.
#[inline(always)]
fn inner_verdict<B: Fixed + ?Sized>(b: &B, inner: usize, filter: &L4Filter) -> Option<bool> {
    let eth_ip = b.fixed::<INNER_SPAN>(inner)?;
    if eth_ip[ETH_TYPE..ETH_TYPE + 2] != ETH_P_IP.to_be_bytes() {
        return None;
    }
    let ip: &[u8; IPV4_HLEN] = eth_ip[ETH_HLEN..].try_into().ok()?;
    let (protocol, l4) = transport4(ip, inner + ETH_HLEN)?;
    Some(keeps(filter, protocol, b.fixed::<UDP_HLEN>(l4)?))
}

/// The protocol and offset of the TCP or UDP header after the plain
/// IPv4 header `ip` at `l3`, unless the packet is a later fragment.
#[inline(always)]
fn transport4(ip: &[u8; IPV4_HLEN], l3: usize) -> Option<(u8, usize)> {
    let offset = u16::from_be_bytes([ip[IPV4_FRAG_OFF], ip[IPV4_FRAG_OFF + 1]]);
    if ip[IPV4_VER_IHL] != IPV4_VER_IHL_PLAIN || offset & IPV4_OFFSET_MASK != 0 {
        return None;
    }
    transported(ip[IPV4_PROTOCOL], l3 + IPV4_HLEN)
}

/// `(protocol, l4)` where the protocol is TCP or UDP.
#[inline(always)]
fn transported(protocol: u8, l4: usize) -> Option<(u8, usize)> {
    (protocol == IPPROTO_TCP || protocol == IPPROTO_UDP).then_some((protocol, l4))
}

/// Whether `filter` keeps a packet of `protocol` whose TCP or UDP header
/// starts with `header`.
#[inline(always)]
fn keeps(filter: &L4Filter, protocol: u8, header: &[u8; UDP_HLEN]) -> bool {
    let sport = u16::from_be_bytes([header[L4_SPORT], header[L4_SPORT + 1]]);
    filter.keeps(protocol, Some((sport, dport(header))))
}

/// The IP header (`N` bytes) of a packet whose Ethernet header, where it
/// has one, says `ethertype`; and its offset.
#[inline(always)]
fn ip_header<const N: usize, B: Fixed + ?Sized>(
    b: &B,
    has_l2: bool,
    ethertype: u16,
) -> Option<(&[u8; N], usize)> {
    let l3 = if has_l2 { ETH_HLEN } else { 0 };
    if has_l2 && b.fixed::<2>(ETH_TYPE) != Some(&ethertype.to_be_bytes()) {
        return None;
    }
    Some((b.fixed::<N>(l3)?, l3))
}

/// The destination port of a UDP header (or of the first eight bytes of
/// a TCP one).
#[inline(always)]
fn dport(udp: &[u8; UDP_HLEN]) -> u16 {
    u16::from_be_bytes([udp[L4_DPORT], udp[L4_DPORT + 1]])
}

/// The pair of an IPv6 header.
#[inline(always)]
fn pair6(ip: &[u8; IPV6_HLEN]) -> FlowKey6 {
    let mut key = FlowKey6 {
        src: [0; 16],
        dst: [0; 16],
    };
    key.src.copy_from_slice(&ip[IPV6_SADDR..IPV6_SADDR + 16]);
    key.dst.copy_from_slice(&ip[IPV6_DADDR..IPV6_DADDR + 16]);
    key
}

/// Whether a VXLAN packet's inner Ethernet and IP headers are an IPv4
/// pair's that is not traced (an IPv6 or tagged one: look closer).
#[inline(always)]
fn inner_untraced(eth_ip: &[u8; INNER_SPAN], maybe_traced: impl Fn(&FlowKey) -> bool) -> bool {
    let ethertype = u16::from_be_bytes([eth_ip[ETH_TYPE], eth_ip[ETH_TYPE + 1]]);
    ethertype == ETH_P_IP
        && eth_ip[ETH_HLEN + IPV4_VER_IHL] >> 4 == IPV4_VERSION
        && !maybe_traced(&pair(eth_ip, ETH_HLEN))
}

/// The (source, destination) pair of the IPv4 header at `l3` of `span`.
#[inline(always)]
fn pair<const N: usize>(span: &[u8; N], l3: usize) -> FlowKey {
    let at = l3 + IPV4_SADDR;
    FlowKey {
        src: [span[at], span[at + 1], span[at + 2], span[at + 3]],
        dst: [span[at + 4], span[at + 5], span[at + 6], span[at + 7]],
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::*;
    use crate::{
        packet::{classify4, classify6, Flows},
        packet6::FlowKey6,
        prefilter::TracedPairs,
        TunnelKey,
    };

    const WEB: [u8; 4] = [10, 244, 1, 2];
    const DB: [u8; 4] = [10, 244, 2, 2];
    const OTHER: [u8; 4] = [10, 244, 1, 9];
    const NODE1: [u8; 4] = [192, 0, 2, 11];
    const NODE2: [u8; 4] = [192, 0, 2, 12];

    /// The classifier at its most willing: the traced pairs, every tunnel
    /// trusted, every IPv6 pair traced unless they are listed, and IPv6
    /// handed on as the IPv4 programs do.
    struct Willing(Vec<FlowKey>, Option<Vec<FlowKey6>>);

    impl Flows for Willing {
        const IPV6_ELSEWHERE: bool = true;
        fn traced(&self, key: &FlowKey) -> bool {
            self.0.contains(key)
        }
        fn traced6(&self, key: &FlowKey6) -> bool {
            self.1.as_ref().is_none_or(|listed| listed.contains(key))
        }
        fn trusted(&self, _: &FlowKey, _: &TunnelKey) -> bool {
            true
        }
        fn trusted6(&self, _: &FlowKey6, _: &TunnelKey) -> bool {
            true
        }
    }

    fn ipv4(src: [u8; 4], dst: [u8; 4], protocol: u8, payload: &[u8]) -> Vec<u8> {
        let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, protocol, 0, 0];
        ip.extend(src);
        ip.extend(dst);
        ip.extend(payload);
        ip
    }

    fn ethernet(ethertype: u16, payload: Vec<u8>) -> Vec<u8> {
        let mut frame = vec![2; 12];
        frame.extend(ethertype.to_be_bytes());
        frame.extend(payload);
        frame
    }

    fn tcp(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        ethernet(
            ETH_P_IP,
            ipv4(src, dst, 6, &[0x9c, 0x40, 0x14, 0x51, 0, 0, 0, 1]),
        )
    }

    fn udp_to(port: u16, payload: Vec<u8>) -> Vec<u8> {
        let mut udp = vec![0xc3, 0x50];
        udp.extend(port.to_be_bytes());
        udp.extend([0, 0, 0, 0]);
        udp.extend(payload);
        ethernet(ETH_P_IP, ipv4(NODE1, NODE2, IPPROTO_UDP, &udp))
    }

    fn vxlan(inner: Vec<u8>) -> Vec<u8> {
        let mut payload = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
        payload.extend(inner);
        udp_to(8472, payload)
    }

    /// Every shape the glance meets, with traced and untraced pairs.
    fn shapes() -> Vec<Vec<u8>> {
        let mut shapes = Vec::new();
        for (src, dst) in [(WEB, DB), (DB, WEB), (WEB, OTHER), (OTHER, DB)] {
            shapes.push(tcp(src, dst));
            shapes.push(vxlan(tcp(src, dst)));
            shapes.push(udp_to(
                6081,
                [vec![0, 0, 0x65, 0x58, 0, 0, 1, 0], tcp(src, dst)].concat(),
            ));
            shapes.push(udp_to(4789, tcp(src, dst)));
            shapes.push(udp_to(53, tcp(src, dst)));
            shapes.push(ethernet(
                ETH_P_IP,
                ipv4(NODE1, NODE2, IPPROTO_IPIP, &tcp(src, dst)[14..]),
            ));
            let mut tagged = tcp(src, dst);
            tagged.splice(12..12, [0x81, 0, 0, 1]);
            shapes.push(tagged);
            // A node's ICMP errors to the sender, quoting its packet.
            for type_code in [[3, 4], [3, 1]] {
                let icmp = [&type_code[..], &[0, 0, 0, 0, 5, 0xaa], &tcp(src, dst)[14..]].concat();
                shapes.push(ethernet(ETH_P_IP, ipv4(NODE1, src, IPPROTO_ICMP, &icmp)));
            }
        }
        shapes.push(vxlan(ethernet(0x86dd, vec![0x60; 60])));
        shapes
    }

    /// A small deterministic generator (xorshift), for mutations.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// Runs `judge` on `per_shape` mutations of each shape (up to three
    /// bytes changed, then cut anywhere), with and without its Ethernet
    /// header (`has_l2`, the IP header at `l3`); counts the packets it
    /// judged (`Some`).
    fn mutated(
        shapes: Vec<Vec<u8>>,
        per_shape: usize,
        mut judge: impl FnMut(&[u8], bool, usize) -> Option<()>,
    ) -> usize {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut judged = 0;
        for shape in shapes {
            for _ in 0..per_shape {
                let mut packet = shape.clone();
                for _ in 0..next(&mut state) % 4 {
                    let at = (next(&mut state) % packet.len() as u64) as usize;
                    packet[at] = next(&mut state) as u8;
                }
                packet.truncate((next(&mut state) % (packet.len() as u64 + 8)) as usize);
                judged += usize::from(judge(&packet, true, ETH_HLEN).is_some());
                let bare = packet.get(ETH_HLEN..).unwrap_or(&[]);
                judged += usize::from(judge(bare, false, 0).is_some());
            }
        }
        judged
    }

    #[test]
    fn the_glance_turns_away_only_what_the_classifier_would() {
        let traced = vec![FlowKey { src: WEB, dst: DB }, FlowKey { src: DB, dst: WEB }];
        let bits = TracedPairs::of(&traced);
        let flows = Willing(traced, None);
        let ports = TunnelPorts::with_vxlan([8999]);
        let judged = mutated(shapes(), 20_000, |b, has_l2, l3| {
            untraced(b, has_l2, || ports, |k| bits.maybe(k)).then(|| {
                assert_eq!(classify4(b, l3, &ports, &flows), None, "{b:02x?}");
            })
        });
        assert!(judged > 100_000, "only {judged} packets judged at a glance");
    }

    const WEB6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2];
    const DB6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 2];
    const OTHER6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9];

    fn ipv6(src: [u8; 16], dst: [u8; 16], next: u8, payload: &[u8]) -> Vec<u8> {
        let mut ip = vec![0x60, 0, 0, 0, 0, payload.len() as u8, next, 64];
        ip.extend(src);
        ip.extend(dst);
        ip.extend(payload);
        ethernet(ETH_P_IPV6, ip)
    }

    /// IPv6 packets of every shape the IPv6 glance meets.
    fn shapes6() -> Vec<Vec<u8>> {
        let mut shapes = Vec::new();
        let ports = [0x9c, 0x40, 0x14, 0x51, 0, 0, 0, 1];
        for (src, dst) in [(WEB6, DB6), (DB6, WEB6), (WEB6, OTHER6), (OTHER6, DB6)] {
            shapes.push(ipv6(src, dst, 6, &ports));
            shapes.push(ipv6(src, dst, 0, &[6, 0, 0, 0, 0, 0, 0, 0, 0x9c, 0x40]));
            for port in [8472u16, 6081, 53] {
                let mut udp = vec![0xc3, 0x50];
                udp.extend(port.to_be_bytes());
                udp.extend([0, 0, 0, 0, 0x08, 0, 0, 0, 0, 0, 1, 0]);
                udp.extend(tcp(WEB, DB));
                shapes.push(ipv6(src, dst, IPPROTO_UDP, &udp));
            }
            shapes.push(ipv6(src, dst, IPPROTO_IPIP, &tcp(WEB, DB)[14..]));
            // Packet too big (2) and destination unreachable (1), quoting
            // the pair's packet, from a node's address to the sender.
            for icmp_type in [2, 1] {
                let quoted = &ipv6(src, dst, 6, &ports)[14..];
                let icmp = [&[icmp_type, 0, 0, 0, 0, 0, 5, 0xaa][..], quoted].concat();
                shapes.push(ipv6(OTHER6, src, crate::headers::IPPROTO_ICMPV6, &icmp));
            }
        }
        shapes
    }

    #[test]
    fn the_ipv6_glance_turns_away_only_what_the_classifier_would() {
        let traced = vec![
            FlowKey6 {
                src: WEB6,
                dst: DB6,
            },
            FlowKey6 {
                src: DB6,
                dst: WEB6,
            },
        ];
        let bits = crate::prefilter::TracedPairs6::of(&traced);
        let flows = Willing(vec![FlowKey { src: WEB, dst: DB }], Some(traced));
        let ports = TunnelPorts::with_vxlan([8999]);
        let judged = mutated(shapes6(), 10_000, |b, has_l2, l3| {
            untraced6(b, has_l2, || ports, |k| bits.maybe(k)).then(|| {
                assert_eq!(classify6(b, l3, &ports, &flows), None, "{b:02x?}");
            })
        });
        assert!(
            judged > 50_000,
            "only {judged} IPv6 packets judged at a glance"
        );
        let maybe = |k: &FlowKey6| bits.maybe(k);
        assert!(untraced6(
            &ipv6(WEB6, OTHER6, 6, &[0; 20])[..],
            true,
            || ports,
            maybe
        ));
        assert!(!untraced6(
            &ipv6(WEB6, DB6, 6, &[0; 20])[..],
            true,
            || ports,
            maybe
        ));
    }

    /// What the programs conclude of a packet past the glance: `None`,
    /// turned away by the classifier; else the filter's verdict on the
    /// header it traces, and how it matched.
    fn classifier_verdict(
        b: &[u8],
        l3: usize,
        ports: &TunnelPorts,
        flows: &Willing,
        filter: &L4Filter,
    ) -> Option<(u8, Option<bool>)> {
        let kind = if crate::packet::ip_version(b, l3)? == IPV6_VERSION {
            classify6(b, l3, ports, flows)?
        } else {
            classify4(b, l3, ports, flows)?
        };
        let traced = crate::transport::traced_l4::<_, true>(b, l3, kind, ports)?;
        Some((kind, crate::filter::judge::<_, true>(b, &traced.l4, filter)))
    }

    #[test]
    fn a_filter_verdict_at_a_glance_is_the_filters_on_the_header_the_classifier_traces() {
        // And a pair of nodes, whose tunnel packets are traced by their
        // outer header.
        let traced = vec![
            FlowKey { src: WEB, dst: DB },
            FlowKey { src: DB, dst: WEB },
            FlowKey {
                src: NODE1,
                dst: NODE2,
            },
        ];
        let bits = TracedPairs::of(&traced);
        let maybe = |k: &FlowKey| bits.maybe(k);
        let flows = Willing(traced.clone(), None);
        let ports = TunnelPorts::with_vxlan([8999]);
        let port = |protocols, port| {
            let mut filter = L4Filter {
                protocols,
                ports_len: 1,
                ..L4Filter::default()
            };
            filter.ports[0] = port;
            filter
        };
        let filters = [
            port(0, 5201),
            port(0, 80),
            port(crate::filter::protocol_bit::UDP, 5201),
            port(crate::filter::protocol_bit::ICMP, 53),
        ];
        let (mut judged, mut left_out) = (0, 0);
        for filter in &filters {
            let shapes = [shapes(), shapes6()].concat();
            mutated(shapes, 2_000, |b, has_l2, l3| {
                let keep = filter_verdict(b, has_l2, || ports, maybe, filter)?;
                judged += 1;
                left_out += usize::from(!keep);
                if let Some((kind, verdict)) = classifier_verdict(b, l3, &ports, &flows, filter) {
                    use crate::sighting::match_kind::{INNER, PLAIN};
                    assert!(kind == PLAIN || kind == INNER, "{kind}: {b:02x?}");
                    assert_eq!(verdict, Some(keep), "{b:02x?}");
                }
                Some(())
            });
        }
        assert!(judged > 20_000, "only {judged} packets judged at a glance");
        assert!(left_out > 5_000, "only {left_out} packets left out");
        // The pair's TCP to port 5201, as the filters ask, and the same
        // through VXLAN; a Geneve packet is the classifier's.
        let pods = TracedPairs::of(&traced[..2]);
        let maybe = |k: &FlowKey| pods.maybe(k);
        for packet in [tcp(WEB, DB), vxlan(tcp(WEB, DB))] {
            let verdict = |f| filter_verdict(&packet[..], true, || ports, maybe, f);
            let verdicts = filters.each_ref().map(verdict);
            assert_eq!(
                verdicts,
                [Some(true), Some(false), Some(false), Some(false)]
            );
        }
        let geneve = [vec![0, 0, 0x65, 0x58, 0, 0, 1, 0], tcp(WEB, DB)].concat();
        let geneve = udp_to(6081, geneve);
        assert_eq!(
            filter_verdict(&geneve[..], true, || ports, maybe, &filters[1]),
            None
        );
    }

    #[test]
    fn untraced_tcp_and_vxlan_are_judged_at_a_glance() {
        let bits = TracedPairs::of(&[FlowKey { src: WEB, dst: DB }]);
        let ports = || TunnelPorts::WELL_KNOWN;
        let maybe = |k: &FlowKey| bits.maybe(k);
        assert!(untraced(&tcp(WEB, OTHER)[..], true, ports, maybe));
        assert!(untraced(&tcp(WEB, OTHER)[14..], false, ports, maybe));
        assert!(untraced(&vxlan(tcp(OTHER, DB))[..], true, ports, maybe));
        assert!(untraced(&udp_to(53, vec![0; 40])[..], true, ports, maybe));
        // The traced pair, inside a tunnel or not, is the classifier's.
        assert!(!untraced(&tcp(WEB, DB)[..], true, ports, maybe));
        assert!(!untraced(&vxlan(tcp(WEB, DB))[..], true, ports, maybe));
    }
}
