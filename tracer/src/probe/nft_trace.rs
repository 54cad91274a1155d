//! `nft -a monitor trace` read into the rules podtrace names: a DROP
//! verdict (a REJECT is one too) or a rule that rewrites addresses.
//!
//! One reader for every table: xtables-monitor (iptables 1.8.9) exits at
//! the first rule of a native `ip` table it cannot parse (kube-proxy's
//! nftables mode has one), so it cannot be the reader on such a node.
//! nft names native rules the way `nft -a list` shows them; rules in
//! iptables-nft's own tables (filter, nat, mangle, raw, security) are
//! named in iptables syntax, as their author wrote them: the rule at the
//! same position in `iptables-save` as the traced handle in `nft -a list
//! chain` ([`super::rule_text::KernelRules`]).
//!
//! The name of a native rule: table `<family> <name>` (`ip kube-proxy`),
//! its chain, and `<rule text> # handle <n>`. A drop reached through a
//! verdict map also names the map lookup and the element that matched,
//! whose comment says which Service it was for (kube-proxy's
//! `no-endpoint-services`).

use std::{
    collections::HashMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use super::{
    nft_rule::{is_iptables_table, table_name, RuleEvent, RuleLookup},
    rule_path::name_path,
    rule_text::without_counts,
};
use crate::model::netfilter::{is_queue, NetfilterRule, PacketId, PathRule, TracedRule};

/// One traced packet: its identity, the base chain it is in, the last
/// rule that sent it into another chain, and every rule it matched on
/// its way (named only if it is dropped: the path a policy is read from).
#[derive(Clone, Debug, Default)]
struct TracedPacket {
    id: Option<PacketId>,
    /// `tcp`/`udp` and the destination port, for verdict map keys.
    dport: Option<(String, u16)>,
    hook: String,
    via: Option<RuleEvent>,
    path: Vec<RuleEvent>,
}

/// The most rules of one packet's path kept: a path longer than that is
/// a loop, or a ruleset no reader would follow either.
const PATH_KEPT: usize = 512;

/// Parses `nft -a monitor trace` lines.
#[derive(Default)]
pub struct TraceParser {
    /// trace id → the packet it is
    packets: HashMap<String, TracedPacket>,
}

impl TraceParser {
    pub fn feed(&mut self, line: &str, rules: &mut dyn RuleLookup) -> Option<TracedRule> {
        let rest = line.trim().strip_prefix("trace id ")?;
        let mut fields = rest.splitn(5, ' ');
        let (id, family, table, chain) = (
            fields.next()?,
            fields.next()?,
            fields.next()?,
            fields.next()?,
        );
        let event = fields.next()?;
        if let Some(packet) = event.strip_prefix("packet: ") {
            if self.packets.len() > 4096 {
                self.packets.clear();
            }
            self.packets.insert(
                id.to_string(),
                TracedPacket {
                    id: packet_id(packet),
                    dport: dport(packet),
                    hook: chain.to_string(),
                    via: None,
                    path: Vec::new(),
                },
            );
            return None;
        }
        let packet = self.packets.get_mut(id)?;
        if let Some(policy) = event.strip_prefix("policy ") {
            if policy.trim() != "drop" {
                return None;
            }
            let policy = format!("the policy of chain {chain} (DROP)");
            let path = name_path(&packet.path, rules);
            return traced(packet, family, table, chain, policy, path, rules);
        }
        let rule = match event.strip_prefix("rule ") {
            Some(rest) => rule_event(family, table, chain, rest)?,
            None => unknown_rule(family, table, chain, event, rules)?,
        };
        if packet.path.len() < PATH_KEPT {
            packet.path.push(rule.clone());
        }
        if rule.verdict.starts_with("jump ") || rule.verdict.starts_with("goto ") {
            packet.via = Some(rule);
            return None;
        }
        // A rule that queued the packet to userspace ends its path too: the
        // kernel drops it if nothing reads the queue (see `is_queue`).
        let ends_here = rule.verdict == "drop" || is_queue(&rule.verdict);
        if !ends_here && !is_nat_rule(&rule.text) {
            return None;
        }
        let named = name_rule(&rule, packet, rules);
        let path = if ends_here {
            name_path(&packet.path, rules)
        } else {
            Vec::new()
        };
        traced(packet, family, table, chain, named, path, rules)
    }
}

/// The named rule, for the packet as it saw it.
fn traced(
    packet: &TracedPacket,
    family: &str,
    table: &str,
    chain: &str,
    rule: String,
    path: Vec<PathRule>,
    rules: &mut dyn RuleLookup,
) -> Option<TracedRule> {
    let (src, dst, ip_id) = packet.id?;
    // iptables-nft names its base chains by their hooks (FORWARD); a
    // native table's are its own names, their hook declared.
    let hook = if is_iptables_table(family, table) {
        packet.hook.clone()
    } else {
        rules
            .chain_hook(family, table, &packet.hook)
            .unwrap_or_else(|| format!("of base chain {} (not read)", packet.hook))
    };
    Some(TracedRule {
        src,
        dst,
        ip_id,
        rule: NetfilterRule {
            table: table_name(family, table),
            chain: chain.into(),
            hook,
            rule,
            path,
        },
    })
}

/// A rule that rewrites addresses, in either syntax nft may print
/// (iptables-nft's DNAT is printed as `dnat to` too).
fn is_nat_rule(text: &str) -> bool {
    [
        "-j DNAT",
        "-j SNAT",
        "-j MASQUERADE",
        "dnat to",
        "dnat ip to",
        "snat to",
        "snat ip to",
        "masquerade",
        "xt target \"DNAT\"",
        "xt target \"SNAT\"",
        "xt target \"MASQUERADE\"",
    ]
    .iter()
    .any(|target| text.contains(target))
}

/// `<text> # handle <n> (verdict <v>)` of one chain.
fn rule_event(family: &str, table: &str, chain: &str, rest: &str) -> Option<RuleEvent> {
    let (body, verdict) = rest.rsplit_once(" (verdict ")?;
    let (text, handle) = body.rsplit_once(" # handle ")?;
    Some(RuleEvent {
        family: family.into(),
        table: table.into(),
        chain: chain.into(),
        text: without_counts(text.trim()),
        handle: handle.trim().parse().ok()?,
        verdict: verdict.trim_end().trim_end_matches(')').to_string(),
    })
}

/// `unknown rule handle <n> (verdict <v>)`: nft prints this for a rule
/// added after the monitor started (kube-proxy resyncs); its text is read
/// from the kernel.
fn unknown_rule(
    family: &str,
    table: &str,
    chain: &str,
    event: &str,
    rules: &mut dyn RuleLookup,
) -> Option<RuleEvent> {
    let (handle, verdict) = event
        .strip_prefix("unknown rule handle ")?
        .split_once(" (verdict ")?;
    let handle = handle.trim().parse().ok()?;
    let text = rules
        .nft_rule(family, table, chain, handle)
        .unwrap_or_else(|| "(a rule whose text could not be read)".into());
    rule_event(
        family,
        table,
        chain,
        &format!("{text} # handle {handle} (verdict {verdict}"),
    )
}

/// The rule as the user would find it on the node: iptables syntax in
/// iptables' tables, `nft -a list` text elsewhere, with the map lookup
/// that led to a drop.
fn name_rule(rule: &RuleEvent, packet: &TracedPacket, rules: &mut dyn RuleLookup) -> String {
    if is_iptables_table(&rule.family, &rule.table) {
        if let Some(line) = rules.iptables_rule(&rule.family, &rule.table, &rule.chain, rule.handle)
        {
            return line;
        }
    }
    let mut named = format!("{} # handle {}", rule.text, rule.handle);
    let Some(via) = packet.via.as_ref().filter(|_| rule.verdict == "drop") else {
        return named;
    };
    if !via.verdict.ends_with(&rule.chain) {
        return named;
    }
    named.push_str(&format!(
        ", reached by {}: {} # handle {}",
        via.chain, via.text, via.handle
    ));
    let map = via
        .text
        .split_once("vmap @")
        .map(|(_, m)| m.split_whitespace().next().unwrap_or(m));
    if let (Some(map), Some((src_dst, Some((proto, port))))) =
        (map, packet.id.map(|id| (id, packet.dport.clone())))
    {
        let key = format!("{} . {proto} . {port}", src_dst.1);
        if let Some(comment) = rules.element_comment(&via.family, &via.table, map, &key) {
            named.push_str(&format!(" on element {key} comment \"{comment}\""));
        }
    }
    named
}

/// `ip saddr A ip daddr B … ip id N` of a packet line; for IPv6, `ip6
/// saddr A ip6 daddr B`, whose packets have no ID (0, as the decoder
/// gives an unfragmented one).
fn packet_id(packet: &str) -> Option<PacketId> {
    let words: Vec<&str> = packet.split_whitespace().collect();
    let after = |a: &str, b: &str| {
        words
            .windows(3)
            .find(|w| w[0] == a && w[1] == b)
            .map(|w| w[2])
    };
    if let (Some(src), Some(dst)) = (after("ip6", "saddr"), after("ip6", "daddr")) {
        let src: Ipv6Addr = src.parse().ok()?;
        let dst: Ipv6Addr = dst.parse().ok()?;
        return Some((src.into(), dst.into(), 0));
    }
    let src: Ipv4Addr = after("ip", "saddr")?.parse().ok()?;
    let dst: Ipv4Addr = after("ip", "daddr")?.parse().ok()?;
    let id: u16 = after("ip", "id")?.parse().ok()?;
    Some((src.into(), dst.into(), id))
}

/// `tcp dport 80` / `udp dport 53` of a packet line.
fn dport(packet: &str) -> Option<(String, u16)> {
    let words: Vec<&str> = packet.split_whitespace().collect();
    words
        .windows(3)
        .find(|w| matches!(w[0], "tcp" | "udp" | "sctp") && w[1] == "dport")
        .and_then(|w| Some((w[0].to_string(), w[2].parse().ok()?)))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Canned answers, as the lab's node gives them.
    #[derive(Default)]
    pub(in crate::probe) struct Canned {
        pub(in crate::probe) iptables: HashMap<(String, u64), String>,
        pub(in crate::probe) native: HashMap<(String, u64), String>,
        pub(in crate::probe) comments: HashMap<String, String>,
        /// chain → its first rule
        pub(in crate::probe) heads: HashMap<String, String>,
        /// base chain → its hook
        pub(in crate::probe) hooks: HashMap<String, String>,
    }

    impl RuleLookup for Canned {
        fn iptables_rule(&mut self, _: &str, _: &str, chain: &str, handle: u64) -> Option<String> {
            self.iptables.get(&(chain.to_string(), handle)).cloned()
        }
        fn nft_rule(&mut self, _: &str, _: &str, chain: &str, handle: u64) -> Option<String> {
            self.native.get(&(chain.to_string(), handle)).cloned()
        }
        fn chain_head(&mut self, _: &str, _: &str, chain: &str) -> Option<String> {
            self.heads.get(chain).cloned()
        }
        fn chain_hook(&mut self, _: &str, _: &str, chain: &str) -> Option<String> {
            self.hooks.get(chain).cloned()
        }
        fn element_comment(&mut self, _: &str, _: &str, map: &str, key: &str) -> Option<String> {
            self.comments.get(&format!("{map} {key}")).cloned()
        }
    }

    /// The rules a recorded `nft monitor trace` names, given `canned`.
    pub(in crate::probe) fn rules_of(trace: &str, canned: &mut Canned) -> Vec<TracedRule> {
        let mut parser = TraceParser::default();
        trace
            .lines()
            .filter_map(|l| parser.feed(l, canned))
            .collect()
    }

    /// Recorded: a rule inserted after the monitor started.
    #[test]
    fn a_rule_the_monitor_does_not_know_is_read_from_the_kernel() {
        let trace = r#"trace id 354d7c83 ip kube-proxy filter-forward packet: iif "cni0" oif "eth0" ip saddr 10.171.1.2 ip daddr 10.96.171.61 ip id 5 ip length 60 tcp sport 1 tcp dport 80
trace id 354d7c83 ip kube-proxy filter-forward unknown rule handle 76 (verdict drop)"#;
        let mut canned = Canned::default();
        canned.native.insert(
            ("filter-forward".into(), 76),
            "ip daddr 10.96.171.61 tcp dport 80 counter packets 1 bytes 60 drop".into(),
        );
        let rules = rules_of(trace, &mut canned);
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].rule.rule,
            "ip daddr 10.96.171.61 tcp dport 80 counter drop # handle 76"
        );
    }

    /// Recorded on the lab (`--proxy-mode nftables`): a SYN to a ClusterIP.
    const KUBE_PROXY_NFT: &str = r#"trace id a76eee94 inet podtrace_r1 prerouting packet: iif "cni0" ether saddr 8e:9b:38:30:42:e5 ether daddr 0a:58:0a:ab:01:01 ip saddr 10.171.1.2 ip daddr 10.96.171.7 ip dscp cs0 ip ecn not-ect ip ttl 64 ip id 14224 ip protocol tcp ip length 60 tcp sport 33924 tcp dport 80 tcp flags == syn tcp window 64860
