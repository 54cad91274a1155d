//! A crowd: the pods and Services of a busy cluster around the lab's
//! own, for what podtrace must not read when it traces two pods. Its pods
//! belong to Deployments (five replicas each, a ReplicaSet owning them)
//! in a few namespaces, spread over the nodes the stub has, each as large
//! as a real pod's JSON (3-4 KB: one container with ports, env, probes,
//! resources, the service account's projected volume; five conditions).
//! Each Service selects one Deployment and has the EndpointSlice the
//! endpointslice controller writes for it (and the mirrored Endpoints).
//!
//! Addresses cannot meet the lab's: pod IPs come from [`POD_RANGE`] (the
//! shared address space, 100.64.0.0/10, which no lab pod CIDR, node or
//! Service range is in), ClusterIPs from [`SERVICE_RANGE`] (10.98.0.0/16;
//! the lab's Services are in 10.96.0.0/16, its Services at scale in
//! 10.97.0.0/16).

use std::net::Ipv4Addr;

use serde_json::{json, Value};

use super::{kubelet, record, services, Change, Stub};

/// Where crowd pods' IPs come from: the pods added so far are counted
/// from its second address on.
pub const POD_RANGE: (Ipv4Addr, u8) = (Ipv4Addr::new(100, 64, 0, 0), 10);
/// Where crowd Services' ClusterIPs come from.
pub const SERVICE_RANGE: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 98, 0, 0), 16);

/// The crowd's namespaces.
const NAMESPACES: [&str; 6] = ["shop", "payments", "search", "analytics", "auth", "media"];
/// Pods per Deployment.
const REPLICAS: usize = 5;

impl Stub {
    /// Adds `pods` pods and `services` Services (each with its
    /// EndpointSlice and Endpoints) to the stub, at once (see the module
    /// doc), on the nodes it has. Their Namespaces are added too. A
    /// second crowd adds to the first.
    pub fn add_crowd(&self, pods: usize, services: usize) {
        let mut state = self.shared.state.lock().unwrap();
        let nodes: Vec<(String, String)> = state
            .objects
            .get("nodes")
            .into_iter()
            .flat_map(|n| n.values())
            .map(|n| (name(n).to_string(), internal_ip(n)))
            .collect();
        assert!(!nodes.is_empty(), "a crowd needs the stub's nodes");
        let first = state
            .objects
            .get("pods")
            .map_or(0, |p| p.values().filter(|p| is_crowd(p)).count());
        let first_service = state
            .objects
            .get("services")
            .map_or(0, |s| s.values().filter(|s| is_crowd(s)).count());
        let mut changes: Vec<Change> = Vec::new();
        let mut add = |resource: &str, object: Value| {
            changes.push(record(&mut state, resource, "ADDED", object));
        };
        for ns in NAMESPACES {
            add("namespaces", super::namespace(ns, None));
        }
        let crowd: Vec<Value> = (first..first + pods)
            .map(|i| pod(i, &nodes[i % nodes.len()]))
            .collect();
        let deployments = (first + pods).div_ceil(REPLICAS).max(1);
        for j in first_service..first_service + services {
            let app = j % deployments;
            // Its pods of this crowd (an earlier crowd's are not looked up).
            let (lo, hi) = (app * REPLICAS, (app + 1) * REPLICAS);
            let backends: Vec<&Value> = (lo.max(first)..hi.min(first + pods))
                .map(|i| &crowd[i - first])
                .collect();
            let mut service = service(j, app);
            services::default_service(&mut service);
            let slice = slice(j, &service, &backends);
            let endpoints = services::endpoints_of(&slice).expect("a slice names its Service");
            add("services", service);
            add("endpointslices", slice);
            add("endpoints", endpoints);
        }
        for pod in crowd {
            add("pods", pod);
        }
        drop(state);
        // Watches far behind end, as the real server ends slow ones.
        for change in changes {
            let _ = self.shared.changes.send(change);
        }
    }
}

const CROWD: &str = "podtrace.io/crowd";

