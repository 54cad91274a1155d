//! From a kernel sighting (`podtrace_common::sighting::Sighting`) to a
//! hop: which node and interface it was seen on, what the headers say,
//! and the drop or route evidence it carries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use podtrace_common::{
    drops::NODE_OTHER_NETNS,
    sighting::{match_kind, sighting_kind, Sighting, FIB_NOT_LOOKED_UP},
    tc::Direction as KernelDirection,
};

use super::{
    decode, decode_encrypted, decode_tunnel,
    hop::{Direction, DropInfo, Hop, KernelRoute, Snapshot},
    in_wireguard,
    wireguard_leg::EncryptedLegs,
    wireguard_message, DecodeError, Decoded, KnownBy, WireguardData,
};
use crate::{
    model::Name,
    node::{
        interfaces::{Role, Watched},
        netns::describe_inode,
        pod_netns::OtherNamespaces,
    },
    probe::Kernel,
};

/// Why a record could not become a hop (counted in the summary).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unplaced {
    /// Seen on an interface podtrace no longer knows (it vanished).
    UnknownInterface,
    /// The headers did not parse.
    Undecodable,
    /// A UDP packet WireGuard sent with a traced packet inside, whose
    /// plaintext sighting was not seen, or whose story tells another
    /// segment of the same packet.
    EncryptedLegUntold,
    /// A WireGuard data message dropped on a node its tag did not reach,
    /// whose leg has not been read (yet): kept until it is, and never
    /// told if it is not (another flow's, or its sending node's is not
    /// traced); see `EncryptedLegs::wait_for_leg`.
    AwaitingLeg,
}

/// What placing a record needs of a traced node, and no more: its name
/// and its links. The node that owns the loaded probes (`app::traced`)
/// answers it; decoding does not reach into it.
pub trait NodeLinks {
    fn name(&self) -> &Name;
    /// A watched interface, by index.
    fn watched(&self, ifindex: u32) -> Option<&Watched>;
    /// Any link's name, by index (drops happen on unwatched links too).
    fn link_name(&self, ifindex: u32) -> Option<&String>;
}

/// The interface a sighting was on: a watched one, or, for a drop, any
/// interface of its namespace (a drop may happen anywhere).
fn interface_of(
    s: &Sighting,
    node: Option<&impl NodeLinks>,
    others: &OtherNamespaces,
) -> Result<(Name, Role), Unplaced> {
    if let Some(w) = node.and_then(|n| n.watched(s.ifindex)) {
        return Ok((w.name.clone(), w.role));
    }
    if s.kind != sighting_kind::DROP {
        return Err(Unplaced::UnknownInterface);
    }
    let name = match node {
        Some(n) => n.link_name(s.ifindex).cloned(),
        None => others
            .get(s.netns_inum)
            .and_then(|o| o.links.get(&s.ifindex).cloned()),
    };
    let name = name.unwrap_or_else(|| match s.ifindex {
        0 => "-".into(),
        index => format!("if{index}"),
    });
    Ok((name.into(), Role::Other))
}

/// Drops in namespaces no traced node owns (pods) are named by `others`
/// (learnt beforehand: see `OtherNamespaces::learn`). The header bytes
/// are kept in the hop only with `keep_snapshot` (`--write`): a copy per
/// hop that nothing else reads. `legs`: the packets gone into WireGuard,
/// which a later encrypted leg's sighting is told as.
pub fn place(
    s: &Sighting,
    nodes: &[impl NodeLinks],
    others: &OtherNamespaces,
    kernel: &Kernel,
    keep_snapshot: bool,
    legs: &mut EncryptedLegs,
) -> Result<Hop, Unplaced> {
    let node = if s.node_id == NODE_OTHER_NETNS {
        None
    } else {
        Some(
            nodes
                .get(s.node_id as usize)
                .ok_or(Unplaced::UnknownInterface)?,
        )
    };
    let (iface, role) = interface_of(s, node, others)?;
    let snapshot = &s.snapshot[..usize::from(s.snapshot_len).min(s.snapshot.len())];
    let (packet, awaits_leg) = decoded(s, snapshot, legs)?;
    let (direction, drop) = direction_of(s, kernel);
    let route = route_of(s, node, packet.packet.dst);
    let hop = Hop {
        ktime_ns: s.ktime_ns,
        node: match node {
            Some(n) => n.name().clone(),
            None => others
                .get(s.netns_inum)
                .map_or_else(|| describe_inode(s.netns_inum), |o| o.label.clone())
                .into(),
        },
        iface,
        role,
        direction,
        skb_len: s.skb_len,
        mark: s.mark,
        packet,
        drop,
        route,
        snapshot: if keep_snapshot {
            Snapshot::of_packet(snapshot, s.has_l2 != 0, &packet)
        } else {
            Snapshot {
                bytes: Vec::new(),
                has_l2: s.has_l2 != 0,
            }
        },
    };
    if awaits_leg {
        legs.wait_for_leg(hop);
        return Err(Unplaced::AwaitingLeg);
    }
    Ok(hop)
}

