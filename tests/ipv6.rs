//! IPv6 against the real kernel: dual-stack labs as flannel's EnableIPv6
//! wires them (flannel-v6.1 over an IPv6 underlay), the same pod pairs
//! traced over IPv6 as over IPv4, and IPv6's own failures: an ip6tables
//! DROP, a missing IPv6 route, a next hop that never answers neighbour
//! discovery, and a pod's payload that looks like VXLAN over IPv6; and a
//! dual-stack Service followed through kube-proxy's IPv6 DNAT. Also pod
//! IPv6 inside the IPv4 underlay's tunnel (one VXLAN device for both
//! families), and a pod's IPv4 payload forging such a packet.

#[allow(dead_code)]
mod support;

use std::{
    net::Ipv6Addr,
    sync::{Mutex, MutexGuard},
};

use serde_json::Value;
use support::*;
use xtask::lab::{
    in_netns, ip,
    kube_proxy::{ProxyMode, TCP_PORT},
    Lab, LabGuard, Topology,
};

/// The lab's IPv6 plan is the same in every dual-stack lab, so two at
/// once would share pod addresses, and the drop tracepoint (which sees
/// every namespace) would see the other lab's pods: one at a time.
static ONE_DUAL_STACK_LAB: Mutex<()> = Mutex::new(());

fn dual_stack_lab(topology: Topology) -> (MutexGuard<'static, ()>, LabGuard) {
    let alone = ONE_DUAL_STACK_LAB
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let lab = lab(topology);
    lab.0.dual_stack().expect("a dual-stack lab");
    (alone, lab)
}

/// A dual-stack lab whose pod IPv6 crosses nodes inside flannel.1 over
/// the IPv4 underlay (one tunnel device for both families), under the
/// same lock as `dual_stack_lab`'s: its IPv6 plan is theirs.
fn dual_stack_in_ipv4_tunnel_lab() -> (MutexGuard<'static, ()>, LabGuard) {
    let alone = ONE_DUAL_STACK_LAB
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let lab = lab(Topology::FlannelVxlan);
    lab.0
        .dual_stack_in_ipv4_tunnel()
        .expect("a dual-stack lab in the IPv4 tunnel");
    (alone, lab)
}

fn ipv6(lab: &Lab, pod: &str) -> Ipv6Addr {
    lab.pod(pod).ipv6.expect("a dual-stack pod")
}

/// Traces `src` ⇄ `dst` on both nodes with `extra` flags while `during`
/// sends, and returns the finished run.
fn traced(lab: &Lab, src: &str, dst: &str, extra: &[&str], during: impl FnOnce()) -> Finished {
    let mut args = vec![src, dst, "-o", "json"];
    args.extend_from_slice(extra);
    if !extra.contains(&"--duration") {
        args.extend(["--duration", "15s"]);
    }
    let mut args = argv(&args, lab_args(lab, &[1, 2]));
    args.extend([
        "--nodes-file".into(),
        lab.nodes_file().display().to_string(),
    ]);
    let trace = Trace::start(&args);
    during();
    let done = trace.finish();
    assert!(done.status.success(), "podtrace failed: {}", done.stderr);
    done
}

/// The (node, role, direction) of every hop of a story.
fn path(story: &Value) -> Vec<String> {
    let hops = story["hops"].as_array().expect("hops");
    hops.iter()
        .map(|h| format!("{} {} {}", h["node"], h["role"], h["direction"]).replace('"', ""))
        .collect()
}

/// The story's packet was delivered on node-2 through the tunnel.
fn assert_tunnelled_to_node_2(story: &Value) {
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "delivered", "{verdict}");
    assert_eq!(verdict["node"], "node-2");
    assert_eq!(
        verdict["path"],
        serde_json::json!(["routed", "encapsulated", "decapsulated"])
    );
}

/// The story of web-0's IPv6 echo request to db-0, traced with `-6` on
/// both nodes while web-0 pings once.
fn echo_request6(lab: &Lab) -> Value {
    let (web, db) = (ipv6(lab, "web-0"), ipv6(lab, "db-0"));
    let done = traced(lab, "web-0", "db-0", &["-6", "--count", "2"], || {
        assert!(lab.ping6("web-0", db, &[]), "the lab's IPv6 is broken");
    });
    story_from(&done.stories(), web, db)
}

/// The story whose packet went `src` → `dst`.
/// The story crossed from a pod on node-1 to one on node-2 in flannel's
/// VXLAN (VNI 1, port 8472), the inner packet paired with the outer one
/// from `src` to `dst` (the nodes' underlay addresses, of either family)
/// leaving node-1 and reaching node-2.
fn assert_paired_across_vxlan(story: &Value, src: impl ToString, dst: impl ToString) {
    assert_eq!(
        path(story),
        [
            "node-1 pod_veth ingress",
            "node-1 bridge ingress",
            "node-1 tunnel egress",
            "node-1 underlay egress",
            "node-2 underlay ingress",
            "node-2 tunnel ingress",
            "node-2 bridge egress",
            "node-2 pod_veth egress",
        ],
        "{story}"
    );
    let (src, dst) = (src.to_string(), dst.to_string());
    for at in [3, 4] {
        let tunnel = &story["hops"][at]["tunnel"];
        assert_eq!(tunnel["kind"], "vxlan", "{tunnel}");
        assert_eq!(tunnel["vni"], 1);
        assert_eq!(tunnel["outer"]["src"], src.as_str());
        assert_eq!(tunnel["outer"]["dst"], dst.as_str());
        assert_eq!(tunnel["outer"]["transport"]["dport"], 8472);
    }
}

