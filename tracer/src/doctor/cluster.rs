//! What the doctor knows of the cluster: the nodes (pod CIDRs, InternalIPs,
//! CNI annotations, conditions), the pods, and the sandbox events of the
//! pods that have no IP — from the API, or from `--pods-file` /
//! `--nodes-file` (which have no events).

use std::net::Ipv4Addr;

use anyhow::{bail, Context, Result};
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::{Event, Node, Pod as KubePod};
use kube::{api::ListParams, Api};
use serde_json::Value;

use super::DoctorArgs;
use crate::cluster::{
    api::{Access, Cluster},
    inventory::{pod_from_json, Inventory, Pod},
};

/// A Node object, as the checks read it.
#[derive(Clone, Debug, Default)]
pub struct ClusterNode {
    pub name: String,
    pub ip: Option<Ipv4Addr>,
    pub pod_cidrs: Vec<Ipv4Net>,
    pub annotations: Value,
    /// `status.conditions`.
    pub conditions: Vec<Value>,
}

impl ClusterNode {
    pub fn from_json(node: &Value) -> Self {
        let cidrs = node["spec"]["podCIDRs"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![node["spec"]["podCIDR"].clone()]);
        Self {
            name: node["metadata"]["name"].as_str().unwrap_or("?").into(),
            ip: crate::cluster::nodes::ipv4_internal_ip(node),
            pod_cidrs: cidrs
                .iter()
                .filter_map(|c| c.as_str()?.parse().ok())
                .collect(),
            annotations: node["metadata"]["annotations"].clone(),
            conditions: node["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        }
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations[key].as_str()
    }

    /// Flannel's backend-data (`{"VNI":1,"VtepMAC":"…"}`), parsed.
    pub fn flannel_backend_data(&self) -> Value {
        self.annotation("flannel.alpha.coreos.com/backend-data")
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or(Value::Null)
    }

    /// The address peers reach the node's VTEP or BGP at.
    pub fn flannel_public_ip(&self) -> Option<Ipv4Addr> {
        self.annotation("flannel.alpha.coreos.com/public-ip")?
            .parse()
            .ok()
            .or(self.ip)
    }

    pub fn calico_ipv4(&self) -> Option<&str> {
        self.annotation("projectcalico.org/IPv4Address")
    }
}

/// A pod, with the events about it (sandbox failures).
#[derive(Clone, Debug)]
pub struct PodState {
    pub pod: Pod,
    /// (reason, message) of its events, oldest first.
    pub events: Vec<(String, String)>,
    /// Why its events could not be read (RBAC without events, …): the
    /// pod is still checked, and the finding says so.
    pub events_unread: Option<String>,
}

#[derive(Default)]
pub struct ClusterState {
    pub nodes: Vec<ClusterNode>,
    pub pods: Vec<PodState>,
    /// The pods named on the command line (all, when none are).
    pub asked: Vec<String>,
    /// Whether the nodes and pods came from anywhere at all.
    pub known: bool,
    /// Whether the pods did (a pods file or the API).
    pub pods_listed: bool,
}

impl ClusterState {
    pub async fn load(args: &DoctorArgs) -> Result<Self> {
        let asked = args
            .pods
            .iter()
            .map(|p| match p.split_once('/') {
                Some(_) => p.clone(),
                None => format!("{}/{p}", args.kube.namespace),
            })
            .collect();
        let access = Access::of(&args.kube);
        let files = args.kube.pods_file.is_some() || args.kube.nodes_file.is_some();
        let mut state = if files || !access.configured() {
            Self::from_files(args)?
        } else {
            Self::from_api(&access).await?
        };
        state.asked = asked;
        Ok(state)
    }

    /// Every pod asked about is known (the `doctor` command: an unknown
    /// pod would give a clean report of nothing).
    pub fn check_asked(&self, args: &DoctorArgs) -> Result<()> {
        let source = if args.kube.pods_file.is_some() {
            "the pods file"
        } else if self.pods_listed {
            "the API"
        } else {
            return match self.asked.first() {
                Some(name) => bail!("pod {name}: no pods file and no API to look it up in (give --pods-file or a kubeconfig)"),
                None => Ok(()),
            };
        };
        let missing = self
            .asked
            .iter()
            .find(|name| !self.pods.iter().any(|p| &p.pod.qualified() == *name));
        match missing {
            Some(name) => bail!("pod {name} not found in {source}"),
            None => Ok(()),
        }
    }

    fn from_files(args: &DoctorArgs) -> Result<Self> {
        let mut state = Self::default();
        if let Some(path) = &args.kube.nodes_file {
            let list: NodeItems = crate::cluster::parse_file(path, "nodes file", "a node list")?;
            state.nodes = list.items.into_iter().map(|n| n.0).collect();
            state.known = true;
        }
        if let Some(path) = &args.kube.pods_file {
            let inventory = Inventory::load(path)?;
            state.pods = inventory
                .pods
                .into_iter()
                .map(|pod| PodState {
                    pod,
                    events: Vec::new(),
                    events_unread: None,
                })
                .collect();
            state.known = true;
            state.pods_listed = true;
        }
        Ok(state)
    }

    async fn from_api(access: &Access) -> Result<Self> {
        let client = Cluster::connect(access).await?.client();
        let nodes: Api<Node> = Api::all(client.clone());
        let nodes = nodes
            .list(&ListParams::default())
            .await
            .context("cannot list nodes")?;
        let pods: Api<KubePod> = Api::all(client.clone());
        let pods = pods
            .list(&ListParams::default())
            .await
            .context("cannot list pods")?;
        let mut state = Self {
            known: true,
            pods_listed: true,
            ..Self::default()
        };
        for node in nodes {
            state
                .nodes
                .push(ClusterNode::from_json(&serde_json::to_value(node)?));
        }
        // Once the API refuses events (RBAC), it refuses them for every
        // pod: asked once, the refusal stands for the rest.
        let mut refused: Option<String> = None;
        for pod in pods {
            let pod = pod_from_json(serde_json::to_value(pod)?)?;
            let (events, events_unread) = match (needs_events(&pod), &refused) {
                (false, _) => (Vec::new(), None),
                (true, Some(why)) => (Vec::new(), Some(why.clone())),
                (true, None) => match events_of(&client, &pod).await {
                    Ok(events) => (events, None),
                    // One pod's events are not worth every other check.
                    Err(e) => {
                        let why = format!("{e:#}");
                        if is_forbidden(&e) {
                            refused = Some(why.clone());
                        }
                        (Vec::new(), Some(why))
                    }
                },
            };
            state.pods.push(PodState {
                pod,
                events,
                events_unread,
            });
        }
        Ok(state)
    }

    /// The node whose InternalIP is one of `addresses`.
    pub fn node_holding(&self, addresses: &[Ipv4Addr]) -> Option<&ClusterNode> {
        self.nodes
            .iter()
            .find(|n| n.ip.is_some_and(|ip| addresses.contains(&ip)))
    }

    pub fn node_named(&self, name: &str) -> Option<&ClusterNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Whether a pod is one the user asked about (every pod, when none).
    pub fn is_asked(&self, pod: &Pod) -> bool {
        self.asked.is_empty() || self.asked.contains(&pod.qualified())
    }
}

/// A nodes file, each node made a `ClusterNode` as it is read.
#[derive(serde::Deserialize)]
struct NodeItems {
    #[serde(default)]
    items: Vec<NodeItem>,
}

struct NodeItem(ClusterNode);

impl<'de> serde::Deserialize<'de> for NodeItem {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let node = <Value as serde::Deserialize>::deserialize(d)?;
        Ok(Self(ClusterNode::from_json(&node)))
    }
}

/// A pod that should have an IP and has none, or is not Running.
pub fn needs_events(pod: &Pod) -> bool {
    !pod.host_network && (pod.ip.is_none() || pod.phase.as_deref().is_some_and(|p| p != "Running"))
}

/// Whether the API refused the call (403).
fn is_forbidden(e: &anyhow::Error) -> bool {
    matches!(e.downcast_ref::<kube::Error>(), Some(kube::Error::Api(status)) if status.code == 403)
}

/// `kubectl get events --field-selector involvedObject.name=<pod>`.
async fn events_of(client: &kube::Client, pod: &Pod) -> Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(client.clone(), &pod.namespace);
    let selector = format!("involvedObject.name={}", pod.name);
    let list = events
        .list(&ListParams::default().fields(&selector))
        .await
        .with_context(|| format!("cannot list the events of {}", pod.qualified()))?;
    Ok(list
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_told_apart_through_the_context_added_to_it() {
        let refused = |code| {
            let status = kube::core::Status {
                code,
                ..Default::default()
            };
            anyhow::Error::new(kube::Error::Api(Box::new(status)))
                .context("cannot list the events of default/db-0")
        };
        assert!(is_forbidden(&refused(403)));
        assert!(!is_forbidden(&refused(500)));
        assert!(!is_forbidden(&anyhow::anyhow!("connection reset")));
    }
}