/// The sighting's packet. Only a packet the kernel matched as
/// encapsulated is read as a tunnel; an encrypted leg is the packet its
/// tag went into WireGuard with. True beside a data message dropped on a
/// node its tag did not reach, whose leg has not been read yet: the
/// packet is the UDP one until it has.
fn decoded(
    s: &Sighting,
    snapshot: &[u8],
    legs: &mut EncryptedLegs,
) -> Result<(Decoded, bool), Unplaced> {
    let has_l2 = s.has_l2 != 0;
    let undecodable = |_: DecodeError| Unplaced::Undecodable;
    let now = |packet| Ok((packet, false));
    match s.match_kind {
        match_kind::INNER => now(decode_tunnel(snapshot, has_l2).map_err(undecodable)?),
        match_kind::ENCRYPTED if s.wireguard_tag == 0 => {
            let (outer, data) = wireguard_message(snapshot, has_l2).map_err(undecodable)?;
            let data = WireguardData {
                known_by: KnownBy::ReceiverAndCounter,
                ..data
            };
            match legs.arrived(&outer, &data) {
                Some(inside) => now(in_wireguard(&inside, outer, data)),
                None => {
                    let udp = Decoded {
                        packet: outer,
                        tunnel: None,
                        quoted: None,
                    };
                    Ok((in_wireguard(&udp, outer, data), true))
                }
            }
        }
        match_kind::ENCRYPTED => {
            let (key, dropped) = ((s.node_id, s.wireguard_tag), s.kind == sighting_kind::DROP);
            let leg = legs.told(key, dropped, |inside| {
                decode_encrypted(snapshot, has_l2, inside)
            });
            now(leg
                .map_err(|_| Unplaced::EncryptedLegUntold)?
                .map_err(undecodable)?)
        }
        _ => {
            let packet = decode(snapshot, has_l2).map_err(undecodable)?;
            if s.wireguard_tag != 0 {
                legs.went_in(s.node_id, s.wireguard_tag, &packet);
            }
            now(packet)
        }
    }
}

/// A drop (with its reason and where the kernel dropped it), or the way
/// the packet was going.
fn direction_of(s: &Sighting, kernel: &Kernel) -> (Direction, Option<DropInfo>) {
    if s.kind == sighting_kind::DROP {
        let location = kernel.symbols.name(s.location);
        let (reason, reason_from_location) = kernel.reasons.name(s.reason, &location);
        let info = DropInfo {
            reason,
            reason_from_location,
            location,
            by_socket: s.match_kind == match_kind::SOCKET,
        };
        (Direction::Drop, Some(info))
    } else if s.direction == KernelDirection::Egress as u8 {
        (Direction::Egress, None)
    } else {
        (Direction::Ingress, None)
    }
}

/// The kernel's route lookup for the packet, if it made one: the device
/// it would leave by on `node`, and the next hop when it is not `dst`.
fn route_of(s: &Sighting, node: Option<&impl NodeLinks>, dst: IpAddr) -> Option<KernelRoute> {
    (s.fib_result != FIB_NOT_LOOKED_UP).then(|| {
        let route = KernelRoute {
            result: KernelRoute::result_name(s.fib_result),
            dev: None,
            via: None,
        };
        if !route.found() {
            return route;
        }
        let dev = node.and_then(|n| n.link_name(s.fib_ifindex).cloned());
        // The lookup was of the packet's own family.
        let via = match dst {
            IpAddr::V4(_) => {
                let [a, b, c, d, ..] = s.fib_nexthop;
                IpAddr::V4(Ipv4Addr::new(a, b, c, d))
            }
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(s.fib_nexthop)),
        };
        KernelRoute {
            dev,
            via: (via != dst).then_some(via),
            ..route
        }
    })
}