/// web-0 pings db-0 once over each family, traced on both nodes: the
/// run and its four stories (both families, both ways).
fn echoed_over_both_families(lab: &Lab) -> (Finished, Vec<Value>) {
    let db = ipv6(lab, "db-0");
    let done = traced(lab, "web-0", "db-0", &["--count", "4"], || {
        assert!(lab.ping6("web-0", db, &[]), "the lab's IPv6 is broken");
        assert!(ping(lab, "web-0", "db-0"), "the lab's IPv4 is broken");
    });
    let stories = done.stories();
    assert_eq!(
        stories.len(),
        4,
        "both families, both ways: {}",
        done.stdout
    );
    (done, stories)
}

fn story_from(stories: &[Value], src: Ipv6Addr, dst: Ipv6Addr) -> Value {
    stories
        .iter()
        .find(|s| s["src"] == src.to_string() && s["dst"] == dst.to_string())
        .unwrap_or_else(|| panic!("no story {src} → {dst}: {stories:#?}"))
        .clone()
}

#[test]
fn a_dual_stack_pair_is_traced_over_both_families_with_the_ipv6_tunnel_paired() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    let (web, db) = (ipv6(&lab.0, "web-0"), ipv6(&lab.0, "db-0"));
    let (done, stories) = echoed_over_both_families(&lab.0);
    assert!(
        done.stderr.contains(&format!(
            "tracing {} (default/web-0) ⇄ {} (default/db-0) and {web} (default/web-0) ⇄ {db} (default/db-0)",
            lab.0.pod("web-0").ip,
            lab.0.pod("db-0").ip
        )),
        "{}",
        done.stderr
    );
    let request = story_from(&stories, web, db);
    assert_eq!(request["transport"]["proto"], "icmpv6", "{request}");
    assert_eq!(request["transport"]["icmp_type"], 128, "{request}");
    assert_paired_across_vxlan(&request, Lab::node_ipv6(1), Lab::node_ipv6(2));
    let h = &request["hops"];
    assert_eq!(h[2]["iface"], "flannel-v6.1");
    // The kernel's IPv6 route, asked as the packet arrived from the pod.
    assert_eq!(h[0]["route"]["result"], "success", "{request}");
    assert_eq!(h[0]["route"]["dev"], "flannel-v6.1");
    let remote_vtep = Lab::node_subnet6(2).network().to_string();
    assert_eq!(h[0]["route"]["via"], remote_vtep.as_str());
    assert_eq!(h[0]["ttl"], 64, "the hop limit");
    assert_eq!(h[7]["ttl"], 62, "two routing decisions, one per node");
    let overhead = h[3]["skb_len"].as_u64().unwrap() - h[2]["skb_len"].as_u64().unwrap();
    assert_eq!(overhead, 70, "Ethernet, IPv6, UDP and VXLAN headers");
    assert_tunnelled_to_node_2(&request);
    let reply = story_from(&stories, db, web);
    assert_eq!(reply["verdict"]["outcome"], "delivered", "{reply}");
    // And the IPv4 pair beside it.
    let ipv4 = stories
        .iter()
        .filter(|s| s["src"] == lab.0.pod("web-0").ip.to_string())
        .count();
    assert_eq!(ipv4, 1, "{}", done.stdout);
}

/// One tunnel device for both families (Antrea, OVN-Kubernetes, Cilium):
/// the pair's IPv6 echo is routed from web-0 into flannel.1 and crosses
/// to node-2 in VXLAN over the nodes' IPv4 underlay, inner (IPv6 pod
/// addresses) and outer (IPv4 node addresses) paired on both nodes, and
/// delivered; the IPv4 pair beside it is told as ever.
#[test]
fn ipv6_inside_the_ipv4_underlays_tunnel_is_traced_with_inner_and_outer_paired() {
    let (_alone, lab) = dual_stack_in_ipv4_tunnel_lab();
    let (web, db) = (ipv6(&lab.0, "web-0"), ipv6(&lab.0, "db-0"));
    let (done, stories) = echoed_over_both_families(&lab.0);
    let request = story_from(&stories, web, db);
    assert_eq!(request["transport"]["proto"], "icmpv6", "{request}");
    assert_paired_across_vxlan(&request, Lab::node_ip(1), Lab::node_ip(2));
    let h = &request["hops"];
    assert_eq!(h[2]["iface"], "flannel.1");
    assert_eq!(h[5]["iface"], "flannel.1");
    assert_eq!(h[0]["route"]["dev"], "flannel.1", "{request}");
    let remote_vtep = Lab::node_subnet6(2).network().to_string();
    assert_eq!(h[0]["route"]["via"], remote_vtep.as_str());
    let overhead = h[3]["skb_len"].as_u64().unwrap() - h[2]["skb_len"].as_u64().unwrap();
    assert_eq!(overhead, 50, "Ethernet, IPv4, UDP and VXLAN headers");
    assert_tunnelled_to_node_2(&request);
    let reply = story_from(&stories, db, web);
    assert_tunnelled_back_to_node_1(&reply);
    let ipv4 = stories
        .iter()
        .filter(|s| s["src"] == lab.0.pod("web-0").ip.to_string())
        .count();
    assert_eq!(ipv4, 1, "{}", done.stdout);
}

