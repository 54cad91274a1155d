//! The path of rules a dropped packet matched, from the base chain it was
//! dropped in (a new `packet:` line of the trace, a new hook or table,
//! starts a new path), first to last, named the
//! way the drop's own rule is: iptables syntax in iptables-nft's tables,
//! `nft -a list` text elsewhere. A rule that sent the packet into another
//! chain also names that chain's first rule, whether the packet matched
//! it or not: Calico writes which policy a chain is in that rule's
//! comment, and a policy whose first rule did not match the packet still
//! selected the pod (the story reads policies from the path).

use serde::{Deserialize, Serialize};

use super::nft_trace::{is_iptables_table, table_name, RuleEvent, RuleLookup};

/// One rule the packet matched on its way to the drop.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct PathRule {
    /// As [`super::netfilter::NetfilterRule::table`] names it.
    pub table: String,
    pub chain: String,
    /// As the drop's own rule is named.
    pub rule: String,
    /// What the rule did with the packet, as nft traces it: `continue`
    /// (a rule without a verdict, such as a mark or a comment alone),
    /// `jump X`, `goto X`, `return`, `accept`, `drop`.
    pub verdict: String,
    /// For a jump or a goto: the first rule of the chain it went to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_head: Option<String>,
}

impl PathRule {
    /// The chain a jump or goto sent the packet to.
    pub fn target(&self) -> Option<&str> {
        self.verdict
            .strip_prefix("jump ")
            .or_else(|| self.verdict.strip_prefix("goto "))
            .map(str::trim)
    }
}

/// Names every rule of a traced packet's path.
pub(super) fn name_path(path: &[RuleEvent], rules: &mut dyn RuleLookup) -> Vec<PathRule> {
    path.iter()
        .map(|event| {
            let mut named = PathRule {
                table: table_name(&event.family, &event.table),
                chain: event.chain.clone(),
                rule: rule_text(event, rules),
                verdict: event.verdict.clone(),
                target_head: None,
            };
            if let Some(target) = named.target().map(str::to_string) {
                named.target_head = rules.chain_head(&event.family, &event.table, &target);
            }
            named
        })
        .collect()
}

fn rule_text(event: &RuleEvent, rules: &mut dyn RuleLookup) -> String {
    if is_iptables_table(&event.family, &event.table) {
        if let Some(line) =
            rules.iptables_rule(&event.family, &event.table, &event.chain, event.handle)
        {
            return line;
        }
    }
    format!("{} # handle {}", event.text, event.handle)
}

#[cfg(test)]
mod tests {
    use super::super::nft_trace::tests::{rules_of, Canned};

    /// Recorded shape of a Felix (nftables mode) workload's drop: the
    /// packet jumped into the policy chain, whose first rule did not
    /// match, and came back to the tier's end.
    #[test]
    fn a_drop_keeps_the_path_and_the_heads_of_the_chains_it_entered() {
        let trace = r#"trace id 0b1d ip calico filter-FORWARD packet: iif "eth0" oif "cali1a2b3c4d5e6" ip saddr 10.245.1.2 ip daddr 10.245.2.2 ip id 77 ip length 84 icmp type echo-request
trace id 0b1d ip calico filter-FORWARD rule counter jump filter-cali-to-wl-dispatch # handle 9 (verdict jump filter-cali-to-wl-dispatch)
trace id 0b1d ip calico filter-cali-to-wl-dispatch rule oifname "cali1a2b3c4d5e6" counter goto filter-cali-tw-cali1a2b3c4d5e6 # handle 12 (verdict goto filter-cali-tw-cali1a2b3c4d5e6)
trace id 0b1d ip calico filter-cali-tw-cali1a2b3c4d5e6 rule meta mark & 0x20000 == 0 counter jump filter-cali-pi-knp/default/backend-deny-ingress # handle 15 (verdict jump filter-cali-pi-knp/default/backend-deny-ingress)
trace id 0b1d ip calico filter-cali-tw-cali1a2b3c4d5e6 rule meta mark & 0x20000 == 0 counter drop comment "cali:abc; End of tier default. Drop if no policies passed packet" # handle 17 (verdict drop)"#;
        let mut canned = Canned::default();
        canned.heads.insert(
            "filter-cali-pi-knp/default/backend-deny-ingress".into(),
            r#"ip saddr @cali40s:x counter comment "cali:q; KubernetesNetworkPolicy default/backend-deny-ingress ingress" # handle 30"#.into(),
        );
        let rules = rules_of(trace, &mut canned);
        assert_eq!(rules.len(), 1, "{rules:?}");
        let path = &rules[0].rule.path;
        assert_eq!(path.len(), 4, "{path:?}");
        assert_eq!(path[0].table, "ip calico");
        assert_eq!(path[3].verdict, "drop");
        assert_eq!(
            path[2].target(),
            Some("filter-cali-pi-knp/default/backend-deny-ingress")
        );
        assert!(path[2]
            .target_head
            .as_deref()
            .is_some_and(|h| h.contains("KubernetesNetworkPolicy default/backend-deny-ingress")));
        assert!(path[3].rule.ends_with("# handle 17"));
    }

    #[test]
    fn a_translation_carries_no_path() {
        let trace = r#"trace id 1 ip nat PREROUTING packet: iif "cni0" ip saddr 10.171.1.2 ip daddr 10.96.171.50 ip id 7 ip length 60 tcp sport 1 tcp dport 80
trace id 1 ip nat PREROUTING rule meta l4proto tcp ip daddr 10.96.171.50 counter packets 0 bytes 0 dnat to 10.171.2.2:8080 # handle 4 (verdict accept)"#;
        let rules = rules_of(trace, &mut Canned::default());
        assert!(rules[0].rule.path.is_empty());
    }
}
