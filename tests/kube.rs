//! `podtrace <ns/pod> <ns/pod>` through the Kubernetes API, against the API
//! stub of xtask's api_stub (HTTPS, bearer token, real REST) fed with the lab's
//! pods and nodes, on the real kernel.

#[allow(dead_code)]
mod support;

use std::path::PathBuf;

use serde_json::{json, Value};
use support::*;
use xtask::api_stub::{Stub, TOKEN};
use xtask::lab::{LabGuard, Topology};

fn scratch() -> PathBuf {
    scratch_dir("kube")
}

fn stub_for(lab: &LabGuard) -> Stub {
    Stub::start(&lab.0.pod_list(), &lab.0.node_list())
}

fn netns_args(lab: &LabGuard, nodes: &[u8]) -> Vec<String> {
    nodes
        .iter()
        .flat_map(|n| ["--netns".to_string(), lab.0.node_netns(*n)])
        .collect()
}

/// web-0 → db-0 by name through the stub, on both nodes, two stories.
fn named_trace(lab: &LabGuard, kubeconfig: &str) -> Trace {
    Trace::start(&argv(
        &[
            "default/web-0",
            "default/db-0",
            "--kubeconfig",
            kubeconfig,
            "-o",
            "json",
            "--count",
            "2",
            "--duration",
            "30s",
        ],
        netns_args(lab, &[1, 2]),
    ))
}

#[test]
fn a_named_trace_tells_the_same_story_as_by_ip_with_names() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = stub_for(&lab);
    let kubeconfig = stub.kubeconfig(&scratch(), TOKEN);
    let kubeconfig = kubeconfig.display().to_string();

    let by_name = Trace::start(&argv(
        &[
            "default/web-0",
            "db-0",
            "-n",
            "default",
            "--kubeconfig",
            &kubeconfig,
            "--context",
            "stub",
            "-o",
            "json",
            "--count",
            "2",
            "--duration",
            "20s",
        ],
        netns_args(&lab, &[1, 2]),
    ));
    assert!(
        by_name.banner.contains(
            "default/web-0 is on node-1 and default/db-0 on node-2: both ends are traced"
        ),
        "{}",
        by_name.banner
    );
    assert!(ping(&lab.0, "web-0", "db-0"));
    let named = by_name.finish();
    assert!(named.status.success(), "{}", named.stderr);
    let named = named.ping_stories();

    let (web, db) = (
        lab.0.pod("web-0").ip.to_string(),
        lab.0.pod("db-0").ip.to_string(),
    );
    let by_ip = Trace::start(&argv(
        &[&web, &db, "-o", "json", "--count", "2", "--duration", "20s"],
        netns_args(&lab, &[1, 2]),
    ));
    assert!(ping(&lab.0, "web-0", "db-0"));
    let plain = by_ip.finish().ping_stories();

    // By IP there are no node names (the namespaces name the nodes).
    let shape = |s: &Value| -> Vec<(Value, Value, Value)> {
        s["hops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h["iface"].clone(), h["direction"].clone(), h["ttl"].clone()))
            .collect()
    };
    for (n, p) in named.iter().zip(&plain) {
        assert_eq!(shape(n), shape(p), "the same path, by name and by IP");
        assert_eq!(n["verdict"]["outcome"], p["verdict"]["outcome"]);
    }
    let request = &named[0];
    assert_eq!(request["src_name"], "default/web-0");
    assert_eq!(request["dst_name"], "default/db-0");
    assert_eq!(request["verdict"]["outcome"], "delivered");
    assert!(request["verdict"]["summary"]
        .as_str()
        .unwrap()
        .contains("(default/db-0) on node-2"));
    // Node names label the outer addresses too.
    assert!(
        request["hops"][4]["note"]
            .as_str()
            .unwrap()
            .contains("from node-1"),
        "{}",
        request["hops"][4]
    );
}

