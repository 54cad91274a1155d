//! Calico's IPIP datapath against the real kernel: tunl0 with BIRD's
//! `via <node> dev tunl0 onlink` routes. This host's kernel has no
//! ipip.ko, so the tests are ignored here and run in the VM matrix
//! (`cargo xtask test --kernel 6.1 --tests ipip`; no_route on 5.10 only,
//! see xtask/src/vm/suite.rs), whose Debian kernels have it; run
//! here with --include-ignored they fail saying so.

#[allow(dead_code)]
mod support;

use serde_json::Value;
use support::*;
use xtask::lab::{bird, in_netns, Lab, Topology};

const NEEDS_IPIP: &str = "needs ipip.ko: runs in the VM matrix (cargo xtask test --kernel 6.1)";

/// The encapsulated hops: node-1's eth0 egress and node-2's eth0 ingress
/// each carry the inner packet paired with its outer IPIP header.
fn assert_paired_over_ipip(story: &Value) {
    for (node, direction) in [("node-1", "egress"), ("node-2", "ingress")] {
        let encap = hop_on(story, node, "eth0", direction)
            .unwrap_or_else(|| panic!("no {node} eth0 {direction} hop in {story}"));
        let tunnel = &encap["tunnel"];
        assert_eq!(tunnel["kind"], "ipip", "{encap}");
        assert_eq!(
            tunnel["outer"]["src"],
            Lab::node_ip(1).to_string(),
            "{encap}"
        );
        assert_eq!(
            tunnel["outer"]["dst"],
            Lab::node_ip(2).to_string(),
            "{encap}"
        );
    }
}

#[test]
#[ignore = "needs ipip.ko: runs in the VM matrix (cargo xtask test --kernel 6.1)"]
fn calico_ipip_cross_node_ping_is_delivered_with_inner_and_outer_paired() {
    let lab = lab(Topology::CalicoIpip);
    let (story, human) = one_ping_told(&lab);
    assert_eq!(story["verdict"]["outcome"], "delivered", "{story}");
    assert!(
        hop_on(&story, "node-1", "tunl0", "egress").is_some(),
        "the inner packet enters tunl0 on node-1: {story}"
    );
    assert_paired_over_ipip(&story);
    if sees_tunl0_ingress() {
        assert!(
            hop_on(&story, "node-2", "tunl0", "ingress").is_some(),
            "node-2's tunl0 hands the inner packet on: {story}"
        );
    }
    let path = &story["verdict"]["path"];
    assert!(
        path.as_array().unwrap().iter().any(|p| p == "encapsulated"),
        "{path}"
    );
    let outer = format!("IPIP {} → {}", Lab::node_ip(1), Lab::node_ip(2));
    assert!(
        human.contains(&outer),
        "the human story names {outer}: {human}"
    );
}

#[test]
#[ignore = "needs ipip.ko: runs in the VM matrix (cargo xtask test --kernel 6.1)"]
fn an_iptables_drop_after_ipip_decapsulation_names_the_rule() {
    let lab = lab(Topology::CalicoIpip);
    let web = lab.0.pod("web-0");
    // As iptables-save prints it (-s before -i), which the verdict quotes.
    let rule = format!("-A FORWARD -s {}/32 -i tunl0 -j DROP", web.ip);
    let added = in_netns(&lab.0.node_netns(2), "iptables")
        .args(rule.split(' '))
        .status()
        .expect("iptables");
    assert!(added.success(), "cannot add {rule}");
    let (story, human) = one_ping_told(&lab);
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{verdict}");
    assert_eq!(verdict["node"], "node-2", "{verdict}");
    assert_eq!(verdict["reason"], "NETFILTER_DROP", "{verdict}");
    assert_eq!(verdict["netfilter"]["chain"], "FORWARD", "{verdict}");
    assert_eq!(verdict["netfilter"]["rule"], rule.as_str(), "{verdict}");
    assert!(human.contains(&rule), "{human}");
    assert_paired_over_ipip(&story);
}

#[test]
#[ignore = "needs ipip.ko: runs in the VM matrix (on 5.10: cargo xtask test --kernel 5.10)"]
fn a_block_withdrawn_by_bgp_is_no_route_naming_birds_ipip_route() {
    let lab = lab(Topology::CalicoIpip);
    // node-2's BIRD stops: node-1's withdraws node-2's block, and the
    // packet leaves by the underlay's default route, unencapsulated.
    bird::stop(&lab.0, 2).expect("stop node-2's BIRD");
    bird::wait_routes(&lab.0, |node, _| node == 2).expect("node-1 withdraws node-2's block");
    let (story, human) = one_ping_told(&lab);
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "no_route", "{verdict}");
    assert_eq!(verdict["check"]["node"], "node-1", "{verdict}");
    let expected = verdict["check"]["expected"]
        .as_str()
        .expect("an expected route");
    let bird_route = format!(
        "{} via {} dev tunl0 proto bird onlink",
        lab.0.node_subnet(2),
        Lab::node_ip(2)
    );
    assert!(
        expected.starts_with(&bird_route),
        "the route BIRD installs, {bird_route}: {verdict}"
    );
    assert!(human.contains(&bird_route), "{human}");
}

#[test]
fn without_ipip_ko_the_lab_says_what_it_needs() {
    require_kernel();
    if std::path::Path::new("/sys/module/ipip").exists() || sees_modprobe_ipip() {
        return;
    }
    let name = format!("ipip-refused-{}", std::process::id() % 100_000);
    let lab = Lab::new(&name, Topology::CalicoIpip, None).expect("a lab");
    let refused = lab.up().expect_err("no calico-ipip lab without ipip.ko");
    lab.down().expect("lab down");
    assert!(
        format!("{refused:#}").contains("needs the ipip kernel module"),
        "{refused:#} ({NEEDS_IPIP})"
    );
}

/// Whether this kernel can load ipip.ko.
fn sees_modprobe_ipip() -> bool {
    std::process::Command::new("modprobe")
        .args(["-n", "ipip"])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
