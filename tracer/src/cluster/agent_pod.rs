//! What an agent pod is: its image, and the Pod object the front-end
//! creates for one node. deploy/ ships the same shape (daemonset.yaml,
//! rbac-cluster.yaml); docs/cluster.md says why each field is there.

use std::time::Duration;

/// The capabilities an agent adds, having dropped ALL; why each, and what
/// podtrace does without it, is in docs/cluster.md (and `probe::capabilities`).
/// CAP_SYS_ADMIN grants what CAP_BPF and CAP_PERFMON would.
pub const CAPABILITIES: [&str; 6] = [
    "NET_ADMIN",
    "SYS_ADMIN",
    "SYS_PTRACE",
    "NET_RAW",
    "SYSLOG",
    "SYS_RESOURCE",
];

use anyhow::{bail, Result};
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::{Api, Client};
use serde_json::json;

/// Where an agent's pod mounts its node's root filesystem, read-only (as
/// `kubectl debug node/…` does): the doctor reads the node's CNI config,
/// plugins and flannel's subnet.env there.
pub const HOST_ROOT: &str = "/host";

/// The agents' own ServiceAccount (deploy/rbac-cluster.yaml): get and
/// delete of the run's lease and of their own pod, and the read-only
/// ClusterRole; never the front-end's right to create pods.
pub const SERVICE_ACCOUNT: &str = "podtrace-agent";

/// The environment variable that names the agent image when `--image`
/// does not: a setting that persists in the user's shell profile.
pub const IMAGE_ENV: &str = "PODTRACE_IMAGE";

/// Memory requested for an agent: its resident set, measured in the lab
/// (VmHWM of `podtrace agent` at 87 MiB while it attaches and reads the
/// kernel's BTF, 71 MiB steady under a ping flood), rounded up: what the
/// kubelet admits it by, and evicts by.
const MEMORY_REQUEST: &str = "96Mi";
/// The agent's memory limit: that peak, plus its output queue full at
/// line rate (65,536 lines of some 500 bytes: ~32 MiB) and the BPF maps
/// (the 4 MiB ring buffer and the flow tables, charged to the pod's
/// cgroup since 5.11): ~125 MiB, doubled for kernels and nodes unlike the
/// lab's. An agent past it is OOM-killed, and said so.
const MEMORY_LIMIT: &str = "256Mi";
/// CPU requested: the ring reader and the log writer at a few thousand
/// packets/s. No CPU limit: a throttled reader loses records.
const CPU_REQUEST: &str = "100m";

/// The image of the agents: `--image`, else [`IMAGE_ENV`], else the
/// podtrace DaemonSet's (deploy/daemonset.yaml, in the agent namespace
/// or kube-system). No default: an image that exists nowhere would only
/// show up as a pull failure on every node.
pub async fn image(
    client: Client,
    given: Option<&String>,
    agent_namespace: &str,
) -> Result<String> {
    if let Some(image) = given {
        return Ok(image.clone());
    }
    if let Some(image) = std::env::var(IMAGE_ENV)
        .ok()
        .filter(|i| !i.trim().is_empty())
    {
        return Ok(image.trim().to_string());
    }
    for ns in [agent_namespace, "kube-system"] {
        let sets: Api<DaemonSet> = Api::namespaced(client.clone(), ns);
        if let Ok(Some(ds)) = sets.get_opt("podtrace").await {
            let image = ds
                .spec
                .and_then(|s| s.template.spec)
                .and_then(|s| s.containers.into_iter().next())
                .and_then(|c| c.image);
            if let Some(image) = image {
                return Ok(image);
            }
        }
    }
    bail!("no agent image: cluster mode runs podtrace in a pod on each node, from an image your nodes can pull; build one with `cargo xtask image` (an OCI archive), push it to a registry they pull from (or load it on them), then pass --image REF, or set {IMAGE_ENV}=REF, or apply deploy/daemonset.yaml with that image")
}

/// The Pod of the agent `name` on `node`, running `argv`.
pub(super) fn agent_pod(
    name: &str,
    node: &str,
    image: &str,
    argv: &[String],
    lease: &str,
    owner: Option<String>,
    deadline: Option<Duration>,
) -> serde_json::Value {
    let owners = owner.map(|uid| json!([{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "name": lease, "uid": uid}]));
    json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "podtrace-agent", "podtrace/lease": lease},
                     "ownerReferences": owners.unwrap_or(json!([]))},
        "spec": {
            "nodeName": node, "hostNetwork": true, "hostPID": true, "restartPolicy": "Never",
            "serviceAccountName": SERVICE_ACCOUNT, "terminationGracePeriodSeconds": 10,
            "activeDeadlineSeconds": deadline.map(|d| d.as_secs() + 300),
            // podtrace is a Linux program: a Windows node refuses the pod
            // at once (NodeAffinity) rather than failing to pull it.
            "nodeSelector": {"kubernetes.io/os": "linux"},
            // Pinned by nodeName to a node whose pods are traced, the
            // agent bypasses the scheduler, so NoSchedule taints do not
            // apply; NoExecute ones would evict it, and a node tainted
            // not-ready or unreachable (its CNI broken) is what a trace is
            // for. So it tolerates both effects, as the traced pods there do.
            "tolerations": [{"operator": "Exists", "effect": "NoSchedule"},
                            {"operator": "Exists", "effect": "NoExecute"}],
            "containers": [{
                "name": "agent", "image": image, "command": ["podtrace"], "args": argv,
                "resources": {"requests": {"cpu": CPU_REQUEST, "memory": MEMORY_REQUEST},
                              "limits": {"memory": MEMORY_LIMIT}},
                "securityContext": {"capabilities": {"add": CAPABILITIES, "drop": ["ALL"]}},
                "volumeMounts": [{"name": "btf", "mountPath": "/sys/kernel/btf", "readOnly": true},
                                 {"name": "runs", "mountPath": "/run/podtrace"},
                                 {"name": "host", "mountPath": HOST_ROOT, "readOnly": true}]
            }],
            "volumes": [{"name": "btf", "hostPath": {"path": "/sys/kernel/btf"}},
                        {"name": "runs", "hostPath": {"path": "/run/podtrace", "type": "DirectoryOrCreate"}},
                        {"name": "host", "hostPath": {"path": "/"}}]
        }
    })
}
