//! Services on the lab (`lab up … --services`), in both kube-proxy modes
//! (a case runs as `…_iptables` and `…_nftables`): a packet to a ClusterIP
//! is followed through kube-proxy's DNAT to its backend on the other node,
//! its reply through conntrack's un-DNAT back, one story per packet, each
//! translation named with both tuples and its rule (iptables syntax for
//! KUBE-SEP-…, `nft -a list` text for the `endpoint-…` chain); a Service
//! without endpoints is `rejected`.
//!
//! The cases: a ClusterIP with its backend on the other node (through
//! `--services-file`, the API stub, a bare `ClusterIP:port`, a bare
//! ClusterIP followed through the nodes' kube-proxy rules alone, and one
//! learnt from conntrack alone), on the same node, and hairpin;
//! a NodePort entering a node without the backend; a pod reaching outside
//! the cluster through the CNI's MASQUERADE; a Service without endpoints;
//! a late reply dropped as conntrack INVALID; and cluster mode.
//!
//! Each case is a `case_…(mode)` run by `in_both_modes!` as a `#[test]`
//! per kube-proxy mode. Translations podtrace cannot know up front (a MASQUERADE's port,
//! a bare ClusterIP's backends without a Services list when the nodes'
//! kube-proxy rules are not read) are learnt from
//! conntrack as connections open: a connection's first packets may pass
//! before that, and their stories must say so, never `vanished`.

#[allow(dead_code)]
mod support;

use serde_json::Value;
use std::{net::Ipv4Addr, time::Duration};
use support::*;

use xtask::{
    api_stub::{Kubelet, Stub, TOKEN},
    lab::{
        kube_proxy::{LabService, ProxyMode, NODE_PORT, OUTSIDE, TCP_PORT},
        sysctl, Lab, LabGuard, Topology,
    },
};

/// The nodes' names, when the pods file or the API names them.
const NAMED: [&str; 2] = ["node-1", "node-2"];

fn services_lab(mode: ProxyMode) -> LabGuard {
    let lab = lab(Topology::FlannelVxlan);
    lab.0.install_services(mode).expect("install services");
    lab
}

/// web-0 → `dst` traced on both nodes (JSON, `extra` flags) while one TCP
/// request goes from web-0 to db's ClusterIP:80.
fn trace_request(
    lab: &Lab,
    src: &str,
    dst: &str,
    extra: &[&str],
) -> (Finished, Result<String, String>) {
    let mut args = vec![src, dst, "-o", "json", "--duration", "6s"];
    args.extend_from_slice(extra);
    let mut rest = vec![];
    for node in [1, 2] {
        rest.push("--netns".to_string());
        rest.push(lab.node_netns(node));
    }
    let trace = Trace::start(&argv(&args, rest));
    let db = lab.service("db");
    let answer = lab.tcp_request("web-0", db.cluster_ip, 80);
    (trace.finish(), answer)
}

fn files(lab: &Lab) -> [String; 4] {
    [
        "--pods-file".into(),
        lab.pods_file().display().to_string(),
        "--services-file".into(),
        lab.services_file().display().to_string(),
    ]
}

/// The SYN's story and the SYN-ACK's.
fn syn_and_synack(done: &Finished) -> (Value, Value) {
    let stories = done.stories();
    let flags = |s: &Value| s["transport"]["flags"].as_u64().unwrap_or(0);
    let syn = stories.iter().find(|s| flags(s) == 0x02);
    let synack = stories.iter().find(|s| flags(s) == 0x12);
    match (syn, synack) {
        (Some(a), Some(b)) => (a.clone(), b.clone()),
        _ => panic!(
            "no SYN and SYN-ACK stories: {}\n{}",
            done.stdout, done.stderr
        ),
    }
}

fn nat_hops<'a>(story: &'a Value, kind: &str) -> Vec<&'a Value> {
    story["hops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| {
            h["nat"]
                .as_array()
                .is_some_and(|n| n.iter().any(|s| s["kind"] == kind))
        })
        .collect()
}

