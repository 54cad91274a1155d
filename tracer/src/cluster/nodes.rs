//! The cluster's nodes as podtrace needs them: each node's pod subnet, IP
//! and CNI (from its annotations), from `kubectl get nodes -o json` or the
//! API's Node objects.

use std::{net::Ipv6Addr, path::Path};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{cni, model::NodeSubnet};

/// The cluster's nodes as podtrace knows them: their IPv4 pod subnets
/// (with IP and CNI), and their IPv6 InternalIPs (an IPv6-only node has
/// only that; a dual-stack one both).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Nodes {
    pub subnets: Vec<NodeSubnet>,
    pub ipv6: Vec<(String, Ipv6Addr)>,
}

/// Nodes of a `kubectl get nodes -o json` file: their pod subnets, IPs and
/// CNI backend (Flannel's backend-type annotation; Calico's IPv4Address).
/// Parsed as it is read (see `cluster::parse_file`): of each node, only
/// what is kept here is held, not its images or managed fields.
pub fn load_nodes(path: &Path) -> Result<Nodes> {
    let list: NodeList = super::parse_file(path, "nodes file", "a node list")?;
    let items = (list.items.into_iter())
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()?;
    nodes_of(&items).with_context(|| format!("{} is not a node list", path.display()))
}

/// Node objects (`v1.Node` JSON) as [`Nodes`].
pub fn nodes_of(items: &[Value]) -> Result<Nodes> {
    let ipv6 = (items.iter())
        .filter_map(|node| {
            let name = node["metadata"]["name"].as_str()?;
            Some((name.to_string(), internal_ip::<Ipv6Addr>(node)?))
        })
        .collect();
    Ok(Nodes {
        subnets: nodes_from_items(items)?,
        ipv6,
    })
}

/// A node list as `load_nodes` reads it.
#[derive(Deserialize)]
struct NodeList {
    items: Vec<NodeObject>,
}

/// The parts of a Node object that `nodes_from_items` reads; the rest is
/// skipped as it is read.
#[derive(Deserialize, Serialize)]
struct NodeObject {
    #[serde(default)]
    metadata: NodeMetadata,
    #[serde(default)]
    spec: NodeSpec,
    #[serde(default)]
    status: NodeStatus,
}

#[derive(Default, Deserialize, Serialize)]
struct NodeMetadata {
    #[serde(default)]
    name: Value,
    #[serde(default)]
    annotations: Value,
}

#[derive(Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeSpec {
    #[serde(default, rename = "podCIDR")]
    pod_cidr: Value,
    #[serde(default, rename = "podCIDRs", skip_serializing_if = "Value::is_null")]
    pod_cidrs: Value,
}

#[derive(Default, Deserialize, Serialize)]
struct NodeStatus {
    #[serde(default)]
    addresses: Value,
}

pub fn parse_nodes(json: &str) -> Result<Vec<NodeSubnet>> {
    let list: serde_json::Value = serde_json::from_str(json)?;
    nodes_from_items(list["items"].as_array().context("no items")?)
}

/// A node's IPv4 InternalIP (`v1.Node` JSON). A dual-stack node lists one
/// InternalIP per family, IPv6 first where that is the cluster's primary
/// family: the IPv4 one is taken wherever it is listed.
pub fn ipv4_internal_ip(node: &serde_json::Value) -> Option<std::net::Ipv4Addr> {
    internal_ip(node)
}

/// A node's pod CIDRs of the family `N` parses as (`Ipv4Net`, `Ipv6Net`):
/// `spec.podCIDRs`, else the older single `spec.podCIDR`.
pub fn pod_cidrs<N: std::str::FromStr>(node: &serde_json::Value) -> Vec<N> {
    let spec = &node["spec"];
    let listed = spec["podCIDRs"].as_array().map(Vec::as_slice);
    let cidrs = listed.unwrap_or(std::slice::from_ref(&spec["podCIDR"]));
    cidrs
        .iter()
        .filter_map(|c| c.as_str()?.parse().ok())
        .collect()
}

/// A node's InternalIP of the family `A` parses as.
fn internal_ip<A: std::str::FromStr>(node: &serde_json::Value) -> Option<A> {
    node["status"]["addresses"]
        .as_array()?
        .iter()
        .filter(|a| a["type"] == "InternalIP")
        .find_map(|a| a["address"].as_str()?.parse().ok())
}

