//! Following one packet across address translation (kube-proxy's DNAT of
//! a Service, its MASQUERADE, conntrack's reverse translation of replies).
//!
//! Design: the kernel reports a packet only if its address pair is in the
//! FLOWS filter, so the trace adds every pair a translation can produce
//! (pod ⇄ ClusterIP and pod ⇄ each backend, known up front from the
//! Services, or learnt from conntrack as connections appear). The kernel
//! then reports the packet before and after the rewrite, under two
//! different keys. The correlator joins them here, purely: a sighting
//! whose key opens no journey is mapped through every known
//! [`Translation`] ([`NatBook::alternatives`]): same IP ID, same protocol
//! and transport identity, with the translated address and port swapped
//! for the other side of the translation. If one of those keys has an open
//! journey, the sighting belongs to it. NAT never changes the IP ID, so a
//! false join needs the same ID, ports and a translation between the pairs.
//!
//! Then, for the story, [`steps`] compares consecutive hops of a journey:
//! where the addresses changed, it names the translation (DNAT, un-DNAT,
//! SNAT/MASQUERADE, un-SNAT) with both tuples, the rule that did it (from
//! nft rule tracing: only a connection's first packet traverses the nat
//! chains, later ones are translated by conntrack) and the Service and
//! backend pod.

use std::{fmt, net::Ipv4Addr};

use serde::{Deserialize, Serialize};

use super::journey::PacketKey;
use crate::{
    decode::{Ipv4Packet, Transport},
    probe::netfilter::NetfilterRule,
};

/// An address and port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frontend {
    pub ip: Ipv4Addr,
    pub port: u16,
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ip, self.port)
    }
}

/// One way kube-proxy rewrites a destination: `front` (ClusterIP:port or
/// node IP:NodePort) to `back` (a backend pod's IP:targetPort).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Translation {
    pub protocol: u8,
    pub front: Frontend,
    pub back: Frontend,
    /// `namespace/name` of the Service.
    pub service: String,
    /// `namespace/name` of the backend pod, when known.
    pub backend: Option<String>,
}

/// Every translation known to the trace.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NatBook {
    pub translations: Vec<Translation>,
}

/// The ports of a transport, if it has any.
fn ports(t: &Transport) -> Option<(u16, u16)> {
    match *t {
        Transport::Tcp { sport, dport, .. } | Transport::Udp { sport, dport } => {
            Some((sport, dport))
        }
        _ => None,
    }
}

fn with_ports(t: Transport, sport: u16, dport: u16) -> Transport {
    match t {
        Transport::Tcp { seq, flags, .. } => Transport::Tcp {
            sport,
            dport,
            seq,
            flags,
        },
        Transport::Udp { .. } => Transport::Udp { sport, dport },
        other => other,
    }
}

impl NatBook {
    /// Adds a translation (learnt from conntrack), once.
    pub fn learn(&mut self, t: Translation) -> bool {
        if self.translations.contains(&t) {
            return false;
        }
        self.translations.push(t);
        true
    }

    /// The same packet as it looks on the other side of each known
    /// translation: before or after a DNAT (request), or after or before
    /// its reverse (reply).
    pub fn alternatives(&self, key: &PacketKey) -> Vec<PacketKey> {
        let Some((sport, dport)) = ports(&key.transport) else {
            return Vec::new();
        };
        let (src, dst) = (
            Frontend {
                ip: key.src,
                port: sport,
            },
            Frontend {
                ip: key.dst,
                port: dport,
            },
        );
        let mut out = Vec::new();
        let proto = key.transport.protocol();
        for t in self.translations.iter().filter(|t| t.protocol == proto) {
            for (from, to) in [(t.front, t.back), (t.back, t.front)] {
                if dst == from {
                    out.push(PacketKey {
                        dst: to.ip,
                        transport: with_ports(key.transport, sport, to.port),
                        ..*key
                    });
                }
                if src == from {
                    out.push(PacketKey {
                        src: to.ip,
                        transport: with_ports(key.transport, to.port, dport),
                        ..*key
                    });
                }
            }
        }
        out
    }

    fn by_front(&self, at: Frontend, back: Option<Frontend>) -> Option<&Translation> {
        self.translations
            .iter()
            .find(|t| t.front == at && back.is_none_or(|b| b == t.back))
            .or_else(|| self.translations.iter().find(|t| t.front == at))
    }

    /// Whether `ip` is a Service frontend (a ClusterIP or a node's
    /// NodePort address).
    fn is_front(&self, at: Frontend) -> bool {
        self.translations.iter().any(|t| t.front == at)
    }
}

/// Which rewrite a step is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum NatKind {
    #[serde(rename = "DNAT")]
    Dnat,
    /// A reply's source put back to the Service frontend (conntrack).
    #[serde(rename = "un-DNAT")]
    UnDnat,
    #[serde(rename = "SNAT")]
    Snat,
    #[serde(rename = "MASQUERADE")]
    Masquerade,
    /// A reply's destination put back to the masqueraded source.
    #[serde(rename = "un-SNAT")]
    UnSnat,
}

