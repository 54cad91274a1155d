//! kube-network-policies' rules (sigs.k8s.io/kube-network-policies,
//! pkg/dataplane): one `inet kube-network-policies` table whose base
//! chains (`postrouting` at srcnat - 5, `input` at srcnat + 1, and
//! `prerouting` for DNS when its netfilter-bug workaround is on) accept
//! what needs no decision (node-local ICMPv6, root's own sockets,
//! connections the engine already labelled) and queue the rest to its
//! userspace engine: `ip saddr @podips-v4 queue to 98`, then `ip daddr
//! @podips-v4 …` (the sets hold the IPs of pods some policy selects; a
//! bare `queue` when admin policies make it divert everything). The
//! engine reads the queue and answers accept or drop per packet, so the
//! rules name no policy: what the kernel shows is the queue, whether it
//! has a bypass (`--fail-open`, the default, renders `flags bypass`),
//! which side of the packet made it queued, and where it was freed
//! (`nf_queue`: nothing took it from the queue; else the engine's drop).

use super::policy_verdict::{Enforcer, PolicyDirection, PolicyOutcome, PolicyQueue, PolicyVerdict};
use crate::model::netfilter::{PathRule, QueueFate, QueueStatement};

/// The table its controller writes unless told another name.
const TABLE: &str = "inet kube-network-policies";
/// The sets of pod IPs its queue rules look up.
const POD_SETS: [&str; 2] = ["@podips-v4", "@podips-v6"];

/// Reads a path that ends in kube-network-policies' queue rule.
pub(super) fn read(path: &[PathRule]) -> Option<PolicyVerdict> {
    let last = path.last()?;
    let queue = queue_of(&last.rule).filter(|_| last.verdict.starts_with("queue"))?;
    if last.table != TABLE && !POD_SETS.iter().any(|set| last.rule.contains(set)) {
        return None;
    }
    Some(PolicyVerdict {
        enforcer: Enforcer::KubeNetworkPolicies,
        direction: direction(&last.chain, &last.rule),
        pod: None,
        policies: Vec::new(),
        tier: None,
        // Which of the two it is, the drop's location tells.
        outcome: PolicyOutcome::DroppedByEngine,
        queue: Some(queue),
        api: None,
    })
}

/// A queued packet freed in `nf_queue` never reached the engine.
pub(super) fn account_for_location(policy: &mut PolicyVerdict, location: &str) {
    if policy.queue.is_some() && QueueFate::of(location) == Some(QueueFate::Unread) {
        policy.outcome = PolicyOutcome::EngineUnreachable;
    }
}

/// The rule's queue, as its verdict says it (the first of a fanout).
fn queue_of(rule: &str) -> Option<PolicyQueue> {
    let statement = QueueStatement::of_nft(rule)?;
    Some(PolicyQueue {
        number: statement.first,
        bypass: statement.bypass,
    })
}

/// The source's set sends a packet to the engine whichever side a
/// policy selects (the engine checks both); the destination's set only
/// when no policy selects the source (its rule comes second), so for the
/// destination's ingress; `input` holds pods' packets to the node.
fn direction(chain: &str, rule: &str) -> PolicyDirection {
    if rule.contains("daddr @podips") {
        PolicyDirection::Ingress
    } else if chain == "input" && rule.contains("saddr @podips") {
        PolicyDirection::Egress
    } else {
        PolicyDirection::IngressOrEgress
    }
}

