//! Calico's BGP on a node, by BIRD's own word: every session's peer,
//! state and last error (`bird.rs` asks it), each peer set against the
//! nodes' addresses (a neighbour that is no node's is the wrong peer),
//! and BIRD's router id against the node's own. With no control socket
//! to ask, `/proc/net/tcp` of the node's namespace tells whether any
//! session on TCP 179 is up, and the check says it fell back, and why.
//! On a dual-stack node, calico-node's bird6 is asked the same of its
//! IPv6 sessions (family `bgp6`: a missing IPv6 route's story names
//! them, an IPv4 one's does not).

use std::net::{IpAddr, Ipv4Addr};

use super::{
    bird::{Asked, Bird, Session, SOCKETS},
    cni_config,
    node::NodeFacts,
    tcp_sockets::TcpSocket,
    Check,
};

const FAMILY: &str = "bgp";
/// The IPv6 sessions' checks (bird6's).
const FAMILY6: &str = "bgp6";
const BGP_PORT: u16 = 179;
/// /proc/net/tcp's states.
const ESTABLISHED: u8 = 0x01;
const LISTEN: u8 = 0x0A;

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    if !cni_config::running(facts, "calico") {
        return Vec::new();
    }
    let mut checks = ipv4_checks(facts);
    checks.extend(ipv6_checks(facts));
    checks
}

/// bird6's word, where it runs: its sessions, or that it is silent.
fn ipv6_checks(facts: &NodeFacts) -> Vec<Check> {
    match &facts.bird6 {
        Some(Asked::Answered(bird)) => from_bird(facts, bird, FAMILY6),
        Some(Asked::Silent { socket, why }) => vec![Check::fail(
            FAMILY6,
            &facts.name,
            "BGP sessions (IPv6)",
            format!("bird6 does not answer on {socket} ({why}): the node's IPv6 pool routes are not being exchanged"),
            format!("check calico-node's bird6 on {} (`sv status bird6` in the container, its logs)", facts.name),
        )],
        // Single-stack: calico-node starts no bird6.
        Some(Asked::NoSocket) | None => Vec::new(),
    }
}

fn ipv4_checks(facts: &NodeFacts) -> Vec<Check> {
    match &facts.bird {
        Some(Asked::Answered(bird)) => from_bird(facts, bird, FAMILY),
        // Calico in VXLAN mode runs no BIRD: no BGP to check.
        Some(Asked::NoSocket) | None if facts.view.link_named("vxlan.calico").is_some() => {
            Vec::new()
        }
        Some(Asked::NoSocket) => vec![from_proc(
            facts,
            &format!(
                "no BIRD control socket under the host root ({})",
                shown_sockets()
            ),
        )],
        Some(Asked::Silent { socket, why }) => vec![from_proc(
            facts,
            &format!("BIRD does not answer on {socket} ({why})"),
        )],
        None => vec![from_proc(
            facts,
            "the node's files are not read (no --host-root), so BIRD's control socket was not asked",
        )],
    }
}

fn shown_sockets() -> String {
    let all: Vec<String> = SOCKETS.iter().map(|s| format!("/{s}")).collect();
    all.join(", ")
}

/// Each BGP session as BIRD tells it, and its router id; `family`: the
/// checks' (`bgp`, or `bgp6` for bird6).
fn from_bird(facts: &NodeFacts, bird: &Bird, family: &'static str) -> Vec<Check> {
    let mut checks = Vec::new();
    if let Some(id) = bird.router_id.filter(|id| !facts.view.holds(*id)) {
        checks.push(Check::fail(family, &facts.name, "BGP router id",
            format!("BIRD's router id {id} is none of this node's addresses ({}): confd takes it, and every session's source address, from the node's projectcalico.org/IPv4Address, so the sessions cannot bind it", own(facts)),
            "set IP_AUTODETECTION_METHOD on calico-node (e.g. interface=eth0 or kubernetes-internal-ip) and restart it on this node, so it announces an address it has".into()));
    }
    if bird.sessions.is_empty() {
        checks.push(Check::not_checked(family, &facts.name, "BGP sessions",
            &format!("BIRD ({}) has no BGP protocol: no peer is configured (a one-node cluster, or the node-to-node mesh off with no BGPPeer)", bird.socket)));
    }
    for session in &bird.sessions {
        checks.push(session_check(facts, bird, session, family));
    }
    checks
}

