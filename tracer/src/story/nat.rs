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
//! Naming those translations in a journey's story is `nat_steps`.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{
    journey::PacketKey,
    nat_connections::{Connection, Connections, MAX_CONNECTIONS},
};
use crate::{
    decode::{IpPacket, Transport},
    model::conntrack::{Entry, Tuple},
    model::{Frontend, Translation},
};

/// Every translation known to the trace, and the traced pair's
/// connections conntrack reported (for their zone and mark, and to tell a
/// packet translated before podtrace learnt how).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NatBook {
    pub translations: Vec<Translation>,
    #[serde(default)]
    pub connections: Connections,
}

pub(super) fn reversed(t: &Tuple) -> Tuple {
    Tuple {
        protocol: t.protocol,
        src: t.dst,
        dst: t.src,
        sport: t.dport,
        dport: t.sport,
    }
}

pub(super) fn tuple_of(p: &IpPacket) -> Option<Tuple> {
    let (sport, dport) = ports(&p.transport)?;
    Some(Tuple {
        protocol: p.transport.protocol(),
        src: p.src,
        dst: p.dst,
        sport,
        dport,
    })
}

/// The ports of a transport, if it has any.
pub(super) fn ports(t: &Transport) -> Option<(u16, u16)> {
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

    /// Whether `ip` is a translated frontend (a ClusterIP, a NodePort's
    /// node address) of a translation the trace knows.
    pub fn is_frontend(&self, ip: IpAddr) -> bool {
        self.translations
            .iter()
            .any(|t| t.front.ip == ip && !t.source)
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

    /// A connection conntrack reported for the traced pair: remembered,
    /// and its translations learnt. Returns the translations new to the
    /// book.
    /// `untraced_until_ns`: see [`Connection`].
    pub fn learn_connection(
        &mut self,
        entry: &Entry,
        name: impl Fn(IpAddr) -> Option<String>,
        untraced_until_ns: u64,
    ) -> Vec<Translation> {
        let c = Connection {
            orig: entry.orig,
            reply: entry.reply,
            zone: entry.zone,
            mark: entry.mark,
            untraced_until_ns,
        };
        self.connections.remember(c);
        let at = |ip, port| Frontend { ip, port };
        let mut learnt = Vec::new();
        if entry.dnat() {
            let back = at(c.reply.src, c.reply.sport);
            learnt.push(Translation {
                protocol: c.orig.protocol,
                front: at(c.orig.dst, c.orig.dport),
                back,
                service: self.only_service_of(c.orig.protocol, back),
                backend: name(c.reply.src),
                source: false,
            });
        }
        if entry.snat() {
            learnt.push(Translation {
                protocol: c.orig.protocol,
                front: at(c.reply.dst, c.reply.dport),
                back: at(c.orig.src, c.orig.sport),
                service: None,
                backend: None,
                source: true,
            });
        }
        learnt.retain(|t| {
            // A Service's own translation, known with its name, is kept.
            let known = self
                .translations
                .iter()
                .any(|k| k.protocol == t.protocol && k.front == t.front && k.back == t.back);
            !known
        });
        for t in &learnt {
            if t.source && self.translations.iter().filter(|t| t.source).count() >= MAX_CONNECTIONS
            {
                if let Some(oldest) = self.translations.iter().position(|t| t.source) {
                    self.translations.remove(oldest);
                }
            }
            self.translations.push(t.clone());
        }
        learnt
    }

    /// The Service a backend belongs to, if the known translations name
    /// exactly one (a NodePort that was not listed, a node IP the
    /// Services list could not know).
    fn only_service_of(&self, protocol: u8, back: Frontend) -> Option<String> {
        let mut names = self
            .translations
            .iter()
            .filter(|t| !t.source && t.protocol == protocol && t.back == back)
            .filter_map(|t| t.service.clone());
        let first = names.next()?;
        names.all(|n| n == first).then_some(first)
    }

    /// The connection a packet belongs to, in either direction, before or
    /// after its translation.
    pub(super) fn connection_of(&self, packets: [&IpPacket; 2]) -> Option<&Connection> {
        packets
            .into_iter()
            .filter_map(tuple_of)
            .flat_map(|t| [reversed(&t), t])
            .filter_map(|t| self.connections.newest_with(&t))
            .max_by_key(|(seq, _)| *seq)
            .map(|(_, c)| c)
    }

    /// A packet last seen before a translation podtrace learnt from
    /// conntrack only afterwards: the translation it then went through
    /// (`DNAT a → b`, `SNAT a → b`), to say why it was not seen again.
    pub fn translated_out_of_sight(&self, last: &IpPacket, seen_ns: u64) -> Option<String> {
        let t = tuple_of(last)?;
        let (_, c) = self.connections.newest_with(&t)?;
        late_translation(c, seen_ns, c.orig == t)
    }

    /// A packet first seen after such a translation: the translation it
    /// had been through, to say why its earlier hops are missing.
    pub fn translated_before_sight(&self, first: &IpPacket, seen_ns: u64) -> Option<String> {
        let t = reversed(&tuple_of(first)?);
        let (_, c) = self.connections.newest_with(&t)?;
        late_translation(c, seen_ns, c.reply == t)
    }

    pub(super) fn by_front(&self, at: Frontend, back: Frontend) -> Option<Through> {
        let services = || {
            self.translations
                .iter()
                .filter(|t| !t.source && t.front == at)
        };
        let exact = services().find(|t| t.back == back);
        // A translation learnt from conntrack has no name: the Service's
        // own, of the same frontend, names it.
        let named = services().find(|t| t.service.is_some());
        let service = exact
            .and_then(|t| t.service.clone())
            .or_else(|| named?.service.clone());
        if exact.is_none() && named.is_none() {
            return None;
        }
        // A named Service lists its endpoints: a target none of them is
        // one it no longer (or does not yet) have.
        let unknown_endpoint =
            named.is_some() && !services().any(|t| t.service.is_some() && t.back == back);
        Some(Through {
            service,
            backend: exact.and_then(|t| t.backend.clone()),
            unknown_endpoint,
        })
    }

    /// Whether `ip` is a Service frontend (a ClusterIP or a node's
    /// NodePort address).
    pub(super) fn is_front(&self, at: Frontend) -> bool {
        self.translations.iter().any(|t| !t.source && t.front == at)
    }
}

/// The Service a translation went through, as the trace knows it.
pub(super) struct Through {
    pub service: Option<String>,
    /// The backend pod, where the target is a known endpoint's.
    pub backend: Option<String>,
    /// The Service is named and its endpoints listed, and the target is
    /// none of them.
    pub unknown_endpoint: bool,
}

/// The translation of connection `c`, as `DNAT a → b, SNAT c → d`
/// (`request`: whether the packet is the request), if the packet,
/// seen at `seen_ns`, passed while its translated addresses were not
/// traced yet.
fn late_translation(c: &Connection, seen_ns: u64, request: bool) -> Option<String> {
    if seen_ns >= c.untraced_until_ns {
        return None;
    }
    let (from, to) = if request {
        (c.orig, reversed(&c.reply))
    } else {
        (c.reply, reversed(&c.orig))
    };
    let (dst_kind, src_kind) = if request {
        ("DNAT", "SNAT")
    } else {
        ("un-SNAT", "un-DNAT")
    };
    let mut said = Vec::new();
    if (from.dst, from.dport) != (to.dst, to.dport) {
        said.push(format!(
            "{dst_kind} {}:{} → {}:{}",
            from.dst, from.dport, to.dst, to.dport
        ));
    }
    if (from.src, from.sport) != (to.src, to.sport) {
        said.push(format!(
            "{src_kind} {}:{} → {}:{}",
            from.src, from.sport, to.src, to.sport
        ));
    }
    (!said.is_empty()).then(|| said.join(", "))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::decode::{decode, tests as frames};
    use crate::{
        model::netfilter::NetfilterRule,
        story::{
            nat_steps::{steps, RULE_NOT_SEEN},
            rule_text::NatKind,
        },
    };
    use std::net::Ipv4Addr;

    pub(crate) fn book() -> NatBook {
        let t = |ip: [u8; 4], pod: &str| Translation {
            protocol: 6,
            front: Frontend {
                ip: Ipv4Addr::new(10, 96, 7, 7).into(),
                port: 80,
            },
            back: Frontend {
                ip: Ipv4Addr::from(ip).into(),
                port: 8080,
            },
            service: Some("default/db".into()),
            backend: Some(pod.into()),
            source: false,
        };
        NatBook {
            translations: vec![
                t([10, 244, 2, 2], "default/db-0"),
                t([10, 244, 2, 3], "default/db-1"),
            ],
            connections: Default::default(),
        }
    }

    fn packet(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> IpPacket {
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
            path: Vec::new(),
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
        // The SYN with its rule not (yet) seen: still a rule's, unnamed.
        let s = steps(&pre, &post, &[], &book());
        assert_eq!(s[0].conntrack.state, "new");
        assert_eq!(s[0].rule, RULE_NOT_SEEN);
        // A later packet of the connection: conntrack did it.
        let ack = |p: &IpPacket| IpPacket {
            transport: match p.transport {
                Transport::Tcp {
                    sport, dport, seq, ..
                } => Transport::Tcp {
                    sport,
                    dport,
                    seq,
                    flags: 0x10,
                },
                other => other,
            },
            ..*p
        };
        let s = steps(&ack(&pre), &ack(&post), &[], &book());
        assert_eq!(s[0].conntrack.state, "established");
        assert!(s[0].text().contains("(conntrack)"));
    }

    #[test]
    fn a_dnat_to_none_of_a_named_services_endpoints_says_so() {
        // conntrack reported a DNAT to 10.244.2.9, which default/db's
        // endpoints do not include: a stale rule's.
        let mut book = book();
        let mut learnt = book.translations[0].clone();
        learnt.back.ip = Ipv4Addr::new(10, 244, 2, 9).into();
        (learnt.service, learnt.backend) = (None, None);
        book.learn(learnt);
        let pre = packet([10, 244, 1, 2], [10, 96, 7, 7], 40000, 80);
        let stale = packet([10, 244, 1, 2], [10, 244, 2, 9], 40000, 8080);
        let s = &steps(&pre, &stale, &[], &book)[0];
        assert_eq!(s.service.as_deref(), Some("default/db"));
        assert_eq!(s.backend, None);
        assert!(s.unknown_endpoint);
        assert!(
            s.text().ends_with("(default/db, to none of its endpoints: a rule left by an endpoint that is gone (the proxy has not synced), a terminating endpoint a Local traffic policy still uses, or one podtrace has not heard of)"),
            "{}",
            s.text()
        );
        // A known endpoint is named, and not said to be unknown.
        let known = packet([10, 244, 1, 2], [10, 244, 2, 3], 40000, 8080);
        let s = &steps(&pre, &known, &[], &book)[0];
        assert_eq!(s.backend.as_deref(), Some("default/db-1"));
        assert!(!s.unknown_endpoint);
        // Only conntrack's own, unnamed: nothing to judge it by.
        book.translations.retain(|t| t.service.is_none());
        let s = &steps(&pre, &stale, &[], &book)[0];
        assert!(!s.unknown_endpoint && s.service.is_none());
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
            path: Vec::new(),
        };
        let out = packet([10, 244, 1, 2], [192, 0, 2, 1], 40000, 80);
        let masqueraded = packet([192, 0, 2, 11], [192, 0, 2, 1], 40000, 80);
        let s = steps(&out, &masqueraded, &[masq], &book());
        assert_eq!(s[0].kind, NatKind::Masquerade);
        assert_eq!(s[0].before, "10.244.1.2:40000");
        assert_eq!(s[0].after, "192.0.2.11:40000");
    }

    /// A TCP tuple.
    pub(crate) fn tuple(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Tuple {
        Tuple {
            protocol: 6,
            src: src.into(),
            dst: dst.into(),
            sport,
            dport,
        }
    }

    /// Conntrack's entry for a hairpin: web-0 to a Service that picked
    /// web-0 itself, DNATed and MASQUERADEd to the bridge's address.
    fn hairpin() -> Entry {
        let t = tuple;
        Entry {
            orig: t([10, 244, 1, 2], [10, 96, 7, 8], 40000, 80),
            reply: t([10, 244, 1, 2], [10, 244, 1, 1], 8080, 25020),
            status: (1 << 4) | (1 << 5),
            zone: 3,
            mark: 0x10,
        }
    }

    #[test]
    fn a_connection_from_conntrack_teaches_both_translations_and_its_zone_and_mark() {
        let mut book = NatBook::default();
        let learnt = book.learn_connection(&hairpin(), |_| Some("default/web-0".into()), 5_000);
        assert_eq!(learnt.len(), 2);
        assert!(learnt[0].front.ip == Ipv4Addr::new(10, 96, 7, 8) && !learnt[0].source);
        assert_eq!(learnt[0].backend.as_deref(), Some("default/web-0"));
        assert!(learnt[1].source && learnt[1].front.port == 25020);
        // Learnt once.
        assert!(book
            .learn_connection(&hairpin(), |_| None, 9_000)
            .is_empty());
        // A backend of one listed Service: a learnt frontend is named by it.
        let mut listed = self::tests::book();
        let mut nodeport = hairpin();
        nodeport.orig.dst = Ipv4Addr::new(192, 0, 2, 11).into();
        nodeport.orig.dport = 30080;
        nodeport.reply.src = Ipv4Addr::new(10, 244, 2, 3).into();
        let learnt = listed.learn_connection(&nodeport, |_| None, 0);
        assert_eq!(learnt[0].service.as_deref(), Some("default/db"));
        let sent = packet([10, 244, 1, 2], [10, 96, 7, 8], 40000, 80);
        let back = packet([10, 244, 1, 1], [10, 244, 1, 2], 25020, 8080);
        let s = steps(&sent, &back, &[], &book);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].kind, s[1].kind), (NatKind::Dnat, NatKind::Snat));
        assert_eq!(
            (s[0].conntrack.zone, s[0].conntrack.mark),
            (Some(3), Some(0x10))
        );
        assert_eq!(
            book.translated_out_of_sight(&sent, 1_000).unwrap(),
            "DNAT 10.96.7.8:80 → 10.244.1.2:8080, SNAT 10.244.1.2:40000 → 10.244.1.1:25020"
        );
        let reply_after = packet([10, 96, 7, 8], [10, 244, 1, 2], 80, 40000);
        assert_eq!(
            book.translated_before_sight(&reply_after, 1_000).unwrap(),
            "un-SNAT 10.244.1.1:25020 → 10.244.1.2:40000, un-DNAT 10.244.1.2:8080 → 10.96.7.8:80"
        );
        // A packet of another connection was not translated by this one.
        assert!(book
            .translated_out_of_sight(&packet([10, 244, 1, 2], [10, 96, 7, 8], 40001, 80), 1_000)
            .is_none());
        // Seen after the translated addresses were traced: lost, not out
        // of sight.
        assert!(book.translated_out_of_sight(&sent, 6_000).is_none());
    }

    #[test]
    fn alternatives_map_both_sides_of_each_translation() {
        let key = |p: &IpPacket| PacketKey {
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