fn assert_tunnelled_back_to_node_1(story: &Value) {
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "delivered", "{verdict}");
    assert_eq!(verdict["node"], "node-1");
    let outer: Vec<&Value> = (story["hops"].as_array().expect("hops").iter())
        .filter(|h| h["tunnel"].is_object())
        .collect();
    assert_eq!(outer.len(), 2, "{story}");
    assert_eq!(
        outer[0]["tunnel"]["outer"]["src"],
        Lab::node_ip(2).to_string()
    );
}

/// Calico's dual-stack VXLAN (an IPv6 pool): the pair's IPv6 echo is
/// routed from web-0's cali veth into vxlan-v6.calico (VNI 4096, port
/// 4789) over the nodes' IPv6 underlay, inner and outer paired on both
/// nodes, and delivered to db-0.
#[test]
fn calico_vxlan_v6_carries_the_pairs_ipv6_across_the_nodes() {
    let (_alone, lab) = dual_stack_lab(Topology::CalicoVxlan);
    let request = echo_request6(&lab.0);
    assert_tunnelled_to_node_2(&request);
    let hops = request["hops"].as_array().expect("hops");
    let into_tunnel = hops.iter().filter(|h| h["iface"] == "vxlan-v6.calico");
    assert_eq!(
        into_tunnel.count(),
        2,
        "the tunnel on both nodes: {request}"
    );
    let outer: Vec<&Value> = hops.iter().filter(|h| h["tunnel"].is_object()).collect();
    assert_eq!(
        outer.len(),
        2,
        "leaving node-1 and reaching node-2: {request}"
    );
    for hop in outer {
        let tunnel = &hop["tunnel"];
        assert_eq!(tunnel["vni"], 4096, "{tunnel}");
        assert_eq!(tunnel["outer"]["transport"]["dport"], 4789);
        assert_eq!(tunnel["outer"]["src"], Lab::node_ipv6(1).to_string());
        assert_eq!(tunnel["outer"]["dst"], Lab::node_ipv6(2).to_string());
    }
}

#[test]
fn ipv6_on_one_node_is_bridged_and_delivered_and_dash_6_leaves_ipv4_out() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    let (web0, web1) = (ipv6(&lab.0, "web-0"), ipv6(&lab.0, "web-1"));
    let done = traced(
        &lab.0,
        "web-0",
        "web-1",
        &["-6", "--duration", "8s"],
        || {
            assert!(ping(&lab.0, "web-0", "web-1"), "the lab's IPv4 is broken");
            assert!(lab.0.ping6("web-0", web1, &[]), "the lab's IPv6 is broken");
        },
    );
    // The pair's neighbour discovery is its traffic too, and may be
    // told beside the pings: only the echo stories are counted.
    assert!(
        done.stories()
            .iter()
            .all(|s| s["transport"]["proto"] == "icmpv6"),
        "-6 leaves IPv4 out: {}",
        done.stdout
    );
    let stories: Vec<Value> = (done.stories().into_iter())
        .filter(|s| matches!(s["transport"]["icmp_type"].as_u64(), Some(128 | 129)))
        .collect();
    assert_eq!(
        stories.len(),
        2,
        "the IPv6 request and reply: {}",
        done.stdout
    );
    let request = story_from(&stories, web0, web1);
    // Bridged between two ports of cni0: no hook of cni0's own is crossed.
    assert_eq!(
        path(&request),
        ["node-1 pod_veth ingress", "node-1 pod_veth egress"]
    );
    assert_eq!(request["verdict"]["outcome"], "delivered", "{request}");
    assert_eq!(request["verdict"]["path"], serde_json::json!(["bridged"]));
}

#[test]
fn an_ip6tables_drop_is_named_in_ip6tables_syntax() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    let (web, db) = (ipv6(&lab.0, "web-0"), ipv6(&lab.0, "db-0"));
    let rule = format!("-A FORWARD -s {web}/128 -j DROP");
    let added = in_netns(&lab.0.node_netns(1), "ip6tables")
        .args(rule.split(' '))
        .status()
        .expect("ip6tables");
    assert!(added.success(), "cannot add {rule}");
    let done = traced(&lab.0, "web-0", "db-0", &["-6", "--count", "1"], || {
        assert!(
            !lab.0.ping6("web-0", db, &[]),
            "the DROP let the ping through"
        );
    });
    let story = story_from(&done.stories(), web, db);
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{verdict}");
    assert_eq!(verdict["node"], "node-1");
    assert_eq!(verdict["reason"], "NETFILTER_DROP");
    let named = &verdict["netfilter"];
    assert_eq!(named["table"], "filter", "{verdict}");
    assert_eq!(named["chain"], "FORWARD");
    assert_eq!(named["rule"], rule.as_str());
}

