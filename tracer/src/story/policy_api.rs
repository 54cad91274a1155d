//! A policy drop's verdict joined to the API's NetworkPolicies: for the
//! pod and direction the rules speak of, each policy that selects it
//! (its podSelector, policyTypes, rules and ports, and the pod labels
//! that made it select) and whether together they allow nothing. Named
//! policies (Calico, kube-router) are matched to the API's objects; where
//! the kernel names none (kube-network-policies), the API's policies are
//! evaluated on the pod's labels, and the verdict says so. Pure: the
//! policies come in through the context (`PolicyBook`).

use super::policy_verdict::{
    ApiFoundBy, ApiPolicies, Enforcer, PodSelection, PolicyDirection, PolicyRef, PolicyVerdict,
    SelectingPolicy,
};
use crate::cluster::{
    network_policies::{NetworkPolicy, PolicyType},
    policy_book::PolicyBook,
};

/// What the API's policies say of `verdict`'s pod (`src`, `dst`: the
/// packet's ends, for a verdict that does not tell the direction).
pub(super) fn from_api(
    verdict: &PolicyVerdict,
    src: Option<&str>,
    dst: Option<&str>,
    book: &PolicyBook,
) -> ApiPolicies {
    let found_by = match named(verdict).next().is_none() {
        true => ApiFoundBy::Evaluated,
        false => ApiFoundBy::KernelNames,
    };
    let mut api = ApiPolicies {
        found_by,
        selections: Vec::new(),
        unmatched: Vec::new(),
        unread: None,
    };
    let asked = match verdict.direction {
        PolicyDirection::Ingress => vec![(verdict.pod.as_deref(), PolicyType::Ingress)],
        PolicyDirection::Egress => vec![(verdict.pod.as_deref(), PolicyType::Egress)],
        PolicyDirection::IngressOrEgress => {
            vec![(src, PolicyType::Egress), (dst, PolicyType::Ingress)]
        }
    };
    for (pod, way) in asked {
        match selection(verdict, pod, way, book, &mut api.unmatched) {
            Ok(selection) => api.selections.push(selection),
            Err(why) => {
                api.unread = Some(why);
                api.selections.clear();
                api.unmatched.clear();
                break;
            }
        }
    }
    api
}

/// The policies selecting `pod` for `way`: the ones the rules named
/// (those the API does not have, or that do not select the pod, go to
/// `unmatched`), or every one of its namespace that selects it.
fn selection(
    verdict: &PolicyVerdict,
    pod: Option<&str>,
    way: PolicyType,
    book: &PolicyBook,
    unmatched: &mut Vec<String>,
) -> Result<PodSelection, String> {
    let pod = pod.ok_or("the rules do not name the pod, and podtrace does not know it")?;
    let Some((namespace, _)) = pod.split_once('/') else {
        return Err(format!("{pod} is not a pod podtrace knows by name"));
    };
    let labels = (book.labels.get(pod)).ok_or(format!("the labels of {pod} are not known"))?;
    let listed = book.policies_of(namespace)?;
    let selecting: Vec<&NetworkPolicy> = if named(verdict).next().is_none() {
        let selects = |p: &&NetworkPolicy| p.selects(namespace, labels, way);
        listed.iter().filter(selects).collect()
    } else {
        let mut matched = Vec::new();
        for policy in named(verdict) {
            let name = policy.name.as_str();
            if !of_the_api(verdict.enforcer, policy) {
                unmatched.push(format!(
                    "{name}: a Calico {}, not a networking.k8s.io NetworkPolicy",
                    policy.kind
                ));
                continue;
            }
            match listed.iter().find(|p| p.qualified() == name) {
                Some(p) if p.selects(namespace, labels, way) => matched.push(p),
                Some(p) => unmatched.push(format!(
                    "{name}: its podSelector {} does not select {pod} for {} by its labels now",
                    p.pod_selector.text(),
                    direction(way).label()
                )),
                None => unmatched.push(format!(
                    "{name}: not a networking.k8s.io NetworkPolicy the API lists in namespace {namespace}"
                )),
            }
        }
        matched
    };
    let policies: Vec<SelectingPolicy> = selecting
        .iter()
        .map(|p| {
            let (rules, ports) = p.rules(way);
            SelectingPolicy {
                name: p.qualified(),
                pod_selector: p.pod_selector.text(),
                policy_types: p.policy_types.iter().map(|t| format!("{t:?}")).collect(),
                rules: rules.to_vec(),
                ports: ports.to_vec(),
                pod_labels: p.pod_selector.deciding_labels(labels),
            }
        })
        .collect();
    Ok(PodSelection {
        pod: pod.to_string(),
        direction: direction(way),
        allows_nothing: !policies.is_empty() && policies.iter().all(|p| p.rules.is_empty()),
        policies,
    })
}

