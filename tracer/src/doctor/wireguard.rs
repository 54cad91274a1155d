//! A node's WireGuard devices (Flannel's flannel-wg, Calico's
//! wireguard.cali), as the kernel holds them (`node::wireguard`): each
//! device up with peers, each peer with a session, and the peers'
//! allowed-ips together covering every other node's pod subnet, each by
//! one peer. WireGuard frees what a peer sends from outside its
//! allowed-ips, and what comes with no session, past the kernel's drop
//! tracepoint: no trace shows those drops, the configuration does.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{node::NodeFacts, Check};
use crate::node::wireguard::{age_text, Session, WgDevice, WgPeer, SESSION_SECS};

const FAMILY: &str = "wireguard";

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    let wg = &facts.view.wireguard;
    if let Some(why) = &wg.unread {
        return vec![Check::not_checked(
            FAMILY,
            &facts.name,
            "WireGuard state",
            why,
        )];
    }
    let mut checks = Vec::new();
    for device in &wg.devices {
        checks.push(check_up(facts, device));
        checks.push(check_peers(facts, device));
        checks.extend(
            (device.peers.iter()).filter_map(|p| check_session(facts, device, p, wg.read_at)),
        );
        checks.extend(check_allowed_ips(facts, device));
    }
    checks
}

fn check_up(facts: &NodeFacts, device: &WgDevice) -> Check {
    let dev = &device.name;
    Check::judge(
        FAMILY,
        &facts.name,
        &format!("{dev} up"),
        device.up,
        format!(
            "{dev} is {}, listening on UDP {}",
            if device.up { "up" } else { "down" },
            device.listen_port
        ),
        || format!("ip link set {dev} up"),
    )
}

fn check_peers(facts: &NodeFacts, device: &WgDevice) -> Check {
    let dev = &device.name;
    let peers: Vec<String> = (device.peers.iter())
        .map(|p| format!("{} ({})", p.short_key(), peer_node(facts, p)))
        .collect();
    Check::judge(
        FAMILY,
        &facts.name,
        &format!("{dev} peers"),
        !peers.is_empty(),
        if peers.is_empty() {
            format!("{dev} has no peer: it encrypts nothing to another node and accepts nothing from one")
        } else {
            format!("{dev} has {} peer(s): {}", peers.len(), peers.join(", "))
        },
        || {
            format!("restart the CNI's agent on this node (flanneld, calico-node): it adds a peer per node (wg set {dev} peer <key> endpoint <node IP>:{} allowed-ips <its pod subnet>)", device.listen_port)
        },
    )
}

/// A peer's session: a handshake within SESSION_SECS, or none needed
/// yet (nothing sent to it); else what it sends is freed undecrypted.
fn check_session(
    facts: &NodeFacts,
    device: &WgDevice,
    peer: &WgPeer,
    read_at: u64,
) -> Option<Check> {
    let dev = &device.name;
    let name = format!("{dev} peer {} session", peer.short_key());
    let who = format!(
        "{dev}'s peer {} ({})",
        peer.short_key(),
        peer_node(facts, peer)
    );
    let fix = || {
        format!(
        "send it traffic (a ping to a pod on {}) and run again; if no handshake follows, its endpoint or key is wrong: wg set {dev} peer {} endpoint <its node IP>:<its port>",
        peer_node(facts, peer), peer.public_key
    )
    };
    let check = match peer.session(read_at) {
        Session::Live { age } => Check::pass(
            FAMILY,
            &facts.name,
            &name,
            format!("{who}: last handshake {} ago", age_text(age)),
        ),
        Session::Never { sent: false } => return None,
        Session::Never { sent: true } => Check::fail(
            FAMILY,
            &facts.name,
            &name,
            format!("{who}: no handshake ever, though {} B were sent to it: no session, so WireGuard frees what it sends (its endpoint {})", peer.tx_bytes, peer.endpoint.map_or("(none)".into(), |e| e.to_string())),
            fix(),
        ),
        Session::Expired { age } => Check::fail(
            FAMILY,
            &facts.name,
            &name,
            format!("{who}: last handshake {} ago, over {SESSION_SECS} s: no session (WireGuard rekeys every 2 min while traffic flows), so what it sends is freed until a new handshake completes", age_text(age)),
            fix(),
        ),
    };
    Some(check)
}