#[test]
fn a_missing_ipv6_route_is_no_route_in_route_dash_6_terms() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    let (web, db) = (ipv6(&lab.0, "web-0"), ipv6(&lab.0, "db-0"));
    let subnet = Lab::node_subnet6(2);
    ip(&lab.0.node_netns(1), &format!("-6 route del {subnet}")).expect("route del");
    let done = traced(&lab.0, "web-0", "db-0", &["-6", "--count", "1"], || {
        assert!(!lab.0.ping6("web-0", db, &[]), "answered without a route");
    });
    let story = story_from(&done.stories(), web, db);
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "no_route", "{verdict}");
    assert_eq!(verdict["check"]["node"], "node-1");
    let vtep = subnet.network();
    assert_eq!(
        verdict["check"]["expected"],
        format!(
            "{subnet} via {vtep} dev flannel-v6.1 onlink (route -6 -n: {subnet} {vtep} UG flannel-v6.1) (pod subnet of node-2)"
        )
        .as_str()
    );
    assert_eq!(verdict["check"]["used"], "no route at all");
    assert_eq!(verdict["then"]["reason"], told_reason("IP_INNOROUTES"));
}

/// Where IPv6 rides flannel.1, the route flanneld would write goes
/// through flannel.1's own IPv6 VTEP, not a flannel-v6.1 the node lacks.
#[test]
fn a_missing_ipv6_route_inside_the_ipv4_tunnel_names_that_tunnels_vtep() {
    let (_alone, lab) = dual_stack_in_ipv4_tunnel_lab();
    let (web, db) = (ipv6(&lab.0, "web-0"), ipv6(&lab.0, "db-0"));
    let subnet = Lab::node_subnet6(2);
    ip(&lab.0.node_netns(1), &format!("-6 route del {subnet}")).expect("route del");
    let done = traced(&lab.0, "web-0", "db-0", &["-6", "--count", "1"], || {
        assert!(!lab.0.ping6("web-0", db, &[]), "answered without a route");
    });
    let verdict = &story_from(&done.stories(), web, db)["verdict"];
    assert_eq!(verdict["outcome"], "no_route", "{verdict}");
    let vtep = subnet.network();
    assert_eq!(
        verdict["check"]["expected"],
        format!(
            "{subnet} via {vtep} dev flannel.1 onlink (route -6 -n: {subnet} {vtep} UG flannel.1) (pod subnet of node-2)"
        )
        .as_str()
    );
}

#[test]
fn a_next_hop_that_never_answers_neighbour_discovery_is_told_like_arp() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    let (web, db) = (ipv6(&lab.0, "web-0"), ipv6(&lab.0, "db-0"));
    // The remote pod subnet routed via an underlay address nobody has.
    let gone: Ipv6Addr = "fd5a:0:2::99".parse().unwrap();
    let route = format!(
        "-6 route replace {} via {gone} dev eth0",
        Lab::node_subnet6(2)
    );
    ip(&lab.0.node_netns(1), &route).expect("route replace");
    let done = traced(&lab.0, "web-0", "db-0", &["-6", "--count", "1"], || {
        assert!(!lab.0.ping6("web-0", db, &["-W", "5"]), "answered");
    });
    let story = story_from(&done.stories(), web, db);
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{verdict}");
    assert_eq!(verdict["node"], "node-1");
    assert_eq!(verdict["reason"], "NEIGH_FAILED", "{verdict}");
    let route = &story["hops"][0]["route"];
    assert_eq!(route["dev"], "eth0", "{story}");
    assert_eq!(route["via"], gone.to_string());
    assert!(
        done.stdout.contains(&format!(
            "no neighbour discovery (NDP) reply from {gone} on eth0"
        )),
        "{}",
        done.stdout
    );
}

/// The Python lines (for `send_vxlan_payload`) of an Ethernet frame
/// holding an ICMPv6 echo request `src` → `dst`: the traced pair, forged.
fn forged_echo_frame(src: Ipv6Addr, dst: Ipv6Addr) -> String {
    format!(
        r#"
echo = struct.pack('!BBHHH', 128, 0, 0, 0x4242, 1) + b'forged!!'
ip6 = struct.pack('!IHBB16s16s', 6 << 28, len(echo), 58, 64,
                  socket.inet_pton(socket.AF_INET6, '{src}'),
                  socket.inet_pton(socket.AF_INET6, '{dst}'))
frame = b'\x02' * 6 + b'\x04' * 6 + b'\x86\xdd' + ip6 + echo
"#
    )
}

/// web-1 sends `to` (db-1's address of either family) the VXLAN-looking
/// payload of `forged_echo_frame` web-0 → db-0 while the pair's IPv6 is
/// traced: no story may come of it.
fn forges_no_story(lab: &Lab, to: std::net::IpAddr) {
    let frame = forged_echo_frame(ipv6(lab, "web-0"), ipv6(lab, "db-0"));
    let done = traced(lab, "web-0", "db-0", &["-6", "--duration", "5s"], || {
        send_vxlan_payload(lab, "web-1", to, &frame);
    });
    assert!(
        done.stories().is_empty(),
        "a pod's payload told a story about another pair: {}",
        done.stdout
    );
}

