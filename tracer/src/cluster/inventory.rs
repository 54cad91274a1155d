//! Pods and nodes named in a `kubectl get pods -A -o json` style file
//! (`--pods-file`), and resolution of the pod arguments.

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use anyhow::{anyhow, bail, Context, Result};

use super::argument::Target;
use serde::Deserialize;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub ip: Option<Ipv4Addr>,
    pub node: Option<String>,
    pub host_ip: Option<Ipv4Addr>,
    /// Its node's IPv6 address (hostIPs of a dual-stack or IPv6 node).
    pub host_ipv6: Option<Ipv6Addr>,
    pub phase: Option<String>,
    pub host_network: bool,
    /// Its podIP as written, when that is not an IP address.
    pub unreadable_ip: Option<String>,
    /// Its IPv6 addresses (podIPs of a dual-stack or IPv6 pod).
    pub ipv6: Vec<Ipv6Addr>,
    /// Its podIP is IPv6 and `ip` came from podIPs: the cluster's primary
    /// family is IPv6, and the API's podIP field selector does not find
    /// the pod by `ip`.
    pub ip_is_secondary: bool,
    /// Its labels: what NetworkPolicies select it by.
    pub labels: BTreeMap<String, String>,
}

impl Pod {
    pub fn qualified(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether `ip` is one of its addresses, of either family.
    pub fn holds(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(ip) => self.ip == Some(ip),
            IpAddr::V6(ip) => self.ipv6.contains(&ip),
        }
    }
}

#[derive(Deserialize)]
struct List {
    items: Vec<Item>,
}

#[derive(Deserialize)]
struct Item {
    /// `Pod` where the list names it (kubectl's does).
    #[serde(default)]
    kind: Option<String>,
    metadata: Metadata,
    #[serde(default)]
    spec: Spec,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
    #[serde(default = "default_namespace")]
    namespace: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Spec {
    node_name: Option<String>,
    #[serde(default)]
    host_network: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    /// Every family's address (dual-stack: podIP is one of them, the
    /// cluster's primary family, which may be IPv6).
    #[serde(rename = "podIPs", default)]
    pod_ips: Vec<Address>,
    #[serde(rename = "hostIP")]
    host_ip: Option<String>,
    #[serde(rename = "hostIPs", default)]
    host_ips: Vec<Address>,
    phase: Option<String>,
}

#[derive(Deserialize, Default)]
struct Address {
    #[serde(default)]
    ip: String,
}

/// Addresses as the API lists a dual-stack object's (`podIP` then
/// `podIPs`, `clusterIP` then `clusterIPs`): the first IPv4 one, and each
/// IPv6 one once. Either family may come first.
pub(crate) fn by_family<'a>(
    listed: impl IntoIterator<Item = &'a str>,
) -> (Option<Ipv4Addr>, Vec<Ipv6Addr>) {
    let mut v4 = None;
    let mut v6 = Vec::new();
    for text in listed {
        match text.parse::<IpAddr>() {
            Ok(IpAddr::V4(ip)) => {
                v4.get_or_insert(ip);
            }
            Ok(IpAddr::V6(ip)) if !v6.contains(&ip) => v6.push(ip),
            _ => {}
        }
    }
    (v4, v6)
}

/// `podIP` and `podIPs` (or the host's), by family.
fn addresses(primary: Option<&str>, all: &[Address]) -> (Option<Ipv4Addr>, Vec<Ipv6Addr>) {
    by_family(primary.into_iter().chain(all.iter().map(|a| a.ip.as_str())))
}

fn default_namespace() -> String {
    "default".into()
}

#[derive(Clone, Debug, Default)]
pub struct Inventory {
    pub pods: Vec<Pod>,
}

impl Inventory {
    /// A pods file, parsed as it is read (see `cluster::parse_file`).
    pub fn load(path: &Path) -> Result<Self> {
        let list: List = super::parse_file(path, "pods file", "a pod list")?;
        Self::of_list(list).map_err(|e| anyhow!("pods file {} {e}", path.display()))
    }

    pub fn parse(json: &str) -> Result<Self> {
        Self::of_list(serde_json::from_str(json)?)
    }