/// Both nodes appear among the hops.
fn nodes_of(story: &Value) -> Vec<String> {
    let mut nodes: Vec<String> = story["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["node"].as_str().unwrap_or("").to_string())
        .collect();
    nodes.dedup();
    nodes
}

/// Runs a case in both kube-proxy modes.
macro_rules! in_both_modes {
    ($($case:ident: $iptables:ident, $nftables:ident;)*) => {$(
        #[test]
        fn $iptables() {
            $case(ProxyMode::Iptables);
        }
        #[test]
        fn $nftables() {
            $case(ProxyMode::Nftables);
        }
    )*};
}

in_both_modes! {
    cluster_ip_to_the_other_node_and_back:
        a_cluster_ip_is_followed_to_its_backend_on_the_other_node_and_back_iptables,
        a_cluster_ip_is_followed_to_its_backend_on_the_other_node_and_back_nftables;
    bare_cluster_ip_and_port:
        a_bare_cluster_ip_and_port_with_the_services_file_is_the_same_story_iptables,
        a_bare_cluster_ip_and_port_with_the_services_file_is_the_same_story_nftables;
    svc_through_the_api:
        svc_db_through_the_api_stub_is_followed_too_iptables,
        svc_db_through_the_api_stub_is_followed_too_nftables;
    service_without_endpoints:
        a_service_without_endpoints_is_rejected_by_kube_proxy_with_the_rule_iptables,
        a_service_without_endpoints_is_rejected_by_kube_proxy_with_the_rule_nftables;
    case_bare_cluster_ip_from_the_nodes_rules:
        a_bare_cluster_ip_without_any_list_is_followed_from_the_first_syn_by_the_nodes_rules_iptables,
        a_bare_cluster_ip_without_any_list_is_followed_from_the_first_syn_by_the_nodes_rules_nftables;
    case_bare_cluster_ip_learnt_from_conntrack:
        a_bare_cluster_ip_without_any_list_is_learnt_from_conntrack_iptables,
        a_bare_cluster_ip_without_any_list_is_learnt_from_conntrack_nftables;
    case_same_node_backend:
        a_cluster_ip_whose_backend_is_on_the_same_node_is_followed_iptables,
        a_cluster_ip_whose_backend_is_on_the_same_node_is_followed_nftables;
    case_hairpin:
        a_pod_reaching_a_service_that_picks_itself_hairpins_with_dnat_and_masquerade_iptables,
        a_pod_reaching_a_service_that_picks_itself_hairpins_with_dnat_and_masquerade_nftables;
    case_node_port_from_outside:
        a_node_port_entering_a_node_without_the_backend_is_dnatted_masqueraded_and_tunnelled_iptables,
        a_node_port_entering_a_node_without_the_backend_is_dnatted_masqueraded_and_tunnelled_nftables;
    case_outside_masquerade:
        a_pod_reaching_outside_the_cluster_is_masqueraded_at_eth0_by_the_cni_rule_iptables,
        a_pod_reaching_outside_the_cluster_is_masqueraded_at_eth0_by_the_cni_rule_nftables;
    case_invalid_reply_dropped:
        a_reply_conntrack_finds_invalid_is_dropped_with_its_rule_named_iptables,
        a_reply_conntrack_finds_invalid_is_dropped_with_its_rule_named_nftables;
    case_cluster_mode:
        cluster_mode_follows_a_cluster_ip_through_its_agents_iptables,
        cluster_mode_follows_a_cluster_ip_through_its_agents_nftables;
    case_cluster_mode_hairpin:
        cluster_mode_joins_a_hairpin_through_what_its_agent_learnt_from_conntrack_iptables,
        cluster_mode_joins_a_hairpin_through_what_its_agent_learnt_from_conntrack_nftables;
}

/// The DNAT rule as the story must name it, for the backend it picked:
/// kube-proxy's KUBE-SEP chain in iptables syntax, or its endpoint chain
/// with the `dnat to` statement as `nft -a list` shows it; none on an
/// iptables-legacy node, whose rules nft's rule tracing cannot see.
fn assert_dnat_rule(mode: ProxyMode, rule: &str, backend: Ipv4Addr) {
    if mode == ProxyMode::IptablesLegacy {
        // Said why, not blamed on the rate limit.
        let why = "a nat rule not seen: rule tracing cannot see this node's iptables-legacy rules";
        assert_eq!(rule, why);
        return;
    }
    let to = format!("{backend}:{TCP_PORT}");
    assert!(dnat_words(mode).iter().all(|w| rule.contains(w)), "{rule}");
    match mode {
        ProxyMode::Iptables | ProxyMode::IptablesLegacy => assert!(
            rule.starts_with("nat KUBE-SEP-")
                && rule.contains(&format!("-j DNAT --to-destination {to}")),
            "{rule}"
        ),
        ProxyMode::Nftables => {
            let chain = format!("__{backend}/8080: ");
            assert!(
                rule.starts_with("ip kube-proxy endpoint-")
                    && rule.contains(&chain)
                    && rule.contains(&format!("dnat to {to} # handle ")),
                "{rule}"
            )
        }
    }
}

/// Words every kube-proxy DNAT rule has in `mode`, whatever its backend.
fn dnat_words(mode: ProxyMode) -> [&'static str; 2] {
    match mode {
        ProxyMode::Iptables | ProxyMode::IptablesLegacy => {
            ["nat KUBE-SEP-", "-j DNAT --to-destination "]
        }
        ProxyMode::Nftables => ["ip kube-proxy endpoint-", " dnat to "],
    }
}

/// kube-proxy's MASQUERADE of what it marked (hairpin, NodePort from
/// outside): KUBE-POSTROUTING's rule, or the `masquerading` chain's
/// `masquerade fully-random` as `nft -a list` shows it.
fn masquerade_words(mode: ProxyMode) -> [&'static str; 2] {
    match mode {
        ProxyMode::Iptables | ProxyMode::IptablesLegacy => {
            ["nat KUBE-POSTROUTING", "-j MASQUERADE --random-fully"]
        }
        ProxyMode::Nftables => [
            "ip kube-proxy masquerading: ",
            "masquerade fully-random # handle ",
        ],
    }
}

fn assert_masquerade_rule(mode: ProxyMode, rule: &str) {
    assert!(
        masquerade_words(mode).iter().all(|w| rule.contains(w)),
        "{rule}"
    );
}

/// Flannel's MASQUERADE of pod traffic leaving the cluster: iptables in
/// both modes, as on a real node.
const FLANNEL_MASQUERADE: [&str; 2] = ["nat FLANNEL-POSTRTG", "-j MASQUERADE --random-fully"];

/// kube-proxy's drop of what conntrack finds INVALID, as the verdict's
/// `netfilter` names it and the summary says it: KUBE-FORWARD's
/// `--ctstate INVALID` DROP, or `ct state invalid drop` in the table's
/// `filter-forward` chain.
fn assert_invalid_drop_rule(mode: ProxyMode, netfilter: &Value, summary: &str) {
    let rule = netfilter["rule"].as_str().unwrap_or("");
    let chain = match mode {
        ProxyMode::Iptables | ProxyMode::IptablesLegacy => {
            assert!(
                rule.contains("--ctstate INVALID") && rule.contains("-j DROP"),
                "{netfilter}"
            );
            "KUBE-FORWARD"
        }
        ProxyMode::Nftables => {
            assert_eq!(netfilter["table"], "ip kube-proxy", "{netfilter}");
            assert!(
                rule.starts_with("ct state invalid drop # handle "),
                "{netfilter}"
            );
            "filter-forward"
        }
    };
    assert_eq!(netfilter["chain"], chain, "{netfilter}");
    assert!(summary.contains(chain), "{summary}");
}

/// `nodes`: how the story names node-1 and node-2 (by their netns without
/// the pods file).
fn assert_cluster_ip_followed(lab: &Lab, done: &Finished, mode: ProxyMode, nodes: [&str; 2]) {
    let [n1, n2] = nodes;
    assert!(done.status.success(), "{}", done.stderr);
    let (syn, synack) = syn_and_synack(done);
    let db = lab.service("db");
    // The SYN: one story from web-0's veth to a db backend's, on both nodes.
    let dnat = nat_hops(&syn, "DNAT");
    assert_eq!(dnat.len(), 1, "one DNAT hop: {syn}");
    let step = &dnat[0]["nat"][0];
    assert_eq!(step["before"], format!("{}:80", db.cluster_ip), "{step}");
    let after = step["after"].as_str().unwrap();
    let backend = db
        .backends
        .iter()
        .find(|b| after == format!("{}:8080", b.ip))
        .unwrap_or_else(|| panic!("DNAT to a backend: {step}"));
    assert_dnat_rule(mode, step["rule"].as_str().unwrap(), backend.ip);
    assert_eq!(step["conntrack"]["state"], "new");
    assert_eq!(step["backend"], format!("default/{}", backend.name));
    assert_eq!(dnat[0]["node"], n1);
    assert_eq!(syn["verdict"]["outcome"], "delivered", "{syn}");
    assert_eq!(syn["verdict"]["node"], n2);
    let summary = syn["verdict"]["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("default/{}", backend.name))
            && summary.contains("through default/db"),
        "{summary}"
    );
    assert_eq!(nodes_of(&syn), [n1, n2]);
    // The SYN-ACK: from the backend, un-DNATed on node-1, delivered to web-0.
    let undone = nat_hops(&synack, "un-DNAT");
    assert_eq!(undone.len(), 1, "one un-DNAT hop: {synack}");
    let step = &undone[0]["nat"][0];
    assert_eq!(step["before"], format!("{}:8080", backend.ip));
    assert_eq!(step["after"], format!("{}:80", db.cluster_ip));
    assert_eq!(undone[0]["node"], n1);
    assert_eq!(synack["verdict"]["outcome"], "delivered");
    assert_eq!(nodes_of(&synack), [n2, n1]);
}

fn cluster_ip_to_the_other_node_and_back(mode: ProxyMode) {
    let lab = services_lab(mode);
    let [a, b, c, d] = files(&lab.0);
    let (done, answer) = trace_request(&lab.0, "default/web-0", "svc/db", &[&a, &b, &c, &d]);
    assert_eq!(answer.as_deref(), Ok("ok"));
    assert_cluster_ip_followed(&lab.0, &done, mode, NAMED);
}

fn bare_cluster_ip_and_port(mode: ProxyMode) {
    let lab = services_lab(mode);
    let db = lab.0.service("db");
    let dst = format!("{}:80", db.cluster_ip);
    let [_, _, c, d] = files(&lab.0);
    let src = lab.0.pod("web-0").ip.to_string();
    // No pods file and no API: plain addresses, the Services from the file.
    let (done, answer) = trace_request(&lab.0, &src, &dst, &[&c, &d]);
    assert_eq!(answer.as_deref(), Ok("ok"));
    let (n1, n2) = (lab.0.node_netns(1), lab.0.node_netns(2));
    assert_cluster_ip_followed(&lab.0, &done, mode, [&n1, &n2]);
}

fn svc_through_the_api(mode: ProxyMode) {
    let lab = services_lab(mode);
    let (_stub, kubeconfig) = api_stub(&lab, &lab.0.pod_list(), &lab.0.service_list());
    let (done, answer) = trace_request(
        &lab.0,
        "default/web-0",
        "svc/db",
        &["--kubeconfig", &kubeconfig],
    );
    assert_eq!(answer.as_deref(), Ok("ok"));
    assert_cluster_ip_followed(&lab.0, &done, mode, NAMED);
}

/// The lab's API (the stub) serving `pods`, its nodes and `services`, and
/// a kubeconfig for it.
fn api_stub(lab: &LabGuard, pods: &Value, services: &Value) -> (Stub, String) {
    let stub = Stub::start(pods, &lab.0.node_list());
    stub.add_services(services);
    let dir = std::env::temp_dir().join(format!("podtrace-svc-tests-{}", std::process::id()));
    let kubeconfig = stub.kubeconfig(&dir, TOKEN).display().to_string();
    (stub, kubeconfig)
}

/// Eight `--port`s, one of them the Service's, and the backends' target
/// port learnt from conntrack: the kernel's filter keeps room for it.
/// With room for eight in all, three connections were told as twelve
/// `vanished` requests, and the refusal printed twenty times.
#[test]
fn eight_ports_keep_the_target_port_conntrack_teaches() {
    let lab = services_lab(ProxyMode::Iptables);
    let lab = &lab.0;
    let db = lab.service("db");
    let (src, dst) = (lab.pod("web-0").ip.to_string(), db.cluster_ip.to_string());
    let ports: Vec<String> = (80..88).map(|p| p.to_string()).collect();
    let mut args = vec![src.as_str(), dst.as_str(), "--no-kube-proxy-rules"];
    for port in &ports {
        args.extend(["--port", port.as_str()]);
    }
    let (done, answers) = trace_while(lab, &args, 9, || {
        requests(3, || lab.tcp_request("web-0", db.cluster_ip, 80))
    });
    assert!(
        answers.iter().all(|a| a.as_deref() == Ok("ok")),
        "{answers:?}"
    );
    assert!(done.status.success(), "{}", done.stderr);
    assert!(!done.stderr.contains("one too many"), "{}", done.stderr);
    let stories = done.stories();
    assert!(!stories.is_empty(), "{}", done.stdout);
    for story in &stories {
        assert_ne!(story["verdict"]["outcome"], "vanished", "{story}");
    }
    assert!(
        stories
            .iter()
            .any(|s| s["verdict"]["outcome"] == "delivered"),
        "{}",
        done.stdout
    );
}

/// An IPv6-primary dual-stack cluster as the API serves it: each pod's
/// and Service's IPv6 address first (podIP, clusterIP), the IPv4 one
/// second in podIPs and clusterIPs. `svc/db` is followed by its IPv4
/// ClusterIP to its backend and back, as on a single-stack cluster, and
/// its IPv6 ClusterIP is traced beside it.
#[test]
fn an_ipv6_primary_dual_stack_service_is_followed_by_its_ipv4_cluster_ip() {
    let mode = ProxyMode::Iptables;
    let lab = services_lab(mode);
    let mut pods = lab.0.pod_list();
    ipv6_first(&mut pods);
    let mut services = lab.0.service_list();
    let items = services["items"].as_array_mut().unwrap();
    for (i, svc) in items
        .iter_mut()
        .filter(|o| o["kind"] == "Service")
        .enumerate()
    {
        let spec = &mut svc["spec"];
        let v6 = format!("fd00:10:96::{:x}", i + 10);
        spec["clusterIPs"] = serde_json::json!([v6, spec["clusterIP"]]);
        spec["clusterIP"] = v6.into();
        spec["ipFamilies"] = serde_json::json!(["IPv6", "IPv4"]);
        spec["ipFamilyPolicy"] = "PreferDualStack".into();
    }
    let (_stub, kubeconfig) = api_stub(&lab, &pods, &services);
    let (done, answer) = trace_request(
        &lab.0,
        "default/web-0",
        "svc/db",
        &["--kubeconfig", &kubeconfig],
    );
    assert_eq!(answer.as_deref(), Ok("ok"));
    assert_cluster_ip_followed(&lab.0, &done, mode, NAMED);
    // The pods' and the Service's IPv6 are traced too: web-0's IPv6
    // address to the Service's IPv6 ClusterIP, named at start.
    let start = done.start_line();
    assert!(
        start.contains(" and fd00:10:244:") && start.contains("(svc/default/db)"),
        "both families named: {start}"
    );
    assert!(!done.stderr.contains("not traced"), "{}", done.stderr);
    // web-0 by its IPv4 address, which the API's podIP field selector
    // does not find there: found in podIPs, and named in the story.
    let web = lab.0.pod("web-0").ip.to_string();
    let (done, answer) = trace_request(&lab.0, &web, "svc/db", &["--kubeconfig", &kubeconfig]);
    assert_eq!(answer.as_deref(), Ok("ok"));
    let (syn, _) = syn_and_synack(&done);
    assert_eq!(syn["src_name"], "default/web-0", "{syn}");
}

fn service_without_endpoints(mode: ProxyMode) {
    let lab = services_lab(mode);
    let empty = lab.0.service("empty");
    let [a, b, c, d] = files(&lab.0);
    let mut args = vec![
        "default/web-0",
        "svc/empty",
        "-o",
        "json",
        "--duration",
        "5s",
    ];
    args.extend([a.as_str(), &b, &c, &d]);
    let trace = Trace::start(&argv(&args, vec!["--netns".into(), lab.0.node_netns(1)]));
    let answer = lab.0.tcp_request("web-0", empty.cluster_ip, 80);
    let done = trace.finish();
    assert!(
        answer
            .as_ref()
            .is_err_and(|e| e.contains("ConnectionRefused")),
        "{answer:?}"
    );
    let stories = done.stories();
    let syn = stories
        .iter()
        .find(|s| s["verdict"]["outcome"] == "dropped")
        .unwrap_or_else(|| panic!("a dropped SYN: {}\n{}", done.stdout, done.stderr));
    let verdict = &syn["verdict"];
    let summary = verdict["summary"].as_str().unwrap();
    assert!(
        summary.starts_with(
            "rejected: default/empty has no endpoints (the client is sent ICMP port unreachable)"
        ),
        "{summary}"
    );
    let rule = verdict["netfilter"]["rule"].as_str().unwrap();
    match mode {
        ProxyMode::Iptables | ProxyMode::IptablesLegacy => {
            assert_eq!(verdict["netfilter"]["chain"], "KUBE-SERVICES", "{verdict}");
            assert!(rule.contains("-j REJECT"), "{rule}");
        }
        ProxyMode::Nftables => {
            // kube-proxy's reject, reached through its map of Services
            // without endpoints, whose element names the Service.
            assert_eq!(verdict["netfilter"]["table"], "ip kube-proxy", "{verdict}");
            assert_eq!(verdict["netfilter"]["chain"], "reject-chain", "{verdict}");
            // The hook its base chain declares, not that chain's own name
            // (filter-forward).
            let hook = verdict["netfilter"]["hook"].as_str().unwrap_or_default();
            let hooks = ["prerouting", "input", "forward", "output", "postrouting"];
            assert!(hooks.contains(&hook), "{verdict}");
            assert!(
                rule.starts_with("reject # handle ")
                    && rule.contains("vmap @no-endpoint-services")
                    && rule.contains("comment \"default/empty:http\""),
                "{rule}"
            );
        }
    }
}

/// podtrace `args` on both nodes (JSON, `--duration`) while `act` runs.
fn trace_while<T>(
    lab: &Lab,
    args: &[&str],
    seconds: u32,
    act: impl FnOnce() -> T,
) -> (Finished, T) {
    let duration = format!("{seconds}s");
    let mut first = args.to_vec();
    first.extend(["-o", "json", "--duration", &duration]);
    let mut rest = vec![];
    for node in [1, 2] {
        rest.push("--netns".to_string());
        rest.push(lab.node_netns(node));
    }
    let trace = Trace::start(&argv(&first, rest));
    let acted = act();
    (trace.finish(), acted)
}

/// `n` requests one after the other, a second apart: nft rule tracing
/// follows 5 packets a second per direction, and each connection sends
/// about that many.
fn requests(
    n: usize,
    mut one: impl FnMut() -> Result<String, String>,
) -> Vec<Result<String, String>> {
    (0..n)
        .map(|_| {
            let answer = one();
            std::thread::sleep(Duration::from_millis(1100));
            answer
        })
        .collect()
}

fn flags(story: &Value) -> u64 {
    story["transport"]["flags"].as_u64().unwrap_or(0)
}

fn syns(done: &Finished) -> Vec<Value> {
    let syns: Vec<Value> = done
        .stories()
        .into_iter()
        .filter(|s| flags(s) == 0x02)
        .collect();
    assert!(
        !syns.is_empty(),
        "no SYN story: {}\n{}",
        done.stdout,
        done.stderr
    );
    syns
}

fn summary(story: &Value) -> &str {
    story["verdict"]["summary"].as_str().unwrap_or("")
}

/// A connection's SYN that passed before podtrace learnt its translation
/// from conntrack: its story names the translation (`what`), never
/// `vanished`. Returns whether the story is such a one.
fn out_of_sight_names(story: &Value, what: &[String]) -> bool {
    if story["verdict"]["outcome"] != "translated_out_of_sight" {
        return false;
    }
    let text = summary(story);
    assert!(what.iter().all(|w| text.contains(w.as_str())), "{text}");
    assert!(
        text.contains("learnt the translation from conntrack only after"),
        "{text}"
    );
    true
}

/// The SYN stories that were followed across the translation (`kind`),
/// each checked to be one or the other.
fn followed<'a>(syns: &'a [Value], kind: &str, out_of_sight: &[String]) -> Vec<&'a Value> {
    let followed: Vec<&Value> = syns
        .iter()
        .filter(|s| !nat_hops(s, kind).is_empty())
        .collect();
    for syn in syns.iter().filter(|s| nat_hops(s, kind).is_empty()) {
        assert!(
            out_of_sight_names(syn, out_of_sight),
            "neither followed nor said: {syn}"
        );
    }
    assert!(
        !followed.is_empty(),
        "no SYN followed through {kind}: {syns:?}"
    );
    followed
}