/// web-1 sends db-1, over IPv6, a UDP datagram to flannel's VXLAN port
/// whose payload is a VXLAN header (flannel's VNI) and an IPv6 frame
/// web-0 → db-0: the traced pair, forged. The kernel never decapsulates
/// it (it is no tunnel packet between two nodes on the underlay): no
/// story may come of it.
#[test]
fn a_pods_ipv6_payload_that_looks_like_vxlan_forges_no_story() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    let db1 = ipv6(&lab.0, "db-1");
    forges_no_story(&lab.0, db1.into());
}

/// Where IPv6 rides in the IPv4 tunnel: web-1 sends db-1, over IPv4, a
/// UDP datagram to flannel's VXLAN port whose payload is a VXLAN header
/// and an IPv6 frame web-0 → db-0. The IPv4 programs hand it (VXLAN to
/// them, with IPv6 inside) to the IPv6 ones, which must not trust it: it
/// is a pod's datagram, not a tunnel packet between two nodes on the
/// underlay. No story may come of it.
#[test]
fn a_pods_ipv4_payload_holding_the_pairs_ipv6_in_vxlan_forges_no_story() {
    let (_alone, lab) = dual_stack_in_ipv4_tunnel_lab();
    forges_no_story(&lab.0, lab.0.pod("db-1").ip.into());
}

/// A dual-stack Service (`PreferDualStack`), programmed by kube-proxy's
/// IPv6 proxier (ip6tables, or the `ip6 kube-proxy` table): web-0's TCP
/// request to db's IPv6 ClusterIP is one story from web-0's veth through
/// the DNAT to a backend on node-2, with the rule named; its SYN-ACK is
/// un-DNATed on node-1 and delivered. The Service is named as `svc/db
/// -6` (iptables) or by its `[ClusterIP]:port` (nftables).
fn an_ipv6_service_is_followed_through_kube_proxys_dnat(mode: ProxyMode) {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    lab.0.install_services(mode).expect("install services");
    let db = lab.0.service("db");
    let cluster_ip = db.cluster_ipv6.expect("a dual-stack Service");
    let services = lab.0.services_file().display().to_string();
    let mut answer = None;
    let front = format!("[{cluster_ip}]:80");
    let (dst, family) = match mode {
        ProxyMode::Iptables | ProxyMode::IptablesLegacy => ("svc/db", "-6"),
        // The address alone asks for IPv6.
        ProxyMode::Nftables => (front.as_str(), "--count"),
    };
    let args = [family, "--count", "2", "--services-file", &services];
    let args = if family == "--count" {
        &args[1..]
    } else {
        &args[..]
    };
    let done = traced(&lab.0, "web-0", dst, args, || {
        answer = Some(lab.0.tcp_request("web-0", cluster_ip, 80));
        // IPv4 beside it, which is not traced.
        assert_eq!(
            lab.0.tcp_request("web-0", db.cluster_ip, 80).as_deref(),
            Ok("ok")
        );
    });
    assert_eq!(answer, Some(Ok("ok".into())), "the lab's IPv6 Service");
    let stories = done.stories();
    let with_flags = |flags: u64| {
        stories
            .iter()
            .find(|s| s["transport"]["flags"] == flags)
            .unwrap_or_else(|| panic!("no story with TCP flags {flags:#x}: {}", done.stdout))
    };
    let (syn, synack) = (with_flags(0x02), with_flags(0x12));
    let web = ipv6(&lab.0, "web-0");
    assert_eq!(syn["src"], web.to_string(), "{syn}");
    let dnat = nat_step(syn, "DNAT");
    assert_eq!(dnat["node"], "node-1", "{syn}");
    let step = &dnat["nat"][0];
    assert_eq!(step["before"], format!("[{cluster_ip}]:80"), "{step}");
    let backend = db
        .backends
        .iter()
        .find(|b| step["after"] == format!("[{}]:{TCP_PORT}", lab.0.ipv6_of(b)))
        .unwrap_or_else(|| panic!("DNAT to a backend: {step}"));
    assert_eq!(step["backend"], format!("default/{}", backend.name));
    let rule = step["rule"].as_str().unwrap_or_default();
    let to = format!("[{}]:{TCP_PORT}", lab.0.ipv6_of(backend));
    match mode {
        ProxyMode::Iptables => assert!(
            rule.starts_with("nat KUBE-SEP-")
                && rule.contains(&format!("-j DNAT --to-destination {to}")),
            "in ip6tables syntax: {rule}"
        ),
        ProxyMode::Nftables => assert!(
            rule.starts_with("ip6 kube-proxy endpoint-") && rule.contains(&format!("dnat to {to}")),
            "the ip6 table's endpoint chain: {rule}"
        ),
        // nft's rule tracing cannot see legacy rules.
        ProxyMode::IptablesLegacy => assert!(rule.contains("iptables-legacy"), "{rule}"),
    }
    let verdict = &syn["verdict"];
    assert_eq!(verdict["outcome"], "delivered", "{verdict}");
    assert_eq!(verdict["node"], "node-2");
    let undone = nat_step(synack, "un-DNAT");
    assert_eq!(undone["node"], "node-1", "{synack}");
    assert_eq!(undone["nat"][0]["after"], format!("[{cluster_ip}]:80"));
    assert_eq!(synack["verdict"]["outcome"], "delivered", "{synack}");
}

