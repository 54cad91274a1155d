//! What kubectl asks before it asks for objects: the version, the API
//! groups and their resources (legacy discovery: kubectl falls back to it
//! when the answer is not the aggregated kind), and server-side tables
//! for `kubectl get`.

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::routes::{json_response, Body};

/// (group/version, resource, kind, namespaced, verbs)
const RESOURCES: &[(&str, &str, &str, bool, &[&str])] = &[
    (
        "v1",
        "pods",
        "Pod",
        true,
        &[
            "create", "delete", "get", "list", "patch", "update", "watch",
        ],
    ),
    ("v1", "pods/log", "Pod", true, &["get"]),
    ("v1", "nodes", "Node", false, &["get", "list", "watch"]),
    ("v1", "services", "Service", true, &["get", "list", "watch"]),
    ("v1", "events", "Event", true, &["get", "list", "watch"]),
    (
        "discovery.k8s.io/v1",
        "endpointslices",
        "EndpointSlice",
        true,
        &["get", "list", "watch"],
    ),
    (
        "coordination.k8s.io/v1",
        "leases",
        "Lease",
        true,
        &[
            "create", "delete", "get", "list", "patch", "update", "watch",
        ],
    ),
];

/// The answer to a discovery path, if `parts` is one.
pub(crate) fn answer(parts: &[&str], _accept: &str) -> Option<Response<Body>> {
    let body = match parts {
        ["version"] => {
            json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-podtrace-stub", "platform": "linux/amd64"})
        }
        ["api"] => {
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
        }
        ["apis"] => {
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group("coordination.k8s.io"), group("discovery.k8s.io")]})
        }
        ["api", "v1"] => resources("v1"),
        ["apis", g, v]
            if ["coordination.k8s.io/v1", "discovery.k8s.io/v1"]
                .contains(&format!("{g}/{v}").as_str()) =>
        {
            resources(&format!("{g}/{v}"))
        }
        _ => return None,
    };
    Some(json_response(StatusCode::OK, &body))
}

fn group(name: &str) -> Value {
    let version = json!({"groupVersion": format!("{name}/v1"), "version": "v1"});
    json!({"name": name, "versions": [version.clone()], "preferredVersion": version})
}

fn resources(group_version: &str) -> Value {
    let list: Vec<Value> = RESOURCES
        .iter()
        .filter(|(gv, ..)| *gv == group_version)
        .map(|(_, name, kind, namespaced, verbs)| {
            json!({"name": name, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": verbs})
        })
        .collect();
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": list})
}

pub(crate) fn list_kind(resource: &str) -> &'static str {
    match resource {
        "pods" => "PodList",
        "nodes" => "NodeList",
        "leases" => "LeaseList",
        "endpointslices" => "EndpointSliceList",
        "events" => "EventList",
        _ => "ServiceList",
    }
}

/// The group/version a resource is served under.
pub(crate) fn group_version(resource: &str) -> &'static str {
    RESOURCES
        .iter()
        .find(|(_, name, ..)| *name == resource)
        .map_or("v1", |(gv, ..)| gv)
}

/// A row's cells, from its object.
type Cells = fn(&Value) -> Vec<Value>;

/// `kubectl get`'s table: the columns it prints (priority 1: `-o wide`).
pub(crate) fn table(resource: &str, items: &[Value], version: &str) -> Value {
    let column = |name: &str, priority: u8| json!({"name": name, "type": "string", "format": "", "description": "", "priority": priority});
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
            |p| {
                let phase = p["status"]["phase"].as_str().unwrap_or("Pending");
                let status = if p["metadata"]["deletionTimestamp"].is_string() {
                    "Terminating"
                } else {
                    phase
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
            },
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
            |n| {
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
            },
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
            |s| {
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
            },
        ),
        "endpointslices" => (
            vec![
                column("Name", 0),
                column("AddressType", 0),
                column("Ports", 0),
                column("Endpoints", 0),
                column("Age", 0),
            ],
            |e| {
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
            },
        ),
        "events" => (
            ["Last Seen", "Type", "Reason", "Object", "Message"]
                .iter()
                .map(|c| column(c, 0))
                .collect(),
            super::events::row,
        ),
        _ => (vec![column("Name", 0), column("Age", 0)], |o| {
            vec![o["metadata"]["name"].clone(), age(o)]
        }),
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|o| json!({"cells": cells(o), "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}}))
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": version}, "columnDefinitions": columns, "rows": rows})
}

fn or_none(v: &Value) -> Value {
    if v.is_null() {
        "<none>".into()
    } else {
        v.clone()
    }
}

/// The lab does not keep time for its objects: an age is shown as such.
fn age(o: &Value) -> Value {
    if o["metadata"]["creationTimestamp"].is_string() {
        "<lab>".into()
    } else {
        "<unknown>".into()
    }
}
