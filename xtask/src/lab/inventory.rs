//! The lab as `kubectl` would print it: its pods and its nodes (with
//! their conditions and their CNI's annotations), written to `pods.json`
//! and `nodes.json` and served by the API stub.

use serde_json::{json, Value};

use super::{Lab, Topology, NODES};

impl Lab {
    /// The pods as `kubectl get pods -A -o json` prints them.
    pub fn pod_list(&self) -> Value {
        let items: Vec<Value> = self
            .pods()
            .iter()
            .map(|p| {
                json!({
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": p.name, "namespace": "default", "labels": {"app": p.name.split('-').next()}},
                    "spec": {"nodeName": Self::node_name(p.node), "containers": [{"name": "main", "image": "busybox"}]},
                    "status": {
                        "phase": "Running",
                        "podIP": p.ip.to_string(),
                        "podIPs": [{"ip": p.ip.to_string()}],
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
        let reason = match self.topology {
            Topology::Calico => "CalicoIsUp",
            _ => "FlannelIsUp",
        };
        json!([
            {"type": "NetworkUnavailable", "status": "False", "reason": reason, "message": format!("{} is running on this node", self.topology.name())},
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"},
        ])
    }

    /// The nodes as `kubectl get nodes -o json` prints them, with the CNI's
    /// annotations.
    pub fn node_list(&self) -> Value {
        let items: Vec<Value> = (1..=NODES)
            .map(|n| {
                let ip = Self::node_ip(n).to_string();
                let annotations = self.topology.cni().node_annotations(self, n);
                json!({
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": Self::node_name(n), "annotations": annotations},
                    "spec": {"podCIDR": self.node_subnet(n).to_string(), "podCIDRs": [self.node_subnet(n).to_string()]},
                    "status": {
                        "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": Self::node_name(n)}],
                        "conditions": self.node_conditions(),
                    }
                })
            })
            .collect();
        json!({"apiVersion": "v1", "kind": "List", "items": items})
    }
}