impl NatKind {
    fn label(self) -> &'static str {
        match self {
            Self::Dnat => "DNAT",
            Self::UnDnat => "un-DNAT",
            Self::Snat => "SNAT",
            Self::Masquerade => "MASQUERADE",
            Self::UnSnat => "un-SNAT",
        }
    }
}

/// The conntrack side of a translation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConntrackState {
    /// `new`: the connection's first packet, translated by a nat rule;
    /// `established`: translated by conntrack from an existing entry.
    pub state: &'static str,
    /// The entry's zone and mark, when conntrack was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mark: Option<u32>,
}

/// One translation seen on a hop (JSON `nat`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NatStep {
    pub kind: NatKind,
    /// `ip:port` (or `ip` for port-less protocols) before and after.
    pub before: String,
    pub after: String,
    /// The rule, as `table chain: rule text`; `conntrack` when an
    /// existing entry did it.
    pub rule: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    pub conntrack: ConntrackState,
}

impl NatStep {
    /// `DNAT 10.96.7.7:80 → 10.244.2.3:8080 by nat KUBE-SEP-… (default/db → default/db-1)`.
    pub fn text(&self) -> String {
        let by = if self.conntrack.state == "new" {
            format!("by {}", self.rule)
        } else {
            "(conntrack)".to_string()
        };
        let which = match (&self.service, &self.backend) {
            (Some(s), Some(b)) => format!(" ({s} → {b})"),
            (Some(s), None) => format!(" ({s})"),
            _ => String::new(),
        };
        format!(
            "{} {} → {} {by}{which}",
            self.kind.label(),
            self.before,
            self.after
        )
    }
}

/// What a nat rule does, from its text (iptables or nft syntax).
pub fn rule_action(rule: &NetfilterRule) -> Option<NatKind> {
    let text = rule.rule.as_str();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if has(&["-j DNAT", "dnat to", "dnat ip to"]) {
        Some(NatKind::Dnat)
    } else if has(&["-j MASQUERADE", "masquerade"]) {
        Some(NatKind::Masquerade)
    } else if has(&["-j SNAT", "snat to", "snat ip to"]) {
        Some(NatKind::Snat)
    } else {
        None
    }
}

fn sock(ip: Ipv4Addr, port: Option<u16>) -> Frontend {
    Frontend {
        ip,
        port: port.unwrap_or(0),
    }
}

fn shown(ip: Ipv4Addr, port: Option<u16>) -> String {
    port.map_or_else(|| ip.to_string(), |p| format!("{ip}:{p}"))
}

/// The translations between two consecutive sightings of one packet
/// (none when its addresses and ports did not change).
pub fn steps(
    before: &Ipv4Packet,
    after: &Ipv4Packet,
    rules: &[NetfilterRule],
    book: &NatBook,
) -> Vec<NatStep> {
    let (b, a) = (ports(&before.transport), ports(&after.transport));
    let (bs, bd) = (b.map(|p| p.0), b.map(|p| p.1));
    let (as_, ad) = (a.map(|p| p.0), a.map(|p| p.1));
    let rule_for = |kinds: &[NatKind]| {
        rules
            .iter()
            .find(|r| rule_action(r).is_some_and(|k| kinds.contains(&k)))
    };
    let mut out = Vec::new();
    if (before.dst, bd) != (after.dst, ad) {
        let front = sock(before.dst, bd);
        let (kind, rule) = if book.is_front(front) {
            (NatKind::Dnat, rule_for(&[NatKind::Dnat]))
        } else {
            (NatKind::UnSnat, None)
        };
        let t = (kind == NatKind::Dnat)
            .then(|| book.by_front(front, Some(sock(after.dst, ad))))
            .flatten();
        out.push(step(
            kind,
            shown(before.dst, bd),
            shown(after.dst, ad),
            rule,
            t,
        ));
    }
    if (before.src, bs) != (after.src, as_) {
        let front = sock(after.src, as_);
        let (kind, rule) = if book.is_front(front) {
            (NatKind::UnDnat, None)
        } else {
            let rule = rule_for(&[NatKind::Masquerade, NatKind::Snat]);
            let kind = rule.and_then(rule_action).unwrap_or(NatKind::Snat);
            (kind, rule)
        };
        let t = (kind == NatKind::UnDnat)
            .then(|| book.by_front(front, Some(sock(before.src, bs))))
            .flatten();
        out.push(step(
            kind,
            shown(before.src, bs),
            shown(after.src, as_),
            rule,
            t,
        ));
    }
    out
}

