//! What a verdict names besides where the packet ended: the netfilter
//! rule that dropped it (or, unnamed, the hook it dropped it at), and the
//! Service and translations on its way.

use super::{
    conntrack::Mechanism,
    nat_steps::STALE_ENDPOINT,
    outcome::Outcome,
    policy::{read_policy, PolicyDirection},
    policy_api::from_api,
    policy_kube_network_policies::account_for_location,
    rule_text::rejection,
    rule_text::NatKind,
    Context, Story,
};
use crate::{
    decode::{hop::Direction, TunnelKind},
    model::netfilter::NetfilterRule,
    story::journey::NETFILTER_DROP,
};

/// Why the rule that dropped WireGuard's UDP packet is not named.
const ENCRYPTED_UNNAMED: &str = "rule tracing follows the traced packet's own header, which WireGuard's UDP packet carries encrypted";

/// How the packet entered the rule's table: its hook, and the base chain
/// where that is neither the rule's chain nor named after the hook (a
/// native table's base chains are named at will, and several may share a
/// hook at different priorities).
fn entered_by(rule: &NetfilterRule) -> String {
    let base = rule
        .path
        .first()
        .map(|step| step.chain.as_str())
        .filter(|base| *base != rule.chain && *base != rule.hook);
    match base {
        Some(base) => format!("hook {}, base chain {base}", rule.hook),
        None => format!("hook {}", rule.hook),
    }
}

impl Story {
    /// Whether the packet was dropped by a netfilter rule.
    pub fn netfilter_drop(&self) -> bool {
        matches!(&self.verdict.outcome, Outcome::Dropped { reason, .. } if reason == NETFILTER_DROP)
    }

    /// Names the netfilter rule that dropped the packet, or says why it
    /// cannot be named.
    pub(super) fn name_rule(&mut self, rule: Option<&NetfilterRule>, ctx: &Context) {
        match rule {
            Some(rule) => {
                // An INVALID rule's drop is told by `conntrack`.
                if let Some(why) = rejection(&rule.rule) {
                    self.verdict.summary = format!("{why}; {}", self.verdict.summary);
                }
                self.verdict.summary.push_str(&format!(
                    "; by table {} chain {} ({}): {}",
                    rule.table,
                    rule.chain,
                    entered_by(rule),
                    rule.rule
                ));
                self.verdict.netfilter = Some(rule.clone());
                self.name_policy(rule, ctx);
            }
            None => {
                let hook = self.netfilter_hook(ctx);
                let node = match &self.verdict.outcome {
                    Outcome::Dropped { node, .. } => ctx.rules_unseen.get(node),
                    _ => None,
                };
                let encrypted = (self.hops.last())
                    .and_then(|h| h.tunnel.as_ref())
                    .is_some_and(|t| t.kind == TunnelKind::Wireguard);
                let why = if encrypted {
                    ENCRYPTED_UNNAMED
                } else {
                    node.map_or(ctx.why_rule_unnamed, String::as_str)
                };
                self.verdict.summary.push_str(&format!(
                    "; dropped by netfilter at hook {hook}; the rule is not named: {why}"
                ));
                self.verdict.netfilter_hook = Some(hook.to_string());
            }
        }
    }

    /// Names the NetworkPolicy behind the drop, when the rules the packet
    /// went through are a policy enforcer's. The pod is the one the rules
    /// name, or else the packet's destination (ingress) or source (egress).
    /// The API's policies for that pod and direction join it.
    fn name_policy(&mut self, rule: &NetfilterRule, ctx: &Context) {
        let Some(mut policy) = read_policy(&rule.path) else {
            return;
        };
        if policy.pod.is_none() {
            policy.pod = match policy.direction {
                PolicyDirection::Ingress => self.dst_name.clone(),
                PolicyDirection::Egress => self.src_name.clone(),
                PolicyDirection::IngressOrEgress => None,
            };
        }
        if let Outcome::Dropped { location, .. } = &self.verdict.outcome {
            account_for_location(&mut policy, location);
        }
        self.verdict
            .summary
            .push_str(&format!("; {}", policy.text()));
        let (src, dst) = (self.src_name.as_deref(), self.dst_name.as_deref());
        policy.api = Some(from_api(&policy, src, dst, &ctx.policies));
        self.verdict.policy = Some(policy);
    }

