//! Kernel integration tests: real labs in network namespaces, real pings,
//! the real podtrace binary, and the stories it tells.

#[allow(dead_code)]
mod support;

use serde_json::Value;
use support::*;
use xtask::lab::Topology;

/// (node, role, direction) of every hop of a JSON story.
fn hops(story: &Value) -> Vec<(String, String, String)> {
    story["hops"]
        .as_array()
        .expect("hops")
        .iter()
        .map(|h| {
            (
                h["node"].as_str().unwrap().to_string(),
                h["role"].as_str().unwrap().to_string(),
                h["direction"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn hop(node: &str, role: &str, dir: &str) -> (String, String, String) {
    (node.into(), role.into(), dir.into())
}

/// Traces one ping from `src` to `dst` (request and reply) in JSON.
fn trace_ping(lab: &xtask::lab::Lab, src: &str, dst: &str, nodes: &[u8]) -> Vec<Value> {
    let trace = Trace::start(&argv(
        &[
            &format!("default/{src}"),
            &format!("default/{dst}"),
            "--count",
            "2",
            "--duration",
            "20s",
            "-o",
            "json",
        ],
        lab_args(lab, nodes),
    ));
    assert!(
        ping(lab, src, dst),
        "the lab itself is broken: {src} cannot ping {dst}"
    );
    let done = trace.finish();
    assert!(done.status.success(), "podtrace failed: {}", done.stderr);
    let summary = done
        .json()
        .into_iter()
        .find(|v| v["type"] == "summary")
        .expect("a summary line");
    assert_eq!(summary["lost_ringbuf_full"], 0);
    assert_eq!(summary["undecodable"], 0);
    let stories = done.ping_stories();
    assert_eq!(
        stories.len(),
        2,
        "expected request and reply: {}",
        done.stdout
    );
    stories
}

#[test]
fn same_node_pods_are_bridged_and_delivered() {
    let lab = lab(Topology::FlannelVxlan);
    let stories = trace_ping(&lab.0, "web-0", "web-1", &[1]);
    let request = &stories[0];
    assert_eq!(request["src_name"], "default/web-0");
    assert_eq!(request["transport"]["icmp_type"], 8);
    assert_eq!(
        hops(request),
        [
            hop("node-1", "pod_veth", "ingress"),
            hop("node-1", "pod_veth", "egress")
        ]
    );
    assert_eq!(request["hops"][0]["iface"], lab.0.pod("web-0").host_iface);
    assert_eq!(request["hops"][1]["iface"], lab.0.pod("web-1").host_iface);
    assert_eq!(request["verdict"]["outcome"], "delivered");
    assert_eq!(request["verdict"]["path"], serde_json::json!(["bridged"]));
    assert_eq!(
        stories[1]["transport"]["icmp_type"], 0,
        "the reply is the second story"
    );
}

#[test]
fn cross_node_vxlan_traced_on_both_nodes() {
    let lab = lab(Topology::FlannelVxlan);
    let stories = trace_ping(&lab.0, "web-0", "db-0", &[1, 2]);
    let request = &stories[0];
    assert_eq!(
        hops(request),
        [
            hop("node-1", "pod_veth", "ingress"),
            hop("node-1", "bridge", "ingress"),
            hop("node-1", "tunnel", "egress"),
            hop("node-1", "underlay", "egress"),
            hop("node-2", "underlay", "ingress"),
            hop("node-2", "tunnel", "ingress"),
            hop("node-2", "bridge", "egress"),
            hop("node-2", "pod_veth", "egress"),
        ]
    );
    let h = &request["hops"];
    assert_eq!(h[2]["iface"], "flannel.1");
    // The kernel's route, asked as the packet arrived from the pod.
    let subnet = lab.0.node_subnet(2);
    assert_eq!(h[0]["route"]["result"], "success");
    assert_eq!(h[0]["route"]["dev"], "flannel.1");
    assert_eq!(h[0]["route"]["via"], subnet.network().to_string().as_str());
    assert_eq!(h[0]["ttl"], 64);
    assert_eq!(h[7]["ttl"], 62, "two routing decisions, one per node");
    let tunnel = &h[3]["tunnel"];
    assert_eq!(tunnel["kind"], "vxlan");
    assert_eq!(tunnel["vni"], 1);
    assert_eq!(tunnel["outer"]["src"], "192.0.2.11");
    assert_eq!(tunnel["outer"]["dst"], "192.0.2.12");
    assert_eq!(tunnel["outer"]["transport"]["dport"], 8472);
    assert_eq!(
        h[3]["skb_len"].as_u64().unwrap() - h[2]["skb_len"].as_u64().unwrap(),
        50
    );
    let verdict = &request["verdict"];
    assert_eq!(verdict["outcome"], "delivered");
    assert_eq!(verdict["node"], "node-2");
    assert_eq!(
        verdict["path"],
        serde_json::json!(["routed", "encapsulated", "decapsulated"])
    );
    // Timestamps only grow along the journey.
    let times: Vec<f64> = h
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["t_us"].as_f64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert_eq!(hops(&stories[1])[0], hop("node-2", "pod_veth", "ingress"));
}

/// flannel with `Backend.Port` set (Calico's `vxlanPort` alike): flannel.1
/// on UDP 8475. The probe reads the node's own VXLAN port as a tunnel's,
/// so the request is still one story across both nodes.
#[test]
fn a_vxlan_device_on_its_own_port_is_traced_through() {
    let lab = lab(Topology::FlannelVxlan);
    xtask::lab::flannel_vxlan::move_to_port(&lab.0, 8475).expect("flannel.1 on 8475");
    let stories = trace_ping(&lab.0, "web-0", "db-0", &[1, 2]);
    let request = &stories[0];
    assert_eq!(hops(request).len(), 8, "{request}");
    let tunnel = &request["hops"][3]["tunnel"];
    assert_eq!(tunnel["kind"], "vxlan");
    assert_eq!(tunnel["vni"], 1);
    assert_eq!(tunnel["outer"]["transport"]["dport"], 8475);
    let verdict = &request["verdict"];
    assert_eq!(verdict["outcome"], "delivered", "{request}");
    assert_eq!(
        verdict["path"],
        serde_json::json!(["routed", "encapsulated", "decapsulated"])
    );
    assert_eq!(stories[1]["verdict"]["outcome"], "delivered");
}

#[test]
fn cross_node_vxlan_traced_from_each_node_alone() {
    let lab = lab(Topology::FlannelVxlan);
    let from_src_node = trace_ping(&lab.0, "web-0", "db-0", &[1]);
    let request = &from_src_node[0];
    assert_eq!(
        hops(request).last().unwrap(),
        &hop("node-1", "underlay", "egress")
    );
    assert_eq!(request["verdict"]["outcome"], "left_node");
    assert_eq!(request["verdict"]["toward"], "192.0.2.12");
    assert_eq!(
        request["verdict"]["path"],
        serde_json::json!(["routed", "encapsulated"])
    );
    // The reply comes back in over the tunnel and is delivered on node-1.
    let reply = &from_src_node[1];
    assert_eq!(hops(reply)[0], hop("node-1", "underlay", "ingress"));
    assert_eq!(reply["verdict"]["outcome"], "delivered");

    let from_dst_node = trace_ping(&lab.0, "web-0", "db-0", &[2]);
    let request = &from_dst_node[0];
    assert_eq!(hops(request)[0], hop("node-2", "underlay", "ingress"));
    assert_eq!(request["hops"][0]["tunnel"]["vni"], 1);
    assert_eq!(request["verdict"]["outcome"], "delivered");
    assert_eq!(
        request["verdict"]["path"],
        serde_json::json!(["routed", "encapsulated", "decapsulated"])
    );
}

fn routed_without_tunnel(topology: Topology) {
    let lab = lab(topology);
    let stories = trace_ping(&lab.0, "web-0", "db-0", &[1, 2]);
    for story in &stories {
        assert_eq!(story["verdict"]["outcome"], "delivered", "{story}");
        assert_eq!(story["verdict"]["path"], serde_json::json!(["routed"]));
        assert!(story["hops"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["tunnel"].is_null()));
        let roles = hops(story);
        assert!(roles.contains(&hop(
            "node-1",
            "underlay",
            if story == &stories[0] {
                "egress"
            } else {
                "ingress"
            }
        )));
    }
}

#[test]
fn flannel_host_gw_is_routed_without_encapsulation() {
    routed_without_tunnel(Topology::FlannelHostGw);
}

#[test]
fn calico_bgp_is_routed_without_encapsulation() {
    routed_without_tunnel(Topology::Calico);
    let lab = lab(Topology::Calico);
    let stories = trace_ping(&lab.0, "web-0", "db-0", &[1, 2]);
    let first = &stories[0]["hops"][0];
    assert!(
        first["iface"].as_str().unwrap().starts_with("cali"),
        "{first}"
    );
    // Each traced pod's host-side interface is found from the node's tables
    // (Calico: the pod's /32 route), and said at start.
    let mut argv = vec!["web-0", "db-0", "--duration", "1s"];
    let extra = lab_args(&lab.0, &[1, 2]);
    argv.extend(extra.iter().map(String::as_str));
    let done = run_podtrace(&argv);
    for (node, pod) in [("node-1", "web-0"), ("node-2", "db-0")] {
        let p = lab.0.pod(pod);
        let line = format!(
            "podtrace: {node}: {} (default/{pod}) is behind {}",
            p.ip, p.host_iface
        );
        assert!(done.stderr.contains(&line), "{line}\n{}", done.stderr);
    }
}

#[test]
fn human_output_tells_the_story_per_hop() {
    let lab = lab(Topology::FlannelVxlan);
    let trace = Trace::start(&argv(
        &["web-0", "db-0", "--count", "2", "--duration", "20s"],
        lab_args(&lab.0, &[1, 2]),
    ));
    assert!(
        trace
            .banner
            .contains("node-1 (eth0, cni0, flannel.1, 1 pod veth)"),
        "{}",
        trace.banner
    );
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let out = &done.stdout;
    let (web, db) = (lab.0.pod("web-0").ip, lab.0.pod("db-0").ip);
    assert!(
        out.contains(&format!(
            "#1 {web} (default/web-0) → {db} (default/db-0): ICMP echo request"
        )),
        "{out}"
    );
    assert!(
        out.contains("encapsulated VXLAN VNI 1 192.0.2.11:"),
        "{out}"
    );
    assert!(out.contains("→ 192.0.2.12:8472 (+50 B)"), "{out}");
    assert!(out.contains("decapsulated"), "{out}");
    assert!(
        out.contains(&format!(
            "verdict: delivered to {db} (default/db-0) on node-2"
        )),
        "{out}"
    );
    assert!(
        !out.contains("\x1b["),
        "no colour when stdout is not a terminal"
    );
    assert!(out.contains("podtrace: 2 stories from "), "{out}");
    assert!(
        out.contains("sightings on 16 hooks; lost: 0 (ring buffer full), 0 (header copy failed); undecodable: 0"),
        "{out}"
    );
}

#[test]
fn nothing_stays_attached_after_sigint_or_sigkill() {
    let lab = lab(Topology::FlannelVxlan);
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGKILL] {
        let trace = Trace::start(&argv(&["web-0", "db-0"], lab_args(&lab.0, &[1, 2])));
        for node in [1, 2] {
            let attached = tcx_programs(&lab.0.node_netns(node));
            assert_eq!(
                attached.len(),
                8,
                "eth0, cni0, flannel.1 and the traced pod's veth, two hooks each, on node {node}: {attached:?}"
            );
            assert!(
                attached.iter().all(|p| p.contains("podtrace_")),
                "{attached:?}"
            );
        }
        trace.signal(signal);
        let done = trace.finish();
        if signal == libc::SIGKILL {
            assert!(!done.status.success());
        } else {
            assert!(done.status.success(), "signal {signal}: {}", done.stderr);
            assert!(
                done.stdout.contains("podtrace: 0 stories"),
                "a summary at exit: {}",
                done.stdout
            );
        }
        // The kernel detaches a link as it releases the dead process's
        // fds, which under a slow VM (6.12 under TCG) may trail the exit
        // status by a moment: a link still there after seconds is left.
        for node in [1, 2] {
            let since = std::time::Instant::now();
            let mut left = tcx_programs(&lab.0.node_netns(node));
            while !left.is_empty() && since.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::sleep(std::time::Duration::from_millis(100));
                left = tcx_programs(&lab.0.node_netns(node));
            }
            assert!(
                left.is_empty(),
                "after signal {signal}, still attached on node {node} 10 s later: {left:?}"
            );
        }
    }
}

#[test]
fn bad_input_is_one_line_and_a_failure() {
    let lab = lab(Topology::FlannelVxlan);
    let pods = lab.0.pods_file().display().to_string();
    let node1 = lab.0.node_netns(1);
    let cases: [(&[&str], &str); 4] = [
        (
            &["web-0", "web-9", "--pods-file", &pods, "--netns", &node1],
            "pod default/web-9 not found; did you mean default/web-0, default/web-1?",
        ),
        (
            &["web-0", "web-0", "--pods-file", &pods, "--netns", &node1],
            "source and destination are the same",
        ),
        (
            &[
                "web-0",
                "db-0",
                "--pods-file",
                &pods,
                "--netns",
                "no-such-netns",
            ],
            "network namespace /run/netns/no-such-netns does not exist",
        ),
        (
            &["web-0", "db-0", "--pods-file", "/nonexistent.json"],
            "cannot read pods file /nonexistent.json",
        ),
    ];
    for (argv, expected) in cases {
        assert_refused(argv, expected, &node1);
        assert!(run_podtrace(argv).stderr.starts_with("podtrace: "));
    }

    // Not root.
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new(PODTRACE)
        .args(["10.244.1.2", "10.244.2.2"])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run podtrace as nobody");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("needs root"), "{stderr}");
}

#[test]
fn a_vxlan_packet_with_no_vtep_to_take_it_is_dropped_with_the_kernels_reason() {
    let lab = lab(Topology::FlannelVxlan);
    // node-2 cannot decapsulate: its VXLAN device is down.
    xtask::lab::ip(&lab.0.node_netns(2), "link set flannel.1 down").expect("flannel.1 down");
    let trace = Trace::start(&one_packet(&lab.0, "web-0", "db-0", "json"));
    assert!(
        !ping(&lab.0, "web-0", "db-0"),
        "the ping must fail with flannel.1 down"
    );
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let story = &done.stories()[0];
    let path = hops(story);
    assert_eq!(path[path.len() - 2], hop("node-2", "underlay", "ingress"));
    assert_eq!(path[path.len() - 1], hop("node-2", "underlay", "drop"));
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "dropped");
    assert_eq!(verdict["node"], "node-2");
    assert_eq!(verdict["iface"], "eth0");
    // Nothing listens on UDP 8472 once flannel.1 is down: the kernel says so.
    assert_eq!(verdict["reason"], "NO_SOCKET");
    assert!(
        verdict["location"]
            .as_str()
            .unwrap()
            .starts_with("__udp4_lib_rcv+"),
        "{verdict}"
    );
}

#[test]
fn clsact_fallback_attaches_and_cleans_up_even_after_sigkill() {
    let lab = lab(Topology::FlannelVxlan);
    let node1 = lab.0.node_netns(1);
    let tc_filters = || {
        let out = xtask::lab::in_netns(&node1, "tc")
            .args(["filter", "show", "dev", "cni0", "ingress"])
            .output()
            .expect("tc");
        String::from_utf8_lossy(&out.stdout)
            .matches("podtrace_ingress")
            .count()
    };
    let stories = {
        let trace = Trace::start(&argv(
            &[
                "web-0",
                "db-0",
                "--attach",
                "clsact",
                "--count",
                "2",
                "--duration",
                "20s",
                "-o",
                "json",
            ],
            lab_args(&lab.0, &[1]),
        ));
        assert_eq!(tc_filters(), 1, "one clsact filter on cni0 ingress");
        assert!(
            tcx_programs(&node1).is_empty(),
            "clsact mode must not use TCX"
        );
        assert!(ping(&lab.0, "web-0", "db-0"));
        trace.finish().ping_stories()
    };
    assert_eq!(stories.len(), 2);
    assert_eq!(stories[0]["verdict"]["outcome"], "left_node");
    assert_eq!(tc_filters(), 0, "filters removed at a clean exit");
    let qdiscs = xtask::lab::in_netns(&node1, "tc")
        .args(["qdisc", "show", "dev", "cni0"])
        .output()
        .expect("tc");
    assert!(
        !String::from_utf8_lossy(&qdiscs.stdout).contains("clsact"),
        "the clsact qdisc podtrace added is removed too"
    );

    // After SIGKILL the filters stay; the next start removes them. (Any
    // podtrace's start may: the other tests' runs share /run/podtrace, so
    // it may already be gone here. cleanup.rs sees the leftover alone.)
    let trace = Trace::start(&argv(
        &["web-0", "db-0", "--attach", "clsact"],
        lab_args(&lab.0, &[1]),
    ));
    trace.signal(libc::SIGKILL);
    trace.finish();
    assert!(
        tc_filters() <= 1,
        "a killed podtrace leaves at most its own clsact filter"
    );
    let trace = Trace::start(&argv(
        &["web-0", "db-0", "--attach", "clsact"],
        lab_args(&lab.0, &[1]),
    ));
    assert_eq!(
        tc_filters(),
        1,
        "the stale filter was replaced, not doubled"
    );
    trace.signal(libc::SIGINT);
    assert!(trace.finish().status.success());
    assert_eq!(tc_filters(), 0);
}

#[test]
fn a_pod_veth_replaced_during_the_trace_is_followed() {
    let lab = lab(Topology::FlannelVxlan);
    let node1 = lab.0.node_netns(1);
    let web = lab.0.pod("web-0");
    let trace = Trace::start(&argv(
        &[
            "web-0",
            "db-0",
            "--count",
            "2",
            "--duration",
            "30s",
            "-o",
            "json",
        ],
        lab_args(&lab.0, &[1]),
    ));
    // The pod's sandbox is recreated: the runtime's CNI DEL takes its
    // veth, its ADD makes a new one (named by the bridge plugin) with the
    // pod's address.
    xtask::lab::flannel::unwire_pod(&lab.0, &web).unwrap();
    let restarted = xtask::lab::flannel::wire_pod(&lab.0, &web, Some(web.ip)).unwrap();
    // Attachment follows the link event; give it a moment before traffic.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !tcx_programs(&node1)
        .iter()
        .any(|p| p.starts_with(&format!("{restarted}:")))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the new veth was never attached"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stderr.contains(&format!(
            "interface {} vanished during the trace",
            web.host_iface
        )),
        "{}",
        done.stderr
    );
    assert!(
        done.stderr
            .contains(&format!("new interface {restarted}, now traced")),
        "{}",
        done.stderr
    );
    let stories = done.ping_stories();
    assert_eq!(stories[0]["hops"][0]["iface"], restarted.as_str());
    let summary = done
        .json()
        .into_iter()
        .find(|v| v["type"] == "summary")
        .unwrap();
    assert_eq!(summary["interfaces_vanished"], 1);
    assert_eq!(summary["interfaces_added"], 1);
}

