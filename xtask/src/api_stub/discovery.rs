//! What kubectl asks before it asks for objects: the version, the API
//! groups and their resources (legacy discovery: kubectl falls back to it
//! when the answer is not the aggregated kind), and server-side tables
//! for `kubectl get`.

use std::time::SystemTime;

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::routes::{json_response, Body};

/// One served resource as discovery tells kubectl of it.
struct Resource {
    group_version: &'static str,
    /// The plural, as in the URL (`pods`, `pods/log`).
    name: &'static str,
    kind: &'static str,
    namespaced: bool,
    verbs: &'static [&'static str],
    /// `kubectl get svc` resolves `svc` only through these.
    short_names: &'static [&'static str],
}

const READ: &[&str] = &["get", "list", "watch"];
const READ_WRITE: &[&str] = &[
    "create", "delete", "get", "list", "patch", "update", "watch",
];

const RESOURCES: &[Resource] = &[
    Resource {
        group_version: "v1",
        name: "pods",
        kind: "Pod",
        namespaced: true,
        verbs: READ_WRITE,
        short_names: &["po"],
    },
    Resource {
        group_version: "v1",
        name: "pods/log",
        kind: "Pod",
        namespaced: true,
        verbs: &["get"],
        short_names: &[],
    },
    Resource {
        group_version: "v1",
        name: "nodes",
        kind: "Node",
        namespaced: false,
        verbs: READ,
        short_names: &["no"],
    },
    Resource {
        group_version: "v1",
        name: "services",
        kind: "Service",
        namespaced: true,
        verbs: READ,
        short_names: &["svc"],
    },
    Resource {
        group_version: "v1",
        name: "endpoints",
        kind: "Endpoints",
        namespaced: true,
        verbs: READ,
        short_names: &["ep"],
    },
    Resource {
        group_version: "v1",
        name: "events",
        kind: "Event",
        namespaced: true,
        verbs: READ,
        short_names: &["ev"],
    },
    Resource {
        group_version: "discovery.k8s.io/v1",
        name: "endpointslices",
        kind: "EndpointSlice",
        namespaced: true,
        verbs: READ,
        short_names: &[],
    },
    Resource {
        group_version: "coordination.k8s.io/v1",
        name: "leases",
        kind: "Lease",
        namespaced: true,
        verbs: READ_WRITE,
        short_names: &[],
    },
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
        .filter(|r| r.group_version == group_version)
        .map(|r| {
            // A subresource has no singular name of its own.
            let singular = if r.name.contains('/') {
                String::new()
            } else {
                r.kind.to_lowercase()
            };
            let mut resource = json!({"name": r.name, "singularName": singular, "namespaced": r.namespaced, "kind": r.kind, "verbs": r.verbs});
            if !r.short_names.is_empty() {
                resource["shortNames"] = json!(r.short_names);
            }
            // `kubectl get all` lists the resources in the "all" category.
            if matches!(r.name, "pods" | "services") {
                resource["categories"] = json!(["all"]);
            }
            resource
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
        "endpoints" => "EndpointsList",
        _ => "ServiceList",
    }
}

/// The group/version a resource is served under.
pub(crate) fn group_version(resource: &str) -> &'static str {
    RESOURCES
        .iter()
        .find(|r| r.name == resource)
        .map_or("v1", |r| r.group_version)
}

/// A row's cells, from its object.
type Cells = fn(&Value) -> Vec<Value>;

/// `kubectl get`'s table: the columns it prints (priority 1: `-o wide`).
pub(crate) fn table(resource: &str, items: &[Value], version: &str) -> Value {
    // The Name column has format "name": kubectl prefixes it with the
    // kind (`pod/web-0`) when several kinds are listed.
    let column = |name: &str, priority: u8| {
        let format = if name == "Name" { "name" } else { "" };
        json!({"name": name, "type": "string", "format": format, "description": "", "priority": priority})
    };
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
        "endpoints" => (
            vec![column("Name", 0), column("Endpoints", 0), column("Age", 0)],
            |e| {
                vec![
                    e["metadata"]["name"].clone(),
                    super::services::endpoints_cell(e),
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
