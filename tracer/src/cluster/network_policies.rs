//! NetworkPolicies as the API serves them (networking.k8s.io/v1), and
//! which of them select a pod in a direction, with the pod labels that
//! made them select: the API's half of a policy drop's story. Pure: the
//! objects are parsed from their wire JSON and evaluated on labels.
//!
//! Selection follows the API's rules: a policy selects the pods of its
//! namespace its `podSelector` matches (`{}` matches all); it applies to
//! ingress when `policyTypes` says so, or, without `policyTypes`, always
//! to ingress and to egress when it has egress rules.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A label selector: every `matchLabels` pair and every requirement must
/// hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyType {
    Ingress,
    Egress,
}

/// One NetworkPolicy, as much of it as a drop's story tells.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkPolicy {
    pub namespace: String,
    pub name: String,
    pub pod_selector: LabelSelector,
    pub policy_types: Vec<PolicyType>,
    /// Each ingress rule, in words (`from app=web on TCP/8080`).
    pub ingress: Vec<String>,
    pub egress: Vec<String>,
    /// The ports its ingress rules allow (`TCP/8080`, `TCP/8000-8090`,
    /// `UDP` for a protocol's every port, `any` for a rule without
    /// ports), each once.
    pub ingress_ports: Vec<String>,
    pub egress_ports: Vec<String>,
}

impl LabelSelector {
    /// A selector object; an unknown operator is an error naming it.
    pub fn parse(value: &Value) -> Result<Self, String> {
        let match_labels = value["matchLabels"]
            .as_object()
            .map(|labels| {
                labels
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let match_expressions = value["matchExpressions"]
            .as_array()
            .map(|all| all.iter().map(Requirement::parse).collect())
            .transpose()?
            .unwrap_or_default();
        Ok(Self {
            match_labels,
            match_expressions,
        })
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.holds(labels))
    }

    /// The pod's labels the selector looked at (`app=db`), which made it
    /// select the pod.
    pub fn deciding_labels(&self, labels: &BTreeMap<String, String>) -> Vec<String> {
        let keys = self
            .match_labels
            .keys()
            .chain(self.match_expressions.iter().map(|r| &r.key));
        let mut said: Vec<String> = keys
            .filter_map(|k| labels.get(k).map(|v| format!("{k}={v}")))
            .collect();
        said.dedup();
        said
    }

    /// `app=db, tier in (a, b)`; `all pods` for the empty selector.
    pub fn text(&self) -> String {
        let pairs = self.match_labels.iter().map(|(k, v)| format!("{k}={v}"));
        let requirements = self.match_expressions.iter().map(Requirement::text);
        let all: Vec<String> = pairs.chain(requirements).collect();
        if all.is_empty() {
            "all pods".to_string()
        } else {
            all.join(", ")
        }
    }
}

impl Requirement {
    fn parse(value: &Value) -> Result<Self, String> {
        let key = value["key"].as_str().unwrap_or_default().to_string();
        let operator = match value["operator"].as_str().unwrap_or_default() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => return Err(format!("label selector operator {other:?} of key {key:?} is not one of In, NotIn, Exists, DoesNotExist")),
        };
        let values = value["values"]
            .as_array()
            .map(|vs| {
                vs.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            key,
            operator,
            values,
        })
    }

    /// NotIn and DoesNotExist hold for a pod without the key.
    fn holds(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.contains(v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }

    fn text(&self) -> String {
        let values = self.values.join(", ");
        match self.operator {
            Operator::In => format!("{} in ({values})", self.key),
            Operator::NotIn => format!("{} notin ({values})", self.key),
            Operator::Exists => self.key.clone(),
            Operator::DoesNotExist => format!("!{}", self.key),
        }
    }
}

impl NetworkPolicy {
    /// A NetworkPolicy object of the API's list.
    pub fn parse(value: &Value) -> Result<Self, String> {
        let meta = &value["metadata"];
        let name = meta["name"].as_str().unwrap_or_default().to_string();
        let spec = &value["spec"];
        let pod_selector = LabelSelector::parse(&spec["podSelector"])
            .map_err(|e| format!("NetworkPolicy {name}: {e}"))?;
        let rules = |field: &str, peers: &str| -> Vec<String> {
            spec[field]
                .as_array()
                .map(|all| all.iter().map(|r| rule_text(r, peers)).collect())
                .unwrap_or_default()
        };
        let (ingress, egress) = (rules("ingress", "from"), rules("egress", "to"));
        let (ingress_ports, egress_ports) = (ports_of(&spec["ingress"]), ports_of(&spec["egress"]));
        let policy_types = match spec["policyTypes"].as_array() {
            Some(types) => types
                .iter()
                .filter_map(|t| match t.as_str() {
                    Some("Ingress") => Some(PolicyType::Ingress),
                    Some("Egress") => Some(PolicyType::Egress),
                    _ => None,
                })
                .collect(),
            None if spec["egress"].is_array() => vec![PolicyType::Ingress, PolicyType::Egress],
            None => vec![PolicyType::Ingress],
        };
        Ok(Self {
            namespace: meta["namespace"].as_str().unwrap_or_default().to_string(),
            name,
            pod_selector,
            policy_types,
            ingress,
            egress,
            ingress_ports,
            egress_ports,
        })
    }