fn session_check(facts: &NodeFacts, bird: &Bird, session: &Session, family: &'static str) -> Check {
    let name = format!("BGP session {}", session.name);
    let peer = session
        .neighbor
        .map_or("an unknown address".to_string(), |ip| ip.to_string());
    let whose = match session.neighbor {
        Some(IpAddr::V4(ip)) => Some(whose(facts, ip)),
        // An IPv6 peer is named by the node that holds it, where one
        // examined does; nodes are judged by their IPv4 addresses.
        Some(IpAddr::V6(ip)) => facts
            .peer_addresses6
            .iter()
            .find(|(_, held)| held.contains(&ip))
            .map(|(node, _)| Peer::Node(node.clone())),
        None => None,
    };
    let whom = match &whose {
        Some(Peer::Node(node)) => format!(" ({node})"),
        _ => String::new(),
    };
    let head = format!(
        "BGP session {} with {peer}{whom} is {}",
        session.name, session.state
    );
    if session.established() {
        return Check::pass(
            family,
            &facts.name,
            &name,
            format!("{head} (BIRD, {})", bird.socket),
        );
    }
    let why = session.why().map(|w| format!(": {w}")).unwrap_or_default();
    let wrong = match &whose {
        Some(Peer::Announced { node, holds }) => format!("; {peer} is what {node} announces (projectcalico.org/IPv4Address), an address it does not have ({})", holds_text(*holds)),
        Some(Peer::Nobody(known)) => format!("; {peer} is no node's address (the nodes' here: {known}): a wrong peer"),
        _ => String::new(),
    };
    // A router id the node does not hold is the sessions' source too.
    let source = bird.router_id.filter(|id| !facts.view.holds(*id));
    let wrong = match (source, wrong.is_empty()) {
        (Some(id), true) => {
            format!("; its source address {id} (BIRD's router id) is not this node's")
        }
        _ => wrong,
    };
    let fix = match (&whose, source) {
        (Some(Peer::Announced { node, .. }), _) => format!("correct {node}'s address: IP_AUTODETECTION_METHOD on its calico-node (e.g. interface=eth0 or kubernetes-internal-ip), then restart it; every node's confd then peers with the right address"),
        (Some(Peer::Nobody(_)), _) => format!("the peer {peer} comes from a node's projectcalico.org/IPv4Address or a BGPPeer: find which (kubectl get nodes -o yaml | grep IPv4Address; calicoctl get bgppeers) and correct it"),
        (_, Some(_)) => format!("correct {}'s own projectcalico.org/IPv4Address (IP_AUTODETECTION_METHOD on its calico-node), then restart it", facts.name),
        _ => format!("check calico-node on the peer (its BIRD runs, its address is {peer}) and that TCP {BGP_PORT} is open between the nodes: birdc -s {} show protocols all {}", bird.socket, session.name),
    };
    Check::fail(
        family,
        &facts.name,
        &name,
        format!("{head}{why} (BIRD, {}){wrong}", bird.socket),
        fix,
    )
}

fn holds_text(holds: Option<Ipv4Addr>) -> String {
    holds.map_or("its InternalIP is not known".into(), |ip| {
        format!("its InternalIP is {ip}")
    })
}

/// Whose address a peer is.
#[derive(Debug, PartialEq, Eq)]
enum Peer {
    /// A node that holds it (`node-2`), or something this node reaches it as.
    Node(String),
    /// Only a node's announced address, which it does not hold.
    Announced {
        node: String,
        holds: Option<Ipv4Addr>,
    },
    /// Nobody's, with the addresses that are known.
    Nobody(String),
}

/// The nodes' addresses: of the other nodes examined (what they hold),
/// of the API's nodes (InternalIP, and the address Calico announces),
/// else what this node shows (its routes' gateways, its neighbours).
fn whose(facts: &NodeFacts, ip: Ipv4Addr) -> Peer {
    if let Some((node, _)) = facts
        .peer_addresses
        .iter()
        .find(|(_, held)| held.contains(&ip))
    {
        return Peer::Node(node.clone());
    }
    if let Some(node) = facts.others.iter().find(|n| n.ip == Some(ip)) {
        return Peer::Node(node.name.clone());
    }
    let announced = |n: &super::cluster::ClusterNode| {
        n.calico_ipv4()
            .and_then(|a| a.split('/').next()?.parse::<Ipv4Addr>().ok())
    };
    if let Some(node) = facts.others.iter().find(|n| announced(n) == Some(ip)) {
        let examined = facts
            .peer_addresses
            .iter()
            .find(|(name, _)| *name == node.name);
        let holds = node
            .ip
            .or_else(|| examined.and_then(|(_, held)| held.first().copied()));
        return Peer::Announced {
            node: node.name.clone(),
            holds,
        };
    }
    let mut known: Vec<String> = facts
        .others
        .iter()
        .filter_map(|n| Some(format!("{} {}", n.name, n.ip?)))
        .chain(facts.peer_addresses.iter().map(|(name, held)| {
            let held: Vec<String> = held.iter().map(Ipv4Addr::to_string).collect();
            format!("{name} {}", held.join(" "))
        }))
        .collect();
    if known.is_empty() {
        let seen: Vec<Ipv4Addr> = seen_from_here(facts);
        if seen.contains(&ip) {
            return Peer::Node("a neighbour of this node".into());
        }
        let seen: Vec<String> = seen.iter().map(Ipv4Addr::to_string).collect();
        known.push(format!(
            "no node list; this node's gateways and neighbours {}",
            seen.join(", ")
        ));
    }
    Peer::Nobody(known.join(", "))
}

