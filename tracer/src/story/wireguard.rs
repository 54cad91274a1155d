//! A packet last seen entering a WireGuard device (Flannel's flannel-wg,
//! Calico's wireguard.cali, Cilium's cilium_wg0). WireGuard encrypts it
//! into UDP to its peer: nothing of the packet is left to follow on the
//! underlay, and where the other node's device takes it back, WireGuard
//! itself frees what it will not hand on (a source outside the sending
//! peer's allowed-ips, no session) without the kernel's drop tracepoint.
//! So "never at the next hook" needs saying what podtrace cannot see,
//! and where to look.

use std::{collections::HashMap, net::IpAddr};

use serde::Serialize;

use crate::{
    decode::{
        hop::{Direction, Hop},
        Transport, Tunnel, TunnelKind,
    },
    model::NodeSubnet,
    node::{
        wireguard::{age_text, Session, WgDevice, WgPeer, WireGuard, KIND, SESSION_SECS},
        NodeFacts,
    },
};

/// What the receiving node's WireGuard configuration says of a packet
/// lost past the sender's device: inferred from the peers podtrace read
/// (again as the story was told, where it could), for the kernel gives
/// no drop event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct WireguardProof {
    /// The node whose device took the packet back, and the device.
    pub node: String,
    pub device: String,
    /// The public key of its peer standing for the sending node (by the
    /// sender's own key, else by its endpoint); null when none does.
    pub peer: Option<String>,
    /// That peer's allowed-ips.
    pub allowed_ips: Vec<String>,
    /// The packet's source, and whether they hold it.
    pub source: IpAddr,
    pub allows_source: bool,
    /// Seconds since that peer's last handshake when podtrace read it
    /// (as the story was told, else at start); null: none ever.
    pub handshake_age_s: Option<u64>,
    /// The state was read again as the story was told (node mode; in
    /// cluster mode, the one the node's agent last sent, read again after
    /// the packet passed); false: it is the one read at start (no read
    /// again yet, or those tried failed).
    pub read_as_told: bool,
    pub cause: WireguardCause,
}

/// Why, by the configuration, WireGuard would free the packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WireguardCause {
    /// No peer there stands for the sending node.
    NoPeer,
    /// The sending node's peer does not allow the packet's source.
    SourceNotAllowed,
    /// It allows it, but had no session when read.
    NoSession,
    /// It allows it and had a session: the configuration explains nothing.
    Allowed,
}

/// What is said of the packet, and the proof where the other node's
/// WireGuard state was read.
pub(super) type Told = (String, Option<WireguardProof>);

/// The traced node whose WireGuard state judges a journey last seen
/// going into a WireGuard device: the one that should have taken it back
/// (its state is read again before the story is told, where podtrace
/// can). None for any other journey, or where that node is not traced.
/// The note of a hop on a WireGuard device, from its configuration: the
/// peer WireGuard encrypts the packet for (egress) or that sent it
/// (ingress). The encrypted leg between is a hop of its own, on the
/// underlay (`decode::wireguard_leg`).
pub(super) fn device_note(hop: &Hop, nodes: &HashMap<String, NodeFacts>) -> Option<String> {
    let wireguard = &nodes.get(&*hop.node)?.view.wireguard;
    let device = wireguard.device(&hop.iface)?;
    let packet = &hop.packet.packet;
    let when = wireguard.read_when();
    Some(match hop.direction {
        Direction::Egress => match routing_peer(device, packet.dst) {
            Some(peer) => format!(
                "into WireGuard for peer {}{} (its allowed-ips hold {}, read {when}){}",
                peer.short_key(),
                endpoint_text(peer, "UDP to"),
                packet.dst,
                held_for_a_handshake(peer, wireguard.read_at)
            ),
            None => format!(
                "into WireGuard: no peer's allowed-ips held {} when read {when}; while so, WireGuard sends it to no peer (wg show {} allowed-ips)",
                packet.dst, hop.iface
            ),
        },
        Direction::Ingress => match routing_peer(device, packet.src) {
            Some(peer) => format!(
                "decrypted by WireGuard from peer {}{}",
                peer.short_key(),
                endpoint_text(peer, "at")
            ),
            None => format!(
                "decrypted by WireGuard (no peer's allowed-ips held {} when read {when})",
                packet.src
            ),
        },
        Direction::Drop => return None,
    })
}