/// The other nodes' pod subnets: Calico's IPAM blocks where known (IPv6
/// ones included), else the Nodes' podCIDRs, a dual-stack Node's IPv6
/// ones included.
fn other_subnets(facts: &NodeFacts) -> Vec<(String, IpNet)> {
    let blocks = (facts.peer_blocks.iter())
        .map(|(node, block)| (node.clone(), IpNet::V4(*block)))
        .chain((facts.peer_blocks6.iter()).map(|(node, block)| (node.clone(), IpNet::V6(*block))));
    let blocks: Vec<(String, IpNet)> = blocks.collect();
    if !blocks.is_empty() {
        return blocks;
    }
    (facts.others.iter())
        .flat_map(|n| {
            let v4 = n.pod_cidrs.iter().map(|c| IpNet::V4(*c));
            let v6 = n.pod_cidrs6.iter().map(|c| IpNet::V6(*c));
            v4.chain(v6).map(|c| (n.name.clone(), c))
        })
        .collect()
}

/// Whether `device` is to carry `subnet`'s family: IPv4 always; IPv6 where
/// one of its peers allows an IPv6 network. Flannel's dual-stack backend
/// may give IPv6 a device of its own (`flannel-wg-v6`), and then the IPv4
/// one allows no IPv6 at all, rightly.
fn carries(device: &WgDevice, subnet: &IpNet) -> bool {
    match subnet {
        IpNet::V4(_) => true,
        IpNet::V6(_) => (device.peers.iter())
            .flat_map(|p| p.allowed_ips.iter())
            .any(|a| matches!(a, IpNet::V6(_))),
    }
}