#[test]
fn a_burst_of_packets_is_told_in_full() {
    let lab = lab(Topology::FlannelVxlan);
    let trace = Trace::start(&argv(
        &[
            "web-0",
            "db-0",
            "--count",
            "200",
            "--duration",
            "30s",
            "-o",
            "json",
            "--profile",
        ],
        lab_args(&lab.0, &[1, 2]),
    ));
    let (web, db) = (lab.0.pod("web-0"), lab.0.pod("db-0"));
    let burst = xtask::lab::in_netns(&web.netns, "ping")
        .args(["-q", "-c", "100", "-i", "0.002", &db.ip.to_string()])
        .output()
        .unwrap();
    assert!(
        burst.status.success(),
        "{}",
        String::from_utf8_lossy(&burst.stdout)
    );
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    assert_eq!(stories.len(), 200, "100 requests and 100 replies");
    let not_whole: Vec<&Value> = stories
        .iter()
        .filter(|s| {
            s["verdict"]["outcome"] != "delivered" || s["hops"].as_array().unwrap().len() != 8
        })
        .collect();
    assert!(not_whole.is_empty(), "{not_whole:#?}\n{}", done.stderr);
    let lines = done.json();
    let summary = lines.iter().find(|v| v["type"] == "summary").unwrap();
    // 8 hooks per packet, plus the frees of ping replies inside web-0 after
    // delivery (its raw socket took a copy; no ICMP socket wanted it).
    let freed: usize = stories
        .iter()
        .map(|s| s["freed_after_delivery"].as_array().unwrap().len())
        .sum();
    assert_eq!(summary["sightings"], 1600 + freed as u64);
    let profile = lines
        .iter()
        .find(|v| v["type"] == "profile")
        .expect("--profile prints the profile");
    let steps = profile["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 14, "7 steps per direction");
    assert!(steps
        .iter()
        .all(|s| s["count"] == 100 && s["p50_us"].as_f64().unwrap() >= 0.0));
}

/// A dual-stack cluster whose primary family is IPv6 lists each pod's
/// IPv6 address as its podIP and both in podIPs (as the API serves it):
/// the pair is traced by both families whichever is listed first, and
/// the start line names both.
#[test]
fn an_ipv6_primary_dual_stack_pair_is_traced_by_both_families() {
    let lab = lab(Topology::FlannelVxlan);
    let mut pods: Value =
        serde_json::from_str(&std::fs::read_to_string(lab.0.pods_file()).unwrap()).unwrap();
    ipv6_first(&mut pods);
    let dir = scratch_dir("dual-stack");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pods.json");
    std::fs::write(&file, pods.to_string()).unwrap();
    let mut args = lab_args(&lab.0, &[1, 2]);
    args[1] = file.display().to_string();
    let trace = Trace::start(&argv(
        &[
            "default/web-0",
            "default/db-0",
            "--count",
            "1",
            "-o",
            "json",
        ],
        args,
    ));
    assert!(ping(&lab.0, "web-0", "db-0"), "the lab itself is broken");
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let story = done.ping_stories().into_iter().next().expect("a story");
    assert_eq!(story["verdict"]["outcome"], "delivered", "{story}");
    assert_eq!(story["src"], lab.0.pod("web-0").ip.to_string(), "{story}");
    let web0 = lab.0.pod("web-0").ip;
    let ipv6_of = |name: &str| {
        let items = pods["items"].as_array().expect("a pod list");
        let pod = (items.iter())
            .find(|p| p["metadata"]["name"] == name)
            .expect("the pod");
        pod["status"]["podIP"]
            .as_str()
            .expect("an IPv6 podIP")
            .to_string()
    };
    let ipv6_pair = format!(
        " and {} (default/web-0) ⇄ {} (default/db-0)",
        ipv6_of("web-0"),
        ipv6_of("db-0")
    );
    let start = done.start_line();
    assert!(
        start.contains(&format!("tracing {web0} (default/web-0)")) && start.contains(&ipv6_pair),
        "both pairs named: {start}"
    );
}
