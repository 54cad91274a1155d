//! The NetworkPolicies of the traced pods' namespaces, as the API listed
//! them (networking.k8s.io/v1), with the traced pods' labels: what a
//! policy drop's story evaluates selection on. A list that fails (RBAC,
//! no API in this mode) does not fail the trace: the book keeps why, and
//! the story says it.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::NetworkPolicy as KubeNetworkPolicy;
use kube::{api::ListParams, Api};
use serde::{Deserialize, Serialize};

use super::{api::Cluster, inventory::Pod, network_policies::NetworkPolicy};

/// What is known of the API's NetworkPolicies, for the stories.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyBook {
    /// By namespace: its NetworkPolicies, or why they were not read.
    pub namespaces: BTreeMap<String, Result<Vec<NetworkPolicy>, String>>,
    /// Why no namespace's were read (no API in this mode); `None` when
    /// they were asked for.
    pub unread: Option<String>,
    /// The traced pods' labels, by `namespace/name`.
    pub labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl PolicyBook {
    /// A book without the API: `why` says which mode left it out.
    pub fn without_api(why: &str, pods: &[&Pod]) -> Self {
        Self {
            unread: Some(why.to_string()),
            labels: labels_of(pods),
            ..Self::default()
        }
    }

    /// The policies of `namespace`, or why they are not known.
    pub fn policies_of(&self, namespace: &str) -> Result<&[NetworkPolicy], String> {
        match (self.namespaces.get(namespace), &self.unread) {
            (Some(Ok(listed)), _) => Ok(listed),
            (Some(Err(why)), _) => Err(why.clone()),
            (None, Some(why)) => Err(why.clone()),
            (None, None) => Err(format!(
                "the NetworkPolicies of namespace {namespace} were not listed (not a traced pod's namespace)"
            )),
        }
    }
}

fn parse(policy: &KubeNetworkPolicy) -> anyhow::Result<NetworkPolicy> {
    NetworkPolicy::parse(&serde_json::to_value(policy)?).map_err(anyhow::Error::msg)
}

fn labels_of(pods: &[&Pod]) -> BTreeMap<String, BTreeMap<String, String>> {
    pods.iter()
        .map(|p| (p.qualified(), p.labels.clone()))
        .collect()
}

impl Cluster {
    /// The NetworkPolicies of each traced pod's namespace, a page at a
    /// time; a namespace whose list fails keeps why, in one line.
    pub async fn policy_book(&self, pods: &[&Pod]) -> PolicyBook {
        let mut namespaces = BTreeMap::new();
        for pod in pods {
            if namespaces.contains_key(&pod.namespace) {
                continue;
            }
            let ns = pod.namespace.as_str();
            let api: Api<KubeNetworkPolicy> = Api::namespaced(self.client(), ns);
            let listed = match super::api::list_pages(&api, &ListParams::default()).await {
                Ok(items) => items.iter().map(parse).collect::<anyhow::Result<Vec<_>>>(),
                // RBAC's answer, short: the story says it under the verdict.
                Err(kube::Error::Api(status)) if status.code == 403 => Err(anyhow::anyhow!(
                    "forbidden: podtrace's RBAC does not allow list networkpolicies in namespace {ns}"
                )),
                Err(e) => Err(self.explain(e, "list", "networkpolicies", Some(ns))),
            };
            namespaces.insert(pod.namespace.clone(), listed.map_err(|e| format!("{e:#}")));
        }
        PolicyBook {
            namespaces,
            unread: None,
            labels: labels_of(pods),
        }
    }
}