/// The policies the rules named (a Calico profile is not one).
fn named(verdict: &PolicyVerdict) -> impl Iterator<Item = &PolicyRef> {
    verdict.policies.iter().filter(|p| p.kind != "Profile")
}

/// Whether the enforcer's kind is the API's NetworkPolicy: kube-router
/// renders only those; Calico also its own kinds.
fn of_the_api(enforcer: Enforcer, policy: &PolicyRef) -> bool {
    match enforcer {
        Enforcer::Calico => policy.kind == "KubernetesNetworkPolicy",
        Enforcer::KubeRouter | Enforcer::KubeNetworkPolicies => true,
    }
}

fn direction(way: PolicyType) -> PolicyDirection {
    match way {
        PolicyType::Ingress => PolicyDirection::Ingress,
        PolicyType::Egress => PolicyDirection::Egress,
    }
}

impl ApiPolicies {
    /// The API's side in words, a line per pod and direction, for the
    /// lines under a verdict.
    pub fn lines(&self) -> Vec<String> {
        if let Some(why) = &self.unread {
            return vec![format!("the API's NetworkPolicies were not read: {why}")];
        }
        let from = match self.found_by {
            ApiFoundBy::KernelNames => "",
            ApiFoundBy::Evaluated => "evaluated from the API, not from the kernel: ",
        };
        // Named policies none of which the API has: `unmatched` says why.
        let told =
            |s: &&PodSelection| self.found_by == ApiFoundBy::Evaluated || !s.policies.is_empty();
        let mut lines: Vec<String> = (self.selections.iter().filter(told))
            .map(|s| format!("{from}{}", s.text()))
            .collect();
        if !self.unmatched.is_empty() {
            lines.push(format!(
                "named by the rules, not matched in the API: {}",
                self.unmatched.join("; ")
            ));
        }
        lines
    }
}

