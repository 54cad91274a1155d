//! Calico's policy rules, as Felix renders them (felix/rules: policy.go,
//! endpoints.go), in iptables mode (chains `cali-tw-<veth>` to a
//! workload, `cali-fw-<veth>` from it) and in nftables mode (table
//! `calico`, the same chains with their layer's prefix:
//! `filter-cali-tw-<veth>`).
//!
//! A workload's chain runs each tier: "Start of tier T", a jump to each
//! policy's chain (`cali-pi-…` ingress, `cali-po-…` egress; through a
//! policy group's `cali-gi-`/`cali-go-` chain when several policies share
//! a selector), then "End of tier T. Drop if no policies passed packet".
//! A policy chain's first rule carries its comment: `<Kind>
//! <namespace>/<name> ingress` (older Felix: `Policy
//! <namespace>/knp.default.<name> ingress`). A deny rule drops inside the
//! policy's chain. With no policy, the profiles (`cali-pri-kns.<ns>`,
//! `cali-pri-ksa.<ns>.<sa>`, comment `Profile <name> ingress`) run, then
//! "Drop if no profiles matched".

use super::policy_verdict::{
    comments, Enforcer, PolicyDirection, PolicyOutcome, PolicyRef, PolicyVerdict,
};
use crate::model::netfilter::PathRule;

/// Reads a path that ends in a drop by Felix's rules.
pub(super) fn read(path: &[PathRule]) -> Option<PolicyVerdict> {
    let last = path.last().filter(|r| r.verdict == "drop")?;
    let chain = felix_chain(&last.chain)?;
    let said = comments(&last.rule);
    let (direction, outcome) = if let Some(dir) = policy_direction(chain) {
        (dir, PolicyOutcome::DeniedByRule)
    } else {
        let dir = endpoint_direction(chain)?;
        if said
            .iter()
            .any(|c| c.ends_with("if no policies passed packet"))
        {
            (dir, PolicyOutcome::NoPolicyAllowed)
        } else if said.iter().any(|c| c.ends_with("if no profiles matched")) {
            (dir, PolicyOutcome::NoProfileAllowed)
        } else {
            return None;
        }
    };
    let wanted = match outcome {
        PolicyOutcome::NoProfileAllowed => profile_prefix(direction)?,
        _ => policy_prefix(direction)?,
    };
    let policies = entered(path, wanted);
    let tier = said
        .iter()
        .find_map(|c| c.strip_prefix("End of tier "))
        .and_then(|t| t.split_once(". "))
        .map(|(tier, _)| tier.to_string())
        .or_else(|| last_tier_started(path))
        .filter(|_| outcome != PolicyOutcome::NoProfileAllowed);
    Some(PolicyVerdict {
        enforcer: Enforcer::Calico,
        direction,
        pod: None,
        policies,
        tier,
        outcome,
        queue: None,
        api: None,
    })
}

/// A chain name without nftables mode's layer prefix (`filter-`).
fn felix_chain(chain: &str) -> Option<&str> {
    chain.find("cali-").map(|at| &chain[at..])
}

fn policy_direction(chain: &str) -> Option<PolicyDirection> {
    [PolicyDirection::Ingress, PolicyDirection::Egress]
        .into_iter()
        .find(|&d| policy_prefix(d).is_some_and(|prefix| chain.starts_with(prefix)))
}

/// To a workload is its ingress; from it, its egress.
fn endpoint_direction(chain: &str) -> Option<PolicyDirection> {
    if chain.starts_with("cali-tw-") {
        Some(PolicyDirection::Ingress)
    } else if chain.starts_with("cali-fw-") {
        Some(PolicyDirection::Egress)
    } else {
        None
    }
}

/// Felix's chains each have one direction.
fn policy_prefix(direction: PolicyDirection) -> Option<&'static str> {
    match direction {
        PolicyDirection::Ingress => Some("cali-pi-"),
        PolicyDirection::Egress => Some("cali-po-"),
        PolicyDirection::IngressOrEgress => None,
    }
}

fn profile_prefix(direction: PolicyDirection) -> Option<&'static str> {
    match direction {
        PolicyDirection::Ingress => Some("cali-pri-"),
        PolicyDirection::Egress => Some("cali-pro-"),
        PolicyDirection::IngressOrEgress => None,
    }
}