/// Node objects (`v1.Node` JSON, from a file or the API) as pod subnets.
pub fn nodes_from_items(items: &[serde_json::Value]) -> Result<Vec<NodeSubnet>> {
    let mut subnets = Vec::new();
    for node in items {
        let name = node["metadata"]["name"]
            .as_str()
            .context("a node without a name")?;
        let annotations = &node["metadata"]["annotations"];
        let internal_ip = ipv4_internal_ip(node);
        let cni = cni::from_annotations(annotations);
        let tunnel_ip = annotations[cni::VXLAN_TUNNEL_ADDR]
            .as_str()
            .and_then(|ip| ip.parse().ok());
        for cidr in pod_cidrs(node) {
            if let Some(node_ip) = internal_ip {
                subnets.push(NodeSubnet {
                    node: name.to_string(),
                    subnet: cidr,
                    node_ip,
                    cni,
                    tunnel_ip,
                });
            }
        }
    }
    Ok(subnets)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    /// An IPv6-primary dual-stack node lists its IPv6 podCIDR and
    /// InternalIP first: the IPv4 ones are taken, not the node dropped.
    #[test]
    fn a_dual_stack_node_gives_its_ipv4_subnet_and_address_in_either_order() {
        let nodes = parse_nodes(
            r#"{"items":[{"metadata":{"name":"node-2"},
              "spec":{"podCIDR":"fd00:10:244:2::/64","podCIDRs":["fd00:10:244:2::/64","10.244.2.0/24"]},
              "status":{"addresses":[{"type":"InternalIP","address":"fd5a::12"},{"type":"Hostname","address":"node-2"},{"type":"InternalIP","address":"192.0.2.12"}]}}]}"#,
        )
        .unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].subnet.to_string(), "10.244.2.0/24");
        assert_eq!(nodes[0].node_ip, Ipv4Addr::new(192, 0, 2, 12));
    }

    /// An IPv6-only node has no IPv4 subnet to list, but is known by its
    /// IPv6 InternalIP (a dual-stack one by both).
    #[test]
    fn a_nodes_ipv6_internal_ip_is_known_with_or_without_ipv4() {
        let items: serde_json::Value = serde_json::from_str(
            r#"[{"metadata":{"name":"v6"},"spec":{"podCIDR":"fd00:10:244:3::/64"},
              "status":{"addresses":[{"type":"InternalIP","address":"fd5a::13"}]}},
             {"metadata":{"name":"dual"},"spec":{"podCIDRs":["10.244.2.0/24","fd00:10:244:2::/64"]},
              "status":{"addresses":[{"type":"InternalIP","address":"192.0.2.12"},{"type":"InternalIP","address":"fd5a::12"}]}}]"#,
        )
        .unwrap();
        let nodes = nodes_of(items.as_array().unwrap()).unwrap();
        let ipv6: Vec<String> = nodes
            .ipv6
            .iter()
            .map(|(n, ip)| format!("{n} {ip}"))
            .collect();
        assert_eq!(ipv6, ["v6 fd5a::13", "dual fd5a::12"]);
        assert_eq!(nodes.subnets.len(), 1, "the dual-stack node's IPv4 subnet");
    }

    #[test]
    fn node_subnets_and_backends_from_a_node_list() {
        let nodes = parse_nodes(
            r#"{"items":[{"metadata":{"name":"node-2","annotations":{"flannel.alpha.coreos.com/backend-type":"vxlan"}},
              "spec":{"podCIDR":"10.244.2.0/24","podCIDRs":["10.244.2.0/24"]},
              "status":{"addresses":[{"type":"InternalIP","address":"192.0.2.12"}]}},
              {"metadata":{"name":"cal-1","annotations":{"projectcalico.org/IPv4Address":"192.0.2.21/24"}},
              "spec":{"podCIDR":"10.245.1.0/24"},"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.21"}]}}]}"#,
        )
        .unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[0].subnet.to_string(), "10.244.2.0/24");
        assert_eq!(nodes[0].cni, Some("flannel-vxlan"));
        assert_eq!(nodes[1].cni, Some("calico-bird"));
        assert_eq!(nodes[1].node_ip, Ipv4Addr::new(192, 0, 2, 21));
    }
}
