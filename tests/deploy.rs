//! deploy/ cannot be applied here (no cluster): its manifests are parsed
//! and checked for what running podtrace needs, and nothing more.

use serde::Deserialize;
use serde_json::Value;

fn documents(file: &str) -> Vec<Value> {
    let path = format!("{}/../deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{file} is not YAML: {e}")))
        .collect()
}

/// (apiGroups, resources, verbs) of each rule of a Role or ClusterRole.
fn rules_of(role: &Value) -> Vec<(Value, Value, Value)> {
    role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["apiGroups"].clone(),
                r["resources"].clone(),
                r["verbs"].clone(),
            )
        })
        .collect()
}

/// What podtrace reads through the API: pods and nodes (the traced pods
/// watched), Services and EndpointSlices (`svc/…` and ClusterIP
/// destinations), events (the doctor, for a pod without an IP), the
/// traced namespaces' NetworkPolicies (a policy drop's selectors) and the
/// podtrace DaemonSet (its image for cluster mode's agents). Read only,
/// and nothing else.
#[test]
fn rbac_grants_read_on_what_podtrace_reads_and_nothing_else() {
    use serde_json::json;
    let docs = documents("rbac.yaml");
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"]
    );
    let rules = rules_of(&docs[1]);
    let read = json!(["get", "list", "watch"]);
    assert_eq!(
        rules,
        [
            (
                json!([""]),
                json!(["pods", "nodes", "services"]),
                read.clone()
            ),
            (json!(["discovery.k8s.io"]), json!(["endpointslices"]), read),
            (json!([""]), json!(["events"]), json!(["get", "list"])),
            (
                json!(["networking.k8s.io"]),
                json!(["networkpolicies"]),
                json!(["list"])
            ),
            (json!(["apps"]), json!(["daemonsets"]), json!(["get"])),
        ]
    );
    // Only its own DaemonSet, whose image cluster mode's agents run.
    assert_eq!(docs[1]["rules"][4]["resourceNames"], json!(["podtrace"]));
    let binding = &docs[2];
    assert_eq!(binding["roleRef"]["name"], "podtrace");
    assert_eq!(binding["subjects"][0]["name"], docs[0]["metadata"]["name"]);
    assert_eq!(
        binding["subjects"][0]["namespace"],
        docs[0]["metadata"]["namespace"]
    );
}

fn check_pod_spec(spec: &Value, what: &str) {
    assert_eq!(spec["serviceAccountName"], "podtrace", "{what}");
    assert_eq!(
        spec["hostNetwork"], true,
        "{what}: the node's interfaces live in its network namespace"
    );
    assert_eq!(
        spec["hostPID"], true,
        "{what}: --netns /proc/<pid>/ns/net needs the host's /proc"
    );
    let container = &spec["containers"][0];
    let security = &container["securityContext"];
    assert!(
        security["privileged"].is_null(),
        "{what}: capabilities, not privileged"
    );
    let added: Vec<&str> = security["capabilities"]["add"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    // Exactly the agents' set, each justified in docs/cluster.md and taken
    // away in turn by tests/deployed.rs.
    assert_eq!(
        added,
        podtrace::cluster::agent_pod::CAPABILITIES,
        "{what}: the agents' capabilities"
    );
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let mounts = container["volumeMounts"].as_array().unwrap();
    let btf = mounts
        .iter()
        .find(|m| m["mountPath"] == "/sys/kernel/btf")
        .expect("BTF mounted");
    assert_eq!(btf["readOnly"], true, "{what}");
    // The doctor's --host-root /host: the node's root, read only.
    let host = mounts
        .iter()
        .find(|m| m["mountPath"] == "/host")
        .unwrap_or_else(|| panic!("{what}: the node's root is not mounted at /host"));
    assert_eq!(host["readOnly"], true, "{what}");
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == host["name"])
        .expect("the /host volume");
    assert_eq!(volume["hostPath"]["path"], "/", "{what}");
}

#[test]
fn the_debug_pod_and_the_daemonset_have_what_podtrace_needs() {
    let pod = &documents("debug-pod.yaml")[0];
    assert_eq!(pod["kind"], "Pod");
    check_pod_spec(&pod["spec"], "debug-pod.yaml");
    let ds = &documents("daemonset.yaml")[0];
    assert_eq!(ds["kind"], "DaemonSet");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    check_pod_spec(&ds["spec"]["template"]["spec"], "daemonset.yaml");
}

