//! Stories that were wrong when podtrace was tried as a new user would:
//! each test reproduces one on the lab and asserts the story a user must
//! get now.

#[allow(dead_code)]
mod support;

use serde_json::Value;
use support::*;
use xtask::{
    faults::{Fault, GONE_GATEWAY},
    lab::{in_netns, Topology},
};

/// web-0 → db-0 traced in JSON on `nodes` (at most 15 s) while `during`
/// makes traffic; podtrace's output once it stopped.
fn traced(lab: &xtask::lab::Lab, nodes: &[u8], extra: &[&str], during: impl FnOnce()) -> Finished {
    let mut args = vec!["web-0", "db-0", "-o", "json"];
    args.extend_from_slice(extra);
    if !extra.contains(&"--duration") {
        args.extend(["--duration", "15s"]);
    }
    let trace = Trace::start(&argv(&args, lab_args(lab, nodes)));
    during();
    trace.finish()
}

/// `pings` pings web-0 → db-0, one second apart, with ping's `options`.
fn ping_db(lab: &xtask::lab::Lab, pings: u32, options: &[&str]) {
    let db = lab.pod("db-0");
    let _ = in_netns(&lab.pod("web-0").netns, "ping")
        .args(["-c", &pings.to_string(), "-W", "2"])
        .args(options)
        .arg(db.ip.to_string())
        .stdout(std::process::Stdio::null())
        .status();
}

/// The stories of `pings` pings web-0 → db-0 traced on `nodes`.
fn trace_pings(lab: &xtask::lab::Lab, nodes: &[u8], pings: u32, extra: &[&str]) -> Finished {
    traced(lab, nodes, extra, || ping_db(lab, pings, &[]))
}

fn icmp_type(story: &Value) -> u64 {
    story["transport"]["icmp_type"].as_u64().unwrap_or(99)
}

#[test]
fn count_tells_the_first_packets_in_the_order_they_were_sent() {
    let lab = lab(Topology::FlannelVxlan);
    // Only node-1 is traced: each request leaves toward an untraced node,
    // each reply is delivered. With two pings, the replies used to be
    // told first and --count 2 never told a request.
    let done = trace_pings(&lab.0, &[1], 2, &["--count", "2"]);
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let told: Vec<(u64, u64)> = stories
        .iter()
        .map(|s| (s["transport"]["seq"].as_u64().unwrap_or(0), icmp_type(s)))
        .collect();
    assert_eq!(
        told,
        [(1, 8), (1, 0)],
        "request 1 then reply 1: {}",
        done.stdout
    );
    assert_eq!(stories[0]["verdict"]["outcome"], "left_node");
    assert_eq!(stories[1]["verdict"]["outcome"], "delivered");
}

