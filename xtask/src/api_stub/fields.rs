//! The fields a field selector may name, per resource, and their values,
//! as kube-apiserver registers them: each kind's field label conversion
//! (pkg/apis/core/v1/conversion.go) says which labels a list or watch
//! takes, and its registry's selectable-fields set gives their values,
//! the empty string where the object leaves one unset. Any other label
//! is a 400 BadRequest naming it, as is one the stub is told to refuse
//! ([`super::Stub::refuse_field_selector`], an older server).

use std::collections::HashSet;

use serde_json::Value;

use super::{namespace_of, Stub};

impl Stub {
    /// Refuses field selectors on `label` of `resource` with 400
    /// BadRequest, as a server older than the label does (Services'
    /// `spec.clusterIP` and `spec.type` are recent).
    pub fn refuse_field_selector(&self, resource: &str, label: &str) {
        let mut state = self.shared.state.lock().unwrap();
        state.refused_fields.insert((resource.into(), label.into()));
    }
}

/// The labels `resource` registers; `None` for a resource with no
/// conversion of its own, which takes apimachinery's default (name and
/// namespace).
fn registered(resource: &str) -> Option<&'static [&'static str]> {
    Some(match resource {
        "pods" => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
            // What old v1 clients send for spec.nodeName.
            "spec.host",
        ],
        "nodes" => &["metadata.name", "spec.unschedulable"],
        "namespaces" => &["status.phase", "metadata.name"],
        "services" => &[
            "metadata.namespace",
            "metadata.name",
            "spec.clusterIP",
            "spec.type",
        ],
        "events" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
            "metadata.namespace",
            "metadata.name",
        ],
        _ => return None,
    })
}

/// The labels a field selector names: each term's left side (`k=v`,
/// `k==v`, `k!=v`), or `Err` with the term that has no operator.
fn labels(selector: &str) -> Result<Vec<&str>, &str> {
    selector
        .split(',')
        .map(str::trim)
        .filter(|term| !term.is_empty())
        .map(|term| {
            let operator = term.find("!=").or_else(|| term.find('='));
            operator.map(|at| term[..at].trim()).ok_or(term)
        })
        .collect()
}

/// The BadRequest message for a field selector `resource` does not take,
/// worded as the real server words it; `None` when it takes it.
/// `refused` holds (resource, label) pairs an older server lacks.
pub(crate) fn refusal(
    resource: &str,
    selector: &str,
    refused: &HashSet<(String, String)>,
) -> Option<String> {
    let labels = match labels(selector) {
        Ok(labels) => labels,
        Err(term) => {
            return Some(format!(
                "invalid selector: '{selector}'; can't understand '{term}'"
            ))
        }
    };
    labels.into_iter().find_map(|label| {
        let gone = refused.contains(&(resource.to_string(), label.to_string()));
        match registered(resource) {
            _ if gone => Some(format!("field label not supported: {label}")),
            Some(known) if known.contains(&label) => None,
            Some(_) => Some(format!("field label not supported: {label}")),
            None if matches!(label, "metadata.name" | "metadata.namespace") => None,
            None => Some(format!(
                "\"{label}\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
            )),
        }
    })
}

/// The value a field selector compares for `label` on `object`, as the
/// resource's selectable fields hold it.
pub(crate) fn value(resource: &str, object: &Value, label: &str) -> String {
    let at = |path: &str| {
        let mut at = object;
        for part in path.split('.') {
            at = &at[part];
        }
        at.clone()
    };
    let found = match (resource, label) {
        (_, "metadata.namespace") => namespace_of(object).into(),
        ("pods", "spec.host") => at("spec.nodeName"),
        // The primary IP: podIPs[0], which the server keeps equal to podIP.
        ("pods", "status.podIP") => match &object["status"]["podIPs"][0]["ip"] {
            Value::Null => at("status.podIP"),
            ip => ip.clone(),
        },
        // Taken by the conversion but absent from the pod's field set.
        ("pods", "status.podIPs") => Value::Null,
        ("pods", "spec.hostNetwork") | ("nodes", "spec.unschedulable") => {
            at(label).as_bool().unwrap_or(false).into()
        }
        ("events", "source") => at("source.component"),
        _ => at(label),
    };
    match found {
        Value::String(s) => s,
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refused(resource: &str, selector: &str) -> Option<String> {
        refusal(resource, selector, &HashSet::new())
    }

    #[test]
    fn a_label_the_resource_does_not_register_is_refused_as_the_server_words_it() {
        assert_eq!(
            refused("pods", "spec.containers=x"),
            Some("field label not supported: spec.containers".into())
        );
        assert_eq!(
            refused("nodes", "metadata.namespace=default"),
            Some("field label not supported: metadata.namespace".into())
        );
        assert_eq!(
            refused("endpointslices", "addressType=IPv4"),
            Some("\"addressType\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"".into())
        );
        assert_eq!(
            refused("pods", "spec.nodeName"),
            Some("invalid selector: 'spec.nodeName'; can't understand 'spec.nodeName'".into())
        );
    }

    #[test]
    fn what_the_product_and_kubectl_send_is_taken() {
        for (resource, selector) in [
            ("pods", "status.podIP=10.244.1.2"),
            ("pods", "metadata.name=web-0"),
            // kubectl describe node.
            (
                "pods",
                "spec.nodeName=node-1,status.phase!=Succeeded,status.phase!=Failed",
            ),
            // kubectl describe pod.
            (
                "events",
                "involvedObject.name=db-0,involvedObject.namespace=default,involvedObject.uid=u",
            ),
            ("services", "spec.clusterIP==10.96.0.10"),
            ("services", "spec.type=NodePort"),
            ("nodes", "metadata.name=node-1"),
            ("endpointslices", "metadata.name=db-abcde"),
            ("leases", "metadata.namespace=podtrace"),
        ] {
            assert_eq!(refused(resource, selector), None, "{resource} {selector}");
        }
    }

    #[test]
    fn an_older_server_refuses_what_it_is_told_to() {
        let older = HashSet::from([("services".to_string(), "spec.clusterIP".to_string())]);
        assert_eq!(
            refusal("services", "spec.clusterIP=10.96.0.10", &older),
            Some("field label not supported: spec.clusterIP".into())
        );
        assert_eq!(refusal("services", "spec.type=ClusterIP", &older), None);
    }

    #[test]
    fn unset_fields_compare_as_the_empty_string_or_their_default() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {},
                         "status": {"podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}, {"ip": "fd00::1"}]}});
        assert_eq!(value("pods", &pod, "spec.nodeName"), "");
        assert_eq!(value("pods", &pod, "spec.hostNetwork"), "false");
        assert_eq!(value("pods", &pod, "status.podIP"), "10.0.0.1");
        assert_eq!(value("pods", &pod, "metadata.namespace"), "ns");
        let event = json!({"source": {"component": "kubelet", "host": "node-1"}});
        assert_eq!(value("events", &event, "source"), "kubelet");
    }
}
