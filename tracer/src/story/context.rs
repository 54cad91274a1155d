//! What podtrace knows about the traced part of the cluster, for telling
//! stories: names of addresses, the traced nodes' facts, pod subnets, and
//! why a netfilter rule could not be named.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr},
};

use ipnet::Ipv4Net;
use serde::{Deserialize, Serialize};

use super::nat::NatBook;
use crate::{
    model::{
        interned::{leak_str, StaticStr},
        NodeSubnet,
    },
    node::NodeFacts,
};

/// What podtrace knows about the traced part of the cluster.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Context {
    /// Labels for addresses: pods ("default/web-0") and nodes ("node-1").
    pub names: HashMap<IpAddr, String>,
    /// What each traced node looked like at start, by node name.
    pub nodes: HashMap<String, NodeFacts>,
    /// Every node's pod subnet (`--nodes-file`).
    pub subnets: Vec<NodeSubnet>,
    /// The cluster's pod CIDRs (`--pod-cidr`).
    pub pod_cidrs: Vec<Ipv4Net>,
    /// Why a netfilter drop's rule may be missing (rule tracing off, …).
    #[serde(deserialize_with = "leak_str")]
    pub why_rule_unnamed: StaticStr,
    /// Cluster mode: how far each node's clock may be off the common
    /// timeline (ns), where the traced packets measured it.
    #[serde(default)]
    pub clock_uncertainty_ns: HashMap<String, u64>,
    /// The address translations known (Services), to name them.
    #[serde(default)]
    pub nat: NatBook,
    /// The doctor's failing checks on each traced node, by node name: what
    /// a verdict without a packet to blame adds.
    #[serde(default)]
    pub doctor: HashMap<String, Vec<crate::model::Finding>>,
    /// Why a netfilter drop on a node may have no traced rule, by node
    /// name, where rule tracing cannot see all of its rules (an
    /// iptables-legacy node, or legacy rules beside nft ones).
    #[serde(default)]
    pub rules_unseen: HashMap<String, String>,
    /// Each traced node's conntrack counters and fill (node mode), read
    /// again before a netfilter drop is told.
    #[serde(default)]
    pub conntrack: HashMap<String, crate::model::conntrack::ConntrackTable>,
    /// Cluster mode: traced nodes whose agent was lost mid-trace.
    #[serde(default)]
    pub lost_agents: Vec<LostAgent>,
    /// The API's NetworkPolicies of the traced pods' namespaces (or why
    /// not read) and the traced pods' labels, for a policy drop.
    #[serde(default)]
    pub policies: crate::cluster::policy_book::PolicyBook,
}

/// An address and its name, as [`Context::label`] shows it.
pub struct Label<'a> {
    ip: IpAddr,
    name: Option<&'a str>,
}

impl std::fmt::Display for Label<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", Shown(self.ip))?;
        match self.name {
            Some(name) => write!(f, " ({name})"),
            None => Ok(()),
        }
    }
}

/// An address in dotted quads, written at once: std's `Display` goes
/// through the formatting machinery once per octet, which was the bulk of
/// a note's cost at line rate. (No width or padding: a note has none.)
pub(crate) struct Dotted(pub Ipv4Addr);

/// An address of either family as `Display` shows it: IPv4 through
/// [`Dotted`], IPv6 as std writes it (the compressed form).
pub(crate) struct Shown(pub IpAddr);

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(v4) => Dotted(v4).fmt(f),
            IpAddr::V6(v6) => write!(f, "{v6}"),
        }
    }
}

impl std::fmt::Display for Dotted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut text = [0u8; 15];
        let mut len = 0;
        for (i, octet) in self.0.octets().into_iter().enumerate() {
            let digits = [octet / 100, octet / 10 % 10, octet % 10];
            let from = match octet {
                100.. => 0,
                10..=99 => 1,
                _ => 2,
            };
            if i > 0 {
                text[len] = b'.';
                len += 1;
            }
            for digit in &digits[from..] {
                text[len] = b'0' + digit;
                len += 1;
            }
        }
        f.write_str(std::str::from_utf8(&text[..len]).expect("ASCII digits and dots"))
    }
}

impl Context {
    /// `ip`, with its name when known ("10.244.2.2 (default/db-0)"): a
    /// `Display`, so that a note at line rate writes it in place rather
    /// than through a String of its own.
    pub fn label(&self, ip: impl Into<IpAddr>) -> Label<'_> {
        let ip = ip.into();
        Label {
            ip,
            name: self.names.get(&ip).map(String::as_str),
        }
    }

    /// The traced node that holds `ip` as one of its own addresses.
    pub fn node_holding(&self, ip: impl Into<IpAddr>) -> Option<&str> {
        let ip = ip.into();
        self.nodes
            .iter()
            .find(|(_, facts)| facts.view.holds(ip))
            .map(|(node, _)| node.as_str())
    }

    /// A packet for `dst` must show up again: a traced node delivers
    /// `dst`'s subnet locally (via a bridge or pod veth).
    pub fn expects_arrival(&self, dst: IpAddr) -> bool {
        self.nodes
            .values()
            .flat_map(|facts| &facts.local_pod_subnets)
            .any(|net| net.contains(&dst))
    }
}

/// A traced node whose hops stopped coming.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LostAgent {
    pub node: String,
    /// Its last progress mark, on the common timeline: every hop its agent
    /// stamped before then came in; later ones may be missing.
    pub since_ns: u64,
    /// What became of the agent, for the verdict ("node-2's agent died at
    /// 23:10:05 (its log ended without its summary)").
    pub what: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_quads_read_as_std_writes_them() {
        for ip in ["0.0.0.0", "255.255.255.255", "10.0.100.9", "192.168.1.10"] {
            let ip: Ipv4Addr = ip.parse().unwrap();
            assert_eq!(Dotted(ip).to_string(), ip.to_string());
        }
    }
}