fn step<'a>(story: &'a Value, kind: &str) -> &'a Value {
    let hops = nat_hops(story, kind);
    assert_eq!(hops.len(), 1, "one {kind} hop: {story}");
    hops[0]["nat"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == kind)
        .unwrap()
}

/// The hop where a SYN's source was rewritten (MASQUERADE, or SNAT
/// when its rule was not traced), and that step.
fn source_step(syn: &Value) -> (&Value, &Value) {
    let hops: Vec<&Value> = ["MASQUERADE", "SNAT"]
        .iter()
        .flat_map(|kind| nat_hops(syn, kind))
        .collect();
    assert_eq!(hops.len(), 1, "one source translation: {syn}");
    let step = hops[0]["nat"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["kind"] == "MASQUERADE" || s["kind"] == "SNAT")
        .unwrap();
    (hops[0], step)
}

/// Some SYN names a translation by a rule with all of `words` (nft rule
/// tracing: a connection's first packet crosses the nat chains).
fn assert_some_rule(syns: &[Value], words: &[&str]) {
    let named = syns
        .iter()
        .flat_map(|s| s["hops"].as_array().unwrap())
        .any(|h| {
            h["nat"].as_array().is_some_and(|steps| {
                steps.iter().any(|step| {
                    step["rule"]
                        .as_str()
                        .is_some_and(|r| words.iter().all(|w| r.contains(w)))
                })
            })
        });
    assert!(
        named,
        "no translation named by a rule with {words:?}: {syns:?}"
    );
}