trace id a76eee94 ip kube-proxy nat-prerouting packet: iif "cni0" ether saddr 8e:9b:38:30:42:e5 ether daddr 0a:58:0a:ab:01:01 ip saddr 10.171.1.2 ip daddr 10.96.171.7 ip dscp cs0 ip ecn not-ect ip ttl 64 ip id 14224 ip length 60 tcp sport 33924 tcp dport 80 tcp flags == syn tcp window 64860
trace id a76eee94 ip kube-proxy nat-prerouting rule jump services # handle 40 (verdict jump services)
trace id a76eee94 ip kube-proxy services rule ip daddr . meta l4proto . th dport vmap @service-ips # handle 46 (verdict goto service-XFP4E4QY-default/db/tcp/http)
trace id a76eee94 ip kube-proxy service-XFP4E4QY-default/db/tcp/http rule numgen random mod 2 vmap { 0 : goto endpoint-PGF3J644-default/db/tcp/http__10.171.2.2/8080, 1 : goto endpoint-RFECL4T7-default/db/tcp/http__10.171.2.3/8080 } # handle 61 (verdict goto endpoint-RFECL4T7-default/db/tcp/http__10.171.2.3/8080)
trace id a76eee94 ip kube-proxy endpoint-RFECL4T7-default/db/tcp/http__10.171.2.3/8080 rule meta l4proto tcp dnat to 10.171.2.3:8080 # handle 58 (verdict accept)
trace id 1cc0b69c ip kube-proxy filter-forward packet: iif "cni0" oif "flannel.1" ip saddr 10.171.1.2 ip daddr 10.171.2.3 ip id 14224 ip length 60 tcp sport 33924 tcp dport 8080 tcp flags == syn tcp window 64860
trace id 1cc0b69c ip kube-proxy filter-forward rule ct state new jump service-endpoints-check # handle 35 (verdict jump service-endpoints-check)
trace id 1cc0b69c ip kube-proxy filter-forward policy accept
"#;

    #[test]
    fn a_native_dnat_is_named_by_its_endpoint_chain_and_nft_text() {
        let rules = rules_of(KUBE_PROXY_NFT, &mut Canned::default());
        assert_eq!(rules.len(), 1, "{rules:?}");
        let rule = &rules[0];
        assert_eq!(
            (rule.src, rule.dst, rule.ip_id),
            (
                "10.171.1.2".parse().unwrap(),
                "10.96.171.7".parse().unwrap(),
                14224
            )
        );
        assert_eq!(rule.rule.table, "ip kube-proxy");
        assert_eq!(
            rule.rule.chain,
            "endpoint-RFECL4T7-default/db/tcp/http__10.171.2.3/8080"
        );
        // Not a base chain's name but the hook it declares, once read;
        // and when it cannot be read, said so.
        assert_eq!(rule.rule.hook, "of base chain nat-prerouting (not read)");
        let mut canned = Canned::default();
        canned
            .hooks
            .insert("nat-prerouting".into(), "prerouting".into());
        let rules = rules_of(KUBE_PROXY_NFT, &mut canned);
        assert_eq!(rules[0].rule.hook, "prerouting");
        assert_eq!(
            rule.rule.rule,
            "meta l4proto tcp dnat to 10.171.2.3:8080 # handle 58"
        );
    }

    #[test]
    fn a_reject_through_a_verdict_map_names_the_lookup_and_its_element() {
        let trace = r#"trace id 63a446b6 ip kube-proxy filter-forward packet: iif "cni0" oif "eth0" ip saddr 10.171.1.2 ip daddr 10.96.171.9 ip id 62883 ip length 60 tcp sport 46352 tcp dport 80 tcp flags == syn
trace id 63a446b6 ip kube-proxy filter-forward rule ct state new jump service-endpoints-check # handle 35 (verdict jump service-endpoints-check)
trace id 63a446b6 ip kube-proxy service-endpoints-check rule ip daddr . meta l4proto . th dport vmap @no-endpoint-services # handle 44 (verdict goto reject-chain)
trace id 63a446b6 ip kube-proxy reject-chain rule reject # handle 54 (verdict drop)"#;
        let mut canned = Canned::default();
        canned.comments.insert(
            "no-endpoint-services 10.96.171.9 . tcp . 80".into(),
            "default/empty:http".into(),
        );
        canned
            .hooks
            .insert("filter-forward".into(), "forward".into());
        let rules = rules_of(trace, &mut canned);
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].rule.chain, "reject-chain");
        assert_eq!(rules[0].rule.hook, "forward");
        assert_eq!(
            rules[0].rule.rule,
            "reject # handle 54, reached by service-endpoints-check: ip daddr . meta l4proto . th dport vmap @no-endpoint-services # handle 44 on element 10.96.171.9 . tcp . 80 comment \"default/empty:http\""
        );
    }

    /// Recorded: a firewalld-style native `inet` table rejecting a pod pair.
    #[test]
    fn other_native_tables_are_named_the_same_way() {
        let trace = r#"trace id c7b07101 inet firewalld filter_FWD_public packet: iif "cni0" oif "flannel.1" ether saddr 8e:9b:38:30:42:e5 ether daddr 0a:58:0a:ab:01:01 ip saddr 10.171.1.2 ip daddr 10.171.2.3 ip dscp cs0 ip ecn not-ect ip ttl 63 ip id 48453 ip protocol tcp ip length 60 tcp sport 37302 tcp dport 8080 tcp flags == syn tcp window 64860
trace id c7b07101 inet firewalld filter_FWD_public rule ip daddr 10.171.2.3 tcp dport 8080 counter packets 0 bytes 0 reject with tcp reset comment "block db-1" # handle 2 (verdict drop)"#;
        let mut canned = Canned::default();
        canned
            .hooks
            .insert("filter_FWD_public".into(), "forward".into());
        let rules = rules_of(trace, &mut canned);
        assert_eq!(rules.len(), 1);
        let rule = &rules[0].rule;
        assert_eq!(
            (rule.table.as_str(), rule.chain.as_str(), rule.hook.as_str()),
            ("inet firewalld", "filter_FWD_public", "forward")
        );
        assert_eq!(
            rule.rule,
            r#"ip daddr 10.171.2.3 tcp dport 8080 counter reject with tcp reset comment "block db-1" # handle 2"#
        );
    }

    #[test]
    fn iptables_rules_keep_iptables_syntax_and_policies_are_named() {
        let trace = r#"trace id 974059b9 ip nat PREROUTING packet: iif "cni0" ip saddr 10.171.1.2 ip daddr 10.96.171.50 ip id 7 ip length 60 tcp sport 1 tcp dport 80
trace id 974059b9 ip nat PREROUTING rule meta l4proto tcp ip daddr 10.96.171.50  counter packets 0 bytes 0 dnat to 10.171.2.2:8080 # handle 4 (verdict accept)
trace id 1 ip filter FORWARD packet: iif "cni0" ip saddr 10.0.0.1 ip daddr 10.0.0.2 ip id 9 ip length 84
trace id 1 ip filter FORWARD rule ip saddr 10.0.0.1 counter packets 0 bytes 0 accept # handle 7 (verdict accept)
trace id 1 ip filter FORWARD policy drop"#;
        let mut canned = Canned::default();
        let dnat = r#"-A PREROUTING -d 10.96.171.50/32 -p tcp -m comment --comment "default/x:http" -j DNAT --to-destination 10.171.2.2:8080"#;
        canned
            .iptables
            .insert(("PREROUTING".into(), 4), dnat.into());
        let rules = rules_of(trace, &mut canned);
        assert_eq!(rules.len(), 2, "{rules:?}");
        assert_eq!(rules[0].rule.table, "nat");
        assert_eq!(rules[0].rule.rule, dnat);
        assert_eq!(rules[1].rule.table, "filter");
        assert_eq!(rules[1].rule.rule, "the policy of chain FORWARD (DROP)");
        assert_eq!(rules[1].ip_id, 9);
    }
}
