//! What the API server and its controllers add to a Service the lab
//! writes: the defaulted spec fields, and the core/v1 Endpoints that the
//! endpoints controller mirrors from the EndpointSlices.

use serde_json::{json, Value};

/// The fields the API server fills in when a Service is created without
/// them (kubectl describe and `-o yaml` show them).
pub(crate) fn default_service(service: &mut Value) {
    let spec = &mut service["spec"];
    let defaults = [
        ("sessionAffinity", json!("None")),
        ("ipFamilies", json!(["IPv4"])),
        ("ipFamilyPolicy", json!("SingleStack")),
        ("internalTrafficPolicy", json!("Cluster")),
    ];
    for (field, value) in defaults {
        if spec[field].is_null() {
            spec[field] = value;
        }
    }
    let external = matches!(spec["type"].as_str(), Some("NodePort" | "LoadBalancer"));
    if external && spec["externalTrafficPolicy"].is_null() {
        spec["externalTrafficPolicy"] = "Cluster".into();
    }
    for port in spec["ports"].as_array_mut().into_iter().flatten() {
        if port["protocol"].is_null() {
            port["protocol"] = "TCP".into();
        }
        if port["targetPort"].is_null() {
            port["targetPort"] = port["port"].clone();
        }
    }
}

/// The Endpoints object mirrored from one Service's EndpointSlice: ready
/// addresses with their node and pod, and the slice's ports.
pub(crate) fn endpoints_of(slice: &Value) -> Option<Value> {
    let service = slice["metadata"]["labels"]["kubernetes.io/service-name"].as_str()?;
    let (ready, not_ready): (Vec<&Value>, Vec<&Value>) = slice["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .partition(|e| e["conditions"]["ready"] != false);
    let addresses = |endpoints: Vec<&Value>| -> Vec<Value> {
        endpoints
            .iter()
            .flat_map(|e| {
                e["addresses"].as_array().into_iter().flatten().map(
                    |ip| json!({"ip": ip, "nodeName": e["nodeName"], "targetRef": e["targetRef"]}),
                )
            })
            .collect()
    };
    let mut subset = json!({"ports": slice["ports"]});
    let (ready, not_ready) = (addresses(ready), addresses(not_ready));
    if !ready.is_empty() {
        subset["addresses"] = ready.into();
    }
    if !not_ready.is_empty() {
        subset["notReadyAddresses"] = not_ready.into();
    }
    let has_addresses =
        subset.get("addresses").is_some() || subset.get("notReadyAddresses").is_some();
    let subsets = if has_addresses { vec![subset] } else { vec![] };
    Some(json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": service, "namespace": slice["metadata"]["namespace"],
                     "labels": {"kubernetes.io/service-name": service},
                     "creationTimestamp": slice["metadata"]["creationTimestamp"]},
        "subsets": subsets
    }))
}

/// `kubectl get endpoints`' ENDPOINTS cell: ip:port pairs, the first
/// three and then "+ N more...", as the API server's table prints them.
pub(crate) fn endpoints_cell(endpoints: &Value) -> Value {
    let mut pairs = Vec::new();
    for subset in endpoints["subsets"].as_array().into_iter().flatten() {
        for address in subset["addresses"].as_array().into_iter().flatten() {
            for port in subset["ports"].as_array().into_iter().flatten() {
                pairs.push(format!(
                    "{}:{}",
                    address["ip"].as_str().unwrap_or(""),
                    port["port"]
                ));
            }
        }
    }
    match pairs.len() {
        0 => "<none>".into(),
        n if n <= 3 => pairs.join(",").into(),
        n => format!("{} + {} more...", pairs[..3].join(","), n - 3).into(),
    }
}