fn step(
    kind: NatKind,
    before: String,
    after: String,
    rule: Option<&NetfilterRule>,
    t: Option<&Translation>,
) -> NatStep {
    NatStep {
        kind,
        before,
        after,
        rule: rule.map_or_else(
            || "conntrack".to_string(),
            |r| format!("{} {}: {}", r.table, r.chain, r.rule),
        ),
        service: t.map(|t| t.service.clone()),
        backend: t.and_then(|t| t.backend.clone()),
        conntrack: ConntrackState {
            state: if rule.is_some() { "new" } else { "established" },
            zone: None,
            mark: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{decode, tests as frames};

    pub(crate) fn book() -> NatBook {
        let t = |ip: [u8; 4], pod: &str| Translation {
            protocol: 6,
            front: Frontend {
                ip: Ipv4Addr::new(10, 96, 7, 7),
                port: 80,
            },
            back: Frontend {
                ip: Ipv4Addr::from(ip),
                port: 8080,
            },
            service: "default/db".into(),
            backend: Some(pod.into()),
        };
        NatBook {
            translations: vec![
                t([10, 244, 2, 2], "default/db-0"),
                t([10, 244, 2, 3], "default/db-1"),
            ],
        }
    }

    fn packet(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Ipv4Packet {
        decode(&frames::tcp_syn(src, dst, sport, dport), true)
            .unwrap()
            .packet
    }

    fn dnat_rule() -> NetfilterRule {
        NetfilterRule {
            table: "nat".into(),
            chain: "KUBE-SEP-ABC".into(),
            hook: "PREROUTING".into(),
            rule: "-A KUBE-SEP-ABC -p tcp -m comment --comment default/db -m tcp -j DNAT --to-destination 10.244.2.3:8080".into(),
        }
    }

    #[test]
    fn a_dnat_is_named_with_both_tuples_its_rule_and_the_backend() {
        let pre = packet([10, 244, 1, 2], [10, 96, 7, 7], 40000, 80);
        let post = packet([10, 244, 1, 2], [10, 244, 2, 3], 40000, 8080);
        let s = steps(&pre, &post, &[dnat_rule()], &book());
        assert_eq!(s.len(), 1);
        assert_eq!(
            s[0].text(),
            "DNAT 10.96.7.7:80 → 10.244.2.3:8080 by nat KUBE-SEP-ABC: -A KUBE-SEP-ABC -p tcp -m comment --comment default/db -m tcp -j DNAT --to-destination 10.244.2.3:8080 (default/db → default/db-1)"
        );
        assert_eq!(s[0].conntrack.state, "new");
        // A later packet of the connection: conntrack did it.
        let s = steps(&pre, &post, &[], &book());
        assert_eq!(s[0].conntrack.state, "established");
        assert!(s[0].text().contains("(conntrack)"));
    }

    #[test]
    fn a_reply_is_un_dnatted_and_a_masquerade_is_named() {
        let pre = packet([10, 244, 2, 3], [10, 244, 1, 2], 8080, 40000);
        let post = packet([10, 96, 7, 7], [10, 244, 1, 2], 80, 40000);
        let s = steps(&pre, &post, &[], &book());
        assert_eq!(
            s[0].text(),
            "un-DNAT 10.244.2.3:8080 → 10.96.7.7:80 (conntrack) (default/db → default/db-1)"
        );
        let masq = NetfilterRule {
            table: "nat".into(),
            chain: "KUBE-POSTROUTING".into(),
            hook: "POSTROUTING".into(),
            rule: "-A KUBE-POSTROUTING -j MASQUERADE --random-fully".into(),
        };
        let out = packet([10, 244, 1, 2], [192, 0, 2, 1], 40000, 80);
        let masqueraded = packet([192, 0, 2, 11], [192, 0, 2, 1], 40000, 80);
        let s = steps(&out, &masqueraded, &[masq], &book());
        assert_eq!(s[0].kind, NatKind::Masquerade);
        assert_eq!(s[0].before, "10.244.1.2:40000");
        assert_eq!(s[0].after, "192.0.2.11:40000");
    }

    #[test]
    fn alternatives_map_both_sides_of_each_translation() {
        let key = |p: &Ipv4Packet| PacketKey {
            src: p.src,
            dst: p.dst,
            ip_id: p.ip_id,
            transport: p.transport,
        };
        let pre = key(&packet([10, 244, 1, 2], [10, 96, 7, 7], 40000, 80));
        let post = key(&packet([10, 244, 1, 2], [10, 244, 2, 3], 40000, 8080));
        assert!(book().alternatives(&pre).contains(&post));
        assert_eq!(book().alternatives(&post), [pre]);
        let reply = key(&packet([10, 244, 2, 3], [10, 244, 1, 2], 8080, 40000));
        let undone = key(&packet([10, 96, 7, 7], [10, 244, 1, 2], 80, 40000));
        assert_eq!(book().alternatives(&reply), [undone]);
        assert!(book().alternatives(&undone).contains(&reply));
    }
}