    /// A drop that was conntrack's own verdict (no rule): the hook it
    /// runs at for that failure.
    pub(super) fn name_conntrack_verdict(&mut self, mechanism: Mechanism) {
        let hook = match mechanism {
            // Entries are confirmed at a packet's last hook.
            Mechanism::InsertFailed | Mechanism::SnatExhausted => "POSTROUTING or INPUT",
            // An entry is made at a packet's first hook.
            Mechanism::TableFull | Mechanism::Invalid => "PREROUTING or OUTPUT",
        };
        self.verdict.summary.push_str(&format!(
            "; dropped by conntrack at hook {hook}, by no rule"
        ));
        self.verdict.netfilter_hook = Some(hook.to_string());
    }

    /// Says which Service the packet went through, and where its
    /// addresses were translated: the destination (DNAT, un-DNAT) and
    /// the source (SNAT, MASQUERADE, un-SNAT).
    pub(super) fn name_translations(&mut self) {
        let mut said = Vec::new();
        for kind in [
            NatKind::Dnat,
            NatKind::UnDnat,
            NatKind::Masquerade,
            NatKind::Snat,
            NatKind::UnSnat,
        ] {
            let found = self
                .hops
                .iter()
                .find_map(|h| h.nat.iter().find(|s| s.kind == kind).map(|s| (h, s)));
            let Some((hop, step)) = found else {
                continue;
            };
            let service = step.service.as_deref().unwrap_or("a Service");
            let what = match kind {
                NatKind::Dnat => format!("through {service}: DNAT"),
                NatKind::UnDnat => format!("reply of {service}: un-DNAT"),
                NatKind::Masquerade => "source MASQUERADE".to_string(),
                NatKind::Snat => "source SNAT".to_string(),
                NatKind::UnSnat => "destination un-SNAT".to_string(),
            };
            let place = step.out_of_sight.as_ref().map_or_else(
                || {
                    format!(
                        "on {} (seen at {} {})",
                        hop.node,
                        hop.iface,
                        hop.direction.label()
                    )
                },
                |o| o.text(),
            );
            let stale = match (&step.service, step.unknown_endpoint) {
                (Some(service), true) => {
                    format!(", to none of {service}'s endpoints ({STALE_ENDPOINT}),")
                }
                _ => String::new(),
            };
            said.push(format!(
                "; {what} {} → {}{stale} {place}",
                step.before, step.after
            ));
        }
        self.verdict.summary.push_str(&said.concat());
    }

    /// The netfilter hook of a drop, from the packet alone: routed on the
    /// dropping node (TTL lower than when it arrived there) means FORWARD;
    /// first seen there leaving, or not seen arriving with one of the
    /// node's own addresses as its source, means the node sent it (to
    /// itself, when the destination is its own too: over lo, where any
    /// of the four hooks may have dropped it).
    fn netfilter_hook(&self, ctx: &Context) -> &'static str {
        let Some(last) = self.hops.last() else {
            return "unknown";
        };
        let arrived = self.hops.iter().find(|h| h.node == last.node);
        let own = |ip: std::net::IpAddr| {
            ctx.nodes
                .get(&*last.node)
                .is_some_and(|node| node.view.holds(ip))
        };
        let unseen_from_here = arrived.is_some_and(|first| first.direction == Direction::Drop);
        match arrived {
            Some(first) if last.ttl < first.ttl => "FORWARD",
            Some(first) if first.direction == Direction::Egress => "OUTPUT or POSTROUTING",
            // Sent to itself, over lo (no tc hook there): any of the four.
            _ if unseen_from_here && own(self.src) && own(self.dst) => {
                "OUTPUT, POSTROUTING, PREROUTING or INPUT"
            }
            _ if unseen_from_here && own(self.src) => "OUTPUT or POSTROUTING",
            _ => "PREROUTING or INPUT",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::netfilter::PathRule;

    #[test]
    fn a_native_tables_drop_names_its_base_chain_beside_the_hook() {
        let step = |chain: &str, verdict: &str| PathRule {
            table: "ip calico".into(),
            chain: chain.into(),
            rule: "…".into(),
            verdict: verdict.into(),
            target_head: None,
        };
        let mut rule = NetfilterRule {
            table: "ip calico".into(),
            chain: "filter-cali-tw-caliA".into(),
            hook: "forward".into(),
            rule: "drop # handle 9".into(),
            path: vec![
                step("filter-FORWARD", "jump filter-cali-tw-caliA"),
                step("filter-cali-tw-caliA", "drop"),
            ],
        };
        assert_eq!(entered_by(&rule), "hook forward, base chain filter-FORWARD");
        // Dropped in the base chain itself, or iptables' (named by hook).
        rule.path.remove(0);
        assert_eq!(entered_by(&rule), "hook forward");
        rule.path = vec![step("FORWARD", "jump KUBE-FORWARD")];
        rule.hook = "FORWARD".into();
        assert_eq!(entered_by(&rule), "hook FORWARD");
    }
}