    /// Its rules and the ports they allow for `way`.
    pub fn rules(&self, way: PolicyType) -> (&[String], &[String]) {
        match way {
            PolicyType::Ingress => (&self.ingress, &self.ingress_ports),
            PolicyType::Egress => (&self.egress, &self.egress_ports),
        }
    }

    /// `namespace/name`.
    pub fn qualified(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether it selects a pod of `namespace` with `labels` for `way`.
    pub fn selects(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        way: PolicyType,
    ) -> bool {
        self.namespace == namespace
            && self.policy_types.contains(&way)
            && self.pod_selector.matches(labels)
    }

    /// `default/backend-deny-ingress selects default/db-0 (app=db) for
    /// ingress: podSelector app=db, no ingress rules`.
    pub fn selection_text(
        &self,
        pod: &str,
        labels: &BTreeMap<String, String>,
        way: PolicyType,
    ) -> String {
        let (dir, rules) = match way {
            PolicyType::Ingress => ("ingress", &self.ingress),
            PolicyType::Egress => ("egress", &self.egress),
        };
        let deciding = self.pod_selector.deciding_labels(labels);
        let because = if deciding.is_empty() {
            String::new()
        } else {
            format!(" ({})", deciding.join(", "))
        };
        let rules = if rules.is_empty() {
            format!("no {dir} rules")
        } else {
            format!("{dir} rules: {}", rules.join("; "))
        };
        format!(
            "{}/{} selects {pod}{because} for {dir}: podSelector {}, {rules}",
            self.namespace,
            self.name,
            self.pod_selector.text()
        )
    }
}

/// One rule in words: its peers and ports (`from app=web on TCP/8080`).
fn rule_text(rule: &Value, peers_word: &str) -> String {
    let peers: Vec<String> = rule[peers_word]
        .as_array()
        .map(|all| all.iter().map(peer_text).collect())
        .unwrap_or_default();
    let ports: Vec<String> = rule["ports"]
        .as_array()
        .map(|all| all.iter().map(port_text).collect())
        .unwrap_or_default();
    let peers = if peers.is_empty() {
        "anywhere".to_string()
    } else {
        peers.join(" or ")
    };
    let ports = if ports.is_empty() {
        "any port".to_string()
    } else {
        ports.join(", ")
    };
    format!("{peers_word} {peers} on {ports}")
}

/// One port of a rule: `TCP/8080`, a named port `TCP/http`, a range
/// `TCP/8000-8090` (`endPort`), or `UDP` alone for every port.
fn port_text(port: &Value) -> String {
    let protocol = port["protocol"].as_str().unwrap_or("TCP");
    let end = port["endPort"].as_u64().map(|e| format!("-{e}"));
    match &port["port"] {
        Value::Null => protocol.to_string(),
        Value::String(s) => format!("{protocol}/{s}"),
        number => format!("{protocol}/{number}{}", end.unwrap_or_default()),
    }
}

/// The ports a direction's rules allow, each once: a rule without ports
/// allows every port (`any`).
fn ports_of(rules: &Value) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for rule in rules.as_array().into_iter().flatten() {
        let listed = rule["ports"].as_array().filter(|p| !p.is_empty());
        let texts = match listed {
            Some(ports) => ports.iter().map(port_text).collect(),
            None => vec!["any".to_string()],
        };
        for text in texts {
            if !all.contains(&text) {
                all.push(text);
            }
        }
    }
    all
}

fn peer_text(peer: &Value) -> String {
    if let Some(cidr) = peer["ipBlock"]["cidr"].as_str() {
        return format!("ipBlock {cidr}");
    }
    let selector = |field: &str| {
        peer.get(field)
            .map(|s| LabelSelector::parse(s).map_or_else(|e| e, |s| s.text()))
    };
    match (selector("namespaceSelector"), selector("podSelector")) {
        (Some(ns), Some(pods)) => format!("pods {pods} in namespaces {ns}"),
        (Some(ns), None) => format!("namespaces {ns}"),
        (None, Some(pods)) => pods,
        (None, None) => "anywhere".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn match_labels_and_each_operator_select_as_the_api_does() {
        let selector = LabelSelector::parse(&json!({
            "matchLabels": {"app": "db"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["data", "cache"]},
                {"key": "env", "operator": "NotIn", "values": ["dev"]},
                {"key": "owner", "operator": "Exists"},
                {"key": "canary", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        let db = labels(&[("app", "db"), ("tier", "data"), ("owner", "x")]);
        assert!(
            selector.matches(&db),
            "NotIn and DoesNotExist hold without the key"
        );
        let dev = labels(&[
            ("app", "db"),
            ("tier", "data"),
            ("owner", "x"),
            ("env", "dev"),
        ]);
        assert!(!selector.matches(&dev));
        assert!(
            !selector.matches(&labels(&[("app", "db"), ("owner", "x")])),
            "In needs the key"
        );
        assert!(!selector.matches(&labels(&[("app", "web"), ("tier", "data"), ("owner", "x")])));
        let canary = labels(&[
            ("app", "db"),
            ("tier", "data"),
            ("owner", "x"),
            ("canary", "1"),
        ]);
        assert!(!selector.matches(&canary));
        assert!(
            !selector.matches(&labels(&[("app", "db"), ("tier", "data")])),
            "Exists"
        );
        assert_eq!(
            selector.text(),
            "app=db, tier in (data, cache), env notin (dev), owner, !canary"
        );
        assert!(LabelSelector::default().matches(&labels(&[])));
        assert_eq!(LabelSelector::default().text(), "all pods");
        let bad =
            LabelSelector::parse(&json!({"matchExpressions": [{"key": "a", "operator": "Gt"}]}));
        assert_eq!(
            bad.unwrap_err(),
            "label selector operator \"Gt\" of key \"a\" is not one of In, NotIn, Exists, DoesNotExist"
        );
    }

    #[test]
    fn a_policy_without_rules_selects_its_pods_for_ingress_and_says_why() {
        let policy = NetworkPolicy::parse(&json!({
            "metadata": {"name": "backend-deny-ingress", "namespace": "default"},
            "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress"]}
        }))
        .unwrap();
        let db = labels(&[
            ("app", "db"),
            ("statefulset.kubernetes.io/pod-name", "db-0"),
        ]);
        assert!(policy.selects("default", &db, PolicyType::Ingress));
        assert!(!policy.selects("default", &db, PolicyType::Egress));
        assert!(!policy.selects("other", &db, PolicyType::Ingress));
        assert_eq!(
            policy.selection_text("default/db-0", &db, PolicyType::Ingress),
            "default/backend-deny-ingress selects default/db-0 (app=db) for ingress: podSelector app=db, no ingress rules"
        );
    }

    #[test]
    fn rules_are_told_by_peers_and_ports_and_types_default_as_the_api_does() {
        let policy = NetworkPolicy::parse(&json!({
            "metadata": {"name": "db-from-web", "namespace": "default"},
            "spec": {
                "podSelector": {},
                "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}},
                                      {"ipBlock": {"cidr": "10.0.0.0/8"}}],
                             "ports": [{"protocol": "TCP", "port": 8080}, {"port": "http"}]}],
                "egress": [{"to": [{"namespaceSelector": {"matchLabels": {"team": "a"}}}]}]
            }
        }))
        .unwrap();
        assert_eq!(
            policy.policy_types,
            [PolicyType::Ingress, PolicyType::Egress]
        );
        assert_eq!(
            policy.ingress,
            ["from app=web or ipBlock 10.0.0.0/8 on TCP/8080, TCP/http"]
        );
        assert_eq!(policy.egress, ["to namespaces team=a on any port"]);
        assert_eq!(policy.ingress_ports, ["TCP/8080", "TCP/http"]);
        assert_eq!(
            policy.egress_ports,
            ["any"],
            "a rule without ports allows every port"
        );
        let any = labels(&[("app", "db")]);
        assert_eq!(
            policy.selection_text("default/db-0", &any, PolicyType::Egress),
            "default/db-from-web selects default/db-0 for egress: podSelector all pods, egress rules: to namespaces team=a on any port"
        );
    }

    #[test]
    fn a_port_range_and_a_protocol_alone_are_told_as_the_api_means_them() {
        let policy = NetworkPolicy::parse(&json!({
            "metadata": {"name": "ranges", "namespace": "default"},
            "spec": {"podSelector": {}, "policyTypes": ["Egress"],
                     "egress": [{"ports": [{"protocol": "TCP", "port": 8000, "endPort": 8090},
                                           {"protocol": "UDP"}]}]}
        }))
        .unwrap();
        assert_eq!(policy.egress_ports, ["TCP/8000-8090", "UDP"]);
        assert!(policy.ingress_ports.is_empty());
        assert_eq!(policy.egress, ["to anywhere on TCP/8000-8090, UDP"]);
    }
}