fn is_crowd(object: &Value) -> bool {
    object["metadata"]["labels"][CROWD].is_string()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

fn internal_ip(node: &Value) -> String {
    let addresses = node["status"]["addresses"].as_array().into_iter().flatten();
    addresses
        .filter(|a| a["type"] == "InternalIP")
        .find_map(|a| a["address"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// A deterministic stand-in for the random suffixes controllers add,
/// from the alphabet they use.
fn suffix(seed: usize, len: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = (seed as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (0..len)
        .map(|_| {
            x ^= x >> 29;
            x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
            ALPHABET[(x >> 33) as usize % ALPHABET.len()] as char
        })
        .collect()
}

fn uid(kind: u8, i: usize) -> String {
    format!("c7a0d{kind:03x}-{:04x}-4000-8000-{i:012x}", i >> 16)
}

fn nth(range: (Ipv4Addr, u8), i: usize) -> String {
    let room = (1u64 << (32 - range.1)) - 2;
    assert!(
        (i as u64) < room,
        "the crowd outgrows {}/{}",
        range.0,
        range.1
    );
    Ipv4Addr::from(u32::from(range.0) + 1 + i as u32).to_string()
}

fn app_name(app: usize) -> String {
    format!("svc{app:05}")
}

fn namespace_of_app(app: usize) -> &'static str {
    NAMESPACES[app % NAMESPACES.len()]
}

/// Pod `i` of the crowd, on `node` (name, InternalIP).
fn pod(i: usize, node: &(String, String)) -> Value {
    let app = i / REPLICAS;
    let (ip, now) = (nth(POD_RANGE, i), kubelet::now());
    let replica_set = format!("{}-{}", app_name(app), suffix(app, 10));
    let name = format!("{replica_set}-{}", suffix(i, 5));
    let hash = &replica_set[replica_set.len() - 10..];
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "generateName": format!("{replica_set}-"), "namespace": namespace_of_app(app),
            "uid": uid(1, i), "creationTimestamp": now,
            "labels": {"app": app_name(app), "pod-template-hash": hash, "app.kubernetes.io/name": app_name(app),
                       "app.kubernetes.io/part-of": namespace_of_app(app), CROWD: "true"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": now},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": replica_set,
                                 "uid": uid(2, app), "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": pod_spec(app, &name, &node.0),
        "status": pod_status(app, i, &ip, &node.1, &now),
    })
}

fn pod_spec(app: usize, pod: &str, node: &str) -> Value {
    let probe = |path: &str, delay: u32| {
        json!({"httpGet": {"path": path, "port": "http", "scheme": "HTTP"}, "initialDelaySeconds": delay,
               "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3})
    };
    let env: Vec<Value> = [
        ("LOG_LEVEL", "info"),
        ("HTTP_PORT", "8080"),
        ("METRICS_PORT", "9090"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector.observability:4317"),
        ("DATABASE_URL", "postgres://app@postgres.data:5432/app?sslmode=require"),
    ]
    .iter()
    .map(|(name, value)| json!({"name": name, "value": value}))
    .chain([json!({"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}})])
    .collect();
    let volume = format!("kube-api-access-{}", suffix(app + 7, 5));
    json!({
        "containers": [{
            "name": "app", "image": format!("registry.example.com/{}/{}:1.{}.{}", namespace_of_app(app), app_name(app), app % 17, app % 5),
            "imagePullPolicy": "IfNotPresent", "args": ["--config=/etc/app/config.yaml", "--listen=:8080"],
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}, {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
            "env": env,
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
            "livenessProbe": probe("/healthz", 10), "readinessProbe": probe("/readyz", 5),
            "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true, "readOnlyRootFilesystem": true, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": volume, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}],
            "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"
        }],
        "volumes": [{"name": volume, "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
        ]}}],
        "nodeName": node, "hostname": pod, "restartPolicy": "Always", "dnsPolicy": "ClusterFirst",
        "schedulerName": "default-scheduler", "serviceAccount": "default", "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30, "enableServiceLinks": true, "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0, "securityContext": {"fsGroup": 2000},
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
        ]
    })
}

fn pod_status(app: usize, i: usize, ip: &str, host_ip: &str, now: &str) -> Value {
    let condition = |kind: &str| json!({"type": kind, "status": "True", "lastProbeTime": null, "lastTransitionTime": now});
    let conditions: Vec<Value> = [
        "PodReadyToStartContainers",
        "Initialized",
        "Ready",
        "ContainersReady",
        "PodScheduled",
    ]
    .iter()
    .map(|c| condition(c))
    .collect();
    json!({
        "phase": "Running", "qosClass": "Burstable", "startTime": now, "conditions": conditions,
        "hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "podIP": ip, "podIPs": [{"ip": ip}],
        "containerStatuses": [{
            "name": "app", "ready": true, "started": true, "restartCount": 0,
            "image": format!("registry.example.com/{}/{}:1.{}.{}", namespace_of_app(app), app_name(app), app % 17, app % 5),
            "imageID": format!("registry.example.com/{}@sha256:{:064x}", app_name(app), app),
            "containerID": format!("containerd://{:064x}", i * 7919 + 1),
            "lastState": {}, "state": {"running": {"startedAt": now}}
        }]
    })
}

/// Service `j` of the crowd, selecting Deployment `app`.
fn service(j: usize, app: usize) -> Value {
    let name = if j == app {
        app_name(app)
    } else {
        format!("{}-alt{j}", app_name(app))
    };
    let ip = nth(SERVICE_RANGE, j);
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace_of_app(app), "uid": uid(3, j), "creationTimestamp": kubelet::now(),
                     "labels": {"app.kubernetes.io/name": app_name(app), CROWD: "true"}},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "selector": {"app": app_name(app)},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}
    })
}

/// The EndpointSlice the endpointslice controller writes for `service`
/// (the crowd's `j`-th) with `backends` ready.
fn slice(j: usize, service: &Value, backends: &[&Value]) -> Value {
    let svc = name(service);
    let endpoints: Vec<Value> = backends
        .iter()
        .map(|pod| {
            json!({"addresses": [pod["status"]["podIP"]], "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": pod["spec"]["nodeName"],
                   "targetRef": {"kind": "Pod", "namespace": pod["metadata"]["namespace"], "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}})
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{svc}-{}", suffix(j + (1 << 40), 5)),
                     "generateName": format!("{svc}-"), "namespace": service["metadata"]["namespace"],
                     "creationTimestamp": service["metadata"]["creationTimestamp"],
                     "labels": {"kubernetes.io/service-name": svc, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io", CROWD: "true"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": svc, "uid": service["metadata"]["uid"],
                                          "controller": true, "blockOwnerDeletion": true}]},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crowd_pod_is_as_large_as_a_real_one_and_its_addresses_stay_out_of_the_labs() {
        let node = ("node-1".to_string(), "192.0.2.11".to_string());
        let pod = pod(12, &node);
        let size = pod.to_string().len();
        assert!((3000..5000).contains(&size), "{size} bytes");
        assert_eq!(pod["status"]["podIP"], "100.64.0.13");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
        let name = pod["metadata"]["name"].as_str().unwrap();
        let template = pod["metadata"]["labels"]["pod-template-hash"]
            .as_str()
            .unwrap();
        assert!(name.starts_with(&format!("svc00002-{template}-")), "{name}");
        assert_eq!(nth(SERVICE_RANGE, 0), "10.98.0.1");
        assert_ne!(suffix(1, 5), suffix(2, 5));
    }
}