#[test]
fn a_next_hop_that_never_answers_arp_is_a_drop_that_names_it() {
    let lab = lab(Topology::FlannelVxlan);
    Fault::NextHopNoArp.apply(&lab.0).expect("apply the fault");
    let done = trace_pings(&lab.0, &[1, 2], 1, &["--count", "1"]);
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let request = stories.first().expect("a story");
    let verdict = &request["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{verdict}");
    let reason = verdict["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("NEIGH_"), "{verdict}");
    let summary = verdict["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains(&format!("no ARP reply from {GONE_GATEWAY} on eth0")),
        "{summary}"
    );
}

/// A probe run ends once its stories are told: one that ended 1.5 s after
/// the last probe told the echo still waiting for ARP `vanished`, and the
/// probe's result quoted that.
#[test]
fn a_probe_waiting_for_arp_is_told_dropped_not_vanished() {
    let lab = lab(Topology::FlannelVxlan);
    Fault::NextHopNoArp.apply(&lab.0).expect("apply the fault");
    let done = Trace::start(&argv(
        &["web-0", "db-0", "-o", "json", "--probe", "icmp"],
        lab_args(&lab.0, &[1, 2]),
    ))
    .finish();
    assert!(done.status.success(), "{}", done.stderr);
    let request = done.stories().into_iter().next().expect("a story");
    let verdict = &request["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{verdict}");
    assert!(
        verdict["reason"]
            .as_str()
            .unwrap_or_default()
            .starts_with("NEIGH_"),
        "{verdict}"
    );
    let probe = done.probes().into_iter().next().expect("a probe result");
    assert!(
        !probe["result"]
            .as_str()
            .unwrap_or_default()
            .contains("vanished"),
        "{probe}"
    );
}

#[test]
fn a_missing_pod_subnet_route_is_no_route_without_the_nodes_file() {
    let lab = lab(Topology::FlannelVxlan);
    Fault::FlannelRouteMissing
        .apply(&lab.0)
        .expect("apply the fault");
    // lab_args gives --pods-file, never --nodes-file.
    let done = trace_pings(&lab.0, &[1, 2], 1, &["--count", "1"]);
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let verdict = &stories.first().expect("a story")["verdict"];
    assert_eq!(verdict["outcome"], "no_route", "{verdict}");
    assert_eq!(verdict["check"]["node"], "node-1", "{verdict}");
    // node-2 is traced: its subnet and flannel's route to it are named from
    // what it shows, with no node list.
    let expected = verdict["check"]["expected"].as_str().unwrap_or_default();
    let subnet = lab.0.node_subnet(2);
    assert_eq!(
        expected,
        format!(
            "{subnet} via {gateway} dev flannel.1 onlink (route -n: {} {gateway} {} UG flannel.1) (pod subnet of node-2)",
            subnet.network(),
            subnet.netmask(),
            gateway = subnet.network(),
        ),
        "{verdict}"
    );
}

#[test]
fn frag_needed_names_the_route_and_its_mtu() {
    let lab = lab(Topology::FlannelVxlan);
    Fault::MtuTooBig.apply(&lab.0).expect("apply the fault");
    let big_df = ["-s", "1472", "-M", "do"];
    let done = traced(&lab.0, &[1, 2], &["--count", "1"], || {
        ping_db(&lab.0, 1, &big_df)
    });
    assert!(done.status.success(), "{}", done.stderr);
    let story = done.stories().into_iter().next().expect("a story");
    let first = story["hops"][0]["note"].as_str().unwrap_or_default();
    assert!(
        first.contains("dev flannel.1; the packet (1500 B) is larger than flannel.1's MTU 1450"),
        "{first}"
    );
}

#[test]
fn tcp_segments_larger_than_the_mtu_are_no_mtu_problem() {
    let lab = lab(Topology::FlannelVxlan);
    let (web, db) = (lab.0.pod("web-0"), lab.0.pod("db-0"));
    let mut server = in_netns(&db.netns, "python3")
        .args(["-c", "import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('0.0.0.0',5001))\ns.listen(1)\nc,_=s.accept()\nwhile c.recv(65536): pass"])
        .spawn()
        .expect("server");
    std::thread::sleep(std::time::Duration::from_millis(300));
    // A TCP transfer: the pod's stack hands its veth GSO super-segments.
    let client = format!(
        "import socket\ns=socket.create_connection(('{}',5001))\ns.sendall(b'x'*2000000)\ns.close()",
        db.ip
    );
    let done = traced(&lab.0, &[1, 2], &["--count", "30"], || {
        let sent = in_netns(&web.netns, "python3")
            .args(["-c", &client])
            .status()
            .expect("client");
        assert!(sent.success(), "the transfer itself failed");
    });
    let _ = server.kill();
    let _ = server.wait();
    let big = done
        .stories()
        .iter()
        .flat_map(|s| s["hops"].as_array().cloned().unwrap_or_default())
        .filter(|h| h["skb_len"].as_u64().unwrap_or(0) > 1500)
        .count();
    assert!(big > 0, "no GSO segment was seen: {}", done.stdout);
    assert!(
        !done.stdout.contains("is larger than"),
        "a GSO segment was called too big: {}",
        done.stdout
    );
}

#[test]
fn a_pod_cannot_forge_another_pairs_story_with_a_tunnel_payload() {
    let lab = lab(Topology::FlannelVxlan);
    let (web0, db0) = (lab.0.pod("web-0"), lab.0.pod("db-0"));
    let (web1, db1) = (lab.0.pod("web-1"), lab.0.pod("db-1"));
    // web-1 sends db-1 a UDP datagram to the VXLAN port whose payload is a
    // VXLAN header (flannel's VNI) and a frame web-0 → db-0, ICMP echo.
    let frame = format!(
        r#"
def csum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return (~s) & 0xffff
icmp = struct.pack('!BBHHH', 8, 0, 0, 0x4242, 1) + b'forged!!'
icmp = icmp[:2] + struct.pack('!H', csum(icmp)) + icmp[4:]
ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(icmp), 7, 0, 64, 1, 0,
                 socket.inet_aton('{src}'), socket.inet_aton('{dst}'))
ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
frame = b'\x02' * 6 + b'\x04' * 6 + b'\x08\x00' + ip + icmp
"#,
        src = web0.ip,
        dst = db0.ip,
    );
    let done = traced(&lab.0, &[1, 2], &["--duration", "4s"], || {
        send_vxlan_payload(&lab.0, &web1.name, db1.ip.into(), &frame);
    });
    assert!(done.status.success(), "{}", done.stderr);
    assert!(
        done.stories().is_empty(),
        "a pod's payload told a story about another pair: {}",
        done.stdout
    );
}

