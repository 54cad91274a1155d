//! The AWS VPC CNI as it wires an EKS node: no overlay; pods take
//! addresses of a secondary ENI (eth1); each pod gets a /32 route to its
//! `eni…` veth, `512: from all to <pod> lookup main` and `1536: from
//! <pod> lookup 2`; table 2 (the ENI's device number + 1) holds the
//! default route via the VPC router over eth1. The underlay plays the
//! VPC: its router sends each node's pod addresses to that node's ENI.

use std::net::Ipv4Addr;

use anyhow::Result;
use ipnet::Ipv4Net;
use serde_json::{json, Value};

use super::{calico, ip, sysctl, Cni, Lab};

/// The secondary ENI's subnet, and the VPC router's address on it.
const ENI_SUBNET: &str = "198.51.100.0/24";
const VPC_ROUTER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
/// The route table of the ENI eth1 (device number 1, plus one).
pub const ENI_TABLE: u32 = 2;

pub struct AwsVpc;

impl AwsVpc {
    /// The node's address on its secondary ENI.
    pub fn eni_ip(node: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 51, 100, 20 + node)
    }
}

impl Cni for AwsVpc {
    fn name(&self) -> &'static str {
        "aws-vpc"
    }

    fn default_pod_cidr(&self) -> Ipv4Net {
        "10.247.0.0/16".parse().expect("literal")
    }

    fn host_iface(&self, pod_netns: &str) -> String {
        format!("eni{:011x}", super::fnv1a(pod_netns) >> 20)
    }

    fn build_node(&self, lab: &Lab, node: u8) -> Result<()> {
        let ns = lab.node_netns(node);
        let ul = lab.underlay_netns();
        // The VPC: its router on the ENIs' subnet, routing each node's
        // pod addresses to that node's ENI, without redirects.
        if node == 1 {
            ip(&ul, &format!("addr add {VPC_ROUTER}/24 dev br0"))?;
            sysctl(&ul, "net.ipv4.ip_forward", "1")?;
            sysctl(&ul, "net.ipv4.conf.all.send_redirects", "0")?;
            sysctl(&ul, "net.ipv4.conf.br0.send_redirects", "0")?;
        }
        ip(
            &ul,
            &format!(
                "route add {} via {}",
                lab.node_subnet(node),
                Self::eni_ip(node)
            ),
        )?;
        ip(
            &ul,
            &format!("link add n{node}e type veth peer name eth1 netns {ns}"),
        )?;
        ip(&ul, &format!("link set n{node}e master br0 up"))?;
        let eni = Ipv4Net::new(Self::eni_ip(node), 24)?;
        debug_assert_eq!(eni.trunc().to_string(), ENI_SUBNET);
        ip(&ns, &format!("addr add {eni} dev eth1"))?;
        ip(&ns, "link set eth1 up")?;
        sysctl(&ns, "net.ipv4.conf.all.accept_redirects", "0")?;
        let table = ENI_TABLE;
        ip(
            &ns,
            &format!("route add {VPC_ROUTER} dev eth1 scope link table {table}"),
        )?;
        ip(
            &ns,
            &format!("route add default via {VPC_ROUTER} dev eth1 table {table}"),
        )?;
        // The pods: veth, /32 and static gateway as the plugin makes them.
        calico::pods(lab, &ns, node, None)?;
        for pod in lab.pods_on(node) {
            ip(
                &ns,
                &format!("rule add to {} lookup main priority 512", pod.ip),
            )?;
            ip(
                &ns,
                &format!("rule add from {} lookup {table} priority 1536", pod.ip),
            )?;
        }
        Ok(())
    }

    fn node_annotations(&self, _lab: &Lab, _node: u8) -> Value {
        json!({})
    }
}
