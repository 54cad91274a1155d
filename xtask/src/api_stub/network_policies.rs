//! NetworkPolicies (networking.k8s.io/v1) as the API server stores them:
//! the fields it defaults on create, as `kubectl get -o json` shows them.

use serde_json::{json, Value};

use super::Stub;

/// The API server's defaults: `policyTypes` (Ingress, and Egress when the
/// policy has egress rules) and each port's protocol (TCP).
fn default_network_policy(policy: &mut Value) {
    let spec = &mut policy["spec"];
    if spec["podSelector"].is_null() {
        spec["podSelector"] = json!({});
    }
    if spec["policyTypes"].is_null() {
        let egress = spec["egress"].is_array();
        spec["policyTypes"] = match egress {
            true => json!(["Ingress", "Egress"]),
            false => json!(["Ingress"]),
        };
    }
    for way in ["ingress", "egress"] {
        let rules = spec[way].as_array_mut().into_iter().flatten();
        for port in rules.flat_map(|r| r["ports"].as_array_mut().into_iter().flatten()) {
            if port["protocol"].is_null() {
                port["protocol"] = "TCP".into();
            }
        }
    }
}

impl Stub {
    /// Adds a NetworkPolicy (`networking.k8s.io/v1` JSON), defaulted as
    /// the API server defaults it.
    pub fn add_network_policy(&self, mut policy: Value) {
        policy["kind"] = "NetworkPolicy".into();
        policy["apiVersion"] = "networking.k8s.io/v1".into();
        policy["metadata"]["generation"] = 1.into();
        policy["metadata"]["creationTimestamp"] = super::kubelet::now().into();
        default_network_policy(&mut policy);
        self.shared.change("networkpolicies", "ADDED", policy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_types_and_protocols_are_defaulted_as_the_api_server_does() {
        let mut policy = json!({"spec": {"egress": [{"ports": [{"port": 53}]}]}});
        default_network_policy(&mut policy);
        assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(policy["spec"]["egress"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(policy["spec"]["podSelector"], json!({}));
    }
}
