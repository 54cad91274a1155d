//! Server-side tables for `kubectl get`: the columns it prints for each
//! resource (priority 1: `-o wide`) and each object's row of cells.

use std::{sync::Arc, time::SystemTime};

use serde_json::{json, Value};

/// A row's cells, from its object.
type Cells = fn(&Value) -> Vec<Value>;

/// `kubectl get`'s table: the columns it prints (priority 1: `-o wide`),
/// with the list's `metadata` (its page's continue token among them).
pub(crate) fn table(resource: &str, items: &[Arc<Value>], metadata: Value) -> Value {
    let (columns, cells): (Vec<Value>, Cells) = match resource {
        "pods" => (
            vec![
                column("Name", 0),
                column("Ready", 0),
                column("Status", 0),
                column("Restarts", 0),
                column("Age", 0),
                column("IP", 1),
                column("Node", 1),
            ],
            pod_cells,
        ),
        "nodes" => (
            vec![
                column("Name", 0),
                column("Status", 0),
                column("Roles", 0),
                column("Age", 0),
                column("Version", 0),
                column("Internal-IP", 1),
            ],
            node_cells,
        ),
        "services" => (
            vec![
                column("Name", 0),
                column("Type", 0),
                column("Cluster-IP", 0),
                column("External-IP", 0),
                column("Port(s)", 0),
                column("Age", 0),
            ],
            service_cells,
        ),
        "endpointslices" => (
            vec![
                column("Name", 0),
                column("AddressType", 0),
                column("Ports", 0),
                column("Endpoints", 0),
                column("Age", 0),
            ],
            slice_cells,
        ),
        "endpoints" => (
            vec![column("Name", 0), column("Endpoints", 0), column("Age", 0)],
            endpoints_cells,
        ),
        "events" => (
            ["Last Seen", "Type", "Reason", "Object", "Message"]
                .iter()
                .map(|c| column(c, 0))
                .collect(),
            super::events::row,
        ),
        "networkpolicies" => (
            vec![
                column("Name", 0),
                column("Pod-Selector", 0),
                column("Age", 0),
            ],
            policy_cells,
        ),
        _ => (vec![column("Name", 0), column("Age", 0)], |o| {
            vec![o["metadata"]["name"].clone(), age(o)]
        }),
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| json!({"cells": cells(o), "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}}))
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": columns, "rows": rows})
}

fn or_none(v: &Value) -> Value {
    if v.is_null() {
        "<none>".into()
    } else {
        v.clone()
    }
}

fn age(o: &Value) -> Value {
    since(&o["metadata"]["creationTimestamp"])
}

/// How long ago an RFC 3339 timestamp was, the way the API server's tables
/// print an age (`45s`, `3m20s`, `17m`, `5h4m`, `3d`).
pub(crate) fn since(timestamp: &Value) -> Value {
    let Some(then) = timestamp
        .as_str()
        .and_then(|t| humantime::parse_rfc3339(t).ok())
    else {
        return "<unknown>".into();
    };
    let secs = SystemTime::now()
        .duration_since(then)
        .map_or(0, |d| d.as_secs());
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    match () {
        _ if secs < 120 => format!("{secs}s"),
        _ if m < 10 => format!("{m}m{}s", secs % 60),
        _ if h < 3 => format!("{m}m"),
        _ if h < 8 => format!("{h}h{}m", m % 60),
        _ if h < 48 => format!("{h}h"),
        _ if h < 192 => format!("{d}d{}h", h % 24),
        _ => format!("{d}d"),
    }
    .into()
}

/// A pod's row: ready, status (Terminating once deleted), restarts, age; IP and node with `-o wide`.
fn pod_cells(p: &Value) -> Vec<Value> {
    let phase = p["status"]["phase"].as_str().unwrap_or("Pending");
    // As the API's printer says it: the pod's reason (Evicted), else a
    // container's waiting or terminated reason (ErrImagePull, OOMKilled).
    let container = p["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|c| {
            let state = &c["state"];
            state["waiting"]["reason"]
                .as_str()
                .or(state["terminated"]["reason"].as_str())
        });
    let reason = p["status"]["reason"].as_str().or(container);
    let status = if p["metadata"]["deletionTimestamp"].is_string() {
        "Terminating"
    } else {
        reason.unwrap_or(phase)
    };
    let ready = if phase == "Running" { "1/1" } else { "0/1" };
    vec![
        p["metadata"]["name"].clone(),
        ready.into(),
        status.into(),
        0.into(),
        age(p),
        or_none(&p["status"]["podIP"]),
        or_none(&p["spec"]["nodeName"]),
    ]
}

/// A node's row: always Ready, the lab's version; its InternalIP with `-o wide`.
fn node_cells(n: &Value) -> Vec<Value> {
    let ip = n["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .map(|a| a["address"].clone());
    vec![
        n["metadata"]["name"].clone(),
        "Ready".into(),
        "<none>".into(),
        age(n),
        "v1.33.0-lab".into(),
        ip.unwrap_or("<none>".into()),
    ]
}

/// A Service's row: its ports as `80:30080/TCP` for a NodePort, `53/UDP` otherwise.
fn service_cells(s: &Value) -> Vec<Value> {
    let ports: Vec<String> = s["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| match p["nodePort"].as_u64() {
            Some(n) => format!(
                "{}:{n}/{}",
                p["port"],
                p["protocol"].as_str().unwrap_or("TCP")
            ),
            None => {
                format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP"))
            }
        })
        .collect();
    vec![
        s["metadata"]["name"].clone(),
        or_none(&s["spec"]["type"]),
        or_none(&s["spec"]["clusterIP"]),
        "<none>".into(),
        ports.join(",").into(),
        age(s),
    ]
}

/// An EndpointSlice's row: its ports and addresses, comma-separated.
fn slice_cells(e: &Value) -> Vec<Value> {
    let list = |v: &Value, key: &str| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .flat_map(|x| match &x[key] {
                Value::Array(a) => a
                    .iter()
                    .map(|i| i.as_str().unwrap_or("").to_string())
                    .collect(),
                other => vec![other.to_string()],
            })
            .collect()
    };
    vec![
        e["metadata"]["name"].clone(),
        or_none(&e["addressType"]),
        list(&e["ports"], "port").join(",").into(),
        list(&e["endpoints"], "addresses").join(",").into(),
        age(e),
    ]
}

/// An Endpoints object's row.
fn endpoints_cells(e: &Value) -> Vec<Value> {
    vec![
        e["metadata"]["name"].clone(),
        super::services::endpoints_cell(e),
        age(e),
    ]
}

/// A column of the table. The Name column has format "name": kubectl
/// prefixes it with the kind (`pod/web-0`) when several kinds are listed.
fn column(name: &str, priority: u8) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": "string", "format": format, "description": "", "priority": priority})
}

/// A NetworkPolicy's row: its podSelector's matchLabels as `k=v,…`
/// (`<none>` for the empty selector, which selects every pod).
fn policy_cells(p: &Value) -> Vec<Value> {
    let labels: Vec<String> = p["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
        .collect();
    let selector = match labels.is_empty() {
        true => "<none>".to_string(),
        false => labels.join(","),
    };
    vec![p["metadata"]["name"].clone(), selector.into(), age(p)]
}