/// The addresses this node reaches other hosts at: its routes' gateways
/// and its neighbours.
fn seen_from_here(facts: &NodeFacts) -> Vec<Ipv4Addr> {
    let mut seen: Vec<Ipv4Addr> = facts
        .view
        .routes
        .iter()
        .filter_map(|r| r.gateway)
        .chain(facts.view.neighbours.iter().map(|(_, ip, _)| *ip))
        .filter_map(|ip| match ip {
            std::net::IpAddr::V4(v4) => Some(v4),
            // BGP peers are judged by their IPv4 addresses.
            std::net::IpAddr::V6(_) => None,
        })
        .collect();
    seen.sort();
    seen.dedup();
    seen
}

fn own(facts: &NodeFacts) -> String {
    let own: Vec<String> = facts
        .addresses()
        .iter()
        .filter(|a| !a.is_loopback())
        .map(Ipv4Addr::to_string)
        .collect();
    own.join(", ")
}

/// Without BIRD's word: the sessions on TCP 179 in /proc/net/tcp.
fn from_proc(facts: &NodeFacts, why: &str) -> Check {
    const NAME: &str = "BGP sessions";
    let Some(tcp) = &facts.tcp else {
        return Check::not_checked(
            FAMILY,
            &facts.name,
            NAME,
            &format!("{why}, and /proc/net/tcp could not be read"),
        );
    };
    let fell_back = format!("{why}; fell back to /proc/net/tcp");
    let bgp = |s: &&TcpSocket| s.local.1 == BGP_PORT || s.remote.1 == BGP_PORT;
    let up: Vec<Ipv4Addr> = tcp
        .iter()
        .filter(bgp)
        .filter(|s| s.state == ESTABLISHED)
        .map(|s| s.remote.0)
        .collect();
    let listens = tcp
        .iter()
        .any(|s| s.state == LISTEN && s.local.1 == BGP_PORT);
    let peers = expected_peers(facts);
    let missing: Vec<&(String, Ipv4Addr)> =
        peers.iter().filter(|(_, ip)| !up.contains(ip)).collect();
    let up_text: Vec<String> = up.iter().map(Ipv4Addr::to_string).collect();
    let listening = if listens {
        "something listens on TCP 179"
    } else {
        "nothing listens on TCP 179: BIRD is not running"
    };
    if up.is_empty() || !missing.is_empty() {
        let missing: Vec<String> = missing
            .iter()
            .map(|(n, ip)| format!("{ip} ({n})"))
            .collect();
        let to = if missing.is_empty() {
            "any peer".to_string()
        } else {
            missing.join(", ")
        };
        return Check::fail(FAMILY, &facts.name, NAME,
            format!("{fell_back}: no ESTABLISHED connection on TCP {BGP_PORT} to {to}; {listening}"),
            format!("start BIRD on {}: it runs in calico-node (its logs; `sv status bird` in the container), and its socket is /var/run/calico/bird.ctl", facts.name));
    }
    Check::pass(
        FAMILY,
        &facts.name,
        NAME,
        format!(
            "{fell_back}: ESTABLISHED on TCP {BGP_PORT} with {}",
            up_text.join(", ")
        ),
    )
}

/// The peers a full mesh needs: every other node's address, as the
/// examined nodes hold them or the API lists them.
fn expected_peers(facts: &NodeFacts) -> Vec<(String, Ipv4Addr)> {
    let mut peers: Vec<(String, Ipv4Addr)> = facts
        .peer_addresses
        .iter()
        .filter_map(|(name, held)| {
            let listed = facts
                .others
                .iter()
                .find(|n| n.name == *name)
                .and_then(|n| n.ip);
            Some((name.clone(), listed.or_else(|| held.first().copied())?))
        })
        .collect();
    for node in &facts.others {
        if let (Some(ip), false) = (node.ip, peers.iter().any(|(n, _)| *n == node.name)) {
            peers.push((node.name.clone(), ip));
        }
    }
    peers
}
