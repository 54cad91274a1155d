//! The traced pairs, as the kernel's flow filter wants them.

use std::net::{IpAddr, Ipv4Addr};

use podtrace_common::{packet6::FlowKey6, FlowKey};

use super::targets::Targets;

/// Every traced pair, both directions: SRC ⇄ DST, and SRC ⇄ each backend
/// DST's Service translates to (so the packet is seen after the DNAT);
/// where both ends have IPv6 (dual-stack pods), their IPv6 pair too;
/// each family unless `-4`/`-6` left it out.
pub(super) fn traced_pairs(targets: &Targets) -> Vec<(IpAddr, IpAddr)> {
    let per_family: Vec<(IpAddr, IpAddr)> = targets.traced_pair_per_family().collect();
    let mut pairs: Vec<_> = (per_family.iter())
        .flat_map(|&(src, dst)| [(src, dst), (dst, src)])
        .collect();
    for t in &targets.nat.translations {
        // A backend of each family is traced from the client's address of
        // that family.
        let same_family = |(src, _): &&(IpAddr, IpAddr)| src.is_ipv6() == t.back.ip.is_ipv6();
        let Some(&(client, _)) = per_family.iter().find(same_family) else {
            continue;
        };
        for pair in [(client, t.back.ip), (t.back.ip, client)] {
            if !pairs.contains(&pair) && t.back.ip != client {
                pairs.push(pair);
            }
        }
    }
    pairs
}

/// Both directions of the traced pair, as the kernel filter wants them.
pub(super) fn flow_ips((a, b): (Ipv4Addr, Ipv4Addr)) -> Vec<FlowKey> {
    let (a, b) = (a.octets(), b.octets());
    vec![FlowKey { src: a, dst: b }, FlowKey { src: b, dst: a }]
}

/// Every IPv4 pair as the kernel filter wants it.
pub(super) fn flow_keys(pairs: &[(IpAddr, IpAddr)]) -> Vec<FlowKey> {
    ipv4_pairs(pairs)
        .iter()
        .map(|(a, b)| FlowKey {
            src: a.octets(),
            dst: b.octets(),
        })
        .collect()
}

/// The IPv4 pairs of `pairs` (rule tracing and conntrack follow IPv4).
pub(crate) fn ipv4_pairs(pairs: &[(IpAddr, IpAddr)]) -> Vec<(Ipv4Addr, Ipv4Addr)> {
    pairs
        .iter()
        .filter_map(|pair| match pair {
            (IpAddr::V4(a), IpAddr::V4(b)) => Some((*a, *b)),
            _ => None,
        })
        .collect()
}

/// The IPv6 pairs of `pairs`, as the kernel's IPv6 flow filter wants them.
pub(crate) fn flow_keys6(pairs: &[(IpAddr, IpAddr)]) -> Vec<FlowKey6> {
    pairs
        .iter()
        .filter_map(|pair| match pair {
            (IpAddr::V6(a), IpAddr::V6(b)) => Some(FlowKey6 {
                src: a.octets(),
                dst: b.octets(),
            }),
            _ => None,
        })
        .collect()
}