#[test]
fn fragmented_pings_are_told_with_their_fragments_and_no_invented_transport() {
    let lab = lab(Topology::FlannelVxlan);
    let done = traced(&lab.0, &[1, 2], &["--count", "2"], || {
        ping_db(&lab.0, 1, &["-s", "3000"])
    });
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    assert_eq!(stories.len(), 2, "request and reply: {}", done.stdout);
    for story in &stories {
        let t = &story["transport"];
        assert_eq!(t["proto"], "icmp", "{story}");
        assert!(matches!(t["icmp_type"].as_u64(), Some(0 | 8)), "{story}");
        assert_eq!(story["verdict"]["outcome"], "delivered", "{story}");
        let notes: Vec<&str> = story["hops"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|h| h["note"].as_str())
            .collect();
        assert!(
            notes.iter().any(|n| n.starts_with("fragment @")),
            "{notes:?}"
        );
    }
    assert!(!done.stdout.contains("type 136"), "{}", done.stdout);
}

/// Adds an iptables rule inside a pod's own namespace.
fn pod_rule(netns: &str, rule: &str) {
    let added = in_netns(netns, "iptables")
        .args(rule.split(' '))
        .status()
        .expect("iptables");
    assert!(added.success(), "{rule}");
}

#[test]
fn a_drop_inside_a_pod_names_the_pod() {
    let lab = lab(Topology::FlannelVxlan);
    let (web, db) = (lab.0.pod("web-0"), lab.0.pod("db-0"));
    // The destination pod's own firewall: the packet reached its veth.
    pod_rule(
        &db.netns,
        &format!("-A INPUT -s {} -p icmp -j DROP", web.ip),
    );
    let done = trace_pings(&lab.0, &[1, 2], 1, &["--count", "1"]);
    assert!(done.status.success(), "{}", done.stderr);
    let story = done.stories().into_iter().next().expect("a story");
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{verdict}");
    assert_eq!(verdict["reason"], "NETFILTER_DROP", "{verdict}");
    assert_eq!(verdict["node"], "pod default/db-0", "{verdict}");
    assert_eq!(verdict["iface"], "eth0", "{verdict}");

    // The sender's own firewall: the packet never left it (no device yet).
    pod_rule(
        &web.netns,
        &format!("-A OUTPUT -d {} -p icmp -j DROP", db.ip),
    );
    let done = trace_pings(&lab.0, &[1, 2], 1, &["--count", "1"]);
    let story = done.stories().into_iter().next().expect("a story");
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{verdict}");
    assert_eq!(verdict["node"], "pod default/web-0", "{verdict}");
}

#[test]
fn records_lost_in_flight_make_stories_incomplete_never_vanished() {
    let lab = lab(Topology::FlannelVxlan);
    // A one-page ring buffer cannot hold a ping flood's records.
    let done = traced(
        &lab.0,
        &[1, 2],
        &["--ring-buffer", "4KiB", "--duration", "6s"],
        || ping_db(&lab.0, 3000, &["-f", "-q"]),
    );
    assert!(done.status.success(), "{}", done.stderr);
    let summary = done.summary();
    let lost = summary["lost_ringbuf_full"].as_u64().unwrap_or(0);
    assert!(lost > 0, "the test needs losses to happen: {summary}");
    let stories = done.stories();
    let vanished = stories
        .iter()
        .filter(|s| s["verdict"]["outcome"] == "vanished")
        .count();
    assert_eq!(
        vanished,
        0,
        "{} of {} stories claim vanished",
        vanished,
        stories.len()
    );
    assert!(stories.iter().any(|s| s["records_lost"] == true));
    assert!(
        done.stderr.contains("records lost"),
        "said as it happens: {}",
        done.stderr
    );
    assert_eq!(
        done.stderr
            .matches("to lose nothing at this rate: --sample N")
            .count(),
        1,
        "with what to do about it, once: {}",
        done.stderr
    );
}

/// web-0 → db-0 given by address, with no inventory at all (neither
/// --pods-file nor --nodes-file), one ping traced on nodes 1 and 2.
fn one_ping_by_address(lab: &xtask::lab::Lab) -> Finished {
    let (web, db) = (lab.pod("web-0").ip, lab.pod("db-0").ip);
    let mut args = vec![web.to_string(), db.to_string()];
    for arg in ["-o", "json", "--count", "1", "--duration", "15s"] {
        args.push(arg.into());
    }
    for node in [1, 2] {
        args.extend(["--netns".to_string(), lab.node_netns(node)]);
    }
    let trace = Trace::start(&args);
    ping_db(lab, 1, &[]);
    trace.finish()
}