/// A SYN to db's ClusterIP DNATed on node-1 and delivered to the backend
/// it picked on node-2, across both nodes: its DNAT step and the backend.
fn dnat_to_a_backend_on_node_2<'a>(lab: &Lab, syn: &'a Value) -> (&'a Value, Ipv4Addr) {
    let db = lab.service("db");
    let (n1, n2) = (lab.node_netns(1), lab.node_netns(2));
    let step = step(syn, "DNAT");
    assert_eq!(step["before"], format!("{}:80", db.cluster_ip), "{step}");
    let after = step["after"].as_str().unwrap();
    let backend = db
        .backends
        .iter()
        .map(|b| b.ip)
        .find(|ip| after == format!("{ip}:{TCP_PORT}"))
        .unwrap_or_else(|| panic!("DNAT to a backend: {step}"));
    // On node-1: seen there, or between node-1's and node-2's hops when
    // the pair was learnt from conntrack while the SYN was in flight.
    match step.get("out_of_sight") {
        Some(sight) => assert_eq!(sight["node"], n1.as_str(), "{syn}"),
        None => assert_eq!(nat_hops(syn, "DNAT")[0]["node"], n1.as_str(), "{syn}"),
    }
    assert_eq!(syn["verdict"]["outcome"], "delivered", "{syn}");
    assert_eq!(syn["verdict"]["node"], n2.as_str());
    assert!(
        summary(syn).contains(&format!("delivered to {backend}")),
        "{syn}"
    );
    assert_eq!(nodes_of(syn), [n1.as_str(), n2.as_str()]);
    (step, backend)
}

