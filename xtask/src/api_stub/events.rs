//! core/v1 Events, as kubelet records them: what `kubectl get events`
//! and `kubectl describe pod` show, and what `podtrace doctor` classifies.
//! A pod whose sandbox cannot be created stays Pending with no IP, and
//! kubelet records `FailedCreatePodSandBox` with the runtime's message.

use serde_json::{json, Value};

use super::{kubelet, Stub};

impl Stub {
    /// Makes pod `namespace/name` Pending without an IP, with a
    /// `FailedCreatePodSandBox` event carrying `message` (the CNI's error,
    /// as in `failed to find plugin "flannel" in path [/opt/cni/bin]`).
    pub fn fail_sandbox(&self, namespace: &str, name: &str, message: &str) {
        let pod = self
            .object("pods", namespace, name)
            .expect("the pod is in the stub");
        let mut pending = pod.clone();
        pending["status"] = json!({"phase": "Pending", "hostIP": pod["status"]["hostIP"],
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]});
        self.shared.change("pods", "MODIFIED", pending);
        let sandbox = "5c1f0a7e9b3d";
        let full = format!("Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox \"{sandbox}\": {message}");
        self.add_event(&pod, "Warning", "FailedCreatePodSandBox", &full);
    }

    /// Records an event about `object` from kubelet on its node.
    pub fn add_event(&self, object: &Value, kind: &str, reason: &str, message: &str) {
        let meta = &object["metadata"];
        let now = kubelet::now();
        let name = format!(
            "{}.{:x}",
            meta["name"].as_str().unwrap_or("x"),
            self.count("events") + 0x17e0
        );
        let event = json!({
            "kind": "Event",
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": meta["namespace"], "creationTimestamp": now},
            "involvedObject": {"kind": object["kind"], "namespace": meta["namespace"], "name": meta["name"],
                "uid": meta["uid"], "apiVersion": "v1", "resourceVersion": meta["resourceVersion"]},
            "reason": reason,
            "message": message,
            "source": {"component": "kubelet", "host": object["spec"]["nodeName"]},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "type": kind,
            "reportingComponent": "kubelet",
            "reportingInstance": object["spec"]["nodeName"],
        });
        self.shared.change("events", "ADDED", event);
    }
}

/// `kubectl get events`' row: LAST SEEN, TYPE, REASON, OBJECT, MESSAGE.
pub(crate) fn row(e: &Value) -> Vec<Value> {
    let object = format!(
        "{}/{}",
        e["involvedObject"]["kind"]
            .as_str()
            .unwrap_or("")
            .to_lowercase(),
        e["involvedObject"]["name"].as_str().unwrap_or("")
    );
    vec![
        super::tables::since(&e["lastTimestamp"]),
        e["type"].clone(),
        e["reason"].clone(),
        object.into(),
        e["message"].clone(),
    ]
}
