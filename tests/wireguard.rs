//! WireGuard as Flannel's wireguard backend runs it (flannel-wg, UDP
//! 51820) against the real kernel. This host's kernel has no
//! wireguard.ko, so the tests are ignored here and run in the VM matrix
//! (`cargo xtask test --kernel 6.1 --tests wireguard`).

#[allow(dead_code)]
mod support;

use support::*;
use xtask::lab::{flannel_wireguard, in_netns, Topology};

#[test]
#[ignore = "needs wireguard.ko: runs in the VM matrix (cargo xtask test --kernel 6.1)"]
fn a_ping_through_flannel_wireguard_is_delivered_with_both_plaintext_legs() {
    let lab = lab(Topology::FlannelWireguard);
    let (story, human) = one_ping_told(&lab);
    assert_eq!(story["verdict"]["outcome"], "delivered", "{story}\n{human}");
    // The plaintext legs: into node-1's device, out of node-2's.
    let dev = flannel_wireguard::DEVICE;
    assert!(hop_on(&story, "node-1", dev, "egress").is_some(), "{story}");
    assert!(
        hop_on(&story, "node-2", dev, "ingress").is_some(),
        "{story}"
    );
}

#[test]
#[ignore = "needs wireguard.ko: runs in the VM matrix (cargo xtask test --kernel 6.1)"]
fn a_packet_wireguard_frees_after_decryption_names_the_allowed_ips_to_read() {
    let lab = lab(Topology::FlannelWireguard);
    // node-2's peer for node-1 allows another subnet: WireGuard drops what
    // it decrypts from web-0 (calico #9751's silent drop).
    let node2 = lab.0.node_netns(2);
    let key = flannel_wireguard::public_key(1).expect("node-1's key");
    let set = in_netns(&node2, "wg")
        .args([
            "set",
            flannel_wireguard::DEVICE,
            "peer",
            &key,
            "allowed-ips",
            "10.99.0.0/24",
        ])
        .status()
        .expect("wg");
    assert!(set.success());
    let (story, human) = one_ping_told(&lab);
    // WireGuard frees the packet itself, past the kernel's drop
    // tracepoint: the story says where it was lost from sight, what
    // podtrace cannot see, and which setting on node-2 to read.
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "vanished", "{story}\n{human}");
    assert_eq!(verdict["iface"], flannel_wireguard::DEVICE, "{verdict}");
    let hint = verdict["hint"].as_str().expect("a hint");
    let web = lab.0.pod("web-0").ip;
    for said in [
        "flannel-wg on node-1 is a WireGuard device",
        "node-2's flannel-wg never handed it on",
        &format!("node-1's peer must allow {web}: wg show flannel-wg allowed-ips on node-2"),
    ] {
        assert!(hint.contains(said), "{said}: {hint}");
    }
    assert!(human.contains("wg show flannel-wg allowed-ips"), "{human}");
}
