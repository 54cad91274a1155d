//! A netfilter drop that was conntrack's doing, told as such: a rule's
//! drop of what conntrack found INVALID, an entry that clashed at confirm
//! (two packets of one tuple racing: the DNS 5-second delay), a source NAT
//! with no free tuple left, a full table. Each is told from evidence only:
//! the rule the trace named, how conntrack's own counters grew on the
//! dropping node over the run, the table's fill, the entry already in the
//! table. Where the evidence is missing, nothing is claimed.

use serde::Serialize;

use super::{
    journey::{Journey, NETFILTER_DROP},
    nat::{reversed, tuple_of},
    rule_text,
    rule_text::{rule_action, NatKind},
    Context, Outcome,
};
use crate::{
    decode::{Transport, TCP_SYN},
    model::conntrack::ConntrackTable,
    model::conntrack::Tuple,
    model::netfilter::NetfilterRule,
};

/// Which of conntrack's failures dropped the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mechanism {
    /// A rule dropped what conntrack found INVALID.
    Invalid,
    /// The packet's entry clashed at confirm with one of the same tuple.
    InsertFailed,
    /// No entry could be made: nf_conntrack_count reached nf_conntrack_max.
    TableFull,
    /// Source NAT found no free tuple: the translated entry clashed.
    SnatExhausted,
}

/// Conntrack's part in a drop, with what shows it and what fixes it.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct ConntrackFailure {
    pub mechanism: Mechanism,
    /// What tells it: the rule, the counters' growth, the table's fill.
    pub evidence: Vec<String>,
    /// Why conntrack did it, where the packet and the node tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// The entry already in the table that the packet's entry clashed with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub colliding: Option<String>,
    pub fix: String,
}

/// Conntrack's part in the journey's drop, if the evidence shows one.
pub(super) fn diagnose(
    journey: &Journey,
    outcome: &Outcome,
    ctx: &Context,
) -> Option<ConntrackFailure> {
    let Outcome::Dropped {
        node,
        reason,
        location,
        ..
    } = outcome
    else {
        return None;
    };
    if reason != NETFILTER_DROP {
        return None;
    }
    let table = ctx.conntrack.get(node);
    if let Some(rule) = &journey.rule {
        return rule_text::invalid(&rule.rule).then(|| invalid(journey, rule, table));
    }
    // No rule: a verdict of conntrack's own (or of a rule not traced),
    // told apart only by conntrack's counters on that node.
    let table = table?;
    let grew = table.grew();
    if by_a_rule(location) {
        return None;
    }
    if grew.insert_failed > 0 {
        Some(insert_failed(journey, table, ctx))
    } else if grew.drop > 0 {
        Some(table_full(table))
    } else {
        None
    }
}

/// Freed where a ruleset is walked (a rule's DROP), not where a hook's
/// verdict is carried out.
fn by_a_rule(location: &str) -> bool {
    ["nft_do_chain", "ipt_do_table", "ip6t_do_table"]
        .iter()
        .any(|f| location.starts_with(f))
}

