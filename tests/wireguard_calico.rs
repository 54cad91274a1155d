//! Calico's WireGuard (`wireguard.cali`, policy-routed: the rule
//! `99: not from all fwmark 0x100000/0x100000 lookup 1` sends pod traffic
//! to table 1, whose routes lead into the device) against the real
//! kernel. This host's kernel has no wireguard.ko, so the tests are
//! ignored here and run in the VM matrix
//! (`cargo xtask test --kernel 6.1 --tests calico_wireguard`).

#[allow(dead_code)]
mod support;

use support::*;
use xtask::lab::{calico_wireguard as cw, wireguard, Topology};

#[test]
#[ignore = "needs wireguard.ko: runs in the VM matrix (cargo xtask test --kernel 6.1)"]
fn a_ping_through_calico_wireguard_is_delivered_naming_table_1_and_its_rule() {
    let lab = lab(Topology::CalicoWireguard);
    let (story, human) = one_ping_told(&lab);
    assert_eq!(story["verdict"]["outcome"], "delivered", "{story}\n{human}");
    // The plaintext legs: into node-1's device, out of node-2's.
    // Each names the peer from the device's configuration; the
    // encrypted leg between is known by the kernel's flow hash.
    let hop = |node, direction| {
        let hop = hop_on(&story, node, cw::DEVICE, direction);
        hop.unwrap_or_else(|| panic!("{node} {direction}: {story}"))
    };
    let note = |hop: &serde_json::Value| hop["note"].as_str().unwrap_or_default().to_string();
    let (into, out_of) = (hop("node-1", "egress"), hop("node-2", "ingress"));
    assert!(
        note(into).contains("into WireGuard for peer "),
        "{}\n{human}",
        note(into)
    );
    assert!(
        note(out_of).contains("decrypted by WireGuard from peer "),
        "{}\n{human}",
        note(out_of)
    );
    assert_encrypted_leg_between(&story, &human, into, out_of);
    // The route into the device is table 1's, by Felix's rule.
    let rule = format!(
        "dev {} table {} (rule {}: not from all fwmark 0x100000/0x100000 lookup {})",
        cw::DEVICE,
        cw::TABLE,
        cw::RULE_PRIORITY,
        cw::TABLE
    );
    assert!(human.contains(&rule), "no hop says {rule}:\n{human}");
}

#[test]
#[ignore = "needs wireguard.ko: runs in the VM matrix (cargo xtask test --kernel 6.1)"]
fn a_packet_calicos_wireguard_frees_after_decryption_is_told_past_the_device() {
    let lab = lab(Topology::CalicoWireguard);
    // node-2's peer for node-1 allows another block (calico #9751).
    wireguard::allow_only(&lab.0.node_netns(2), cw::DEVICE, 1, "10.99.0.0/24")
        .expect("node-2's peer for node-1 narrowed");
    let (story, human) = one_ping_told(&lab);
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "vanished", "{story}\n{human}");
    let (_, leg) = encrypted_leg(&story).expect("the encrypted leg");
    assert_eq!(verdict["iface"], leg["iface"], "{verdict}");
    let hint = verdict["hint"].as_str().expect("a hint");
    assert!(
        hint.contains("wireguard.cali on node-1 encrypted it, and it left by "),
        "{hint}"
    );
    // From node-2's WireGuard state: its peer for node-1 (by node-1's
    // key) allows only the other block.
    let wireguard = &verdict["wireguard"];
    assert_eq!(wireguard["cause"], "source_not_allowed", "{wireguard}");
    assert_eq!(wireguard["node"], "node-2", "{wireguard}");
    assert_eq!(wireguard["allowed_ips"][0], "10.99.0.0/24", "{wireguard}");
}
