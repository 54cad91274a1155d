//! kube-router's policy rules (pkg/controllers/netpol, iptables mode): a
//! packet to or from a local pod goes from `KUBE-ROUTER-FORWARD` (or
//! -INPUT, -OUTPUT) to the pod's `KUBE-POD-FW-<hash>` chain, which jumps
//! to each policy selecting the pod (`KUBE-NWPLCY-<hash>`; the
//! `KUBE-NWPLCY-DEFAULT` chain when none does) and then rejects what no
//! policy marked as allowed. kube-router has no deny rules.
//!
//! Comments name pod and policy. Releases up to v2.9: "rule to jump
//! traffic destined to POD name:<pod> namespace: <ns> to chain …" (`from
//! POD` for egress), "run through nw policy <name>" (the policy is in the
//! pod's namespace), "rule to REJECT traffic destined for POD name:<pod>
//! namespace: <ns>". Later: `<ns>/<pod> in`, `<ns>/<pod> out`,
//! `<ns>/<policy> policy`, `<ns>/<pod> reject`.

use super::policy_verdict::{
    comments, Enforcer, PolicyDirection, PolicyOutcome, PolicyRef, PolicyVerdict,
};
use crate::model::netfilter::PathRule;

const POD_CHAIN: &str = "KUBE-POD-FW-";
const POLICY_CHAIN: &str = "KUBE-NWPLCY-";
/// kube-router's own policy chains, not a NetworkPolicy's.
const OWN_CHAINS: [&str; 2] = ["KUBE-NWPLCY-DEFAULT", "KUBE-NWPLCY-COMMON"];

/// Reads a path that ends in the reject of a pod's firewall chain.
pub(super) fn read(path: &[PathRule]) -> Option<PolicyVerdict> {
    let last = path.last().filter(|r| r.verdict == "drop")?;
    if !last.chain.starts_with(POD_CHAIN) {
        return None;
    }
    let pod = comments(&last.rule).iter().find_map(|c| rejected_pod(c))?;
    let into = path
        .iter()
        .rev()
        .find(|r| r.target() == Some(last.chain.as_str()))?;
    let direction = comments(&into.rule)
        .iter()
        .find_map(|c| jump_direction(c))?;
    let namespace = pod.split_once('/').map_or("", |(ns, _)| ns).to_string();
    let policies = path
        .iter()
        .filter(|r| r.chain == last.chain)
        .filter_map(|r| policy_of(r, &namespace))
        .collect();
    Some(PolicyVerdict {
        enforcer: Enforcer::KubeRouter,
        direction,
        pod: Some(pod),
        policies,
        tier: None,
        outcome: PolicyOutcome::NoPolicyAllowed,
        queue: None,
        api: None,
    })
}

/// The pod of the pod chain's reject rule, `namespace/name`.
fn rejected_pod(comment: &str) -> Option<String> {
    if let Some(rest) = comment.strip_prefix("rule to REJECT traffic destined for POD ") {
        return pod_named(rest);
    }
    comment
        .strip_suffix(" reject")
        .filter(|pod| pod.contains('/'))
        .map(str::to_string)
}

/// `name:db-0 namespace: default…` → `default/db-0`.
fn pod_named(text: &str) -> Option<String> {
    let (name, rest) = text.strip_prefix("name:")?.split_once(" namespace: ")?;
    let namespace = rest.split(' ').next()?;
    Some(format!("{namespace}/{name}"))
}

/// Which way the jump into the pod's chain was: to the pod (its ingress)
/// or from it (its egress).
fn jump_direction(comment: &str) -> Option<PolicyDirection> {
    if comment.starts_with("rule to jump traffic destined to POD ") || comment.ends_with(" in") {
        Some(PolicyDirection::Ingress)
    } else if comment.starts_with("rule to jump traffic from POD ") || comment.ends_with(" out") {
        Some(PolicyDirection::Egress)
    } else {
        None
    }
}