/// A rule's drop of ctstate INVALID: why conntrack found the packet so,
/// from its TCP flags and the node's conntrack sysctls.
fn invalid(
    journey: &Journey,
    rule: &NetfilterRule,
    table: Option<&ConntrackTable>,
) -> ConntrackFailure {
    let mut evidence = vec![format!("rule: {}", rule.rule)];
    let grown = table.map_or(0, |t| t.grew().invalid);
    if grown > 0 {
        evidence.push(format!(
            "conntrack's invalid counter on {} grew by {grown}",
            table.map_or("", |t| &t.node)
        ));
    }
    let last = &journey.hops[journey.hops.len() - 1].packet.packet;
    let mid_stream = matches!(last.transport, Transport::Tcp { flags, .. } if flags & TCP_SYN == 0);
    let loose = table.and_then(|t| t.tcp_loose);
    let liberal = table.and_then(|t| t.tcp_be_liberal);
    let timeout = table.and_then(|t| t.tcp_timeout_established);
    let why = match (mid_stream, loose, liberal) {
        (true, Some(false), _) => Some(format!(
            "a mid-stream TCP segment with no conntrack entry: nf_conntrack_tcp_loose=0 takes up no connection conntrack did not see open, and this one's entry was gone (expired{}, or flushed)",
            timeout.map_or(String::new(), |s| format!(": nf_conntrack_tcp_timeout_established={s}s"))
        )),
        (true, _, Some(false)) => Some("a TCP segment outside the window conntrack tracks for its connection (or of a connection whose entry is gone); nf_conntrack_tcp_be_liberal=0 drops such segments".to_string()),
        _ => None,
    };
    let fix = if mid_stream {
        "let conntrack take up connections it lost and accept out-of-window segments: sysctl net.netfilter.nf_conntrack_tcp_be_liberal=1 (kube-proxy's conntrack.tcpBeLiberal) and nf_conntrack_tcp_loose=1; keep idle connections' entries (nf_conntrack_tcp_timeout_established above the application's idle time)"
    } else {
        "find what sends packets conntrack ties to no connection (an ICMP error for no flow, a malformed header): `conntrack -S` counts them per CPU"
    };
    ConntrackFailure {
        mechanism: Mechanism::Invalid,
        evidence,
        why,
        colliding: None,
        fix: fix.to_string(),
    }
}

/// An entry that clashed at confirm: a source NAT that found no free
/// tuple, or two packets of one tuple racing (the DNS 5-second delay).
fn insert_failed(journey: &Journey, table: &ConntrackTable, ctx: &Context) -> ConntrackFailure {
    let first = &journey.hops[0].packet.packet;
    let last = &journey.hops[journey.hops.len() - 1].packet.packet;
    let mut evidence = vec![format!(
        "conntrack's insert_failed counter on {} grew by {}",
        table.node,
        table.grew().insert_failed
    )];
    let snat = journey
        .nat_rules
        .iter()
        .find(|r| matches!(rule_action(r), Some(NatKind::Snat | NatKind::Masquerade)));
    let clash = ctx.nat.connection_of([first, last]);
    // The same original tuple already confirmed: a race. The tuple the
    // source NAT gave this packet already some other connection's: no
    // free tuple was left.
    let race = clash.is_some_and(|c| Some(c.orig) == tuple_of(first));
    let nat_chose_a_taken_tuple = clash.is_some_and(|c| {
        Some(reversed(&c.reply)) == tuple_of(last) && Some(c.orig) != tuple_of(last)
    });
    let translated = first.src != last.src || snat.is_some() || nat_chose_a_taken_tuple;
    if let Some(rule) = snat {
        evidence.push(format!("source NAT rule: {}", rule.rule));
    }
    let colliding = clash.map(|c| format!("{} (reply {})", shown(&c.orig), shown(&c.reply)));
    if translated && !race {
        let range = snat.and_then(|r| port_range(&r.rule));
        if let Some((lo, hi)) = range {
            evidence.push(format!(
                "its ports: {lo}-{hi}, {} tuples per destination",
                hi - lo + 1
            ));
        }
        return ConntrackFailure {
            mechanism: Mechanism::SnatExhausted,
            evidence,
            why: Some("source NAT found no free source address and port toward this destination: the translated entry clashed with one already in the table".into()),
            colliding,
            fix: "widen the SNAT/MASQUERADE port range (`--to-ports`, `--to-source IP:ports`) or give it more addresses, with `--random-fully`; or open fewer connections to one destination (reuse them)".into(),
        };
    }
    let dns = matches!(first.transport, Transport::Udp { dport: 53, .. });
    let why = match (first.transport, dns) {
        (Transport::Udp { .. }, true) => "two DNS queries sent at once from one socket (glibc's A and AAAA) made two entries of one tuple; the second lost the race to confirm (the 5-second DNS delay, kubernetes#56903)",
        (Transport::Udp { .. }, false) => "two packets of one UDP tuple sent at once made two entries; the second lost the race to confirm",
        _ => "the packet's entry clashed with one of the same tuple already confirmed",
    };
    let fix = if dns {
        "in the pod's dnsConfig: options single-request-reopen (or use-vc); or NodeLocal DNSCache; kernels ≥ 5.0 resolve most of these clashes"
    } else {
        "send a connection's first packets one at a time, or from separate sockets"
    };
    ConntrackFailure {
        mechanism: Mechanism::InsertFailed,
        evidence,
        why: Some(why.into()),
        colliding,
        fix: fix.into(),
    }
}