/// Two IPv6 addresses name the pair and ask for its IPv6 traffic alone;
/// an IPv4 address beside an IPv6 one is refused in one line.
#[test]
fn ipv6_addresses_as_arguments_trace_the_pairs_ipv6_alone() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    let (web, db) = (ipv6(&lab.0, "web-0"), ipv6(&lab.0, "db-0"));
    let (src, dst) = (web.to_string(), db.to_string());
    let done = traced(&lab.0, &src, &dst, &["--count", "2"], || {
        assert!(lab.0.ping6("web-0", db, &[]), "the lab's IPv6 is broken");
        assert!(ping(&lab.0, "web-0", "db-0"), "the lab's IPv4 is broken");
    });
    done.ipv6_echo_alone(web, db);
    let node1 = lab.0.node_netns(1);
    let pods = lab.0.pods_file().display().to_string();
    let refused = |src: &str, dst: &str, extra: &[&str], expected: &str| {
        let mut args = vec![src, dst, "--pods-file", &pods, "--netns", &node1];
        args.extend_from_slice(extra);
        assert_refused(&args, expected, &node1);
    };
    refused(
        "10.244.1.2",
        &dst,
        &[],
        "10.244.1.2 is an IPv4 address and ",
    );
    refused(&src, &dst, &["-4"], "-4 leaves out IPv6, and ");
}

/// The one hop of `story` that made a `kind` translation.
fn nat_step<'a>(story: &'a Value, kind: &str) -> &'a Value {
    let hops = story["hops"].as_array().expect("hops");
    let translated: Vec<&Value> = hops
        .iter()
        .filter(|h| {
            h["nat"]
                .as_array()
                .is_some_and(|n| n.iter().any(|s| s["kind"] == kind))
        })
        .collect();
    assert_eq!(translated.len(), 1, "one {kind} hop: {story}");
    translated[0]
}

#[test]
fn an_ipv6_cluster_ip_is_followed_through_ip6tables_dnat() {
    an_ipv6_service_is_followed_through_kube_proxys_dnat(ProxyMode::Iptables);
}

#[test]
fn an_ipv6_cluster_ip_is_followed_through_the_ip6_kube_proxy_table() {
    an_ipv6_service_is_followed_through_kube_proxys_dnat(ProxyMode::Nftables);
}

/// The lab's pods and nodes as an IPv6-only cluster lists them: each
/// one's IPv6 addresses alone (podIP and podIPs, hostIP and hostIPs;
/// InternalIP, podCIDR and podCIDRs, and no IPv4 annotations).
fn ipv6_only_listings(lab: &Lab) -> (String, String) {
    let only_ipv6 = |list: &mut Value| {
        let kept: Vec<Value> = (list.as_array().into_iter().flatten())
            .filter(|a| {
                a["ip"]
                    .as_str()
                    .or(a["address"].as_str())
                    .is_some_and(|ip| ip.contains(':') || !ip.contains('.'))
            })
            .cloned()
            .collect();
        *list = kept.into();
    };
    let mut pods: Value =
        serde_json::from_str(&std::fs::read_to_string(lab.pods_file()).unwrap()).unwrap();
    for pod in pods["items"].as_array_mut().unwrap() {
        let node: u8 = pod["spec"]["nodeName"].as_str().unwrap()[5..]
            .parse()
            .unwrap();
        let status = &mut pod["status"];
        only_ipv6(&mut status["podIPs"]);
        status["podIP"] = status["podIPs"][0]["ip"].clone();
        status["hostIP"] = Lab::node_ipv6(node).to_string().into();
        status["hostIPs"] = serde_json::json!([{"ip": Lab::node_ipv6(node).to_string()}]);
    }
    let mut nodes: Value =
        serde_json::from_str(&std::fs::read_to_string(lab.nodes_file()).unwrap()).unwrap();
    for node in nodes["items"].as_array_mut().unwrap() {
        only_ipv6(&mut node["status"]["addresses"]);
        let cidrs: Vec<Value> = (node["spec"]["podCIDRs"].as_array().into_iter().flatten())
            .filter(|c| c.as_str().is_some_and(|c| c.contains(':')))
            .cloned()
            .collect();
        node["spec"]["podCIDR"] = cidrs[0].clone();
        node["spec"]["podCIDRs"] = cidrs.into();
    }
    let dir = lab.pods_file().parent().unwrap().to_path_buf();
    let (pods_file, nodes_file) = (
        dir.join("pods-ipv6-only.json"),
        dir.join("nodes-ipv6-only.json"),
    );
    std::fs::write(&pods_file, pods.to_string()).unwrap();
    std::fs::write(&nodes_file, nodes.to_string()).unwrap();
    (
        pods_file.display().to_string(),
        nodes_file.display().to_string(),
    )
}

