//! The NetworkPolicy behind a netfilter drop, read from the rules the
//! dropped packet matched (its traced path): which enforcer wrote the
//! rules, which policies selected the pod in that direction, and whether
//! a deny rule matched or nothing allowed the packet. One reader per
//! enforcer, each knowing how its renderer names chains and writes
//! comments (`policy_calico`, `policy_kube_router`,
//! `policy_kube_network_policies`); a drop whose path none recognises
//! names no policy.

pub use super::policy_verdict::{
    ApiFoundBy, ApiPolicies, Enforcer, PodSelection, PolicyDirection, PolicyOutcome, PolicyQueue,
    PolicyRef, PolicyVerdict, SelectingPolicy,
};
use crate::model::netfilter::PathRule;

/// The policy story of a drop whose path an enforcer's rules explain.
pub fn read_policy(path: &[PathRule]) -> Option<PolicyVerdict> {
    super::policy_calico::read(path)
        .or_else(|| super::policy_kube_router::read(path))
        .or_else(|| super::policy_kube_network_policies::read(path))
}

impl PolicyVerdict {
    /// The verdict in words, for the summary.
    pub fn text(&self) -> String {
        let pod = self.pod.as_deref().unwrap_or("the pod");
        let dir = self.direction.label();
        let names = self
            .policies
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let by = match self.enforcer {
            Enforcer::Calico => match &self.tier {
                Some(tier) => format!("Calico, tier {tier}"),
                None => "Calico".to_string(),
            },
            Enforcer::KubeRouter => "kube-router".to_string(),
            Enforcer::KubeNetworkPolicies => "kube-network-policies".to_string(),
        };
        let said = match (self.outcome, self.policies.len()) {
            (PolicyOutcome::NoPolicyAllowed, 0) => {
                format!("policies select {pod} for {dir} and none allowed this packet")
            }
            (PolicyOutcome::NoPolicyAllowed, 1) => {
                format!("{names} selects {pod} for {dir} and allows nothing this packet matches")
            }
            (PolicyOutcome::NoPolicyAllowed, _) => {
                format!("{names} select {pod} for {dir} and none allows this packet")
            }
            (PolicyOutcome::DeniedByRule, _) => {
                let policy = self.policies.last().map_or("a policy", |p| p.name.as_str());
                format!("a deny rule of {policy} (selecting {pod} for {dir}) matched this packet")
            }
            (PolicyOutcome::NoProfileAllowed, 0) => {
                format!("no policy selects {pod} for {dir}, and no profile allowed this packet")
            }
            (PolicyOutcome::NoProfileAllowed, _) => format!(
                "no policy selects {pod} for {dir}, and its profiles ({names}) allow nothing this packet matches"
            ),
            // A queue's story (kube-network-policies) is its own.
            (PolicyOutcome::DroppedByEngine | PolicyOutcome::EngineUnreachable, _) => {
                return super::policy_kube_network_policies::text(self);
            }
        };
        format!("NetworkPolicy: {said} ({by})")
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::story::policy_verdict::comments;

    #[test]
    fn comments_are_read_in_iptables_and_nft_syntax() {
        assert_eq!(
            comments(
                r#"-A cali-tw-x -m comment --comment "cali:s4tX" -m comment --comment "End of tier default. Drop if no policies passed packet" -j DROP"#
            ),
            [
                "cali:s4tX",
                "End of tier default. Drop if no policies passed packet"
            ]
        );
        assert_eq!(
            comments(
                r#"meta mark & 0x20000 == 0 counter drop comment "cali:abc; End of tier default. Drop if no policies passed packet" # handle 17"#
            ),
            [
                "cali:abc",
                "End of tier default. Drop if no policies passed packet"
            ]
        );
        assert_eq!(
            comments("-A X -m comment --comment cali:abc -j DROP"),
            ["cali:abc"]
        );
    }

    /// A ping web-0 → db-0 dropped on node-2 by netfilter, freed in
    /// `location`: the recorded hops of a policy drop.
    pub(in crate::story) fn ping_dropped_on_node_2(
        location: &str,
    ) -> crate::story::journey::Journey {
        use crate::{
            decode::{hop::tests::drop_hop, tests as frames},
            node::interfaces::Role,
            story::{journey::NETFILTER_DROP, tests::sample_journey},
        };
        let mut journey = sample_journey();
        journey.hops.truncate(6);
        let routed = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 62, 1);
        let mut dropped = drop_hop(
            11_000,
            "node-2",
            "cni0",
            Role::Bridge,
            &routed,
            NETFILTER_DROP,
        );
        dropped.drop.as_mut().expect("a drop").location = location.into();
        journey.hops.push(dropped);
        journey
    }

    /// A ping to db-0 dropped on node-2 by Felix's end of tier: the
    /// story names the policy, with the pod the packet was for.
    #[test]
    fn a_story_of_a_policy_drop_names_the_policy_and_the_pod() {
        use crate::{
            model::netfilter::NetfilterRule,
            story::{tell, Context},
        };
        let mut journey = ping_dropped_on_node_2("nf_hook_slow+0x9c");
        let path = super::super::policy_calico::tests::iptables_path();
        journey.rule = Some(NetfilterRule {
            table: "filter".into(),
            chain: "cali-tw-cali76f017e6feb".into(),
            hook: "FORWARD".into(),
            rule: path.last().unwrap().rule.clone(),
            path,
        });
        let mut ctx = Context::default();
        ctx.names
            .insert("10.244.2.2".parse().unwrap(), "default/db-0".into());
        let story = tell(&journey, &ctx);
        let policy = story.verdict.policy.expect("the policy");
        assert_eq!(policy.pod.as_deref(), Some("default/db-0"));
        assert!(
            story.verdict.summary.ends_with("; NetworkPolicy: default/backend-deny-ingress selects default/db-0 for ingress and allows nothing this packet matches (Calico, tier default)"),
            "{}",
            story.verdict.summary
        );
    }

    #[test]
    fn the_text_names_policy_pod_direction_and_enforcer() {
        let verdict = PolicyVerdict {
            enforcer: Enforcer::Calico,
            direction: PolicyDirection::Ingress,
            pod: Some("default/db-0".into()),
            policies: vec![PolicyRef {
                kind: "KubernetesNetworkPolicy".into(),
                name: "default/backend-deny-ingress".into(),
                chain: "cali-pi-_3SjGCfk6HPOX91Gip1T".into(),
            }],
            tier: Some("default".into()),
            outcome: PolicyOutcome::NoPolicyAllowed,
            queue: None,
            api: None,
        };
        assert_eq!(
            verdict.text(),
            "NetworkPolicy: default/backend-deny-ingress selects default/db-0 for ingress and allows nothing this packet matches (Calico, tier default)"
        );
        let json = serde_json::to_value(&verdict).unwrap();
        assert_eq!(json["enforcer"], "calico");
        assert_eq!(json["outcome"], "no_policy_allowed");
        assert_eq!(json["policies"][0]["chain"], "cali-pi-_3SjGCfk6HPOX91Gip1T");
    }
}