    /// The pods of a list, each named once.
    fn of_list(list: List) -> Result<Self> {
        // Another kind's list (a nodes file given here) is said, not read
        // as pods that are not the ones asked for. Other kinds beside
        // pods (`kubectl get pods,nodes`) are left out.
        let is_pod = |i: &Item| i.kind.as_deref().is_none_or(|k| k == "Pod");
        let other = list
            .items
            .iter()
            .find_map(|i| i.kind.as_deref().filter(|k| *k != "Pod"));
        if let Some(kind) = other.filter(|_| !list.items.iter().any(is_pod)) {
            bail!("lists {kind} objects, not pods (kubectl get pods -A -o json)");
        }
        let pods: Vec<Pod> = list
            .items
            .into_iter()
            .filter(is_pod)
            .map(Pod::from)
            .collect();
        let mut seen = std::collections::HashSet::new();
        if let Some(twice) = pods.iter().find(|p| !seen.insert((&p.namespace, &p.name))) {
            bail!("lists pod {} twice", twice.qualified());
        }
        Ok(Self { pods })
    }

    /// An endpoint argument, from the pods in the file.
    pub fn resolve(&self, target: &Target) -> Result<Endpoint> {
        match target {
            Target::Ip(ip) | Target::IpPort(ip, _) => Endpoint::of_ip(*ip, self.pods_with(*ip)),
            Target::Ip6(ip) | Target::Ip6Port(ip, _) => Endpoint::of_ip(*ip, self.pods_with(*ip)),
            Target::Pod { namespace, name } => {
                let Some(pod) = self
                    .pods
                    .iter()
                    .find(|p| p.namespace == *namespace && p.name == *name)
                else {
                    bail!(not_found(namespace, name, &self.pods));
                };
                Endpoint::of_pod(pod.clone())
            }
            Target::Node(node) => {
                let ip = self.node_ip(node).with_context(|| {
                    format!("node {node}'s IPv4 address is not known: no pod of the pods file on it lists an IPv4 hostIP; give its IP")
                })?;
                Ok(Endpoint {
                    ip: ip.into(),
                    pod: None,
                    label: Some(format!("node/{node}")),
                })
            }
            Target::Service { namespace, name } => bail!(
                "svc/{namespace}/{name} needs the Kubernetes API to find its ClusterIP: give the ClusterIP instead"
            ),
        }
    }

    /// The pods that have `ip`, of either family.
    fn pods_with(&self, ip: impl Into<IpAddr>) -> Vec<Pod> {
        let ip = ip.into();
        self.pods.iter().filter(|p| p.holds(ip)).cloned().collect()
    }

    /// The node's IPv4 address, as any of its pods tells it (a pod listed
    /// without hostIPs, IPv6-primary, tells none).
    pub fn node_ip(&self, node: &str) -> Option<Ipv4Addr> {
        self.pods
            .iter()
            .filter(|p| p.node.as_deref() == Some(node))
            .find_map(|p| p.host_ip)
    }

    /// Node names and their IPv4 addresses, as far as the pods tell.
    pub fn nodes(&self) -> Vec<(String, Ipv4Addr)> {
        self.nodes_by(|p| p.host_ip)
    }

    /// Node names and their IPv6 addresses, as far as the pods tell (an
    /// IPv6-only cluster's nodes have no other).
    pub fn nodes6(&self) -> Vec<(String, Ipv6Addr)> {
        self.nodes_by(|p| p.host_ipv6)
    }

    fn nodes_by<A: Ord>(&self, address: impl Fn(&Pod) -> Option<A>) -> Vec<(String, A)> {
        let mut nodes: Vec<(String, A)> = self
            .pods
            .iter()
            .filter_map(|p| Some((p.node.clone()?, address(p)?)))
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }
}

/// One side of the traced flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Its IPv4 address where it has one, else its IPv6 one (an
    /// IPv6-only pod, a plain IPv6 address).
    pub ip: IpAddr,
    pub pod: Option<Pod>,
    /// How to call it when it is not a pod: `node/worker-1`, `svc/ns/name`.
    pub label: Option<String>,
}

/// A pod asked for that has no IP yet (its sandbox may have failed: the
/// doctor can tell why), as a type so that callers act on it without
/// reading the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodWithoutIp {
    /// `namespace/name`.
    pub pod: String,
    pub phase: String,
}

impl std::fmt::Display for PodWithoutIp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pod {} has no IP yet (phase {})", self.pod, self.phase)
    }
}

impl std::error::Error for PodWithoutIp {}