/// The chains starting with `prefix` the packet was sent into, once
/// each, named by their first rule's comment (or by a comment of a rule
/// of theirs it matched).
fn entered(path: &[PathRule], prefix: &str) -> Vec<PolicyRef> {
    let mut found: Vec<PolicyRef> = Vec::new();
    for rule in path {
        let Some(target) = rule.target() else {
            continue;
        };
        let Some(chain) = felix_chain(target).filter(|c| c.starts_with(prefix)) else {
            continue;
        };
        if found.iter().any(|p| p.chain == target) {
            continue;
        }
        let named = rule
            .target_head
            .iter()
            .chain(path.iter().filter(|r| r.chain == target).map(|r| &r.rule))
            .flat_map(|text| comments(text))
            .find_map(|c| policy_named(&c));
        let (kind, name) = named.unwrap_or_else(|| {
            // Unnamed (its rules could not be read): the chain says what
            // Felix hashed, not the name.
            ("unknown".to_string(), chain.to_string())
        });
        found.push(PolicyRef {
            kind,
            name,
            chain: target.to_string(),
        });
    }
    found
}

/// `KubernetesNetworkPolicy default/x ingress` → (kind, name); older
/// Felix's `Policy default/knp.default.x ingress` → the same; `Profile
/// kns.default ingress` → (Profile, kns.default).
fn policy_named(comment: &str) -> Option<(String, String)> {
    let mut words = comment.split(' ');
    let (kind, name, dir) = (words.next()?, words.next()?, words.next()?);
    if words.next().is_some() || !matches!(dir, "ingress" | "egress") {
        return None;
    }
    if kind != "Policy" {
        let known = kind.ends_with("NetworkPolicy") || kind == "Profile";
        return known.then(|| (kind.to_string(), name.to_string()));
    }
    Some(match name.split_once('/') {
        Some((ns, policy)) => match policy.strip_prefix("knp.default.") {
            Some(k8s) => ("KubernetesNetworkPolicy".into(), format!("{ns}/{k8s}")),
            None => ("NetworkPolicy".into(), name.to_string()),
        },
        None => ("GlobalNetworkPolicy".into(), name.to_string()),
    })
}