/// The verdict in words.
pub(super) fn text(verdict: &PolicyVerdict) -> String {
    let pod = verdict.pod.as_deref().unwrap_or("the pod");
    let why = match verdict.direction {
        PolicyDirection::Ingress => format!("a NetworkPolicy selects {pod}, for its ingress"),
        PolicyDirection::Egress => format!("a NetworkPolicy selects {pod}, for its egress"),
        PolicyDirection::IngressOrEgress => {
            "a NetworkPolicy selects its source pod; the engine checks the source's egress and the destination's ingress".to_string()
        }
    };
    let (number, bypass) = verdict.queue.map_or((0, false), |q| (q.number, q.bypass));
    let queued = format!(
        "kube-network-policies queued this packet to its policy engine on nfqueue {number} ({why})"
    );
    let said = match verdict.outcome {
        PolicyOutcome::EngineUnreachable if bypass => format!(
            "{queued} and nothing took it from the queue (the queue was full): the kernel dropped it, no policy decided"
        ),
        PolicyOutcome::EngineUnreachable => format!(
            "{queued} and nothing took it from the queue: the engine is not running (or its queue is full) and the rule has no bypass (--fail-open=false), so the kernel drops every packet it queues; no policy decided"
        ),
        _ => format!(
            "{queued}, which dropped it: the engine decides in userspace, and its rules do not name the policy"
        ),
    };
    format!("NetworkPolicy: {said}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::story::policy::read_policy;

    fn rule(chain: &str, rule: &str, verdict: &str) -> PathRule {
        PathRule {
            table: TABLE.into(),
            chain: chain.into(),
            rule: rule.into(),
            verdict: verdict.into(),
            target_head: None,
        }
    }

    /// The path of a packet to a pod a policy selects, as nft traces it
    /// through the controller's postrouting chain.
    fn to_selected_pod(queue: &str) -> Vec<PathRule> {
        vec![rule(
            "postrouting",
            &format!("ip daddr @podips-v4 {queue} # handle 9"),
            "queue",
        )]
    }

    #[test]
    fn a_queue_without_bypass_that_nothing_read_is_told_as_an_unreachable_engine() {
        let mut policy = read_policy(&to_selected_pod("queue to 98")).expect("read");
        assert_eq!(policy.enforcer, Enforcer::KubeNetworkPolicies);
        assert_eq!(policy.direction, PolicyDirection::Ingress);
        assert_eq!(
            policy.queue,
            Some(PolicyQueue {
                number: 98,
                bypass: false
            })
        );
        assert!(policy.policies.is_empty());
        account_for_location(&mut policy, "nf_queue+0x5c");
        assert_eq!(policy.outcome, PolicyOutcome::EngineUnreachable);
        policy.pod = Some("default/db-0".into());
        assert_eq!(
            policy.text(),
            "NetworkPolicy: kube-network-policies queued this packet to its policy engine on nfqueue 98 (a NetworkPolicy selects default/db-0, for its ingress) and nothing took it from the queue: the engine is not running (or its queue is full) and the rule has no bypass (--fail-open=false), so the kernel drops every packet it queues; no policy decided"
        );
        let json = serde_json::to_value(&policy).unwrap();
        assert_eq!(json["enforcer"], "kube-network-policies");
        assert_eq!(json["outcome"], "engine_unreachable");
        assert_eq!(json["queue"]["number"], 98);
        assert_eq!(json["queue"]["bypass"], false);
    }

    #[test]
    fn a_drop_after_the_engine_read_the_queue_is_the_engines_and_names_no_policy() {
        for queue in ["queue flags bypass to 98", "queue num 98 bypass"] {
            let mut policy = read_policy(&to_selected_pod(queue)).expect("read");
            account_for_location(&mut policy, "nf_reinject+0x1a0");
            assert_eq!(policy.outcome, PolicyOutcome::DroppedByEngine, "{queue}");
            assert_eq!(
                policy.queue,
                Some(PolicyQueue {
                    number: 98,
                    bypass: true
                })
            );
            assert!(policy.text().ends_with(
                "which dropped it: the engine decides in userspace, and its rules do not name the policy"
            ));
        }
    }

    #[test]
    fn the_side_that_made_it_queued_gives_the_direction() {
        let from = |chain: &str| {
            let path = vec![rule(
                chain,
                "ip saddr @podips-v4 queue to 100 # handle 7",
                "queue",
            )];
            read_policy(&path).expect("read").direction
        };
        assert_eq!(from("postrouting"), PolicyDirection::IngressOrEgress);
        assert_eq!(from("input"), PolicyDirection::Egress);
    }

    #[test]
    fn another_tables_queue_or_drop_is_not_kube_network_policies() {
        let mut suricata = rule("forward", "queue to 0 # handle 3", "queue");
        suricata.table = "inet ips".into();
        assert_eq!(read_policy(&[suricata]), None);
        let dropped = rule("postrouting", "ip daddr @podips-v4 drop # handle 3", "drop");
        assert_eq!(read_policy(&[dropped]), None);
    }
}