impl Endpoint {
    /// A pod, once it has an IP to trace: its IPv4 address, or its first
    /// IPv6 one where it has no IPv4 (an IPv6-only cluster's pods).
    pub fn of_pod(pod: Pod) -> Result<Self> {
        let first = pod
            .ip
            .map(IpAddr::V4)
            .or_else(|| pod.ipv6.first().copied().map(IpAddr::V6));
        let Some(ip) = first else {
            if let Some(text) = &pod.unreadable_ip {
                bail!(
                    "pod {} has podIP {text:?}, which is not an IP address",
                    pod.qualified()
                );
            }
            let phase = pod.phase.clone().unwrap_or_else(|| "Pending".into());
            return Err(PodWithoutIp {
                pod: pod.qualified(),
                phase,
            }
            .into());
        };
        Ok(Self {
            ip,
            pod: Some(pod),
            label: None,
        })
    }

    /// An IP and the pods that have it: none (not a pod: traced as a
    /// plain address), one, or several host-network pods sharing a node
    /// IP (ambiguous).
    pub fn of_ip(ip: impl Into<IpAddr>, pods: Vec<Pod>) -> Result<Self> {
        let ip = ip.into();
        match pods.as_slice() {
            [] => Ok(Self {
                ip,
                pod: None,
                label: None,
            }),
            [pod] => Ok(Self {
                ip: if ip.is_ipv6() {
                    Self::of_pod(pod.clone())?.ip
                } else {
                    ip
                },
                pod: Some(pod.clone()),
                label: None,
            }),
            many => {
                let names: Vec<String> = many.iter().map(Pod::qualified).collect();
                bail!(
                    "{ip} is ambiguous: {} pods have it ({}); name one of them",
                    names.len(),
                    names.join(", ")
                )
            }
        }
    }

    /// Its IPv4 address, if it has one.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        match self.ip {
            IpAddr::V4(ip) => Some(ip),
            IpAddr::V6(_) => None,
        }
    }

    /// What to call it in stories.
    pub fn name(&self) -> Option<String> {
        self.pod
            .as_ref()
            .map(Pod::qualified)
            .or_else(|| self.label.clone())
    }
}

impl From<Item> for Pod {
    fn from(item: Item) -> Self {
        let status = item.status;
        let written = status.pod_ip.filter(|ip| !ip.is_empty());
        let (ip, ipv6) = addresses(written.as_deref(), &status.pod_ips);
        let (host_ip, host_ipv6) = addresses(status.host_ip.as_deref(), &status.host_ips);
        let primary = written.as_deref().and_then(|w| w.parse::<IpAddr>().ok());
        let readable = primary.is_some();
        let ip_is_secondary = ip.is_some() && primary.is_some_and(|p| p.is_ipv6());
        Pod {
            namespace: item.metadata.namespace,
            name: item.metadata.name,
            unreadable_ip: written.filter(|_| ip.is_none() && !readable),
            ip,
            node: item.spec.node_name,
            host_ip,
            host_ipv6: host_ipv6.first().copied(),
            phase: status.phase,
            host_network: item.spec.host_network,
            ipv6,
            ip_is_secondary,
            labels: item.metadata.labels,
        }
    }
}

/// A pod object as the API serves it (`v1.Pod` JSON).
pub fn pod_from_json(value: serde_json::Value) -> Result<Pod> {
    Ok(serde_json::from_value::<Item>(value)?.into())
}

/// How many close names "did you mean" offers at most.
const MAX_SUGGESTIONS: usize = 5;