/// Every other node's subnet allowed by exactly one peer: WireGuard takes
/// from a peer only the sources its allowed-ips hold, and for a subnet
/// split between two, the most specific one only.
fn check_allowed_ips(facts: &NodeFacts, device: &WgDevice) -> Option<Check> {
    let mut subnets = other_subnets(facts);
    subnets.retain(|(_, subnet)| carries(device, subnet));
    if subnets.is_empty() || device.peers.is_empty() {
        return None;
    }
    let dev = &device.name;
    let mut wrong = Vec::new();
    let mut fixes = Vec::new();
    for (node, subnet) in &subnets {
        let allowing: Vec<&WgPeer> = (device.peers.iter())
            .filter(|p| p.allowed_ips.iter().any(|a| overlaps(a, subnet)))
            .collect();
        match allowing.as_slice() {
            [_] => {}
            [] => {
                wrong.push(format!("{node}'s pod subnet {subnet} is allowed by no peer: WireGuard frees what {node}'s pods send"));
                fixes.push(match peer_for_node(facts, device, node) {
                    Some(peer) => format!(
                        "wg set {dev} peer {} allowed-ips {}",
                        peer.public_key,
                        peer.allowed_ips_with(&subnet.to_string())
                    ),
                    None => format!("wg set {dev} peer <{node}'s key> endpoint <{node}'s IP>:{} allowed-ips {subnet} (restart the CNI's agent: it adds it)", device.listen_port),
                });
            }
            several => {
                let names: Vec<String> = (several.iter())
                    .map(|p| {
                        format!(
                            "{} ({}: {})",
                            p.short_key(),
                            peer_node(facts, p),
                            p.allowed_list()
                        )
                    })
                    .collect();
                wrong.push(format!("{node}'s pod subnet {subnet} is allowed by {} peers, {}: WireGuard takes each source from the most specific one only", several.len(), names.join(" and ")));
                fixes.push(format!("leave {subnet} to {node}'s peer alone: wg set {dev} peer <other key> allowed-ips <its own subnet>"));
            }
        }
    }
    let covered: Vec<String> = subnets.iter().map(|(n, s)| format!("{n} {s}")).collect();
    Some(Check::judge(
        FAMILY,
        &facts.name,
        &format!("{dev} allowed-ips"),
        wrong.is_empty(),
        if wrong.is_empty() {
            format!(
                "each other node's pod subnet is allowed by one peer ({})",
                covered.join(", ")
            )
        } else {
            wrong.join("; ")
        },
        || fixes.join("; "),
    ))
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The node a peer stands for, by its endpoint: a Node's InternalIP or an
/// examined node's address.
fn node_of_endpoint(facts: &NodeFacts, ip: IpAddr) -> Option<String> {
    let IpAddr::V4(v4) = ip else {
        return (facts.peer_addresses6.iter())
            .find(|(_, a)| a.iter().any(|a| IpAddr::V6(*a) == ip))
            .map(|(n, _)| n.clone());
    };
    (facts.others.iter())
        .find(|n| n.ip == Some(v4))
        .map(|n| n.name.clone())
        .or_else(|| {
            (facts.peer_addresses.iter())
                .find(|(_, a)| a.contains(&v4))
                .map(|(n, _)| n.clone())
        })
}

fn peer_node(facts: &NodeFacts, peer: &WgPeer) -> String {
    peer.endpoint
        .and_then(|e| node_of_endpoint(facts, e.ip()))
        .or_else(|| peer.endpoint.map(|e| format!("endpoint {e}")))
        .unwrap_or_else(|| "no endpoint".into())
}

fn peer_for_node<'a>(facts: &NodeFacts, device: &'a WgDevice, node: &str) -> Option<&'a WgPeer> {
    (device.peers.iter()).find(|p| {
        p.endpoint
            .and_then(|e| node_of_endpoint(facts, e.ip()))
            .is_some_and(|n| n == node)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{doctor::cluster::ClusterNode, node::wireguard::WireGuard};

    const NOW: u64 = 1_000_000;

    fn peer(node: u8, allowed: &[&str], handshake: Option<u64>) -> WgPeer {
        WgPeer {
            public_key: format!("KEY{node}xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx="),
            endpoint: Some(format!("192.0.2.1{node}:51820").parse().unwrap()),
            allowed_ips: allowed.iter().map(|a| a.parse().unwrap()).collect(),
            last_handshake: handshake,
            rx_bytes: 100,
            tx_bytes: 100,
        }
    }

    fn node(name: &str, ip: &str, cidr: &str) -> ClusterNode {
        ClusterNode {
            name: name.into(),
            ip: Some(ip.parse().unwrap()),
            pod_cidrs: vec![cidr.parse().unwrap()],
            ..Default::default()
        }
    }

    /// node-1 of three, its flannel-wg with a peer each for node-2 and node-3.
    fn facts(peers: Vec<WgPeer>, up: bool) -> NodeFacts {
        let mut facts = NodeFacts::of_root(std::path::Path::new("/nonexistent"));
        facts.others = vec![
            node("node-2", "192.0.2.12", "10.244.2.0/24"),
            node("node-3", "192.0.2.13", "10.244.3.0/24"),
        ];
        facts.view.wireguard = WireGuard {
            devices: vec![WgDevice {
                name: "flannel-wg".into(),
                index: 7,
                up,
                public_key: Some("KEY1".into()),
                listen_port: 51820,
                peers,
            }],
            unread: None,
            read_at: NOW,
            read_again: false,
        };
        facts
    }

    /// The checks of node-1 whose peers for node-2 and node-3 allow `two`
    /// and `three`, node-3's last handshake `age` seconds ago.
    fn two_peers(two: &str, three: &str, age: u64) -> Vec<Check> {
        let peers = vec![
            peer(2, &[two], Some(NOW - 30)),
            peer(3, &[three], Some(NOW - age)),
        ];
        checks(&facts(peers, true))
    }

    fn named<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no {name}: {checks:#?}"))
    }

    #[test]
    fn a_healthy_device_passes_with_each_nodes_subnet_allowed_once() {
        let checks = two_peers("10.244.2.0/24", "10.244.3.0/24", 100);
        assert!(checks.iter().all(Check::ok), "{checks:#?}");
        let session = named(&checks, "flannel-wg peer KEY2xxxx session");
        assert_eq!(
            session.evidence,
            "flannel-wg's peer KEY2xxxx (node-2): last handshake 30s ago"
        );
    }

    #[test]
    fn a_subnet_no_peer_allows_names_the_node_and_the_wg_set_that_adds_it() {
        let checks = two_peers("10.99.0.0/24", "10.244.3.0/24", 30);
        let check = named(&checks, "flannel-wg allowed-ips");
        assert!(check.failed());
        assert_eq!(check.evidence, "node-2's pod subnet 10.244.2.0/24 is allowed by no peer: WireGuard frees what node-2's pods send");
        assert_eq!(
            check.fix.as_deref(),
            Some("wg set flannel-wg peer KEY2xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx= allowed-ips 10.99.0.0/24,10.244.2.0/24")
        );
    }

    /// node-1's peers on a dual-stack cluster: node-2 and node-3 with
    /// IPv6 podCIDRs beside their IPv4 ones, each peer allowing `two` and
    /// `three`.
    fn dual_stack(two: &[&str], three: &[&str]) -> Vec<Check> {
        let mut facts = facts(
            vec![peer(2, two, Some(NOW - 30)), peer(3, three, Some(NOW - 30))],
            true,
        );
        for (node, v6) in facts.others.iter_mut().zip(["fd00:2::/64", "fd00:3::/64"]) {
            node.pod_cidrs6 = vec![v6.parse().unwrap()];
        }
        checks(&facts)
    }

    #[test]
    fn a_dual_stack_device_is_checked_for_each_nodes_ipv6_subnet_too() {
        let both = dual_stack(
            &["10.244.2.0/24", "fd00:2::/64"],
            &["10.244.3.0/24", "fd00:3::/64"],
        );
        let check = named(&both, "flannel-wg allowed-ips");
        assert!(check.ok(), "{check:?}");
        assert!(
            check.evidence.contains("node-3 fd00:3::/64"),
            "{}",
            check.evidence
        );
        let lacking = dual_stack(&["10.244.2.0/24", "fd00:2::/64"], &["10.244.3.0/24"]);
        let check = named(&lacking, "flannel-wg allowed-ips");
        assert!(check.failed());
        assert_eq!(check.evidence, "node-3's pod subnet fd00:3::/64 is allowed by no peer: WireGuard frees what node-3's pods send");
        assert_eq!(
            check.fix.as_deref(),
            Some("wg set flannel-wg peer KEY3xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx= allowed-ips 10.244.3.0/24,fd00:3::/64")
        );
    }

    #[test]
    fn calicos_ipv6_blocks_are_checked_beside_its_ipv4_ones() {
        // Calico's blocks stand for the podCIDRs (which Calico IPAM does
        // not use): a block no peer allows fails, in either family.
        let mut facts = facts(
            vec![
                peer(2, &["10.244.8.0/26", "fd00:8::/122"], Some(NOW - 30)),
                peer(3, &["10.244.9.0/26"], Some(NOW - 30)),
            ],
            true,
        );
        facts.peer_blocks = vec![
            ("node-2".into(), "10.244.8.0/26".parse().unwrap()),
            ("node-3".into(), "10.244.9.0/26".parse().unwrap()),
        ];
        facts.peer_blocks6 = vec![
            ("node-2".into(), "fd00:8::/122".parse().unwrap()),
            ("node-3".into(), "fd00:9::/122".parse().unwrap()),
        ];
        let checks = checks(&facts);
        let check = named(&checks, "flannel-wg allowed-ips");
        assert!(check.failed(), "{check:?}");
        assert_eq!(check.evidence, "node-3's pod subnet fd00:9::/122 is allowed by no peer: WireGuard frees what node-3's pods send");
    }

    #[test]
    fn an_ipv4_only_device_of_a_dual_stack_cluster_is_not_asked_for_ipv6() {
        let checks = dual_stack(&["10.244.2.0/24"], &["10.244.3.0/24"]);
        assert!(checks.iter().all(Check::ok), "{checks:#?}");
    }

    #[test]
    fn a_subnet_two_peers_allow_names_both() {
        let checks = two_peers("10.244.0.0/16", "10.244.3.0/24", 30);
        let check = named(&checks, "flannel-wg allowed-ips");
        assert!(check.failed());
        assert!(check.evidence.contains("node-3's pod subnet 10.244.3.0/24 is allowed by 2 peers, KEY2xxxx (node-2: 10.244.0.0/16) and KEY3xxxx (node-3: 10.244.3.0/24)"), "{}", check.evidence);
    }

    #[test]
    fn a_device_down_or_without_a_session_fails_with_the_handshakes_age() {
        let checks = checks(&facts(
            vec![
                peer(2, &["10.244.2.0/24"], Some(NOW - 600)),
                peer(3, &["10.244.3.0/24"], None),
            ],
            false,
        ));
        let up = named(&checks, "flannel-wg up");
        assert!(up.failed());
        assert_eq!(up.fix.as_deref(), Some("ip link set flannel-wg up"));
        let expired = named(&checks, "flannel-wg peer KEY2xxxx session");
        assert!(expired.failed());
        assert!(
            expired
                .evidence
                .contains("last handshake 10m ago, over 180 s: no session"),
            "{}",
            expired.evidence
        );
        let never = named(&checks, "flannel-wg peer KEY3xxxx session");
        assert!(never
            .evidence
            .contains("no handshake ever, though 100 B were sent to it"));
    }

    #[test]
    fn a_peer_nothing_was_sent_to_needs_no_session_yet() {
        let mut idle = peer(2, &["10.244.2.0/24"], None);
        idle.tx_bytes = 0;
        let checks = checks(&facts(vec![idle], true));
        assert!(
            !checks.iter().any(|c| c.name.ends_with("session")),
            "{checks:#?}"
        );
    }

    #[test]
    fn unread_state_is_not_checked_and_says_why() {
        let mut facts = facts(Vec::new(), true);
        facts.view.wireguard.unread = Some("reading it needs CAP_NET_ADMIN".into());
        let checks = checks(&facts);
        assert_eq!(checks.len(), 1);
        assert_eq!(
            checks[0].evidence,
            "not checked: reading it needs CAP_NET_ADMIN"
        );
    }
}