/// No pods file, no Services file, no API: the traced nodes' kube-proxy
/// rules say where the ClusterIP goes, so every connection's SYN, the
/// first one included, is followed across the DNAT to its backend.
fn case_bare_cluster_ip_from_the_nodes_rules(mode: ProxyMode) {
    let lab = services_lab(mode);
    let lab = &lab.0;
    let db = lab.service("db");
    let web0 = lab.pod("web-0");
    let (src, dst) = (web0.ip.to_string(), db.cluster_ip.to_string());
    let connections = 3;
    let (done, answers) = trace_while(lab, &[&src, &dst], 9, || {
        requests(connections, || lab.tcp_request("web-0", db.cluster_ip, 80))
    });
    assert!(
        answers.iter().all(|a| a.as_deref() == Ok("ok")),
        "{answers:?}"
    );
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        !done.stderr.contains("no kube-proxy rules"),
        "{}",
        done.stderr
    );
    let syns = syns(&done);
    assert!(syns.len() >= connections, "a SYN per connection: {syns:?}");
    for syn in &syns {
        let (step, backend) = dnat_to_a_backend_on_node_2(lab, syn);
        assert_eq!(step["conntrack"]["state"], "new", "{step}");
        assert_dnat_rule(mode, step["rule"].as_str().unwrap_or(""), backend);
    }
}

/// An iptables-legacy node (kube-proxy's rules and kubelet's chains in
/// legacy's tables): podtrace reads the rules from iptables-legacy-save,
/// as kube-proxy's own wrapper would pick it, not from the `iptables` it
/// runs, so the first SYN is followed all the same.
#[test]
fn a_bare_cluster_ip_on_iptables_legacy_nodes_is_followed_by_their_legacy_rules() {
    case_bare_cluster_ip_from_the_nodes_rules(ProxyMode::IptablesLegacy);
}