/// On an IPv6-only cluster (pods and nodes listed with IPv6 addresses
/// alone) a pod pair is traced over IPv6, its nodes named by their IPv6
/// addresses; two plain IPv6 addresses, with no Kubernetes at all, are
/// traced as two plain IPv4 ones are.
#[test]
fn ipv6_only_pods_and_plain_ipv6_addresses_are_traced() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    let (web, db) = (ipv6(&lab.0, "web-0"), ipv6(&lab.0, "db-0"));
    let (pods, nodes) = ipv6_only_listings(&lab.0);
    let (node1, node2) = (lab.0.node_netns(1), lab.0.node_netns(2));
    let run = |args: &[&str]| {
        let mut args = argv(args, vec![]);
        args.extend(
            [
                "-o",
                "json",
                "--count",
                "2",
                "--duration",
                "15s",
                "--netns",
                &node1,
                "--netns",
                &node2,
            ]
            .map(String::from),
        );
        let trace = Trace::start(&args);
        assert!(lab.0.ping6("web-0", db, &[]), "the lab's IPv6 is broken");
        assert!(ping(&lab.0, "web-0", "db-0"), "the lab's IPv4 is broken");
        let done = trace.finish();
        assert!(done.status.success(), "podtrace failed: {}", done.stderr);
        done
    };
    let named = run(&[
        "web-0",
        "db-0",
        "--pods-file",
        &pods,
        "--nodes-file",
        &nodes,
    ]);
    named.ipv6_echo_alone(web, db);
    assert_tunnelled_to_node_2(&story_from(&named.stories(), web, db));
    let (src, dst) = (web.to_string(), db.to_string());
    let plain = run(&[&src, &dst]);
    let stories = plain.stories();
    assert_eq!(
        stories.len(),
        2,
        "the IPv6 echo and its reply: {}",
        plain.stdout
    );
    let request = story_from(&stories, web, db);
    assert_eq!(request["verdict"]["outcome"], "delivered", "{request}");
    assert_eq!(
        request["verdict"]["path"],
        serde_json::json!(["routed", "encapsulated", "decapsulated"])
    );
}

/// Calico's IPv6 pool over BGP (a bird6 per node, no tunnel): the pair's
/// IPv6 is routed node to node on the underlay, via the peer's IPv6
/// address as BIRD installed it (`proto bird`), and the doctor reads
/// bird6's sessions. With node-2's bird6 stopped, node-1's route to its
/// block is withdrawn: no route, with the route BIRD would have installed
/// and bird6's word on the session.
#[test]
fn calico_bgp_routes_the_pairs_ipv6_and_a_withdrawn_ipv6_block_is_no_route() {
    let (_alone, lab) = dual_stack_lab(Topology::Calico);
    let (web, db) = (ipv6(&lab.0, "web-0"), ipv6(&lab.0, "db-0"));
    let request = echo_request6(&lab.0);
    let verdict = &request["verdict"];
    assert_eq!(verdict["outcome"], "delivered", "{verdict}");
    assert_eq!(verdict["node"], "node-2");
    assert_eq!(verdict["path"], serde_json::json!(["routed"]));
    let hops = request["hops"].as_array().expect("hops");
    assert!(hops.iter().all(|h| h["tunnel"].is_null()), "{request}");
    assert!(
        path(&request).contains(&"node-1 underlay egress".to_string()),
        "{request}"
    );
    let roots: Vec<String> = (1..=2)
        .flat_map(|n| {
            [
                "--host-root".to_string(),
                lab.0.host_root(n).display().to_string(),
            ]
        })
        .collect();
    let mut doctor = argv(&["doctor", "-o", "json"], lab_args(&lab.0, &[1, 2]));
    doctor.extend(roots.iter().cloned());
    let report: Value = serde_json::from_str(
        &run_podtrace(&doctor.iter().map(String::as_str).collect::<Vec<_>>()).stdout,
    )
    .expect("a JSON report");
    let (peer, socket) = (Lab::node_ipv6(2), "/var/run/calico/bird6.ctl");
    let session = format!("BGP session Mesh_{}", peer.to_string().replace(':', "_"));
    let checks = report["checks"].as_array().expect("checks");
    let on_node1 = checks
        .iter()
        .find(|c| c["node"] == "node-1" && c["name"] == session.as_str());
    assert_eq!(
        on_node1.map(|c| c["evidence"].clone()),
        Some(format!("{session} with {peer} (node-2) is Established (BIRD, {socket})").into()),
        "{report:#}"
    );
    xtask::lab::bird6::withdraw(&lab.0, 2).expect("bird6 on node-2 stopped");
    let extra: Vec<&str> = ["-6", "--count", "1"]
        .into_iter()
        .chain(roots.iter().map(String::as_str))
        .collect();
    let done = traced(&lab.0, "web-0", "db-0", &extra, || {
        assert!(!lab.0.ping6("web-0", db, &[]), "answered without a route");
    });
    let story = story_from(&done.stories(), web, db);
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "no_route", "{verdict}");
    assert_eq!(verdict["check"]["node"], "node-1");
    let block = Lab::node_subnet6(2);
    assert_eq!(
        verdict["check"]["expected"],
        format!("{block} via {peer} dev eth0 proto bird (route -6 -n: {block} {peer} UG eth0) (pod block of node-2)").as_str()
    );
    let summary = verdict["summary"].as_str().unwrap();
    assert!(
        summary.contains(&format!("; {session} with {peer} (node-2) is "))
            && !summary.contains("Mesh_192"),
        "bird6's session, not bird's: {summary}"
    );
}