/// No entry could be made: the table full.
fn table_full(table: &ConntrackTable) -> ConntrackFailure {
    let grew = table.grew();
    let mut evidence = vec![
        format!(
            "conntrack's drop counter on {} grew by {}",
            table.node, grew.drop
        ),
        format!(
            "nf_conntrack_count {} of nf_conntrack_max {}",
            table.entries, table.max
        ),
    ];
    if grew.early_drop > 0 {
        evidence.push(format!(
            "early_drop grew by {}: entries were evicted to make room",
            grew.early_drop
        ));
    }
    ConntrackFailure {
        mechanism: Mechanism::TableFull,
        evidence,
        why: Some("conntrack's table was full: no entry could be made for a new connection (\"nf_conntrack: table full, dropping packet\")".into()),
        colliding: None,
        fix: "raise sysctl net.netfilter.nf_conntrack_max (kube-proxy's conntrack.maxPerCore), or find what opens so many connections (conntrack -L)".into(),
    }
}

fn shown(t: &Tuple) -> String {
    format!("{}:{} → {}:{}", t.src, t.sport, t.dst, t.dport)
}

/// A SNAT or MASQUERADE rule's port range: `--to-ports 40000-40010`,
/// `--to-source 10.0.0.1:40000-40010`, nft's `to :40000-40010`.
fn port_range(rule: &str) -> Option<(u16, u16)> {
    let after = ["--to-ports ", "--to-source ", " to "]
        .iter()
        .find_map(|k| rule.split_once(k).map(|(_, rest)| rest))?;
    let word = after.split_whitespace().next()?;
    let ports = word.rsplit_once(':').map_or(word, |(_, p)| p);
    let (lo, hi) = ports.split_once('-').unwrap_or((ports, ports));
    let (lo, hi) = (lo.parse().ok()?, hi.parse().ok()?);
    (lo <= hi).then_some((lo, hi))
}

/// The verdict's words for it: the mechanism, then what shows it and the fix.
pub(super) fn said(failure: &ConntrackFailure) -> (String, String) {
    let what = match failure.mechanism {
        Mechanism::Invalid => "dropped as conntrack INVALID",
        Mechanism::InsertFailed => {
            "dropped by conntrack: its entry failed to insert (insert_failed)"
        }
        Mechanism::TableFull => "dropped by conntrack: the table is full",
        Mechanism::SnatExhausted => {
            "dropped by conntrack: source NAT ports exhausted (insert_failed)"
        }
    };
    let what = match &failure.why {
        Some(why) => format!("{what}: {why}"),
        None => what.to_string(),
    };
    let mut tail = String::new();
    if let Some(entry) = &failure.colliding {
        tail.push_str(&format!("; colliding entry {entry}"));
    }
    tail.push_str(&format!("; evidence: {}", failure.evidence.join(", ")));
    tail.push_str(&format!("; fix: {}", failure.fix));
    (what, tail)
}

#[cfg(test)]
mod tests {
    use etherparse::PacketBuilder;

    use super::*;
    use crate::{
        decode::hop::{
            tests::{drop_hop, hop},
            Direction::*,
        },
        model::conntrack::ConntrackCounters,
        model::conntrack::Entry,
        node::interfaces::Role,
        story::{tell, Story},
    };

