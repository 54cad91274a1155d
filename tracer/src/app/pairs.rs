//! The traced pairs, as the kernel's flow filter wants them.

use std::net::Ipv4Addr;

use podtrace_common::FlowKey;

use super::Targets;

/// Every traced pair, both directions: SRC ⇄ DST, and SRC ⇄ each backend
/// DST's Service translates to (so the packet is seen after the DNAT).
pub(super) fn traced_pairs(targets: &Targets) -> Vec<(Ipv4Addr, Ipv4Addr)> {
    let (src, dst) = (targets.src.ip, targets.dst.ip);
    let mut pairs = vec![(src, dst), (dst, src)];
    for t in &targets.nat.translations {
        for pair in [(src, t.back.ip), (t.back.ip, src)] {
            if !pairs.contains(&pair) && t.back.ip != src {
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

/// Every pair as the kernel filter wants it.
pub(super) fn flow_keys(pairs: &[(Ipv4Addr, Ipv4Addr)]) -> Vec<FlowKey> {
    pairs
        .iter()
        .map(|(a, b)| FlowKey {
            src: a.octets(),
            dst: b.octets(),
        })
        .collect()
}