#[test]
fn a_calico_bgp_node_without_a_default_route_is_traced_without_a_node_list() {
    let lab = lab(Topology::Calico);
    for node in [1, 2] {
        xtask::lab::ip(&lab.0.node_netns(node), "route del default").expect("no default route");
    }
    let done = one_ping_by_address(&lab.0);
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let verdict = &stories.first().expect("a story")["verdict"];
    assert_eq!(
        verdict["outcome"], "delivered",
        "{verdict}\n{}",
        done.stderr
    );
}

#[test]
fn a_missing_calico_block_route_names_the_other_traced_nodes_block() {
    let lab = lab(Topology::Calico);
    let node_1 = lab.0.node_netns(1);
    let subnet = lab.0.node_subnet(2);
    // node-1's BIRD would put the route back at its next scan of the
    // kernel's table: it is stopped first (its routes stay, `persist`).
    xtask::lab::bird::stop(&lab.0, 1).expect("bird stopped");
    xtask::lab::ip(&node_1, &format!("route del {subnet}")).expect("route gone");
    xtask::lab::ip(&node_1, "route del default").expect("no default route");
    let done = one_ping_by_address(&lab.0);
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let verdict = &stories.first().expect("a story")["verdict"];
    assert_eq!(verdict["outcome"], "no_route", "{verdict}");
    let node_2 = lab.0.node_netns(2);
    let node_2 = node_2.rsplit('/').next().unwrap_or_default();
    let node_ip = xtask::lab::Lab::node_ip(2);
    assert_eq!(
        verdict["check"]["expected"],
        format!(
            "{subnet} via {node_ip} dev eth0 proto bird (route -n: {} {node_ip} {} UG eth0) (pod block of {node_2})",
            subnet.network(),
            subnet.netmask()
        )
        .as_str(),
        "{verdict}"
    );
    assert_eq!(verdict["check"]["used"], "no route at all", "{verdict}");
}

/// #21 item 13: traced between two nodes' own addresses, the VXLAN
/// packets carrying pods' traffic between them match the pair by their
/// outer header; they are that pod traffic's encapsulation, not stories of
/// their own (each was one, `vanished` or delivered to the node's stack),
/// and the nodes' own packets keep their hops on both nodes.
#[test]
fn tunnel_packets_between_traced_node_addresses_are_not_stories_of_their_own() {
    let lab = lab(Topology::FlannelVxlan);
    let [node_1, node_2] = [1, 2].map(xtask::lab::Lab::node_ip);
    let (n1, n2) = (node_1.to_string(), node_2.to_string());
    let args = [n1.as_str(), n2.as_str(), "-o", "json", "--duration", "8s"];
    let trace = Trace::start(&argv(&args, lab_args(&lab.0, &[1, 2])));
    ping_db(&lab.0, 3, &["-i", "0.3"]);
    let pinged = in_netns(&lab.0.node_netns(1), "ping")
        .args(["-c", "1", "-W", "2", &n2])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let done = trace.finish();
    assert!(pinged && done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let tunnelled: Vec<&Value> = stories
        .iter()
        .filter(|s| s["transport"]["dport"] == 8472 || s["transport"]["sport"] == 8472)
        .collect();
    assert!(tunnelled.is_empty(), "VXLAN packets told: {tunnelled:?}");
    let summary = done.summary();
    let encapsulated = summary["other_pairs_encapsulated"].as_u64().unwrap_or(0);
    // Six pod packets, each seen leaving one node and arriving at the other.
    assert!(encapsulated >= 6, "{summary}");
    let request = stories
        .iter()
        .find(|s| icmp_type(s) == 8)
        .unwrap_or_else(|| panic!("node-1's echo request: {}", done.stdout));
    assert_eq!(request["verdict"]["outcome"], "delivered", "{request}");
    let hops: Vec<(&str, &str)> = request["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["node"].as_str().unwrap(), h["iface"].as_str().unwrap()))
        .collect();
    assert_eq!(hops, [("node-1", "eth0"), ("node-2", "eth0")], "{request}");
    // ping(8) took the reply on its raw socket; ping_rcv freed the
    // original: delivered, not dropped.
    let reply = stories
        .iter()
        .find(|s| icmp_type(s) == 0)
        .unwrap_or_else(|| panic!("node-2's echo reply: {}", done.stdout));
    assert_eq!(reply["verdict"]["outcome"], "delivered", "{reply}");
}
