//! The API stub under load, judged by the real kubectl (v1.32 on PATH)
//! and curl: a crowd of pods and Services around the lab's own, lists in
//! pages, field selectors as kube-apiserver takes them, and the request
//! log that counts what each client asked and was sent. No lab is
//! brought up: the stub is fed the lab's pod and node lists.

use std::{collections::HashSet, path::PathBuf, process::Command, time::Instant};

use serde_json::Value;
use xtask::{
    api_stub::{ApiRequest, Stub, TOKEN},
    lab::{Lab, Topology},
};

fn stub() -> (Stub, Lab) {
    let lab = Lab::new("stubload", Topology::FlannelVxlan, None).expect("a lab plan");
    (Stub::start(&lab.pod_list(), &lab.node_list()), lab)
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("podtrace-api-stub-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs kubectl against the stub; its stdout, or its stderr as the error.
fn kubectl(stub: &Stub, args: &[&str]) -> Result<String, String> {
    let kubeconfig = stub.kubeconfig(&scratch(), TOKEN);
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(args)
        .output()
        .expect("kubectl on PATH (the tests judge the stub by the real one)");
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

fn pod_lists(stub: &Stub) -> Vec<ApiRequest> {
    let lists = stub.requests().into_iter();
    lists
        .filter(|r| r.verb == "list" && r.resource == "pods")
        .collect()
}

#[test]
fn kubectl_in_chunks_gets_every_pod_of_a_crowd_once() {
    let (stub, lab) = stub();
    stub.add_crowd(1200, 100);
    let total = lab.pods().len() + 1200;
    for output in [&["-o", "name"][..], &["--no-headers"][..]] {
        stub.clear_requests();
        let args = [&["get", "pods", "-A", "--chunk-size=500"][..], output].concat();
        let listed = kubectl(&stub, &args).unwrap();
        // `-o name`: pod/<name>; the table: namespace, name, ready...
        let pods: Vec<String> = listed
            .lines()
            .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join("/"))
            .collect();
        let unique: HashSet<&String> = pods.iter().collect();
        assert_eq!(pods.len(), total, "{output:?}: every pod");
        assert_eq!(unique.len(), total, "{output:?}: each once");
        let lists = pod_lists(&stub);
        assert_eq!(lists.len(), total.div_ceil(500), "{lists:#?}");
        assert!(lists
            .iter()
            .all(|r| r.limit == Some(500) && r.status == 200));
        assert_eq!(lists[0].continue_token, None);
        assert!(lists[1..].iter().all(|r| r.continue_token.is_some()));
        assert!(lists[0]
            .user_agent
            .as_deref()
            .unwrap()
            .starts_with("kubectl"));
        assert!(lists.iter().all(|r| r.bytes > 0));
    }
}

#[test]
fn field_selectors_are_taken_and_refused_as_the_real_server_does() {
    let (stub, _lab) = stub();
    stub.add_crowd(20, 4);
    let by_ip = [
        "get",
        "svc",
        "-A",
        "--field-selector",
        "spec.clusterIP=10.98.0.2",
        "-o",
        "name",
    ];
    assert_eq!(kubectl(&stub, &by_ip).unwrap().trim(), "service/svc00001");
    let described = kubectl(&stub, &["describe", "node", "node-1"]).unwrap();
    assert!(described.contains("Non-terminated Pods"), "{described}");
    let slices = [
        "get",
        "endpointslices",
        "-A",
        "--field-selector",
        "addressType=IPv4",
    ];
    let refused = kubectl(&stub, &slices).unwrap_err();
    assert!(
        refused.contains("\"addressType\" is not a known field selector"),
        "{refused}"
    );
    // An older server, without Services' spec.clusterIP selector.
    stub.refuse_field_selector("services", "spec.clusterIP");
    let refused = kubectl(&stub, &by_ip).unwrap_err();
    assert!(
        refused.contains("field label not supported: spec.clusterIP"),
        "{refused}"
    );
    let last = stub.requests().pop().unwrap();
    assert_eq!((last.status, last.resource.as_str()), (400, "services"));
}

/// NetworkPolicies are served as kube-apiserver serves them: the real
/// kubectl lists them per namespace and in all of them, as JSON
/// (NetworkPolicyList, defaulted fields) and as its table, and a list
/// RBAC denies is a 403 naming the group.
#[test]
fn kubectl_lists_network_policies_as_from_a_real_api_server() {
    let (stub, _lab) = stub();
    stub.add_network_policy(serde_json::json!({
        "metadata": {"name": "backend-deny-ingress", "namespace": "default"},
        "spec": {"podSelector": {"matchLabels": {"app": "db"}}}
    }));
    stub.add_network_policy(serde_json::json!({
        "metadata": {"name": "dns-out", "namespace": "kube-system"},
        "spec": {"podSelector": {}, "egress": [{"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53}]}]}
    }));
    let listed = kubectl(
        &stub,
        &["get", "networkpolicies", "-n", "default", "-o", "json"],
    )
    .unwrap();
    let list: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(list["kind"], "List", "kubectl wraps what it got: {list}");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["kind"], "NetworkPolicy");
    assert_eq!(items[0]["apiVersion"], "networking.k8s.io/v1");
    assert_eq!(
        items[0]["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );
    let all = kubectl(&stub, &["get", "netpol", "-A", "-o", "json"]).unwrap();
    let all: Value = serde_json::from_str(&all).unwrap();
    let dns = &all["items"].as_array().unwrap()[1];
    assert_eq!(
        dns["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert_eq!(dns["spec"]["egress"][0]["ports"][1]["protocol"], "TCP");
    let table = kubectl(&stub, &["get", "networkpolicies", "-A"]).unwrap();
    assert!(table.contains("POD-SELECTOR"), "{table}");
    assert!(table.contains("backend-deny-ingress   app=db"), "{table}");
    // The raw list, as podtrace's client reads it.
    let raw = kubectl(
        &stub,
        &[
            "get",
            "--raw",
            "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies",
        ],
    )
    .unwrap();
    let raw: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(raw["kind"], "NetworkPolicyList");
    assert_eq!(raw["apiVersion"], "networking.k8s.io/v1");
    assert!(raw["metadata"]["resourceVersion"].is_string(), "{raw}");
    stub.forbid("list", "networkpolicies");
    let refused = kubectl(&stub, &["get", "netpol", "-n", "default"]).unwrap_err();
    assert!(
        refused.contains("cannot list resource \"networkpolicies\" in API group \"networking.k8s.io\" in the namespace \"default\""),
        "{refused}"
    );
}

/// How long a crowd takes to add, and a full list of it to send: printed
/// (`--nocapture`), not asserted; what is asserted is that the list is
/// whole and the log counts the bytes curl received.
#[test]
fn a_crowd_of_ten_thousand_pods_is_added_and_listed_whole() {
    let (stub, lab) = stub();
    let started = Instant::now();
    stub.add_crowd(10_000, 2_000);
    let added = started.elapsed();
    assert_eq!(stub.count("pods"), lab.pods().len() + 10_000);
    assert_eq!(stub.count("endpointslices"), 2_000);
    stub.clear_requests();
    let url = format!("https://{}/api/v1/pods", stub.addr);
    let started = Instant::now();
    let out = Command::new("curl")
        .args(["-sSk", "-H", &format!("Authorization: Bearer {TOKEN}")])
        .args(["-H", "User-Agent: load-test", &url])
        .output()
        .expect("curl on PATH");
    let listed = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), stub.count("pods"));
    let [request] = stub.requests().try_into().unwrap();
    assert_eq!(request.bytes, out.stdout.len() as u64);
    assert_eq!(request.user_agent.as_deref(), Some("load-test"));
    println!(
        "add_crowd(10000, 2000): {added:?}; list of {} pods: {listed:?}, {} bytes",
        stub.count("pods"),
        out.stdout.len()
    );
}