/// With no Services list and kube-proxy's rules not read, an IPv6
/// ClusterIP's backend is learnt from conntrack as the connection opens
/// (as an IPv4 one's is): the backend's veth is watched from then on and
/// the replies are told through the un-DNAT.
#[test]
fn an_ipv6_service_backend_is_learnt_from_conntrack_alone() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    lab.0
        .install_services(ProxyMode::Iptables)
        .expect("install services");
    let cluster_ip = lab
        .0
        .service("db")
        .cluster_ipv6
        .expect("a dual-stack Service");
    let (web, cluster) = (ipv6(&lab.0, "web-0").to_string(), cluster_ip.to_string());
    let mut args = argv(
        &[&web, &cluster, "-o", "json", "--no-kube-proxy-rules"],
        vec![],
    );
    args.extend(["--duration", "12s"].map(String::from));
    for node in [1, 2] {
        args.extend(["--netns".to_string(), lab.0.node_netns(node)]);
    }
    let trace = Trace::start(&args);
    for _ in 0..2 {
        let answer = lab.0.tcp_request("web-0", cluster_ip, 80);
        assert_eq!(answer.as_deref(), Ok("ok"), "the lab's IPv6 Service");
    }
    let done = trace.finish();
    assert!(done.status.success(), "podtrace failed: {}", done.stderr);
    let db = lab.0.service("db");
    let watched = |b: &xtask::lab::LabPod| {
        let line = format!("{} is behind veth", lab.0.ipv6_of(b));
        done.stderr.contains(&line)
    };
    let backend_watched = db.backends.iter().any(watched);
    assert!(
        backend_watched,
        "the backend's veth, once learnt: {}",
        done.stderr
    );
    let undnat = format!("→ [{cluster_ip}]:80");
    let replies = done.stories().into_iter().filter(|s| {
        s["verdict"]["summary"]
            .as_str()
            .is_some_and(|v| v.contains("un-DNAT") && v.contains(&undnat))
    });
    assert!(
        replies.count() > 0,
        "replies told through the un-DNAT: {}",
        done.stdout
    );
}

/// `ping -6 -s 3000`: each reply arrives in fragments and is reassembled
/// in web-0, where ping_rcv frees it after ping got it. The replies are
/// told delivered, never a NO_SOCKET drop of their own.
#[test]
fn fragmented_ipv6_echo_replies_are_delivered_not_dropped_after_reassembly() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    let db = ipv6(&lab.0, "db-0");
    let done = traced(
        &lab.0,
        "web-0",
        "db-0",
        &["-6", "--duration", "10s"],
        || {
            // The first may meet the tunnel's MTU before the path's is known.
            let big = ["-s", "3000", "-c", "3", "-i", "0.3"];
            let _ = lab.0.ping6("web-0", db, &big);
        },
    );
    let stories = done.stories();
    let replies: Vec<&Value> = (stories.iter())
        .filter(|s| s["transport"]["icmp_type"] == 129)
        .collect();
    assert!(replies.len() >= 2, "{}", done.stdout);
    for reply in replies {
        assert_eq!(reply["verdict"]["outcome"], "delivered", "{reply}");
    }
    assert!(!done.stdout.contains("ping_rcv\"") && !done.stdout.contains("NO_SOCKET in ping_rcv"));
}

/// Three identical UDP datagrams 300 ms apart: IPv6 gives them no ID, yet
/// each is a story of its own, sent once.
#[test]
fn identical_ipv6_datagrams_are_a_story_each() {
    let (_alone, lab) = dual_stack_lab(Topology::FlannelVxlan);
    let db = ipv6(&lab.0, "db-0");
    let send = format!(
        "import socket, time\ns = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\ns.bind(('', 40000))\nfor _ in range(3):\n    s.sendto(b'same bytes', ('{db}', 9999))\n    time.sleep(0.3)\n"
    );
    let done = traced(
        &lab.0,
        "web-0",
        "db-0",
        &["-6", "--proto", "udp", "--duration", "8s"],
        || {
            let sent = in_netns(&lab.0.pod("web-0").netns, "python3")
                .args(["-c", &send])
                .status()
                .expect("python3");
            assert!(sent.success());
        },
    );
    let datagrams: Vec<Value> = (done.stories().into_iter())
        .filter(|s| s["transport"]["proto"] == "udp" && s["transport"]["dport"] == 9999)
        .collect();
    assert_eq!(datagrams.len(), 3, "{}", done.stdout);
    for story in &datagrams {
        let sent_by = path(story)
            .iter()
            .filter(|h| *h == "node-1 pod_veth ingress")
            .count();
        assert_eq!(sent_by, 1, "{story}");
    }
}
