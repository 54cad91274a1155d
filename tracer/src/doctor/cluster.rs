//! What the doctor knows of the cluster: the nodes (pod CIDRs, InternalIPs,
//! CNI annotations, conditions), the pods, and the sandbox events of the
//! pods that have no IP — from the API, or from `--pods-file` /
//! `--nodes-file` (which have no events).

use std::net::Ipv4Addr;

use anyhow::{bail, Context, Result};
use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::api::core::v1::{Event, Node, Pod as KubePod};
use kube::{api::ListParams, Api};
use serde_json::Value;

use crate::cli::DoctorArgs;
use crate::cluster::{
    access::Access,
    api::{list_pages, Cluster},
    inventory::{pod_from_json, Inventory, Pod},
};

/// A Node object, as the checks read it.
#[derive(Clone, Debug, Default)]
pub struct ClusterNode {
    pub name: String,
    pub ip: Option<Ipv4Addr>,
    pub pod_cidrs: Vec<Ipv4Net>,
    /// A dual-stack Node's IPv6 podCIDRs.
    pub pod_cidrs6: Vec<Ipv6Net>,
    pub annotations: Value,
    /// `status.conditions`.
    pub conditions: Vec<Value>,
}

impl ClusterNode {
    pub fn from_json(node: &Value) -> Self {
        Self {
            name: node["metadata"]["name"].as_str().unwrap_or("?").into(),
            ip: crate::cluster::nodes::ipv4_internal_ip(node),
            pod_cidrs: crate::cluster::nodes::pod_cidrs(node),
            pod_cidrs6: crate::cluster::nodes::pod_cidrs(node),
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
    /// The pods and nodes asked about, from the files or the API; through
    /// `connected` where the caller already holds a connection (a trace's
    /// resolution), so that a trace talks to the API over one handle.
    pub async fn load(args: &DoctorArgs, connected: Option<&Cluster>) -> Result<Self> {
        let asked: Vec<String> = args
            .pods
            .iter()
            .map(|p| match p.split_once('/') {
                Some(_) => p.clone(),
                None => format!("{}/{p}", args.kube.namespace()),
            })
            .collect();
        let access = Access::of(&args.kube);
        let files = args.kube.pods_file.is_some() || args.kube.nodes_file.is_some();
        let mut state = if files || !access.configured() {
            Self::from_files(args)?
        } else {
            match connected {
                Some(cluster) => Self::from_api(args, cluster, &asked).await?,
                None => Self::from_api(args, &Cluster::connect(&access).await?, &asked).await?,
            }
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

    /// The pods asked about, each by name (every pod, a page at a time,
    /// when none is); every node, a page at a time, for the peer checks
    /// between them. Inside a trace, only the nodes it involves, by name
    /// (with the pods' own, `--node`'s and an agent's), never the whole
    /// cluster.
    async fn from_api(args: &DoctorArgs, cluster: &Cluster, asked: &[String]) -> Result<Self> {
        let client = cluster.client();
        let params = ListParams::default();
        let pods = if asked.is_empty() && args.trace_nodes.is_none() {
            let pods: Api<KubePod> = Api::all(client.clone());
            cluster.list_paged(&pods, &params, "pods", None).await?
        } else {
            pods_named(cluster, asked).await?
        };
        let nodes = match &args.trace_nodes {
            None => {
                let nodes: Api<Node> = Api::all(client.clone());
                cluster.list_paged(&nodes, &params, "nodes", None).await?
            }
            Some(involved) => {
                let names: Vec<String> = (pods.iter())
                    .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                    .chain(involved.iter().cloned())
                    .chain(args.node.iter().cloned())
                    .chain(args.kube.agent_on.clone())
                    .collect();
                cluster.nodes_named(&names).await?
            }
        };
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
        let pods: Vec<Pod> = (pods.into_iter())
            .map(|p| pod_from_json(serde_json::to_value(p)?))
            .collect::<Result<_>>()?;
        let needing: Vec<&Pod> = pods.iter().filter(|p| needs_events(p)).collect();
        let mut events = SandboxEvents::of(cluster, &needing).await;
        state.pods = (pods.into_iter())
            .map(|pod| {
                let (events, events_unread) = events.take(&pod);
                PodState {
                    pod,
                    events,
                    events_unread,
                }
            })
            .collect();
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

/// The pods `asked` (`namespace/name`), each by name; one the API does
/// not have is left out (the doctor says so).
async fn pods_named(cluster: &Cluster, asked: &[String]) -> Result<Vec<KubePod>> {
    let mut found = Vec::new();
    for qualified in asked {
        let (namespace, name) = qualified.split_once('/').unwrap_or(("default", qualified));
        let pods: Api<KubePod> = Api::namespaced(cluster.client(), namespace);
        let pod = (pods.get_opt(name).await)
            .with_context(|| format!("cannot get pod {qualified} from the API"))?;
        found.extend(pod);
    }
    Ok(found)
}

/// The pods' kubelet events that the checks read (sandbox failures):
/// each pod's own, asked pod by pod; for more pods than that is worth,
/// every such event of the cluster in one list, a page at a time.
struct SandboxEvents {
    /// (reason, message) by `namespace/name` of the pod, oldest first.
    by_pod: std::collections::HashMap<String, Vec<(String, String)>>,
    /// Why they could not be read, for every pod (RBAC refused them).
    unread: Option<String>,
}

/// Pods whose events are asked one by one at most.
const EVENTS_POD_BY_POD: usize = 10;
/// The only events the checks read.
const SANDBOX_FAILURE: &str = "FailedCreatePodSandBox";

impl SandboxEvents {
    async fn of(cluster: &Cluster, pods: &[&Pod]) -> Self {
        let mut events = Self {
            by_pod: Default::default(),
            unread: None,
        };
        let lists: Vec<(Option<&str>, String)> = if pods.len() > EVENTS_POD_BY_POD {
            vec![(
                None,
                format!("involvedObject.kind=Pod,reason={SANDBOX_FAILURE}"),
            )]
        } else {
            (pods.iter())
                .map(|p| {
                    let selector =
                        format!("involvedObject.name={},reason={SANDBOX_FAILURE}", p.name);
                    (Some(p.namespace.as_str()), selector)
                })
                .collect()
        };
        for (namespace, selector) in lists {
            let api: Api<Event> = match namespace {
                Some(ns) => Api::namespaced(cluster.client(), ns),
                None => Api::all(cluster.client()),
            };
            let params = ListParams::default().fields(&selector);
            match list_pages(&api, &params).await {
                Ok(listed) => events.add(listed),
                // Once the API refuses events (RBAC), it refuses them for
                // every pod: asked once, the refusal stands for the rest.
                Err(e) => {
                    let refused = matches!(&e, kube::Error::Api(status) if status.code == 403);
                    let whose =
                        namespace.map_or("the pods".to_string(), |ns| format!("pods in {ns}"));
                    events.unread = Some(format!("cannot list the events of {whose}: {e}"));
                    if refused || namespace.is_none() {
                        break;
                    }
                }
            }
        }
        events
    }

    fn add(&mut self, listed: Vec<Event>) {
        for event in listed {
            let object = &event.involved_object;
            let pod = format!(
                "{}/{}",
                object.namespace.as_deref().unwrap_or_default(),
                object.name.as_deref().unwrap_or_default()
            );
            let said = (
                event.reason.unwrap_or_default(),
                event.message.unwrap_or_default(),
            );
            self.by_pod.entry(pod).or_default().push(said);
        }
    }

    /// A pod's events, or why they are unread.
    fn take(&mut self, pod: &Pod) -> (Vec<(String, String)>, Option<String>) {
        if !needs_events(pod) {
            return (Vec::new(), None);
        }
        let events = self.by_pod.remove(&pod.qualified()).unwrap_or_default();
        let unread = events.is_empty().then(|| self.unread.clone()).flatten();
        (events, unread)
    }
}
