//! What kubectl asks before it asks for objects: the version, the API
//! groups and their resources (legacy discovery: kubectl falls back to it
//! when the answer is not the aggregated kind). The server-side tables
//! for `kubectl get` are `tables`.

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
        name: "namespaces",
        kind: "Namespace",
        namespaced: false,
        verbs: READ_WRITE,
        short_names: &["ns"],
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
    Resource {
        group_version: "networking.k8s.io/v1",
        name: "networkpolicies",
        kind: "NetworkPolicy",
        namespaced: true,
        verbs: READ,
        short_names: &["netpol"],
    },
];

/// The API groups served besides the core one.
const GROUPS: [&str; 3] = [
    "coordination.k8s.io",
    "discovery.k8s.io",
    "networking.k8s.io",
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
            let groups: Vec<Value> = GROUPS.iter().map(|g| group(g)).collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        ["api", "v1"] => resources("v1"),
        ["apis", g, v] if GROUPS.contains(g) && *v == "v1" => resources(&format!("{g}/{v}")),
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
        "namespaces" => "NamespaceList",
        "networkpolicies" => "NetworkPolicyList",
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