/// A jump of the pod's chain to a NetworkPolicy's chain.
fn policy_of(rule: &PathRule, namespace: &str) -> Option<PolicyRef> {
    let target = rule.target()?;
    if !target.starts_with(POLICY_CHAIN) || OWN_CHAINS.contains(&target) {
        return None;
    }
    let name = comments(&rule.rule).iter().find_map(|c| {
        if let Some(policy) = c.strip_prefix("run through nw policy ") {
            return Some(format!("{namespace}/{policy}"));
        }
        c.strip_suffix(" policy")
            .filter(|p| p.contains('/'))
            .map(str::to_string)
    });
    Some(PolicyRef {
        kind: "NetworkPolicy".into(),
        name: name.unwrap_or_else(|| target.to_string()),
        chain: target.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::story::policy::read_policy;

    fn rule(chain: &str, rule: &str, verdict: &str) -> PathRule {
        PathRule {
            table: "filter".into(),
            chain: chain.into(),
            rule: rule.into(),
            verdict: verdict.into(),
            target_head: None,
        }
    }

    const POD_FW: &str = "KUBE-POD-FW-4KUQGIPWCNTMSGHV";
    const NWPLCY: &str = "KUBE-NWPLCY-C3FKFHHD6YPGKRJD";

    /// kube-router v2.x, for db-0 (10.244.2.2) whose ingress
    /// `backend-deny-ingress` selects, as iptables-nft's tables name it.
    fn v2_path() -> Vec<PathRule> {
        vec![
            rule(
                "FORWARD",
                r#"-A FORWARD -m comment --comment "kube-router netpol - TEMCG2JMHZYE7H7T" -j KUBE-ROUTER-FORWARD"#,
                "jump KUBE-ROUTER-FORWARD",
            ),
            rule(
                "KUBE-ROUTER-FORWARD",
                &format!(
                    r#"-A KUBE-ROUTER-FORWARD -d 10.244.2.2/32 -m comment --comment "rule to jump traffic destined to POD name:db-0 namespace: default to chain {POD_FW}" -j {POD_FW}"#
                ),
                &format!("jump {POD_FW}"),
            ),
            rule(
                POD_FW,
                r#"-A KUBE-POD-FW-4KUQGIPWCNTMSGHV -m comment --comment "common bi-directional traffic policy rules" -j KUBE-NWPLCY-COMMON"#,
                "jump KUBE-NWPLCY-COMMON",
            ),
            rule(
                POD_FW,
                &format!(
                    r#"-A {POD_FW} -d 10.244.2.2/32 -m comment --comment "run through nw policy backend-deny-ingress" -j {NWPLCY}"#
                ),
                &format!("jump {NWPLCY}"),
            ),
            rule(
                POD_FW,
                r#"-A KUBE-POD-FW-4KUQGIPWCNTMSGHV -m comment --comment "rule to log dropped traffic POD name:db-0 namespace: default" -m mark ! --mark 0x10000/0x10000 -j NFLOG --nflog-group 100 --nflog-threshold 1 -m limit --limit 10/min"#,
                "continue",
            ),
            rule(
                POD_FW,
                r#"-A KUBE-POD-FW-4KUQGIPWCNTMSGHV -m comment --comment "rule to REJECT traffic destined for POD name:db-0 namespace: default" -m mark ! --mark 0x10000/0x10000 -j REJECT --reject-with icmp-port-unreachable"#,
                "drop",
            ),
        ]
    }

    #[test]
    fn kube_router_v2_names_the_policy_and_the_pod() {
        let verdict = read_policy(&v2_path()).expect("a kube-router drop");
        assert_eq!(
            verdict,
            PolicyVerdict {
                enforcer: Enforcer::KubeRouter,
                direction: PolicyDirection::Ingress,
                pod: Some("default/db-0".into()),
                policies: vec![PolicyRef {
                    kind: "NetworkPolicy".into(),
                    name: "default/backend-deny-ingress".into(),
                    chain: NWPLCY.into(),
                }],
                tier: None,
                outcome: PolicyOutcome::NoPolicyAllowed,
                queue: None,
                api: None,
            }
        );
        assert!(verdict.text().contains(
            "default/backend-deny-ingress selects default/db-0 for ingress and allows nothing this packet matches (kube-router)"
        ));
    }

    #[test]
    fn newer_kube_router_comments_are_read_too() {
        let path = vec![
            rule(
                "KUBE-ROUTER-FORWARD",
                &format!(
                    r#"-A KUBE-ROUTER-FORWARD -s 10.244.1.2/32 -m comment --comment "default/web-0 out" -j {POD_FW}"#
                ),
                &format!("jump {POD_FW}"),
            ),
            rule(
                POD_FW,
                &format!(
                    r#"-A {POD_FW} -s 10.244.1.2/32 -m comment --comment "default/web-egress policy" -j {NWPLCY}"#
                ),
                &format!("jump {NWPLCY}"),
            ),
            rule(
                POD_FW,
                &format!(
                    r#"-A {POD_FW} -m comment --comment "default/web-0 reject" -m mark ! --mark 0x10000/0x10000 -j REJECT"#
                ),
                "drop",
            ),
        ];
        let verdict = read_policy(&path).unwrap();
        assert_eq!(verdict.direction, PolicyDirection::Egress);
        assert_eq!(verdict.pod.as_deref(), Some("default/web-0"));
        assert_eq!(verdict.policies[0].name, "default/web-egress");
    }

    #[test]
    fn its_own_chains_are_no_policy() {
        let mut path = v2_path();
        path.remove(3);
        let verdict = read_policy(&path).unwrap();
        assert!(verdict.policies.is_empty(), "{verdict:?}");
    }
}