#[test]
fn the_image_ships_podtrace_and_its_kubectl_plugin_name() {
    let deploy = format!("{}/../deploy", env!("CARGO_MANIFEST_DIR"));
    let dockerfile = std::fs::read_to_string(format!("{deploy}/Dockerfile")).unwrap();
    let build = dockerfile
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("a cargo build");
    assert!(build.contains("--release") && build.contains("--package podtrace"));
    assert!(dockerfile.contains("ln -s podtrace /usr/local/bin/kubectl-podtrace"));
    // The runtime stage installs the list `cargo xtask image` installs.
    assert!(dockerfile.contains("COPY deploy/image-packages.txt"));
    let packages = std::fs::read_to_string(format!("{deploy}/image-packages.txt")).unwrap();
    let listed: Vec<&str> = packages
        .lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .collect();
    for needed in ["nftables", "iptables", "iproute2"] {
        assert!(
            listed.contains(&needed),
            "image-packages.txt lacks {needed}"
        );
    }
}

#[test]
fn cluster_mode_rbac_is_a_role_in_podtraces_own_namespace_only() {
    use serde_json::json;
    let docs = documents("rbac-cluster.yaml");
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "Namespace",
            "ServiceAccount",
            "Role",
            "Role",
            "RoleBinding",
            "ClusterRoleBinding"
        ]
    );
    // Agent pods need the privileged Pod Security level, wherever the
    // cluster's default is stricter.
    let labels = &docs[0]["metadata"]["labels"];
    for mode in ["enforce", "audit", "warn"] {
        assert_eq!(
            labels[format!("pod-security.kubernetes.io/{mode}")],
            "privileged"
        );
    }
    let front_end = &docs[2];
    assert_eq!(front_end["metadata"]["namespace"], "podtrace");
    assert_eq!(
        rules_of(front_end),
        [
            (
                json!([""]),
                json!(["pods"]),
                json!(["create", "delete", "get"])
            ),
            (json!([""]), json!(["pods/log"]), json!(["get"])),
            (
                json!(["coordination.k8s.io"]),
                json!(["leases"]),
                json!(["create", "delete", "get", "patch"])
            ),
        ]
    );
    // The agents' own account, the one their pods run as: get and delete
    // of pods and leases (their own), never create. A leaked agent token
    // starts no pod.
    let account = &docs[1]["metadata"];
    assert_eq!(
        account["name"],
        podtrace::cluster::agent_pod::SERVICE_ACCOUNT
    );
    let agent = &docs[3];
    assert_eq!(
        rules_of(agent),
        [
            (json!([""]), json!(["pods"]), json!(["delete", "get"])),
            (
                json!(["coordination.k8s.io"]),
                json!(["leases"]),
                json!(["delete", "get"])
            ),
        ]
    );
    for binding in &docs[4..] {
        assert_eq!(binding["subjects"][0]["name"], account["name"]);
        assert_eq!(binding["subjects"][0]["namespace"], account["namespace"]);
    }
    assert_eq!(docs[4]["roleRef"]["name"], agent["metadata"]["name"]);
    // …and read as podtrace does everywhere: rbac.yaml's read-only role.
    assert_eq!(docs[5]["roleRef"]["name"], "podtrace");
    let read_only = &documents("rbac.yaml")[1]["rules"][0]["verbs"];
    assert_eq!(*read_only, json!(["get", "list", "watch"]));
}

/// The DaemonSet stays off Windows nodes, tolerates taints by effect (not
/// PreferNoSchedule's soft ones by accident), and is sized: requests and
/// a memory limit, no CPU limit.
#[test]
fn the_daemonset_is_sized_and_kept_to_linux_nodes() {
    let ds = &documents("daemonset.yaml")[0];
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["nodeSelector"]["kubernetes.io/os"], "linux");
    let effects: Vec<&str> = spec["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["effect"].as_str().expect("a toleration by effect"))
        .collect();
    assert_eq!(effects, ["NoSchedule", "NoExecute"]);
    let resources = &spec["containers"][0]["resources"];
    assert!(resources["requests"]["memory"].is_string(), "{resources}");
    assert!(resources["requests"]["cpu"].is_string(), "{resources}");
    assert!(resources["limits"]["memory"].is_string(), "{resources}");
    assert!(
        resources["limits"]["cpu"].is_null(),
        "a throttled ring reader loses records"
    );
}