#[test]
fn a_pod_that_comes_back_with_a_new_ip_is_followed() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = stub_for(&lab);
    let kubeconfig = stub.kubeconfig(&scratch(), TOKEN).display().to_string();
    let trace = named_trace(&lab, &kubeconfig);
    // db-0 is recreated with a new IP: the lab moves it, the API says so.
    let db = lab.0.pod("db-0");
    let new_ip = lab.0.node_subnet(2).hosts().nth(8).unwrap();
    let gateway = lab.0.node_subnet(2).hosts().next().unwrap();
    xtask::lab::ip(&db.netns, "addr flush dev eth0").unwrap();
    xtask::lab::flannel::address_pod(&db.netns, new_ip, gateway).unwrap();
    stub.set_pod_ip("default", "db-0", &new_ip.to_string());
    // Give the watch a moment, then talk to the new IP.
    std::thread::sleep(std::time::Duration::from_secs(2));
    // The nft rule tracing follows too.
    // The run's table (`podtrace_r<run id>`) is the only one in the lab.
    let table = xtask::lab::in_netns(&lab.0.node_netns(1), "nft")
        .args(["list", "ruleset"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    // A rule that traces packets to the new IP (at a bounded rate).
    let traces_new_ip = table
        .lines()
        .any(|l| l.contains(&format!("ip daddr {new_ip} ")) && l.contains("meta nftrace set 1"));
    assert!(traces_new_ip, "{table}");
    assert!(lab.0.ping("web-0", new_ip, &[]));
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stderr
            .contains(&format!("default/db-0 moved from {} to {new_ip}", db.ip)),
        "{}",
        done.stderr
    );
    let stories = done.ping_stories();
    assert_eq!(stories.len(), 2, "{}", done.stdout);
    assert_eq!(stories[0]["dst"], new_ip.to_string().as_str());
    assert_eq!(stories[0]["dst_name"], "default/db-0");
    assert_eq!(stories[0]["verdict"]["outcome"], "delivered");
}

#[test]
fn bad_input_through_the_api_is_one_line_and_nothing_is_attached() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = stub_for(&lab);
    let dir = scratch();
    let good = stub.kubeconfig(&dir, TOKEN).display().to_string();
    let wrong_token = stub.kubeconfig(&dir, "not-the-token").display().to_string();
    let foreign_ca = stub
        .kubeconfig_with(
            &dir,
            TOKEN,
            &Stub::foreign_ca(),
            &format!("https://{}", stub.addr),
        )
        .display()
        .to_string();
    let unreachable = {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        stub.kubeconfig_with(
            &dir,
            TOKEN,
            &Stub::foreign_ca(),
            &format!("https://127.0.0.1:{port}"),
        )
        .display()
        .to_string()
    };
    let node_ip = xtask::lab::Lab::node_ip(1).to_string();
    for (name, host_network) in [("kube-proxy-a", true), ("kube-proxy-b", true)] {
        stub.add_pod(json!({"metadata": {"name": name, "namespace": "kube-system"}, "spec": {"nodeName": "node-1", "hostNetwork": host_network},
            "status": {"phase": "Running", "podIP": node_ip, "hostIP": node_ip}}));
    }
    stub.add_pod(json!({"metadata": {"name": "pending-0", "namespace": "default"}, "spec": {}, "status": {"phase": "Pending"}}));

    let node1 = lab.0.node_netns(1);
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["web-0", "web-9", "--kubeconfig", &good], "pod default/web-9 not found; did you mean default/web-0, default/web-1?".into()),
        (vec!["web-0", &node_ip, "--kubeconfig", &good], format!("{node_ip} is ambiguous: 2 pods have it (kube-system/kube-proxy-a, kube-system/kube-proxy-b)")),
        (vec!["web-0", "pending-0", "--kubeconfig", &good], "pod default/pending-0 has no IP yet (phase Pending)".into()),
        (vec!["web-0", "default/web-0", "--kubeconfig", &good], "source and destination are the same address".into()),
        (vec!["web-0", "db-0", "--kubeconfig", &unreachable], "cannot reach the Kubernetes API at https://127.0.0.1:".into()),
        (vec!["web-0", "db-0", "--kubeconfig", &unreachable], "without the API, pass --pods-file and --nodes-file".into()),
        (vec!["web-0", "db-0", "--kubeconfig", &foreign_ca], "TLS with the Kubernetes API".into()),
        (vec!["web-0", "db-0", "--kubeconfig", &wrong_token], "rejected podtrace's credentials (401 Unauthorized)".into()),
    ];
    let check = |args: Vec<&str>, expected: &str| {
        let mut all = args.clone();
        all.extend(["--netns", &node1]);
        let done = run_podtrace(&all);
        assert!(!done.status.success(), "{all:?} succeeded");
        assert_eq!(
            done.stderr.lines().count(),
            1,
            "one line for {all:?}: {}",
            done.stderr
        );
        assert!(done.stderr.starts_with("podtrace: "), "{}", done.stderr);
        assert!(done.stderr.contains(expected), "{all:?}: {}", done.stderr);
        assert!(
            tcx_programs(&node1).is_empty(),
            "{all:?} left programs attached"
        );
    };
    for (args, expected) in cases {
        check(args, &expected);
    }
    // A host-network pod is allowed, with a note that says what it means.
    let node2_ip = xtask::lab::Lab::node_ip(2).to_string();
    stub.add_pod(
        json!({"metadata": {"name": "node-exporter-0", "namespace": "monitoring"},
        "spec": {"nodeName": "node-2", "hostNetwork": true},
        "status": {"phase": "Running", "podIP": node2_ip, "hostIP": node2_ip}}),
    );
    let done = run_podtrace(&[
        "monitoring/node-exporter-0",
        "default/web-0",
        "--kubeconfig",
        &good,
        "--netns",
        &node1,
        "--duration",
        "1s",
    ]);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stderr.contains("note: monitoring/node-exporter-0 uses the host network: its packets use the node's own interfaces"),
        "{}",
        done.stderr
    );
    // kubectl's global flags over the kubeconfig: its context names an
    // unreachable cluster, `--cluster` the stub; `--token` over the
    // user's; `--server` over the cluster's address.
    let two_clusters = dir.join("kubeconfig-two-clusters");
    let closed_port = {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        closed.local_addr().unwrap().port()
    };
    let dead = format!("clusters:\n- name: dead\n  cluster:\n    server: https://127.0.0.1:{closed_port}\n    insecure-skip-tls-verify: true\n");
    let text = std::fs::read_to_string(&good).unwrap();
    let text = (text.replacen("clusters:\n", &dead, 1))
        .replace("    cluster: stub\n", "    cluster: dead\n");
    std::fs::write(&two_clusters, text).unwrap();
    let two_clusters = two_clusters.display().to_string();
    let stub_url = format!("https://{}", stub.addr);
    let found_nothing = "pod default/web-9 not found";
    let pair = ["web-0", "web-9"];
    for (flags, expected) in [
        (
            vec!["--kubeconfig", &two_clusters],
            "cannot reach the Kubernetes API",
        ),
        (
            vec!["--kubeconfig", &two_clusters, "--cluster", "stub"],
            found_nothing,
        ),
        (
            vec!["--kubeconfig", &two_clusters, "--server", &stub_url],
            found_nothing,
        ),
        (
            vec!["--kubeconfig", &wrong_token, "--token", TOKEN],
            found_nothing,
        ),
        (
            vec!["--kubeconfig", &good, "--token", "not-the-token"],
            "(401 Unauthorized)",
        ),
    ] {
        check([&pair[..], &flags].concat(), expected);
    }

    // A pod named without a namespace is in the context's, as kubectl's;
    // `-n` wins over it.
    let in_monitoring = dir.join("kubeconfig-in-monitoring");
    let text = std::fs::read_to_string(&good).unwrap();
    std::fs::write(
        &in_monitoring,
        text.replace("namespace: default", "namespace: monitoring"),
    )
    .unwrap();
    let in_monitoring = in_monitoring.display().to_string();
    let args = ["node-exporter-0", "web-0", "--kubeconfig", &in_monitoring];
    check(args.to_vec(), "pod monitoring/web-0 not found");
    check(
        [&args[..], &["-n", "default"]].concat(),
        "pod default/node-exporter-0 not found",
    );

    stub.forbid("get", "pods");
    check(
        vec!["web-0", "db-0", "--kubeconfig", &good],
        "the Kubernetes API forbids this: podtrace needs RBAC permission to get pods in namespace default",
    );
}