/// A peer without a live session when read: WireGuard queues what it is
/// sent until a handshake completes, and frees it if none does.
fn held_for_a_handshake(peer: &WgPeer, read_at: u64) -> String {
    match peer.session(read_at) {
        Session::Live { .. } => String::new(),
        Session::Expired { age } => format!(
            "; its last handshake was {} old when read: WireGuard holds the packet until a new one completes",
            age_text(age)
        ),
        Session::Never { .. } => {
            "; it had no handshake when read: WireGuard holds the packet until one completes".into()
        }
    }
}

/// The peer whose allowed-ips route `ip`, as WireGuard's own table does:
/// the longest prefix that holds it.
fn routing_peer(device: &WgDevice, ip: IpAddr) -> Option<&WgPeer> {
    (device.peers.iter())
        .flat_map(|peer| peer.allowed_ips.iter().map(move |net| (net, peer)))
        .filter(|(net, _)| net.contains(&ip))
        .max_by_key(|(net, _)| net.prefix_len())
        .map(|(_, peer)| peer)
}

/// "192.0.2.12:51820", where an encrypted leg was sent.
fn udp_destination(tunnel: &Tunnel) -> String {
    let port = match tunnel.outer.transport {
        Transport::Udp { dport, .. } => dport,
        _ => 0,
    };
    std::net::SocketAddr::new(tunnel.outer.dst, port).to_string()
}

/// ` (UDP to 192.0.2.12:51820)`, or nothing for a peer without endpoint.
fn endpoint_text(peer: &WgPeer, how: &str) -> String {
    peer.endpoint
        .map_or_else(String::new, |at| format!(" ({how} {at})"))
}

pub fn receiving_node<'a>(
    hops: &[Hop],
    nodes: &'a HashMap<String, NodeFacts>,
    subnets: &'a [NodeSubnet],
) -> Option<&'a str> {
    if !last_seen_going_into_a_device(hops, nodes) {
        return None;
    }
    let there = node_of(hops.last()?.packet.packet.dst, subnets, nodes)?;
    nodes.contains_key(there).then_some(there)
}

/// Whether a journey's last hop is the way into a WireGuard device, or
/// its encrypted leg leaving by the underlay.
fn last_seen_going_into_a_device(hops: &[Hop], nodes: &HashMap<String, NodeFacts>) -> bool {
    went_into_a_device(hops, nodes).is_some()
}

/// The hop by which a journey went into a WireGuard device, where
/// nothing of it was seen after but its encrypted leg leaving on the
/// underlay (a drop of that leg is a verdict of its own).
fn went_into_a_device<'a>(hops: &'a [Hop], nodes: &HashMap<String, NodeFacts>) -> Option<&'a Hop> {
    let on_its_way = |h: &Hop| is_encrypted_leg(h) && h.direction == Direction::Egress;
    let plain = hops.iter().rposition(|h| !on_its_way(h))?;
    let hop = &hops[plain];
    let device = nodes.get(&*hop.node)?.view.link_named(&hop.iface)?;
    (hop.direction == Direction::Egress && device.kind == KIND).then_some(hop)
}

/// A UDP packet WireGuard sent with the journey's packet inside.
fn is_encrypted_leg(hop: &Hop) -> bool {
    hop.packet
        .tunnel
        .is_some_and(|t| t.kind == TunnelKind::Wireguard)
}

/// What to say of a journey whose last hop is the way into a WireGuard
/// device; None for any other.
pub(super) fn lost_after_encryption(
    hops: &[Hop],
    nodes: &HashMap<String, NodeFacts>,
    subnets: &[NodeSubnet],
) -> Option<Told> {
    let last = went_into_a_device(hops, nodes)?;
    let facts = nodes.get(&*last.node)?;
    let src = last.packet.packet.src;
    let dst = last.packet.packet.dst;
    let here = match hops.last().and_then(|h| Some((h, h.packet.tunnel?))) {
        Some((leg, tunnel)) if is_encrypted_leg(leg) => format!(
            "{} on {} encrypted it, and it left by {} as UDP to {}; podtrace sees the other end only where WireGuard hands it on",
            last.iface, last.node, leg.iface, udp_destination(&tunnel)
        ),
        _ => format!(
            "{} on {} is a WireGuard device: it encrypts the packet into UDP to its peer, and its encrypted leg was not seen on the underlay",
            last.iface, last.node
        ),
    };
    let Some(there) = node_of(dst, subnets, nodes) else {
        return Some((here, None));
    };
    let Some(remote) = nodes.get(there) else {
        return Some((
            format!("{here}; trace {there} too, to see whether its WireGuard device hands it on"),
            None,
        ));
    };
    let Some(remote_device) = remote.view.links_of_kind(KIND).next() else {
        return Some((
            format!("{here}; {there} has no WireGuard device to take it back"),
            None,
        ));
    };
    let dev = &remote_device.name;
    let sender = Sender {
        node: &last.node,
        facts,
        device: &last.iface,
        src,
        subnet: node_of(src, subnets, nodes)
            .and_then(|n| subnets.iter().find(|s| s.node == n))
            .map(|s| s.subnet.to_string()),
    };
    let wg = &remote.view.wireguard;
    let read = wg.device(dev).map(|d| prove(&sender, there, d, wg));
    let Some((said, proof)) = read else {
        let unread = wg.unread.as_deref().map_or(String::new(), |why| {
            format!(" (its WireGuard state was not read: {why})")
        });
        return Some((
            format!(
                "{here}; {there}'s {dev} never handed it on: WireGuard there frees a decrypted packet whose source is outside the allowed-ips of the peer that sent it ({}'s peer must allow {src}: wg show {dev} allowed-ips on {there}), or one from a peer it has no session with (wg show {dev} latest-handshakes){unread}",
                last.node
            ),
            None,
        ));
    };
    Some((format!("{here}; {said}"), Some(proof)))
}