    const WEB: [u8; 4] = [10, 244, 1, 2];
    const DB: [u8; 4] = [10, 244, 2, 2];
    /// node-1's flannel.1 address, what its MASQUERADE gives.
    const NODE1: [u8; 4] = [10, 244, 1, 0];

    /// `hop` read as a plain packet (the recorded hops' helper reads any
    /// UDP as a tunnel's).
    fn plain(mut hop: crate::decode::hop::Hop, frame: &[u8]) -> crate::decode::hop::Hop {
        hop.packet = crate::decode::decode(frame, true).unwrap();
        hop
    }

    fn syn() -> Vec<u8> {
        crate::decode::tests::tcp_syn(WEB, DB, 41000, 8080)
    }

    fn udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut out = Vec::new();
        let builder = PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv4(src, dst, 64)
            .udp(sport, dport);
        builder.write(&mut out, b"hello").unwrap();
        out
    }

    /// A mid-stream segment (ACK, PSH) carrying a late answer.
    fn tcp_data(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut out = Vec::new();
        let builder = PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv4(src, dst, 63)
            .tcp(sport, dport, 5000, 64240)
            .ack(1000)
            .psh();
        builder.write(&mut out, b"late\n").unwrap();
        out
    }

    /// node-1's table, its counters grown by `grew` over the run.
    fn table(grew: ConntrackCounters) -> ConntrackTable {
        ConntrackTable {
            node: "node-1".into(),
            start: ConntrackCounters::default(),
            now: grew,
            entries: 12,
            max: 262_144,
            tcp_loose: Some(false),
            tcp_be_liberal: Some(false),
            tcp_timeout_established: Some(1),
        }
    }

    fn ctx_with(table: ConntrackTable) -> Context {
        let mut ctx = Context::default();
        ctx.conntrack.insert(table.node.clone(), table);
        ctx
    }

    fn rule(table: &str, chain: &str, hook: &str, text: &str) -> NetfilterRule {
        NetfilterRule {
            table: table.into(),
            chain: chain.into(),
            hook: hook.into(),
            rule: text.into(),
            path: Vec::new(),
        }
    }

    /// Conntrack's entry for a connection it translated.
    fn learn(ctx: &mut Context, orig: Tuple, reply: Tuple, status: u32) {
        let entry = Entry {
            orig,
            reply,
            status,
            zone: 0,
            mark: 0,
        };
        ctx.nat.learn_connection(&entry, |_| None, 0);
    }

    fn udp_tuple(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Tuple {
        Tuple {
            protocol: 17,
            src: src.into(),
            dst: dst.into(),
            sport,
            dport,
        }
    }

    fn failure(story: &Story) -> &ConntrackFailure {
        story
            .verdict
            .conntrack
            .as_ref()
            .expect("told as conntrack's")
    }

    #[test]
    fn a_late_answer_dropped_by_the_invalid_rule_says_why_from_the_sysctls() {
        let late = tcp_data(DB, WEB, 9090, 41000);
        let mut journey = Journey::new(vec![
            hop(1_000, "node-1", "flannel.1", Role::Tunnel, Ingress, &late),
            drop_hop(
                2_000,
                "node-1",
                "flannel.1",
                Role::Tunnel,
                &late,
                NETFILTER_DROP,
            ),
        ]);
        journey.hops[1].drop.as_mut().unwrap().location = "nft_do_chain+0x46f".into();
        journey.rule = Some(rule(
            "filter",
            "KUBE-FORWARD",
            "FORWARD",
            r#"-A KUBE-FORWARD -m conntrack --ctstate INVALID -m comment --comment "kubernetes forwarding conntrack rule" -j DROP"#,
        ));
        let ctx = ctx_with(table(ConntrackCounters {
            invalid: 1,
            ..Default::default()
        }));
        let story = tell(&journey, &ctx);
        let told = failure(&story);
        assert_eq!(told.mechanism, Mechanism::Invalid);
        assert!(
            told.why
                .as_deref()
                .unwrap()
                .contains("nf_conntrack_tcp_loose=0"),
            "{told:?}"
        );
        assert!(told
            .why
            .as_deref()
            .unwrap()
            .contains("nf_conntrack_tcp_timeout_established=1s"));
        assert!(told
            .evidence
            .iter()
            .any(|e| e == "conntrack's invalid counter on node-1 grew by 1"));
        assert!(told.fix.contains("nf_conntrack_tcp_be_liberal=1"));
        let summary = &story.verdict.summary;
        assert!(
            summary.starts_with("dropped as conntrack INVALID: a mid-stream TCP segment"),
            "{summary}"
        );
        assert!(
            summary.contains("by table filter chain KUBE-FORWARD (hook FORWARD)"),
            "{summary}"
        );
        assert!(summary.contains("; fix: "), "{summary}");
    }

    #[test]
    fn a_second_flow_masqueraded_to_a_taken_port_is_snat_exhausted_with_the_colliding_entry() {
        // web-0:41001 → db-0:9999, masqueraded to the one port 40000
        // that web-0:41000's connection holds: dropped at confirm.
        let sent = udp(WEB, DB, 41001, 9999);
        let masqueraded = udp(NODE1, DB, 40000, 9999);
        let mut journey = Journey::new(vec![
            plain(
                hop(1_000, "node-1", "veth1", Role::PodVeth, Ingress, &syn()),
                &sent,
            ),
            plain(
                hop(2_000, "node-1", "cni0", Role::Bridge, Ingress, &syn()),
                &sent,
            ),
            plain(
                drop_hop(
                    3_000,
                    "node-1",
                    "flannel.1",
                    Role::Tunnel,
                    &syn(),
                    NETFILTER_DROP,
                ),
                &masqueraded,
            ),
        ]);
        journey.nat_rules.push(rule(
            "nat",
            "POSTROUTING",
            "POSTROUTING",
            "-A POSTROUTING -s 10.244.1.2/32 -d 10.244.2.2/32 -p udp -j MASQUERADE --to-ports 40000",
        ));
        let mut ctx = ctx_with(table(ConntrackCounters {
            insert_failed: 1,
            insert: 1,
            ..Default::default()
        }));
        learn(
            &mut ctx,
            udp_tuple(WEB, DB, 41000, 9999),
            udp_tuple(DB, NODE1, 9999, 40000),
            1 << 4,
        );
        let story = tell(&journey, &ctx);
        let told = failure(&story);
        assert_eq!(told.mechanism, Mechanism::SnatExhausted);
        assert_eq!(
            told.colliding.as_deref(),
            Some("10.244.1.2:41000 → 10.244.2.2:9999 (reply 10.244.2.2:9999 → 10.244.1.0:40000)")
        );
        assert!(told
            .evidence
            .iter()
            .any(|e| e == "its ports: 40000-40000, 1 tuples per destination"));
        assert!(told
            .evidence
            .iter()
            .any(|e| e.contains("insert_failed counter on node-1 grew by 1")));
        assert!(told.fix.contains("--to-ports"));
        let summary = &story.verdict.summary;
        assert!(
            summary.starts_with("dropped by conntrack: source NAT ports exhausted"),
            "{summary}"
        );
        assert!(
            summary.contains("dropped by conntrack at hook"),
            "{summary}"
        );
        assert!(!summary.contains("the rule is not named"), "{summary}");
    }

    #[test]
    fn a_dns_query_that_lost_the_insert_race_names_the_race_and_the_resolver_fix() {
        // web-0:5353 → the DNS Service 10.96.0.10:53, DNATed to one
        // backend; its twin (the AAAA query, same socket) to another was
        // confirmed first.
        let dns = [10, 96, 0, 10];
        let sent = udp(WEB, dns, 5353, 53);
        let dnat = udp(WEB, [10, 244, 2, 5], 5353, 53);
        let journey = Journey::new(vec![
            plain(
                hop(1_000, "node-1", "veth1", Role::PodVeth, Ingress, &syn()),
                &sent,
            ),
            plain(
                drop_hop(
                    2_000,
                    "node-1",
                    "cni0",
                    Role::Bridge,
                    &syn(),
                    NETFILTER_DROP,
                ),
                &dnat,
            ),
        ]);
        let mut ctx = ctx_with(table(ConntrackCounters {
            insert_failed: 1,
            ..Default::default()
        }));
        learn(
            &mut ctx,
            udp_tuple(WEB, dns, 5353, 53),
            udp_tuple([10, 244, 2, 6], WEB, 53, 5353),
            1 << 5,
        );
        let story = tell(&journey, &ctx);
        let told = failure(&story);
        assert_eq!(told.mechanism, Mechanism::InsertFailed);
        assert!(told.why.as_deref().unwrap().contains("kubernetes#56903"));
        assert_eq!(
            told.colliding.as_deref(),
            Some("10.244.1.2:5353 → 10.96.0.10:53 (reply 10.244.2.6:53 → 10.244.1.2:5353)")
        );
        assert!(told.fix.contains("single-request-reopen"), "{told:?}");
        assert!(told.fix.contains("NodeLocal DNSCache"), "{told:?}");
    }

    #[test]
    fn a_new_connection_dropped_with_the_drop_counter_grown_is_a_full_table() {
        let syn = syn();
        let journey = Journey::new(vec![
            hop(1_000, "node-1", "veth1", Role::PodVeth, Ingress, &syn),
            drop_hop(2_000, "node-1", "cni0", Role::Bridge, &syn, NETFILTER_DROP),
        ]);
        let mut full = table(ConntrackCounters {
            drop: 3,
            ..Default::default()
        });
        full.entries = full.max;
        let story = tell(&journey, &ctx_with(full));
        let told = failure(&story);
        assert_eq!(told.mechanism, Mechanism::TableFull);
        assert!(told
            .evidence
            .iter()
            .any(|e| e == "nf_conntrack_count 262144 of nf_conntrack_max 262144"));
        assert!(told.fix.contains("net.netfilter.nf_conntrack_max"));
    }

    #[test]
    fn without_evidence_nothing_is_blamed_on_conntrack() {
        let syn = syn();
        let mut journey = Journey::new(vec![
            hop(1_000, "node-1", "veth1", Role::PodVeth, Ingress, &syn),
            drop_hop(2_000, "node-1", "cni0", Role::Bridge, &syn, NETFILTER_DROP),
        ]);
        // No counters read on the node: a rule-less drop stays netfilter's.
        assert_eq!(tell(&journey, &Context::default()).verdict.conntrack, None);
        // Counters that did not grow: the same.
        let quiet = ctx_with(table(ConntrackCounters::default()));
        let story = tell(&journey, &quiet);
        assert_eq!(story.verdict.conntrack, None);
        assert!(story.verdict.summary.contains("the rule is not named"));
        // A rule's DROP that is no INVALID match, even as insert_failed grew.
        journey.rule = Some(rule(
            "filter",
            "FORWARD",
            "FORWARD",
            "-A FORWARD -s 10.244.1.2/32 -j DROP",
        ));
        let busy = ctx_with(table(ConntrackCounters {
            insert_failed: 4,
            ..Default::default()
        }));
        assert_eq!(tell(&journey, &busy).verdict.conntrack, None);
    }

    #[test]
    fn snat_port_ranges_are_read_from_iptables_and_nft_rules() {
        assert_eq!(
            port_range("-j MASQUERADE --to-ports 40000-40009"),
            Some((40000, 40009))
        );
        assert_eq!(
            port_range("-j SNAT --to-source 192.0.2.11:1024-2047"),
            Some((1024, 2047))
        );
        assert_eq!(
            port_range("meta l4proto udp masquerade to :40000 # handle 4"),
            Some((40000, 40000))
        );
        assert_eq!(port_range("-j MASQUERADE --random-fully"), None);
    }
}