fn case_bare_cluster_ip_learnt_from_conntrack(mode: ProxyMode) {
    let lab = services_lab(mode);
    let lab = &lab.0;
    let db = lab.service("db");
    let web0 = lab.pod("web-0");
    let (src, dst) = (web0.ip.to_string(), db.cluster_ip.to_string());
    // A connection mark on node-1, as a CNI's policy would set one: the
    // story must carry conntrack's own.
    let marked = xtask::lab::in_netns(&lab.node_netns(1), "iptables")
        .args(["-t", "mangle", "-A", "PREROUTING", "-s", &src])
        .args(["-j", "CONNMARK", "--set-mark", "0x42"])
        .status()
        .expect("iptables");
    assert!(marked.success());
    // No pods file, no Services file, no API, and the nodes' kube-proxy
    // rules left unread: only conntrack can say where the ClusterIP goes.
    // Three connections over two backends: one goes to a backend an
    // earlier one taught.
    let args = [src.as_str(), dst.as_str(), "--no-kube-proxy-rules"];
    let (done, answers) = trace_while(lab, &args, 9, || {
        requests(3, || lab.tcp_request("web-0", db.cluster_ip, 80))
    });
    assert!(
        answers.iter().all(|a| a.as_deref() == Ok("ok")),
        "{answers:?}"
    );
    assert!(done.status.success(), "{}", done.stderr);
    let n1 = lab.node_netns(1);
    let syns = syns(&done);
    let dnat = format!("DNAT {}:80 → ", db.cluster_ip);
    for syn in followed(&syns, "DNAT", &[dnat]) {
        let (step, backend) = dnat_to_a_backend_on_node_2(lab, syn);
        // What conntrack said of the connection.
        assert_eq!(step["conntrack"]["zone"], 0, "{step}");
        assert_eq!(step["conntrack"]["mark"], 0x42, "{step}");
        if step["conntrack"]["state"] == "new" {
            assert_dnat_rule(mode, step["rule"].as_str().unwrap(), backend);
        }
    }
    assert_some_rule(&syns, &dnat_words(mode));
    // The first connection's SYN passed before conntrack reported it: the
    // nodes' rules were indeed left unread.
    assert!(
        syns.iter()
            .any(|s| s["verdict"]["outcome"] == "translated_out_of_sight"),
        "{syns:?}"
    );
    // Every connection was answered: none of its packets is lost, not
    // even one in flight while podtrace learnt where it went.
    let vanished: Vec<Value> = done
        .stories()
        .into_iter()
        .filter(|s| s["verdict"]["outcome"] == "vanished")
        .collect();
    assert!(vanished.is_empty(), "{vanished:?}");
    // The replies: un-DNATed on node-1, or said to be first seen after it.
    let synacks: Vec<Value> = done
        .stories()
        .into_iter()
        .filter(|s| flags(s) == 0x12)
        .collect();
    assert!(!synacks.is_empty());
    for synack in &synacks {
        let undone = nat_hops(synack, "un-DNAT");
        if undone.is_empty() {
            assert!(
                summary(synack).contains("first seen after a translation by conntrack (un-DNAT"),
                "{synack}"
            );
        } else {
            assert_eq!(undone[0]["node"], n1.as_str());
            assert_eq!(synack["verdict"]["outcome"], "delivered", "{synack}");
        }
    }
}

fn case_same_node_backend(mode: ProxyMode) {
    let lab = services_lab(mode);
    let lab = &lab.0;
    let web = lab.service("web");
    let [a, b, c, d] = files(lab);
    let (done, answer) = trace_while(
        lab,
        &["default/web-1", "svc/web", &a, &b, &c, &d],
        5,
        || lab.tcp_request("web-1", web.cluster_ip, 80),
    );
    assert_eq!(answer.as_deref(), Ok("ok"));
    assert!(done.status.success(), "{}", done.stderr);
    let (syn, synack) = syn_and_synack(&done);
    let dnat = step(&syn, "DNAT");
    assert_eq!(dnat["before"], format!("{}:80", web.cluster_ip));
    assert_eq!(dnat["after"], format!("{}:{TCP_PORT}", lab.pod("web-0").ip));
    assert_dnat_rule(mode, dnat["rule"].as_str().unwrap(), lab.pod("web-0").ip);
    assert_eq!(dnat["conntrack"]["state"], "new");
    assert_eq!(dnat["backend"], "default/web-0");
    assert_eq!(syn["verdict"]["outcome"], "delivered", "{syn}");
    assert!(
        summary(&syn).contains("delivered to")
            && summary(&syn).contains("(default/web-0) on node-1"),
        "{syn}"
    );
    assert_eq!(nodes_of(&syn), ["node-1"]);
    let undone = step(&synack, "un-DNAT");
    assert_eq!(undone["after"], format!("{}:80", web.cluster_ip));
    assert_eq!(synack["verdict"]["outcome"], "delivered", "{synack}");
    assert_eq!(nodes_of(&synack), ["node-1"]);
}

fn case_hairpin(mode: ProxyMode) {
    let lab = services_lab(mode);
    let lab = &lab.0;
    let [a, b, c, d] = files(lab);
    // The MASQUERADE's port is new with each connection: conntrack says it.
    let (done, answers) = trace_while(
        lab,
        &["default/web-0", "svc/web", &a, &b, &c, &d],
        6,
        || {
            requests(2, || {
                lab.tcp_request("web-0", lab.service("web").cluster_ip, 80)
            })
        },
    );
    assert_hairpin(lab, mode, &done, &answers, true);
}