/// The node that sent the packet through its WireGuard device.
struct Sender<'a> {
    node: &'a str,
    facts: &'a NodeFacts,
    device: &'a str,
    src: IpAddr,
    /// Its pod subnet, where the node list names it.
    subnet: Option<String>,
}

/// The receiving device's peer for the sender judged against the packet.
fn prove(
    sender: &Sender,
    there: &str,
    device: &WgDevice,
    state: &WireGuard,
) -> (String, WireguardProof) {
    let key =
        (sender.facts.view.wireguard.device(sender.device)).and_then(|d| d.public_key.as_deref());
    let peer = device.peer_of(key, |ip| sender.facts.view.holds(ip));
    let (src, from, dev) = (sender.src, sender.node, &device.name);
    let read_at = state.read_at;
    let when_read = state.read_when();
    let inferred = format!("podtrace infers it from the configuration it read {when_read}: WireGuard frees such a packet with no drop event");
    let mut proof = WireguardProof {
        node: there.into(),
        device: dev.clone(),
        peer: peer.map(|p| p.public_key.clone()),
        allowed_ips: peer.map_or(Vec::new(), |p| {
            (p.allowed_ips.iter()).map(|n| n.to_string()).collect()
        }),
        source: src,
        allows_source: peer.is_some_and(|p| p.allows(src)),
        handshake_age_s: peer.and_then(|p| Some(read_at.saturating_sub(p.last_handshake?))),
        read_as_told: state.read_again,
        cause: WireguardCause::NoPeer,
    };
    let Some(peer) = peer else {
        return (
            format!("WireGuard on {there} freed it: its {dev} has no peer for {from} (none with {from}'s key nor an endpoint at its address) ({inferred})"),
            proof,
        );
    };
    let short = peer.short_key();
    if !proof.allows_source {
        proof.cause = WireguardCause::SourceNotAllowed;
        let wanted = sender.subnet.clone().unwrap_or_else(|| src.to_string());
        return (
            format!(
                "WireGuard on {there} freed it: {from}'s peer there ({short}) allows only {}, not {src} ({inferred}; fix: wg set {dev} peer {} allowed-ips {})",
                peer.allowed_list(), peer.public_key, peer.allowed_ips_with(&wanted)
            ),
            proof,
        );
    }
    let allows = format!("{from}'s peer there ({short}) allows {src}");
    match peer.session(read_at) {
        Session::Live { age } => {
            proof.cause = WireguardCause::Allowed;
            (format!("{there}'s {dev} never handed it on, though the configuration allows it: {allows} and had a session (last handshake {} ago)", age_text(age)), proof)
        }
        session => {
            proof.cause = WireguardCause::NoSession;
            let when = match session {
                Session::Expired { age } => format!(
                    "its last handshake was {} ago, over {SESSION_SECS} s",
                    age_text(age)
                ),
                _ => "it had never made a handshake".into(),
            };
            (format!("WireGuard on {there} may have freed it for want of a session: {allows}, but when podtrace read {dev} {when_read} {when} ({inferred}; wg show {dev} latest-handshakes on {there} tells whether one was made since)"), proof)
        }
    }
}

