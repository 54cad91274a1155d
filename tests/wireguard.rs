//! WireGuard as Flannel's wireguard backend runs it (flannel-wg, UDP
//! 51820) against the real kernel. This host's kernel has no
//! wireguard.ko, so the tests are ignored here and run in the VM matrix
//! (`cargo xtask test --kernel 6.1 --tests wireguard`; the doctor's test
//! on 6.12 only, see xtask/src/vm/suite.rs).

#[allow(dead_code)]
mod support;

use serde_json::Value;
use support::*;
use xtask::{
    api_stub::{Kubelet, Stub, TOKEN},
    lab::{flannel_wireguard, in_netns, wireguard, LabGuard, Topology},
};

#[test]
#[ignore = "needs wireguard.ko: runs in the VM matrix (cargo xtask test --kernel 6.1)"]
fn a_ping_through_flannel_wireguard_is_delivered_with_its_encrypted_leg() {
    let lab = lab(Topology::FlannelWireguard);
    let (story, human) = one_ping_told(&lab);
    assert_eq!(story["verdict"]["outcome"], "delivered", "{story}\n{human}");
    // The plaintext legs: into node-1's device, out of node-2's.
    let dev = flannel_wireguard::DEVICE;
    let into = hop_on(&story, "node-1", dev, "egress").expect("node-1's device egress");
    let out_of = hop_on(&story, "node-2", dev, "ingress").expect("node-2's device ingress");
    // Each names the peer by the device's own configuration.
    let key = |n| flannel_wireguard::public_key(n).expect("a node's key")[..8].to_string();
    let note = |hop: &serde_json::Value| hop["note"].as_str().unwrap_or_default().to_string();
    assert!(
        note(into).contains(&format!("into WireGuard for peer {} (UDP to ", key(2))),
        "{}\n{human}",
        note(into)
    );
    // The encrypted leg between, known by the kernel's flow hash.
    assert_encrypted_leg_between(&story, &human, into, out_of);
    assert!(
        note(out_of).contains(&format!("decrypted by WireGuard from peer {}", key(1))),
        "{}\n{human}",
        note(out_of)
    );
}

#[test]
#[ignore = "needs wireguard.ko: runs in the VM matrix (on 6.12: cargo xtask test --kernel 6.12)"]
fn an_encrypted_packet_dropped_on_either_nodes_underlay_is_its_storys_drop() {
    let lab = lab(Topology::FlannelWireguard);
    // A session first: its handshake must pass before the firewall
    // drops what WireGuard sends (a node's egress rule on its port).
    let _answered = ping(&lab.0, "web-0", "db-0");
    let sending = ["OUTPUT", "-p", "udp", "--dport", "51820", "-j", "DROP"];
    firewall(&lab, 1, "-A", &sending);
    let (story, human) = one_ping_told(&lab);
    // Not "vanished past the device": the UDP packet carrying the ping,
    // known by its tag, was dropped on node-1, with the kernel's reason.
    let drop = encrypted_drop_on(&story, &human, "node-1");
    assert_eq!(
        drop["tunnel"]["wireguard"]["known_by"], "flow_hash_tag",
        "{drop}"
    );
    // Now the receiving node's firewall: the tag did not cross the wire,
    // and the drop is known by the receiver index and counter node-1's
    // leg left with.
    firewall(&lab, 1, "-D", &sending);
    firewall(
        &lab,
        2,
        "-A",
        &["INPUT", "-p", "udp", "--dport", "51820", "-j", "DROP"],
    );
    let (story, human) = one_ping_told(&lab);
    let drop = encrypted_drop_on(&story, &human, "node-2");
    let (_, leg) = encrypted_leg(&story).expect("node-1's encrypted leg");
    assert_eq!(leg["node"], "node-1", "{leg}");
    let (sent, dropped) = (&leg["tunnel"]["wireguard"], &drop["tunnel"]["wireguard"]);
    assert_eq!(dropped["known_by"], "receiver_and_counter", "{drop}");
    assert_eq!(dropped["counter"], sent["counter"], "{story}");
    assert_eq!(dropped["receiver"], sent["receiver"], "{story}");
    assert!(
        human.contains("known by the receiver index and counter"),
        "{human}"
    );
}