/// "pod ns/name not found", with the closest names among `candidates`
/// (a few: a cluster may have thousands of pods).
pub fn not_found(ns: &str, name: &str, candidates: &[Pod]) -> String {
    let prefix: String = name.chars().take(3).collect();
    let mut near: Vec<(usize, String)> = candidates
        .iter()
        .filter_map(|p| {
            let distance = edit_distance(&p.name, name);
            let close = p.name.starts_with(&prefix) || distance <= 2;
            (close && p.namespace == ns || distance <= 2).then(|| (distance, p.qualified()))
        })
        .collect();
    near.sort();
    near.dedup();
    let more = near.len().saturating_sub(MAX_SUGGESTIONS);
    let shown: Vec<String> = near
        .into_iter()
        .take(MAX_SUGGESTIONS)
        .map(|(_, name)| name)
        .collect();
    match (shown.is_empty(), more) {
        (true, _) => format!("pod {ns}/{name} not found"),
        (false, 0) => format!(
            "pod {ns}/{name} not found; did you mean {}?",
            shown.join(", ")
        ),
        (false, more) => format!(
            "pod {ns}/{name} not found; did you mean {} (or {more} more)?",
            shown.join(", ")
        ),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: &str = r#"{"apiVersion":"v1","kind":"List","items":[
      {"metadata":{"name":"web-0","namespace":"default"},"spec":{"nodeName":"node-1"},
       "status":{"podIP":"10.244.1.2","hostIP":"192.0.2.11","phase":"Running"}},
      {"metadata":{"name":"db-0","namespace":"default","labels":{"app":"db"}},"spec":{"nodeName":"node-2"},
       "status":{"podIP":"10.244.2.2","hostIP":"192.0.2.12","phase":"Running"}},
      {"metadata":{"name":"pending","namespace":"kube-system"},"spec":{},"status":{"phase":"Pending"}}]}"#;

    fn resolve(inv: &Inventory, arg: &str, ns: &str) -> Result<Endpoint> {
        inv.resolve(&Target::parse(arg, ns)?)
    }

    #[test]
    fn another_kinds_list_is_not_read_as_pods() {
        let nodes = r#"{"kind":"List","items":[{"kind":"Node","metadata":{"name":"node-1"}}]}"#;
        let e = Inventory::parse(nodes).unwrap_err().to_string();
        assert!(e.starts_with("lists Node objects, not pods"), "{e}");
        // Beside pods (kubectl get pods,nodes), other kinds are left out.
        let both = r#"{"kind":"List","items":[{"kind":"Node","metadata":{"name":"node-1"}},
            {"kind":"Pod","metadata":{"name":"web-0"},"status":{"podIP":"10.244.1.2"}}]}"#;
        let inv = Inventory::parse(both).unwrap();
        assert_eq!(inv.pods.len(), 1);
        assert_eq!(inv.pods[0].name, "web-0");
    }

    #[test]
    fn resolves_names_ips_and_explains_failures() {
        let inv = Inventory::parse(PODS).unwrap();
        let db = resolve(&inv, "default/db-0", "x").unwrap();
        assert_eq!(db.ip, Ipv4Addr::new(10, 244, 2, 2));
        // What its NetworkPolicies select it by.
        let labels = db.pod.unwrap().labels;
        assert_eq!(labels.get("app").map(String::as_str), Some("db"));
        assert_eq!(
            resolve(&inv, "web-0", "default")
                .unwrap()
                .pod
                .unwrap()
                .node
                .as_deref(),
            Some("node-1")
        );
        let by_ip = resolve(&inv, "10.244.1.2", "default").unwrap();
        assert_eq!(by_ip.pod.unwrap().name, "web-0");
        assert!(resolve(&inv, "10.9.9.9", "default").unwrap().pod.is_none());
        let err = resolve(&inv, "web-1", "default").unwrap_err().to_string();
        assert_eq!(
            err,
            "pod default/web-1 not found; did you mean default/web-0?"
        );
        let err = resolve(&inv, "kube-system/pending", "default").unwrap_err();
        assert_eq!(
            err.to_string(),
            "pod kube-system/pending has no IP yet (phase Pending)"
        );
        // Told by its type, under whatever context callers add: a trace
        // hands such a pod to the doctor for why.
        let err = err.context("resolving DST");
        assert_eq!(
            err.downcast_ref::<PodWithoutIp>().map(|e| e.pod.as_str()),
            Some("kube-system/pending")
        );
        assert_eq!(inv.nodes().len(), 2);
        assert_eq!(inv.node_ip("node-2"), Some(Ipv4Addr::new(192, 0, 2, 12)));
    }

    #[test]
    fn a_huge_inventory_offers_a_few_close_names_not_all() {
        let pods: Vec<Pod> = (0..100_000)
            .map(|i| Pod {
                namespace: "default".into(),
                name: format!("web-{i}"),
                ip: None,
                node: None,
                host_ip: None,
                host_ipv6: None,
                phase: None,
                host_network: false,
                unreadable_ip: None,
                ipv6: Vec::new(),
                ip_is_secondary: false,
                labels: BTreeMap::new(),
            })
            .collect();
        let message = not_found("default", "web-x", &pods);
        assert!(message.len() < 200, "{message}");
        assert!(message.contains("more)?"), "{message}");
    }

    #[test]
    fn a_pod_ip_that_is_not_an_address_is_named_so() {
        let inv = Inventory::parse(
            r#"{"items":[{"metadata":{"name":"odd-0"},"status":{"podIP":"999.1.1.1","phase":"Running"}}]}"#,
        )
        .unwrap();
        let err = resolve(&inv, "odd-0", "default").unwrap_err().to_string();
        assert_eq!(
            err,
            "pod default/odd-0 has podIP \"999.1.1.1\", which is not an IP address"
        );
        assert!(!err.contains("no IP"), "{err}");
    }

    /// A dual-stack cluster whose primary family is IPv6 writes the IPv6
    /// address in podIP and hostIP: the pod is traced by the IPv4 one of
    /// podIPs, and its IPv6 addresses are kept to say they are not traced.
    /// A pod of IPv6 only is traced by its IPv6 address.
    #[test]
    fn a_dual_stack_pod_is_traced_by_its_ipv4_address_whichever_is_primary() {
        let inv = Inventory::parse(
            r#"{"items":[
            {"metadata":{"name":"web-0"},"spec":{"nodeName":"node-1"},"status":{"podIP":"fd00:10:244:1::2","podIPs":[{"ip":"fd00:10:244:1::2"},{"ip":"10.244.1.2"}],
             "hostIP":"fd5a::11","hostIPs":[{"ip":"fd5a::11"},{"ip":"192.0.2.11"}],"phase":"Running"}},
            {"metadata":{"name":"db-0"},"status":{"podIP":"10.244.2.2","podIPs":[{"ip":"10.244.2.2"},{"ip":"fd00:10:244:2::2"}]}},
            {"metadata":{"name":"v6-0"},"status":{"podIP":"fd00:10:244:1::9","podIPs":[{"ip":"fd00:10:244:1::9"}],"phase":"Running"}}]}"#,
        )
        .unwrap();
        let web = resolve(&inv, "web-0", "default").unwrap();
        assert_eq!(web.ip, Ipv4Addr::new(10, 244, 1, 2));
        assert_eq!(web.ipv4(), Some(Ipv4Addr::new(10, 244, 1, 2)));
        let pod = web.pod.unwrap();
        assert_eq!(pod.ipv6, ["fd00:10:244:1::2".parse::<Ipv6Addr>().unwrap()]);
        assert!(pod.ip_is_secondary);
        assert_eq!(pod.host_ip, Some(Ipv4Addr::new(192, 0, 2, 11)));
        assert_eq!(pod.host_ipv6, Some("fd5a::11".parse().unwrap()));
        assert_eq!(inv.node_ip("node-1"), Some(Ipv4Addr::new(192, 0, 2, 11)));
        let db = resolve(&inv, "db-0", "default").unwrap();
        assert_eq!(db.ip, Ipv4Addr::new(10, 244, 2, 2));
        assert!(!db.pod.unwrap().ip_is_secondary);
        let v6 = resolve(&inv, "v6-0", "default").unwrap();
        assert_eq!(v6.ip, "fd00:10:244:1::9".parse::<Ipv6Addr>().unwrap());
        assert_eq!(v6.ipv4(), None);
    }

    #[test]
    fn a_pod_listed_twice_is_refused_in_one_line() {
        let twice = r#"{"items":[{"metadata":{"name":"web-0"},"status":{"podIP":"10.1.1.2"}},
            {"metadata":{"name":"db-0"}},{"metadata":{"name":"web-0","namespace":"default"}}]}"#;
        let err = Inventory::parse(twice).unwrap_err().to_string();
        assert_eq!(err, "lists pod default/web-0 twice");
        let path = std::env::temp_dir().join(format!("podtrace-twice-{}.json", std::process::id()));
        std::fs::write(&path, twice).unwrap();
        let err = format!("{:#}", Inventory::load(&path).unwrap_err());
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            err,
            format!("pods file {} lists pod default/web-0 twice", path.display())
        );
        assert_eq!(err.lines().count(), 1);
    }

    #[test]
    fn edit_distance_counts_edits() {
        assert_eq!(edit_distance("web-0", "web-0"), 0);
        assert_eq!(edit_distance("web-0", "wbe-0"), 2);
        assert_eq!(edit_distance("db-0", "db-10"), 1);
    }
}