/// web-0 → svc/web, whose only backend is web-0: the stories of a
/// hairpin. `every`: each connection's first packet is followed too (node
/// mode traces the node's addresses with the backends from the start).
fn assert_hairpin(
    lab: &Lab,
    mode: ProxyMode,
    done: &Finished,
    answers: &[Result<String, String>],
    every: bool,
) {
    let web = lab.service("web");
    let web0 = lab.pod("web-0");
    assert!(
        answers.iter().all(|a| a.as_deref() == Ok("ok")),
        "{answers:?}"
    );
    assert!(done.status.success(), "{}", done.stderr);
    let syns = syns(done);
    let said = [
        format!("DNAT {}:80 → {}:{TCP_PORT}", web.cluster_ip, web0.ip),
        format!("SNAT {}:", web0.ip),
    ];
    let followed = followed(&syns, "DNAT", &said);
    if every {
        assert_eq!(followed.len(), syns.len(), "every SYN followed: {syns:?}");
    }
    let syn = followed[0];
    // One hop: DNAT to web-0 itself and MASQUERADE, on one packet.
    let dnat = step(syn, "DNAT");
    assert_eq!(dnat["after"], format!("{}:{TCP_PORT}", web0.ip));
    assert_eq!(dnat["backend"], "default/web-0");
    let (masq, snat) = source_step(syn);
    assert_eq!(masq["iface"], nat_hops(syn, "DNAT")[0]["iface"], "{syn}");
    assert!(
        snat["before"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{}:", web0.ip)),
        "{snat}"
    );
    // MASQUERADE picks the address of the way out: the bridge's, on node-1.
    let bridge_ip = lab.subnet_host(1, 1);
    assert!(
        snat["after"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{bridge_ip}:")),
        "{snat}"
    );
    if snat["conntrack"]["state"] == "new" {
        assert_masquerade_rule(mode, snat["rule"].as_str().unwrap());
    }
    assert_eq!(syn["verdict"]["outcome"], "delivered", "{syn}");
    assert_eq!(
        syn["verdict"]["iface"], syn["hops"][0]["iface"],
        "back out of its own veth: {syn}"
    );
    // The reply: un-SNAT and un-DNAT on one hop, back to web-0.
    let reply = done
        .stories()
        .into_iter()
        .find(|s| flags(s) == 0x12 && !nat_hops(s, "un-DNAT").is_empty())
        .unwrap_or_else(|| panic!("a SYN-ACK un-DNATed: {}", done.stdout));
    assert_eq!(nat_hops(&reply, "un-SNAT").len(), 1, "{reply}");
    assert_eq!(
        step(&reply, "un-DNAT")["after"],
        format!("{}:80", web.cluster_ip)
    );
    assert_eq!(reply["verdict"]["outcome"], "delivered", "{reply}");
}

fn case_node_port_from_outside(mode: ProxyMode) {
    let lab = services_lab(mode);
    let lab = &lab.0;
    let db = lab.service("db");
    let node1 = Lab::node_ip(1);
    let client_ns = lab.underlay_netns();
    // The client is outside the pods: the nodes' gateway, on the underlay.
    let client = "192.0.2.1";
    let [a, b, c, d] = files(lab);
    // DST as a user types it: the node's address and the NodePort.
    let node_port = format!("{node1}:{NODE_PORT}");
    let (done, answers) = trace_while(lab, &[client, &node_port, &a, &b, &c, &d], 9, || {
        requests(3, || {
            lab.tcp_request_from_netns(&client_ns, node1, NODE_PORT)
        })
    });
    assert!(
        answers.iter().all(|a| a.as_deref() == Ok("ok")),
        "{answers:?}"
    );
    assert!(done.status.success(), "{}", done.stderr);
    let syns = syns(&done);
    let said = [
        format!("DNAT {node1}:{NODE_PORT} → "),
        "SNAT 192.0.2.1:".to_string(),
    ];
    // The Services name the node's NodePorts: the backends and the
    // node's addresses are traced from the start, every SYN is followed.
    let followed = followed(&syns, "DNAT", &said);
    assert_eq!(followed.len(), syns.len(), "every SYN followed: {syns:?}");
    for syn in followed {
        let dnat = step(syn, "DNAT");
        assert_eq!(dnat["before"], format!("{node1}:{NODE_PORT}"), "{dnat}");
        assert_eq!(dnat["service"], "default/db", "{dnat}");
        let after = dnat["after"].as_str().unwrap();
        let backend = db
            .backends
            .iter()
            .find(|b| after == format!("{}:{TCP_PORT}", b.ip))
            .unwrap_or_else(|| panic!("DNAT to a backend: {dnat}"));
        assert_eq!(dnat["backend"], format!("default/{}", backend.name));
        if dnat["conntrack"]["state"] == "new" {
            assert_dnat_rule(mode, dnat["rule"].as_str().unwrap(), backend.ip);
        }
        // Then MASQUERADE (KUBE-MARK-MASQ's mark), then the tunnel.
        let (masq, snat) = source_step(syn);
        assert_eq!(masq["node"], "node-1");
        assert!(
            snat["before"].as_str().unwrap().starts_with("192.0.2.1:"),
            "{snat}"
        );
        let hops = syn["hops"].as_array().unwrap();
        let tunnel = hops
            .iter()
            .position(|h| !h["tunnel"].is_null())
            .expect("encapsulated");
        let masq_at = hops.iter().position(|h| h == masq).unwrap();
        assert!(masq_at < tunnel, "MASQUERADE before the tunnel: {syn}");
        assert_eq!(syn["verdict"]["outcome"], "delivered", "{syn}");
        assert_eq!(syn["verdict"]["node"], "node-2");
        assert_eq!(nodes_of(syn), ["node-1", "node-2"]);
    }
    assert_some_rule(&syns, &masquerade_words(mode));
    assert_replies_left_toward(&done, &db, client);
}

/// Every reply of the backends leaves node-1 by eth0 toward the outside
/// `client` once un-SNATed there (#21 item 11: they were `vanished`, as
/// the MASQUERADE address they were sent to is in node-1's pod subnet).
fn assert_replies_left_toward(done: &Finished, db: &LabService, client: &str) {
    let from_backend = |s: &&Value| db.backends.iter().any(|b| s["src"] == b.ip.to_string());
    let stories = done.stories();
    let replies: Vec<&Value> = stories.iter().filter(from_backend).collect();
    assert!(
        replies.len() >= 9,
        "three connections' replies: {replies:?}"
    );
    for reply in replies {
        let verdict = &reply["verdict"];
        assert_eq!(verdict["outcome"], "left_node", "{reply}");
        assert_eq!(
            (&verdict["node"], &verdict["iface"], &verdict["toward"]),
            (&"node-1".into(), &"eth0".into(), &client.into()),
            "{reply}"
        );
    }
}

fn case_outside_masquerade(mode: ProxyMode) {
    let lab = services_lab(mode);
    let lab = &lab.0;
    let web0 = lab.pod("web-0");
    let node1 = Lab::node_ip(1);
    let outside = OUTSIDE.to_string();
    let [a, b, _, _] = files(lab);
    let (done, answers) = trace_while(lab, &["default/web-0", &outside, &a, &b], 6, || {
        requests(2, || lab.tcp_request("web-0", OUTSIDE, TCP_PORT))
    });
    assert!(
        answers.iter().all(|a| a.as_deref() == Ok("ok")),
        "{answers:?}"
    );
    assert!(done.status.success(), "{}", done.stderr);
    let syns = syns(&done);
    let said = [format!("SNAT {}:", web0.ip), format!(" → {node1}:")];
    // The MASQUERADE's port is new with each connection (conntrack says
    // it); the node's addresses with the outside are traced from the
    // start, so every connection's first packet is followed.
    let followed = followed(&syns, "MASQUERADE", &said);
    assert_eq!(followed.len(), syns.len(), "every SYN followed: {syns:?}");
    for syn in followed {
        let masq = step(syn, "MASQUERADE");
        assert!(
            masq["before"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{}:", web0.ip)),
            "{masq}"
        );
        assert!(
            masq["after"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{node1}:")),
            "{masq}"
        );
        let hop = nat_hops(syn, "MASQUERADE")[0];
        assert_eq!(
            (
                hop["node"].as_str(),
                hop["iface"].as_str(),
                hop["direction"].as_str()
            ),
            (Some("node-1"), Some("eth0"), Some("egress")),
            "{syn}"
        );
        if masq["conntrack"]["state"] == "new" {
            let rule = masq["rule"].as_str().unwrap();
            assert!(
                FLANNEL_MASQUERADE.iter().all(|w| rule.contains(w)),
                "{masq}"
            );
        }
        assert_eq!(syn["verdict"]["outcome"], "left_node", "{syn}");
        assert_eq!(syn["verdict"]["toward"], outside.as_str());
        // The verdict names the source it left with.
        let text = summary(syn);
        assert!(
            text.contains(&format!("source MASQUERADE {}:", web0.ip)),
            "{text}"
        );
        assert!(text.contains(&format!(" → {node1}:")), "{text}");
    }
    assert_some_rule(&syns, &FLANNEL_MASQUERADE);
    // The answer comes back un-SNATed to web-0.
    let reply = done
        .stories()
        .into_iter()
        .find(|s| flags(s) == 0x12 && !nat_hops(s, "un-SNAT").is_empty())
        .unwrap_or_else(|| panic!("a SYN-ACK un-SNATed: {}", done.stdout));
    assert!(step(&reply, "un-SNAT")["after"]
        .as_str()
        .unwrap()
        .starts_with(&format!("{}:", web0.ip)));
    assert_eq!(reply["verdict"]["outcome"], "delivered", "{reply}");
}

fn case_invalid_reply_dropped(mode: ProxyMode) {
    let lab = services_lab(mode);
    let lab = &lab.0;
    let (web0, db0) = (lab.pod("web-0"), lab.pod("db-0"));
    // node-2 forgets an idle connection after a second, and takes no
    // mid-stream packet for a new one: the late reply is INVALID there.
    let node2 = lab.node_netns(2);
    sysctl(
        &node2,
        "net.netfilter.nf_conntrack_tcp_timeout_established",
        "1",
    )
    .expect("sysctl");
    sysctl(&node2, "net.netfilter.nf_conntrack_tcp_loose", "0").expect("sysctl");
    let port = 9090;
    let mut server = slow_server(lab, "db-0", port, Duration::from_secs(3));
    let [a, b, _, _] = files(lab);
    let (done, answer) = trace_while(lab, &["default/web-0", "default/db-0", &a, &b], 8, || {
        lab.tcp_request_patient("web-0", db0.ip, port)
    });
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        answer.is_err(),
        "the late answer must not arrive: {answer:?}"
    );
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let dropped = stories
        .iter()
        .find(|s| s["src"] == db0.ip.to_string() && s["verdict"]["outcome"] == "dropped")
        .unwrap_or_else(|| panic!("a dropped reply: {}\n{}", done.stdout, done.stderr));
    assert_eq!(dropped["dst"], web0.ip.to_string());
    assert_eq!(dropped["verdict"]["node"], "node-2", "{dropped}");
    assert!(
        summary(dropped).starts_with("dropped as conntrack INVALID"),
        "{dropped}"
    );
    assert_invalid_drop_rule(mode, &dropped["verdict"]["netfilter"], summary(dropped));
}

/// `podtrace --cluster-mode SRC DST` through the API stub, which plays kubelet
/// for both nodes (the agents are this podtrace), while `act` runs.
fn cluster_trace_while<T>(
    lab: &Lab,
    src: &str,
    dst: &str,
    act: impl FnOnce() -> T,
) -> (Finished, T) {
    let state = std::env::temp_dir().join(format!("podtrace-svc-cluster-{}", lab.prefix));
    std::fs::create_dir_all(&state).unwrap();
    let kubelet = Kubelet::for_lab(PODTRACE.as_ref(), lab, &state);
    let stub = Stub::with_kubelet(&lab.pod_list(), &lab.node_list(), kubelet);
    stub.add_services(&lab.service_list());
    let kubeconfig = stub.kubeconfig(&state, TOKEN).display().to_string();
    let args = [
        src,
        dst,
        "--cluster-mode",
        "--kubeconfig",
        &kubeconfig,
        "-o",
        "json",
        "--duration",
        "12s",
    ];
    let trace = Trace::start(&argv(&args, vec![]));
    let acted = act();
    (trace.finish(), acted)
}

fn case_cluster_mode(mode: ProxyMode) {
    let lab = services_lab(mode);
    let lab = &lab.0;
    let (done, answer) = cluster_trace_while(lab, "default/web-0", "svc/db", || {
        lab.tcp_request("web-0", lab.service("db").cluster_ip, 80)
    });
    assert_eq!(answer.as_deref(), Ok("ok"));
    assert_cluster_ip_followed(lab, &done, mode, NAMED);
}

/// The MASQUERADE of a hairpin is learnt from conntrack by the agent and
/// passed on to the front-end.
fn case_cluster_mode_hairpin(mode: ProxyMode) {
    let lab = services_lab(mode);
    let lab = &lab.0;
    let (done, answers) = cluster_trace_while(lab, "default/web-0", "svc/web", || {
        requests(2, || {
            lab.tcp_request("web-0", lab.service("web").cluster_ip, 80)
        })
    });
    assert_hairpin(lab, mode, &done, &answers, false);
}