/// Adds (`-A`) or deletes (`-D`) `rule` in node `node`'s iptables.
fn firewall(lab: &LabGuard, node: u8, op: &str, rule: &[&str]) {
    let changed = in_netns(&lab.0.node_netns(node), "iptables")
        .arg(op)
        .args(rule)
        .status()
        .expect("iptables");
    assert!(changed.success(), "iptables {op} {rule:?} on node {node}");
}

/// The story's last hop, a drop on `node` of the UDP packet WireGuard
/// sent with the traced packet inside, with the kernel's reason; the
/// verdict a drop there, with no word of WireGuard freeing it.
fn encrypted_drop_on<'a>(story: &'a Value, human: &str, node: &str) -> &'a Value {
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{story}\n{human}");
    assert_eq!(verdict["node"], node, "{verdict}");
    let last = story["hops"]
        .as_array()
        .expect("hops")
        .last()
        .expect("a hop");
    assert_eq!(last["direction"], "drop", "{last}");
    assert_eq!(last["node"], node, "{last}");
    assert_eq!(last["tunnel"]["kind"], "wireguard", "{last}");
    assert!(
        human.contains("dropped encrypted (WireGuard ") && human.contains("NETFILTER_DROP"),
        "{human}"
    );
    assert!(verdict["wireguard"].is_null(), "{verdict}");
    // Not blamed on rule tracing's rate: it follows the traced header.
    let summary = verdict["summary"].as_str().unwrap_or_default();
    assert!(
        summary.contains("WireGuard's UDP packet carries encrypted"),
        "{summary}"
    );
    last
}

#[test]
#[ignore = "needs wireguard.ko: runs in the VM matrix (cargo xtask test --kernel 6.1)"]
fn a_packet_wireguard_frees_after_decryption_names_the_allowed_ips_to_read() {
    let lab = lab(Topology::FlannelWireguard);
    let (node2, dev) = (lab.0.node_netns(2), flannel_wireguard::DEVICE);
    let key = flannel_wireguard::public_key(1).expect("node-1's key");
    // podtrace starts on a healthy cluster; then node-2's peer for node-1
    // is narrowed to another subnet, so that WireGuard drops what it
    // decrypts from web-0 (calico #9751's silent drop). The story must
    // judge by node-2's peers as they are when it is told, not at start.
    let trace = Trace::start(&one_packet(&lab.0, "web-0", "db-0", "json"));
    wireguard::allow_only(&node2, dev, 1, "10.99.0.0/24").expect("narrowed");
    let _answered = ping(&lab.0, "web-0", "db-0");
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let story = done.ping_stories().into_iter().next().expect("a story");
    let human = {
        let trace = Trace::start(&one_packet(&lab.0, "web-0", "db-0", "human"));
        let _answered = ping(&lab.0, "web-0", "db-0");
        trace.finish().stdout
    };
    // WireGuard frees the packet itself, past the kernel's drop
    // tracepoint: the story says where it was lost from sight, and from
    // node-2's WireGuard state, read over netlink again, why.
    // Last seen leaving node-1 encrypted, on its underlay.
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "vanished", "{story}\n{human}");
    let (_, leg) = encrypted_leg(&story).expect("the encrypted leg");
    assert_eq!(verdict["iface"], leg["iface"], "{verdict}");
    let web = lab.0.pod("web-0").ip;
    let proof = &verdict["wireguard"];
    assert_eq!(proof["cause"], "source_not_allowed", "{verdict}");
    assert_eq!(proof["node"], "node-2", "{proof}");
    assert_eq!(proof["peer"], key.as_str(), "{proof}");
    assert_eq!(
        proof["allowed_ips"],
        serde_json::json!(["10.99.0.0/24"]),
        "{proof}"
    );
    assert_eq!(proof["source"], web.to_string(), "{proof}");
    assert_eq!(proof["allows_source"], false, "{proof}");
    assert_eq!(proof["read_as_told"], true, "{proof}");
    let hint = verdict["hint"].as_str().expect("a hint");
    for said in [
        "flannel-wg on node-1 encrypted it, and it left by ",
        &format!("WireGuard on node-2 freed it: node-1's peer there ({}) allows only 10.99.0.0/24, not {web}", &key[..8]),
        "podtrace infers it from the configuration it read as this story was told",
        &format!("fix: wg set flannel-wg peer {key} allowed-ips 10.99.0.0/24,"),
    ] {
        assert!(hint.contains(said), "{said}: {hint}");
    }
    assert!(human.contains("allows only 10.99.0.0/24"), "{human}");
}