/// The node whose pod subnet holds `ip`: by the node list, else the
/// traced node that delivers it locally.
fn node_of<'a>(
    ip: IpAddr,
    subnets: &'a [NodeSubnet],
    nodes: &'a HashMap<String, NodeFacts>,
) -> Option<&'a str> {
    let listed = subnets
        .iter()
        .find(|s| matches!(ip, IpAddr::V4(v4) if s.subnet.contains(&v4)))
        .map(|s| s.node.as_str());
    listed.or_else(|| {
        (nodes.iter())
            .find(|(_, facts)| facts.local_pod_subnets.iter().any(|net| net.contains(&ip)))
            .map(|(name, _)| name.as_str())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        decode::{hop::tests::hop, tests as frames},
        node::{fixtures::link, interfaces::Role, NodeView},
    };

    fn wireguard_node() -> NodeFacts {
        NodeFacts {
            view: NodeView {
                links: vec![link(2, "eth0", ""), link(7, "flannel-wg", "wireguard")],
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn subnets() -> Vec<NodeSubnet> {
        (1..=2)
            .map(|n| NodeSubnet {
                node: format!("node-{n}"),
                subnet: format!("10.244.{n}.0/24").parse().unwrap(),
                node_ip: format!("192.0.2.1{n}").parse().unwrap(),
                cni: None,
                tunnel_ip: None,
            })
            .collect()
    }

    fn into_flannel_wg() -> Vec<Hop> {
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
        vec![hop(
            5,
            "node-1",
            "flannel-wg",
            Role::Tunnel,
            Direction::Egress,
            &frame,
        )]
    }

    #[test]
    fn without_the_other_nodes_wireguard_state_it_names_the_allowed_ips_and_handshake_to_read() {
        let nodes = HashMap::from([
            ("node-1".to_string(), wireguard_node()),
            ("node-2".to_string(), wireguard_node()),
        ]);
        let said = lost_after_encryption(&into_flannel_wg(), &nodes, &subnets())
            .unwrap()
            .0;
        assert!(said.starts_with("flannel-wg on node-1 is a WireGuard device: it encrypts the packet into UDP to its peer"), "{said}");
        assert!(
            said.contains("node-2's flannel-wg never handed it on"),
            "{said}"
        );
        assert!(
            said.contains(
                "node-1's peer must allow 10.244.1.2: wg show flannel-wg allowed-ips on node-2"
            ),
            "{said}"
        );
    }

    #[test]
    fn a_journey_last_seen_encrypted_on_the_underlay_is_judged_by_the_device_it_went_into() {
        let nodes = HashMap::from([
            ("node-1".to_string(), wireguard_node()),
            ("node-2".to_string(), wireguard_node()),
        ]);
        let mut hops = into_flannel_wg();
        let inside = hops[0].packet;
        // Placed as the kernel's sighting of it is (`decode::sighting`).
        let mut leg = hop(
            9,
            "node-1",
            "eth0",
            Role::Underlay,
            Direction::Egress,
            &frames::icmp_echo([192, 0, 2, 11], [192, 0, 2, 12], 64, 1),
        );
        leg.packet =
            crate::decode::decode_encrypted(&frames::wireguard_data(100), true, &inside).unwrap();
        hops.push(leg);
        assert_eq!(receiving_node(&hops, &nodes, &subnets()), Some("node-2"));
        let said = lost_after_encryption(&hops, &nodes, &subnets()).unwrap().0;
        assert!(
            said.starts_with(
                "flannel-wg on node-1 encrypted it, and it left by eth0 as UDP to 192.0.2.12:51820"
            ),
            "{said}"
        );
        assert!(
            said.contains("node-2's flannel-wg never handed it on"),
            "{said}"
        );
    }

    const READ_AT: u64 = 1_000_000;

    /// node-1 (its flannel-wg's key KEY1, its address 192.0.2.11) and
    /// node-2, whose peer for node-1 allows `allowed`, its last handshake
    /// at `handshake`.
    fn read_nodes(allowed: &str, handshake: Option<u64>) -> HashMap<String, NodeFacts> {
        use crate::node::wireguard::{WgDevice, WgPeer, WireGuard};
        let state = |key: &str, peers| WireGuard {
            devices: vec![WgDevice {
                name: "flannel-wg".into(),
                index: 7,
                up: true,
                public_key: Some(key.into()),
                listen_port: 51820,
                peers,
            }],
            unread: None,
            read_at: READ_AT,
            read_again: false,
        };
        let mut node_1 = wireguard_node();
        node_1.view.addresses = vec![(2, "192.0.2.11".parse().unwrap())];
        node_1.view.wireguard = state("KEY1wxyzKEY1=", Vec::new());
        let mut node_2 = wireguard_node();
        let peer = WgPeer {
            public_key: "KEY1wxyzKEY1=".into(),
            endpoint: Some("192.0.2.11:51820".parse().unwrap()),
            allowed_ips: vec![allowed.parse().unwrap()],
            last_handshake: handshake,
            rx_bytes: 92,
            tx_bytes: 148,
        };
        node_2.view.wireguard = state("KEY2wxyzKEY2=", vec![peer]);
        HashMap::from([
            ("node-1".to_string(), node_1),
            ("node-2".to_string(), node_2),
        ])
    }

    fn told(nodes: &HashMap<String, NodeFacts>) -> (String, WireguardProof) {
        let (said, proof) = lost_after_encryption(&into_flannel_wg(), nodes, &subnets()).unwrap();
        (said, proof.expect("a proof"))
    }

    #[test]
    fn a_wireguard_devices_hops_name_the_peer_and_say_the_encrypted_leg_is_not_traced() {
        let nodes = read_nodes("10.244.1.0/24", Some(READ_AT - 5));
        // node-2 receives from node-1's peer: web-0's packet, decrypted.
        let frame = frames::icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, 1);
        let at =
            |node: &str, direction| hop(9, node, "flannel-wg", Role::Tunnel, direction, &frame);
        assert_eq!(
            device_note(&at("node-2", Direction::Ingress), &nodes).unwrap(),
            "decrypted by WireGuard from peer KEY1wxyz (at 192.0.2.11:51820)"
        );
        // node-1 has no peer for node-2's pods in this fixture.
        let said = device_note(&at("node-1", Direction::Egress), &nodes).unwrap();
        assert!(
            said.starts_with("into WireGuard: no peer's allowed-ips held 10.244.2.2"),
            "{said}"
        );
        // Back from db-0 on node-2: its peer for node-1, by the longest
        // prefix of its allowed-ips.
        let mut nodes = nodes;
        let device = &mut nodes.get_mut("node-2").unwrap().view.wireguard.devices[0];
        let mut wide = device.peers[0].clone();
        wide.public_key = "WIDEkeyWIDE=".into();
        wide.allowed_ips = vec!["10.244.0.0/16".parse().unwrap()];
        device.peers.insert(0, wide);
        let back = frames::icmp_echo([10, 244, 2, 2], [10, 244, 1, 2], 64, 1);
        let out = hop(
            9,
            "node-2",
            "flannel-wg",
            Role::Tunnel,
            Direction::Egress,
            &back,
        );
        let said = device_note(&out, &nodes).unwrap();
        assert!(
            said.starts_with("into WireGuard for peer KEY1wxyz (UDP to 192.0.2.11:51820) (its allowed-ips hold 10.244.1.2, read at start)"),
            "{said}"
        );
        // Without a handshake when read: held for one, not sent yet.
        let device = &mut nodes.get_mut("node-2").unwrap().view.wireguard.devices[0];
        device.peers[1].last_handshake = None;
        let said = device_note(&out, &nodes).unwrap();
        assert!(
            said.contains(
                "; it had no handshake when read: WireGuard holds the packet until one completes"
            ),
            "{said}"
        );
        // Not a WireGuard device: no such note.
        let eth0 = hop(
            9,
            "node-2",
            "eth0",
            Role::Underlay,
            Direction::Egress,
            &back,
        );
        assert_eq!(device_note(&eth0, &nodes), None);
    }

    #[test]
    fn a_source_outside_the_senders_peers_allowed_ips_is_what_freed_it() {
        let (said, proof) = told(&read_nodes("10.99.0.0/24", Some(READ_AT - 5)));
        assert!(said.contains("; WireGuard on node-2 freed it: node-1's peer there (KEY1wxyz) allows only 10.99.0.0/24, not 10.244.1.2 (podtrace infers it from the configuration it read at start: WireGuard frees such a packet with no drop event; fix: wg set flannel-wg peer KEY1wxyzKEY1= allowed-ips 10.99.0.0/24,10.244.1.0/24)"), "{said}");
        assert_eq!(proof.cause, WireguardCause::SourceNotAllowed);
        assert_eq!(proof.peer.as_deref(), Some("KEY1wxyzKEY1="));
        assert_eq!(proof.allowed_ips, ["10.99.0.0/24"]);
        assert!(!proof.allows_source);
        assert_eq!(proof.handshake_age_s, Some(5));
    }

    #[test]
    fn an_allowed_source_without_a_session_says_the_handshakes_age() {
        let (said, proof) = told(&read_nodes("10.244.1.0/24", Some(READ_AT - 600)));
        assert_eq!(proof.cause, WireguardCause::NoSession);
        assert!(said.contains("WireGuard on node-2 may have freed it for want of a session: node-1's peer there (KEY1wxyz) allows 10.244.1.2, but when podtrace read flannel-wg at start its last handshake was 10m ago, over 180 s"), "{said}");
    }

    #[test]
    fn a_state_read_again_as_the_story_is_told_says_so() {
        let mut nodes = read_nodes("10.244.1.0/24", None);
        nodes.get_mut("node-2").unwrap().view.wireguard.read_again = true;
        let (said, proof) = told(&nodes);
        assert_eq!(proof.cause, WireguardCause::NoSession);
        assert!(said.contains("but when podtrace read flannel-wg as this story was told it had never made a handshake"), "{said}");
        assert!(proof.read_as_told);
        let judging = |hops: &[Hop]| receiving_node(hops, &nodes, &subnets()).map(String::from);
        assert_eq!(judging(&into_flannel_wg()).as_deref(), Some("node-2"));
        let mut out_of_it = into_flannel_wg();
        out_of_it[0].direction = Direction::Ingress;
        assert_eq!(judging(&out_of_it), None);
        assert_eq!(judging(&[]), None);
        let untraced = HashMap::from([("node-1".to_string(), wireguard_node())]);
        assert_eq!(
            receiving_node(&into_flannel_wg(), &untraced, &subnets()),
            None
        );
    }

    #[test]
    fn an_allowed_source_with_a_session_is_not_blamed_on_the_configuration() {
        let (said, proof) = told(&read_nodes("10.244.1.0/24", Some(READ_AT - 30)));
        assert_eq!(proof.cause, WireguardCause::Allowed);
        assert!(proof.allows_source);
        assert!(said.contains("node-2's flannel-wg never handed it on, though the configuration allows it: node-1's peer there (KEY1wxyz) allows 10.244.1.2 and had a session (last handshake 30s ago)"), "{said}");
    }

    #[test]
    fn the_senders_peer_is_found_by_its_endpoint_where_keys_differ() {
        let mut nodes = read_nodes("10.99.0.0/24", None);
        nodes.get_mut("node-1").unwrap().view.wireguard.devices[0].public_key = None;
        let (_, proof) = told(&nodes);
        assert_eq!(proof.cause, WireguardCause::SourceNotAllowed);
        nodes.get_mut("node-1").unwrap().view.addresses.clear();
        let (said, proof) = told(&nodes);
        assert_eq!(proof.cause, WireguardCause::NoPeer);
        assert!(
            said.contains("WireGuard on node-2 freed it: its flannel-wg has no peer for node-1"),
            "{said}"
        );
    }

    #[test]
    fn without_a_node_list_the_node_delivering_the_pod_locally_is_the_other_end() {
        let mut node_2 = wireguard_node();
        node_2.local_pod_subnets = vec!["10.244.2.0/24".parse().unwrap()];
        let nodes = HashMap::from([
            ("node-1".to_string(), wireguard_node()),
            ("node-2".to_string(), node_2),
        ]);
        let said = lost_after_encryption(&into_flannel_wg(), &nodes, &[])
            .unwrap()
            .0;
        assert!(
            said.contains("node-2's flannel-wg never handed it on"),
            "{said}"
        );
    }

    #[test]
    fn with_the_other_node_untraced_it_asks_for_it() {
        let nodes = HashMap::from([("node-1".to_string(), wireguard_node())]);
        let said = lost_after_encryption(&into_flannel_wg(), &nodes, &subnets())
            .unwrap()
            .0;
        assert!(
            said.ends_with("; trace node-2 too, to see whether its WireGuard device hands it on"),
            "{said}"
        );
    }

    #[test]
    fn a_packet_last_seen_on_another_device_is_not_wireguards() {
        let nodes = HashMap::from([("node-1".to_string(), wireguard_node())]);
        let mut hops = into_flannel_wg();
        hops[0].iface = "eth0".into();
        assert_eq!(lost_after_encryption(&hops, &nodes, &subnets()), None);
        hops[0].iface = "flannel-wg".into();
        hops[0].direction = Direction::Ingress;
        assert_eq!(lost_after_encryption(&hops, &nodes, &subnets()), None);
    }
}