/// The tier whose "Start of tier" mark the packet passed last.
fn last_tier_started(path: &[PathRule]) -> Option<String> {
    path.iter()
        .rev()
        .flat_map(|r| comments(&r.rule))
        .find_map(|c| c.strip_prefix("Start of tier ").map(str::to_string))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::story::policy::read_policy;

    fn rule(chain: &str, rule: &str, verdict: &str, head: Option<&str>) -> PathRule {
        PathRule {
            table: "filter".into(),
            chain: chain.into(),
            rule: rule.into(),
            verdict: verdict.into(),
            target_head: head.map(str::to_string),
        }
    }

    const TW: &str = "cali-tw-cali76f017e6feb";
    const PI: &str = "cali-pi-_3SjGCfk6HPOX91Gip1T";
    const HEAD: &str = r#"-A cali-pi-_3SjGCfk6HPOX91Gip1T -m comment --comment "cali:R3Bg4XQlcMCzJfMa" -m comment --comment "KubernetesNetworkPolicy default/backend-deny-ingress ingress""#;

    /// Felix (iptables mode) for a pod whose ingress is selected by a
    /// NetworkPolicy without rules, as iptables-nft's tables name it.
    pub(in crate::story) fn iptables_path() -> Vec<PathRule> {
        vec![
            rule(
                "FORWARD",
                r#"-A FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD"#,
                "jump cali-FORWARD",
                None,
            ),
            rule(
                "cali-FORWARD",
                r#"-A cali-FORWARD -m comment --comment "cali:vjrMJCRpqwy5oRoX" -j MARK --set-xmark 0x0/0xe0000"#,
                "continue",
                None,
            ),
            rule(
                "cali-FORWARD",
                r#"-A cali-FORWARD -o cali+ -m comment --comment "cali:8ZoYfO5HKXWbB3pk" -j cali-to-wl-dispatch"#,
                "jump cali-to-wl-dispatch",
                None,
            ),
            rule(
                "cali-to-wl-dispatch",
                r#"-A cali-to-wl-dispatch -o cali76f017e6feb -m comment --comment "cali:lSj8x5fXYVtbL3Kq" -g cali-tw-cali76f017e6feb"#,
                "goto cali-tw-cali76f017e6feb",
                None,
            ),
            rule(
                TW,
                r#"-A cali-tw-cali76f017e6feb -m comment --comment "cali:2eEWKPJdmEBKINUF" -j MARK --set-xmark 0x0/0x10000"#,
                "continue",
                None,
            ),
            rule(
                TW,
                r#"-A cali-tw-cali76f017e6feb -m comment --comment "cali:wcHQ6Nl1vEgMO3zh" -m comment --comment "Start of tier default" -j MARK --set-xmark 0x0/0x20000"#,
                "continue",
                None,
            ),
            rule(
                TW,
                r#"-A cali-tw-cali76f017e6feb -m comment --comment "cali:Gz8T5Oshy9sdhsQ9" -m mark --mark 0x0/0x20000 -j cali-pi-_3SjGCfk6HPOX91Gip1T"#,
                &format!("jump {PI}"),
                Some(HEAD),
            ),
            rule(PI, HEAD, "continue", None),
            rule(
                TW,
                r#"-A cali-tw-cali76f017e6feb -m comment --comment "cali:9RJKa0VgLHeVw5Ar" -m mark --mark 0x0/0x20000 -m comment --comment "End of tier default. Drop if no policies passed packet" -j DROP"#,
                "drop",
                None,
            ),
        ]
    }

    fn backend_deny_ingress(chain: &str) -> PolicyRef {
        PolicyRef {
            kind: "KubernetesNetworkPolicy".into(),
            name: "default/backend-deny-ingress".into(),
            chain: chain.into(),
        }
    }

    #[test]
    fn felix_iptables_end_of_tier_names_the_policy_that_selected_the_pod() {
        let verdict = read_policy(&iptables_path()).expect("a Calico drop");
        assert_eq!(
            verdict,
            PolicyVerdict {
                enforcer: Enforcer::Calico,
                direction: PolicyDirection::Ingress,
                pod: None,
                policies: vec![backend_deny_ingress(PI)],
                tier: Some("default".into()),
                outcome: PolicyOutcome::NoPolicyAllowed,
                queue: None,
                api: None,
            }
        );
    }

    #[test]
    fn a_policy_whose_first_rule_did_not_match_is_named_by_its_head() {
        let mut path = iptables_path();
        path.remove(7);
        let verdict = read_policy(&path).unwrap();
        assert_eq!(verdict.policies, [backend_deny_ingress(PI)]);
        // Its head unreadable too: the chain is said, the name is not made up.
        path[6].target_head = None;
        let verdict = read_policy(&path).unwrap();
        assert_eq!(verdict.policies[0].kind, "unknown");
        assert_eq!(verdict.policies[0].name, PI);
    }

    /// Felix (nftables mode): table `ip calico`, layer-prefixed chains,
    /// hash and comments in one nft comment.
    #[test]
    fn felix_nftables_mode_is_read_the_same() {
        let tw = "filter-cali-tw-cali76f017e6feb";
        let pi = "filter-cali-pi-knp/default/backend-deny-ingress";
        let head = r#"counter comment "cali:R3Bg4XQlcMCzJfMa; KubernetesNetworkPolicy default/backend-deny-ingress ingress" # handle 41"#;
        let path = vec![
            rule(
                "filter-FORWARD",
                "counter jump filter-cali-FORWARD # handle 3",
                "jump filter-cali-FORWARD",
                None,
            ),
            rule(
                "filter-cali-FORWARD",
                r#"oifname vmap @filter-cali-to-wl-dispatch comment "cali:8ZoYfO5HKXWbB3pk;" # handle 9"#,
                &format!("goto {tw}"),
                None,
            ),
            rule(
                tw,
                r#"counter meta mark set mark & 0xfffdffff comment "cali:wcHQ6Nl1vEgMO3zh; Start of tier default" # handle 20"#,
                "continue",
                None,
            ),
            rule(
                tw,
                &format!("meta mark & 0x20000 == 0 counter jump {pi} # handle 21"),
                &format!("jump {pi}"),
                Some(head),
            ),
            rule(pi, head, "continue", None),
            rule(
                tw,
                r#"meta mark & 0x20000 == 0 counter drop comment "cali:9RJKa0VgLHeVw5Ar; End of tier default. Drop if no policies passed packet" # handle 23"#,
                "drop",
                None,
            ),
        ];
        let verdict = read_policy(&path).expect("a Calico drop");
        assert_eq!(verdict.policies, [backend_deny_ingress(pi)]);
        assert_eq!(verdict.tier.as_deref(), Some("default"));
        assert_eq!(verdict.outcome, PolicyOutcome::NoPolicyAllowed);
    }

    #[test]
    fn a_deny_rule_in_a_policy_chain_is_a_denial_by_that_policy() {
        let po = "cali-po-_Zq0kM9wWuXgTvYc4Hh1E";
        let head = r#"-A cali-po-_Zq0kM9wWuXgTvYc4Hh1E -m comment --comment "cali:Jd2PV7dqvKgkAoGc" -m comment --comment "NetworkPolicy default/no-db egress" -d 10.245.2.2/32 -j DROP"#;
        let fw = "cali-fw-cali1a2b3c4d5e6";
        let path = vec![
            rule(
                fw,
                r#"-A cali-fw-cali1a2b3c4d5e6 -m comment --comment "cali:abc" -m comment --comment "Start of tier security" -j MARK --set-xmark 0x0/0x20000"#,
                "continue",
                None,
            ),
            rule(
                fw,
                &format!(
                    r#"-A {fw} -m comment --comment "cali:d" -m mark --mark 0x0/0x20000 -j {po}"#
                ),
                &format!("jump {po}"),
                Some(head),
            ),
            rule(po, head, "drop", None),
        ];
        let verdict = read_policy(&path).unwrap();
        assert_eq!(verdict.direction, PolicyDirection::Egress);
        assert_eq!(verdict.outcome, PolicyOutcome::DeniedByRule);
        assert_eq!(verdict.tier.as_deref(), Some("security"));
        assert_eq!(verdict.policies[0].name, "default/no-db");
        assert_eq!(verdict.policies[0].kind, "NetworkPolicy");
    }

    #[test]
    fn no_policy_and_no_profile_allowing_names_the_profiles() {
        let pri = "cali-pri-kns.default";
        let head = r#"-A cali-pri-kns.default -m comment --comment "cali:7T0w8B9pz2DpUjPw" -m comment --comment "Profile kns.default ingress" -j MARK --set-xmark 0x10000/0x10000"#;
        let path = vec![
            rule(
                TW,
                &format!(r#"-A {TW} -m comment --comment "cali:x" -j {pri}"#),
                &format!("jump {pri}"),
                Some(head),
            ),
            rule(
                TW,
                &format!(
                    r#"-A {TW} -m comment --comment "cali:s4tXYq2MQ2b8zM1b" -m comment --comment "Drop if no profiles matched" -j DROP"#
                ),
                "drop",
                None,
            ),
        ];
        let verdict = read_policy(&path).unwrap();
        assert_eq!(verdict.outcome, PolicyOutcome::NoProfileAllowed);
        assert_eq!(verdict.policies[0].kind, "Profile");
        assert_eq!(verdict.policies[0].name, "kns.default");
        assert_eq!(verdict.tier, None);
    }

    #[test]
    fn older_felix_policy_comments_are_understood() {
        assert_eq!(
            policy_named("Policy default/knp.default.backend-deny-ingress ingress"),
            Some((
                "KubernetesNetworkPolicy".into(),
                "default/backend-deny-ingress".into()
            ))
        );
        assert_eq!(
            policy_named("GlobalNetworkPolicy default.deny-all egress"),
            Some(("GlobalNetworkPolicy".into(), "default.deny-all".into()))
        );
        assert_eq!(policy_named("Start of tier default"), None);
    }

    #[test]
    fn other_drops_are_no_calico_policy() {
        let path = vec![rule(
            "FORWARD",
            "-A FORWARD -s 10.0.0.1/32 -j DROP",
            "drop",
            None,
        )];
        assert_eq!(read(&path), None);
    }
}