#[test]
#[ignore = "needs wireguard.ko: runs in the VM matrix (on 6.1: cargo xtask test --kernel 6.1)"]
fn cluster_mode_judges_a_peer_narrowed_mid_trace_by_what_its_agent_read_since() {
    let lab = lab(Topology::FlannelWireguard);
    let (node2, dev) = (lab.0.node_netns(2), flannel_wireguard::DEVICE);
    // The API stub plays kubelet: its agents are this podtrace, one per
    // lab node.
    let state = scratch_dir("wireguard").join(&lab.0.prefix);
    std::fs::create_dir_all(&state).unwrap();
    let kubelet = Kubelet::for_lab(PODTRACE.as_ref(), &lab.0, &state);
    let stub = Stub::with_kubelet(&lab.0.pod_list(), &lab.0.node_list(), kubelet);
    let kubeconfig = stub.kubeconfig(&state, TOKEN).display().to_string();
    let args = [
        "--cluster-mode",
        "--kubeconfig",
        &kubeconfig,
        "default/web-0",
        "default/db-0",
        "--count",
        "1",
        "--duration",
        "40s",
        "-o",
        "json",
    ];
    let trace = Trace::start(&args.map(String::from));
    // Narrowed once every agent traces, as in node mode's test: node-2's
    // agent must send the state it reads now, not keep its start's.
    wireguard::allow_only(&node2, dev, 1, "10.99.0.0/24").expect("narrowed");
    let _answered = ping(&lab.0, "web-0", "db-0");
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    let story = done.ping_stories().into_iter().next().expect("a story");
    let proof = &story["verdict"]["wireguard"];
    assert_eq!(proof["cause"], "source_not_allowed", "{story}");
    assert_eq!(proof["node"], "node-2", "{proof}");
    assert_eq!(
        proof["allowed_ips"],
        serde_json::json!(["10.99.0.0/24"]),
        "{proof}"
    );
    assert_eq!(proof["read_as_told"], true, "{proof}");
}

#[test]
#[ignore = "needs wireguard.ko: runs in the VM matrix (on 6.12: cargo xtask test --kernel 6.12)"]
fn the_doctor_reads_wireguard_and_names_a_device_down_and_a_subnet_no_peer_allows() {
    let lab = lab(Topology::FlannelWireguard);
    let dev = flannel_wireguard::DEVICE;
    // node-2's peer for node-1 allows another subnet; node-1's device is down.
    let key = flannel_wireguard::public_key(1).expect("node-1's key");
    wireguard::allow_only(&lab.0.node_netns(2), dev, 1, "10.99.0.0/24").expect("narrowed");
    let down = in_netns(&lab.0.node_netns(1), "ip")
        .args(["link", "set", dev, "down"])
        .status()
        .expect("ip");
    assert!(down.success());
    let (report, code) = doctor_report(&lab, &[]);
    assert_eq!(code, 1, "{report:#}");
    let check = |node: &str, name: &str| check_on(&report, node, name);
    let up = check("node-1", &format!("{dev} up"));
    assert_eq!(up["ok"], false, "{up}");
    assert_eq!(up["fix"], format!("ip link set {dev} up"), "{up}");
    let allowed = check("node-2", &format!("{dev} allowed-ips"));
    assert_eq!(allowed["ok"], false, "{allowed}");
    let subnet = lab.0.node_subnet(1);
    let evidence = allowed["evidence"].as_str().unwrap();
    assert!(
        evidence.contains(&format!(
            "node-1's pod subnet {subnet} is allowed by no peer"
        )),
        "{evidence}"
    );
    let fix = allowed["fix"].as_str().unwrap();
    assert!(
        fix.contains(&format!(
            "wg set {dev} peer {key} allowed-ips 10.99.0.0/24,{subnet}"
        )),
        "{fix}"
    );
    // node-1's peer for node-2 is as the lab made it.
    let healthy = check("node-1", &format!("{dev} allowed-ips"));
    assert_eq!(healthy["ok"], true, "{healthy}");
}