impl PodSelection {
    /// `default/backend-deny-ingress selects default/db-0 for ingress
    /// (podSelector app=db, by its label app=db; policyTypes Ingress) and
    /// allows nothing`.
    fn text(&self) -> String {
        let dir = self.direction.label();
        if self.policies.is_empty() {
            return format!("no NetworkPolicy in the API selects {} for {dir}", self.pod);
        }
        let said: Vec<String> = self
            .policies
            .iter()
            .map(|p| {
                let by = match p.pod_labels.as_slice() {
                    [] => String::new(),
                    [one] => format!(", by its label {one}"),
                    many => format!(", by its labels {}", many.join(", ")),
                };
                let allows = match p.rules.is_empty() {
                    true => "nothing".to_string(),
                    false => format!("{} (ports {})", p.rules.join("; "), p.ports.join(", ")),
                };
                format!(
                    "{} selects {} for {dir} (podSelector {}{by}; policyTypes {}) and allows {allows}",
                    p.name,
                    self.pod,
                    p.pod_selector,
                    p.policy_types.join(", ")
                )
            })
            .collect();
        said.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::story::policy::{read_policy, PolicyOutcome, PolicyQueue};

    /// The API's objects of namespace default, as it serves them.
    fn book(listed: Result<Vec<serde_json::Value>, &str>) -> PolicyBook {
        let parsed = listed
            .map(|all| {
                all.iter()
                    .map(|p| NetworkPolicy::parse(p).unwrap())
                    .collect()
            })
            .map_err(str::to_string);
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        PolicyBook {
            namespaces: [("default".to_string(), parsed)].into(),
            unread: None,
            labels: [
                (
                    "default/db-0".into(),
                    labels(&[("app", "db"), ("tier", "data")]),
                ),
                ("default/web-0".into(), labels(&[("app", "web")])),
            ]
            .into(),
        }
    }

    fn deny_ingress() -> serde_json::Value {
        json!({"metadata": {"name": "backend-deny-ingress", "namespace": "default"},
               "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"]}})
    }

    fn db_from_web() -> serde_json::Value {
        json!({"metadata": {"name": "db-from-web", "namespace": "default"},
               "spec": {"podSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["data"]}]},
                        "policyTypes": ["Ingress"],
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}],
                                     "ports": [{"protocol": "TCP", "port": 5432}]}]}})
    }

    /// Felix's drop names backend-deny-ingress: the API's object of that
    /// name says why it selects db-0 and that it allows nothing; the
    /// other policy selecting db-0, which the rules did not name, is not
    /// blamed.
    #[test]
    fn a_named_calico_policy_is_matched_to_the_api_object_with_its_selector() {
        let mut verdict =
            read_policy(&super::super::policy_calico::tests::iptables_path()).unwrap();
        verdict.pod = Some("default/db-0".into());
        let api = from_api(
            &verdict,
            None,
            None,
            &book(Ok(vec![deny_ingress(), db_from_web()])),
        );
        assert_eq!(api.found_by, ApiFoundBy::KernelNames);
        assert_eq!(api.unread, None);
        let selection = &api.selections[0];
        assert_eq!(selection.pod, "default/db-0");
        assert!(selection.allows_nothing);
        let policy = &selection.policies[..];
        assert_eq!(policy.len(), 1, "{policy:?}");
        assert_eq!(policy[0].name, "default/backend-deny-ingress");
        assert_eq!(policy[0].pod_selector, "app=db");
        assert_eq!(policy[0].policy_types, ["Ingress"]);
        assert_eq!(policy[0].pod_labels, ["app=db"]);
        assert!(policy[0].rules.is_empty() && policy[0].ports.is_empty());
        assert_eq!(
            api.lines(),
            ["default/backend-deny-ingress selects default/db-0 for ingress (podSelector app=db, by its label app=db; policyTypes Ingress) and allows nothing"]
        );
        let json = serde_json::to_value(&api).unwrap();
        assert_eq!(json["found_by"], "kernel_names");
        assert_eq!(json["selections"][0]["direction"], "ingress");
        assert_eq!(json["selections"][0]["allows_nothing"], true);
    }

    /// kube-network-policies names no policy: every policy of the pod's
    /// namespace is evaluated on its labels, and the verdict says so.
    #[test]
    fn without_names_from_the_kernel_the_api_policies_are_evaluated_and_said_to_be() {
        let verdict = PolicyVerdict {
            enforcer: Enforcer::KubeNetworkPolicies,
            direction: PolicyDirection::IngressOrEgress,
            pod: None,
            policies: Vec::new(),
            tier: None,
            outcome: PolicyOutcome::EngineUnreachable,
            queue: Some(PolicyQueue {
                number: 98,
                bypass: false,
            }),
            api: None,
        };
        let book = book(Ok(vec![deny_ingress(), db_from_web()]));
        let api = from_api(&verdict, Some("default/web-0"), Some("default/db-0"), &book);
        assert_eq!(api.found_by, ApiFoundBy::Evaluated);
        let [egress, ingress] = &api.selections[..] else {
            panic!("{api:?}")
        };
        assert_eq!(
            (egress.pod.as_str(), egress.direction),
            ("default/web-0", PolicyDirection::Egress)
        );
        assert!(egress.policies.is_empty() && !egress.allows_nothing);
        let names: Vec<&str> = ingress.policies.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["default/backend-deny-ingress", "default/db-from-web"]
        );
        assert!(
            !ingress.allows_nothing,
            "db-from-web allows TCP/5432 from app=web"
        );
        assert_eq!(ingress.policies[1].ports, ["TCP/5432"]);
        assert_eq!(ingress.policies[1].pod_labels, ["tier=data"]);
        assert_eq!(
            api.lines(),
            [
                "evaluated from the API, not from the kernel: no NetworkPolicy in the API selects default/web-0 for egress",
                "evaluated from the API, not from the kernel: default/backend-deny-ingress selects default/db-0 for ingress (podSelector app=db, by its label app=db; policyTypes Ingress) and allows nothing; default/db-from-web selects default/db-0 for ingress (podSelector tier in (data), by its label tier=data; policyTypes Ingress) and allows from app=web on TCP/5432 (ports TCP/5432)"
            ]
        );
    }

    /// A list RBAC forbade, and a mode without the API: said, never
    /// silence; named policies the API lacks are said apart.
    #[test]
    fn policies_not_read_or_not_matched_are_said() {
        let mut verdict =
            read_policy(&super::super::policy_calico::tests::iptables_path()).unwrap();
        verdict.pod = Some("default/db-0".into());
        let why =
            "forbidden: podtrace's RBAC does not allow list networkpolicies in namespace default";
        let api = from_api(&verdict, None, None, &book(Err(why)));
        assert_eq!(api.unread.as_deref(), Some(why));
        assert!(api.selections.is_empty());
        assert_eq!(
            api.lines(),
            [format!("the API's NetworkPolicies were not read: {why}")]
        );
        let none = PolicyBook::without_api(
            "no Kubernetes API in this mode (the ends were given as IPs)",
            &[],
        );
        let api = from_api(&verdict, None, None, &none);
        assert_eq!(
            api.unread.as_deref(),
            Some("the labels of default/db-0 are not known")
        );
        let api = from_api(&verdict, None, None, &book(Ok(vec![db_from_web()])));
        assert_eq!(
            api.lines(),
            ["named by the rules, not matched in the API: default/backend-deny-ingress: not a networking.k8s.io NetworkPolicy the API lists in namespace default"]
        );
    }

    /// Told from recorded hops: a kube-network-policies drop whose rule
    /// does not tell the direction gets the API's evaluation for the
    /// source's egress and the destination's ingress, by the names the
    /// context gives the packet's ends.
    #[test]
    fn a_told_queue_drop_carries_the_api_policies_of_both_ends() {
        use crate::{
            model::netfilter::{NetfilterRule, PathRule},
            story::{policy::tests::ping_dropped_on_node_2, tell, Context},
        };
        // Freed where the queue is, not later by something else.
        let mut journey = ping_dropped_on_node_2("nf_queue+0x5c");
        let queued = PathRule {
            table: "inet kube-network-policies".into(),
            chain: "postrouting".into(),
            rule: "ip saddr @podips-v4 queue to 100 # handle 7".into(),
            verdict: "queue".into(),
            target_head: None,
        };
        journey.rule = Some(NetfilterRule {
            table: queued.table.clone(),
            chain: queued.chain.clone(),
            hook: "POSTROUTING".into(),
            rule: queued.rule.clone(),
            path: vec![queued],
        });
        let mut ctx = Context::default();
        for (ip, pod) in [
            ("10.244.1.2", "default/web-0"),
            ("10.244.2.2", "default/db-0"),
        ] {
            ctx.names.insert(ip.parse().unwrap(), pod.into());
        }
        ctx.policies = book(Ok(vec![deny_ingress()]));
        let story = tell(&journey, &ctx);
        let summary = story.verdict.summary.clone();
        let policy = (story.verdict.policy).unwrap_or_else(|| panic!("no policy: {summary}"));
        assert_eq!(policy.direction, PolicyDirection::IngressOrEgress);
        let api = policy.api.expect("the API's side");
        assert_eq!(api.found_by, ApiFoundBy::Evaluated);
        let told: Vec<(&str, PolicyDirection, bool)> = (api.selections.iter())
            .map(|s| (s.pod.as_str(), s.direction, s.allows_nothing))
            .collect();
        assert_eq!(
            told,
            [
                ("default/web-0", PolicyDirection::Egress, false),
                ("default/db-0", PolicyDirection::Ingress, true)
            ]
        );
    }
}
