//! The lab as `kubectl` would print it: its pods and its nodes (with
//! their conditions and their CNI's annotations), written to `pods.json`
//! and `nodes.json` and served by the API stub.

use serde_json::{json, Value};

use super::Lab;

impl Lab {
    /// The pods as `kubectl get pods -A -o json` prints them.
    pub fn pod_list(&self) -> Value {
        let items: Vec<Value> = self
            .pods()
            .iter()
            .map(|p| {
                // IPv4-primary: podIP stays IPv4, IPv6 second in podIPs.
                let mut pod_ips = vec![json!({"ip": p.ip.to_string()})];
                pod_ips.extend(p.ipv6.map(|ip| json!({"ip": ip.to_string()})));
                json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": p.name, "namespace": "default", "labels": {"app": p.name.split('-').next()}},
                    "spec": {"nodeName": Self::node_name(p.node), "containers": [{"name": "main", "image": "busybox"}]},
                    "status": {
                        "phase": "Running",
                        "podIP": p.ip.to_string(),
                        "podIPs": pod_ips,
                        "hostIP": Self::node_ip(p.node).to_string(),
                    }
                })
            })
            .collect();
        json!({"apiVersion": "v1", "kind": "List", "items": items})
    }

    /// A healthy node's conditions: Ready, and the network its CNI set up
    /// (NetworkUnavailable False, as Flannel and Calico set it).
    fn node_conditions(&self) -> Value {
        let reason = if self.topology.is_calico_bgp() {
            "CalicoIsUp"
        } else {
            "FlannelIsUp"
        };
        json!([
            {"type": "NetworkUnavailable", "status": "False", "reason": reason, "message": format!("{} is running on this node", self.topology.name())},
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"},
        ])
    }

    /// The nodes as `kubectl get nodes -o json` prints them, with the CNI's
    /// annotations.
    pub fn node_list(&self) -> Value {
        let items: Vec<Value> = self
            .nodes()
            .map(|n| {
                let annotations = self.topology.cni().node_annotations(self, n);
                let subnet = self.node_subnet(n).to_string();
                let mut pod_cidrs = vec![json!(subnet)];
                let mut addresses =
                    vec![json!({"type": "InternalIP", "address": Self::node_ip(n).to_string()})];
                // A dual-stack node: one podCIDR and one InternalIP per
                // family, IPv4 first as on an IPv4-primary cluster (no
                // IPv6 one where the underlay is IPv4 alone).
                if self.is_dual_stack() {
                    pod_cidrs.push(json!(Self::node_subnet6(n).to_string()));
                }
                if self.is_dual_stack() && !self.ipv6_in_ipv4_tunnel() {
                    addresses.push(
                        json!({"type": "InternalIP", "address": Self::node_ipv6(n).to_string()}),
                    );
                }
                addresses.push(json!({"type": "Hostname", "address": Self::node_name(n)}));
                json!({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": Self::node_name(n), "annotations": annotations},
                    "spec": {"podCIDR": subnet, "podCIDRs": pod_cidrs},
                    "status": {
                        "addresses": addresses,
                        "conditions": self.node_conditions(),
                    }
                })
            })
            .collect();
        json!({"apiVersion": "v1", "kind": "List", "items": items})
    }
}