#[test]
fn the_stub_watch_answers_410_for_a_stale_resource_version() {
    // kube-rs's watcher relists after 410 Gone: the trace keeps following.
    let lab = lab(Topology::FlannelVxlan);
    let stub = stub_for(&lab);
    let kubeconfig = stub.kubeconfig(&scratch(), TOKEN).display().to_string();
    let trace = named_trace(&lab, &kubeconfig);
    stub.compact();
    stub.set_pod_ip("default", "web-1", &lab.0.pod("web-1").ip.to_string());
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(done.ping_stories()[0]["verdict"]["outcome"], "delivered");
}

#[test]
fn kubectl_runs_podtrace_as_a_plugin() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = stub_for(&lab);
    let kubeconfig = stub.kubeconfig(&scratch(), TOKEN).display().to_string();
    let bin = scratch().join("plugin-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let plugin = bin.join("kubectl-podtrace");
    let _ = std::fs::remove_file(&plugin);
    std::os::unix::fs::symlink(PODTRACE, &plugin).unwrap();
    let kubectl = which("kubectl")
        .expect("kubectl is installed by cargo xtask setup (package kubernetes-client)");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut kubectl = std::process::Command::new(kubectl);
    kubectl
        .args([
            "podtrace",
            "default/web-0",
            "default/db-0",
            "--kubeconfig",
            &kubeconfig,
            "-o",
            "json",
            "--count",
            "2",
            "--duration",
            "20s",
        ])
        .args(netns_args(&lab, &[1, 2]))
        .env("PATH", path);
    // Its pings only once it traces: one sent before would be half seen.
    let trace = Trace::start_command(kubectl);
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let story: Value = serde_json::from_str(done.stdout.lines().next().expect("a story")).unwrap();
    assert_eq!(story["verdict"]["outcome"], "delivered");
    assert!(story["src_name"] == "default/web-0" || story["src_name"] == "default/db-0");
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var("PATH")
        .ok()?
        .split(':')
        .map(|d| PathBuf::from(d).join(program))
        .find(|p| p.exists())
}
