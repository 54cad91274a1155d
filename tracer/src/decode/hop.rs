//! From a raw kernel record to a hop: which node and interface it was
//! seen on, what the headers say, and the drop or route evidence it
//! carries. The hop is what correlation and stories work on.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use podtrace_common::{
    drops::NODE_OTHER_NETNS,
    sighting::{match_kind, sighting_kind, Sighting, FIB_NOT_LOOKED_UP},
    tc::Direction as KernelDirection,
};
use serde::{Deserialize, Serialize};

use super::{decode, decode_tunnel, Decoded};
use crate::{
    model::Name,
    node::{
        interfaces::{Role, Watched},
        netns::describe_inode,
        pod_netns::OtherNamespaces,
        rules::Flow,
    },
    probe::Kernel,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Ingress,
    Egress,
    /// Not a tc hook: the kernel dropped the packet here.
    Drop,
}

impl Direction {
    pub fn label(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
            Self::Drop => "drop",
        }
    }
}

/// The kernel's route for a packet as it arrived (bpf_fib_lookup at tc
/// ingress).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct KernelRoute {
    /// success, blackhole, unreachable, prohibit, not_forwarded,
    /// forwarding_disabled, no_neighbour, frag_needed, …
    pub result: String,
    /// Output device and next hop, when the lookup found a route.
    pub dev: Option<String>,
    pub via: Option<IpAddr>,
}

impl KernelRoute {
    /// The next hop's MAC is not known yet (the packet waits for ARP, or
    /// IPv6's neighbour discovery).
    pub const NO_NEIGHBOUR: &'static str = "no_neighbour";
    /// No route (the lookup failed), or one that does not forward: the
    /// node's own address, a broadcast.
    pub const NOT_FORWARDED: &'static str = "not_forwarded";
    /// The packet is larger than the route's MTU.
    pub const FRAG_NEEDED: &'static str = "frag_needed";

    /// Names a `BPF_FIB_LKUP_RET_*` code (UAPI, stable).
    pub fn result_name(code: u8) -> String {
        const NAMES: [&str; 10] = [
            "success",
            "blackhole",
            "unreachable",
            "prohibit",
            "not_forwarded",
            "forwarding_disabled",
            "unsupported_lwt",
            "no_neighbour",
            "frag_needed",
            "no_source_address",
        ];
        NAMES
            .get(usize::from(code))
            .map_or_else(|| format!("code {code}"), |n| n.to_string())
    }

    pub fn found(&self) -> bool {
        matches!(
            self.result.as_str(),
            "success" | "no_neighbour" | "frag_needed"
        )
    }
}

/// Why and where the kernel dropped a packet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct DropInfo {
    /// `enum skb_drop_reason` name, without SKB_DROP_REASON_.
    pub reason: String,
    /// The kernel passes no reason (< 5.17): `reason` is what the
    /// location says (nf_hook_slow: NETFILTER_DROP).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reason_from_location: bool,
    /// The kernel function that freed the packet, `name+0xoff`.
    pub location: String,
    /// The packet had no IP header yet; it was matched by its socket.
    pub by_socket: bool,
}

/// One sighting, placed on its node and interface.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    pub ktime_ns: u64,
    pub node: Name,
    pub iface: Name,
    pub role: Role,
    pub direction: Direction,
    pub skb_len: u32,
    pub mark: u32,
    pub packet: Decoded,
    pub drop: Option<DropInfo>,
    pub route: Option<KernelRoute>,
    /// The bytes the kernel copied, for `--write` (not part of any story):
    /// kept only when asked for, and then carried from an agent to its
    /// front-end. A pcapng holds them as the packet, not in the record.
    #[serde(default, skip_serializing_if = "Snapshot::is_empty")]
    pub snapshot: Snapshot,
}

/// The header bytes of a sighting as the kernel copied them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Base64 on the wire: a JSON array of numbers would be four times
    /// the bytes on an agent's log.
    #[serde(with = "base64_bytes")]
    pub bytes: Vec<u8>,
    /// They start at an Ethernet header (else at the IPv4 header).
    pub has_l2: bool,
}

/// Bytes as one base64 string (serde's `with`).
mod base64_bytes {
    use base64::{engine::general_purpose::STANDARD, Engine};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

impl Hop {
    /// The packet as policy rules select it where this hook saw it: by
    /// its addresses, mark, and the device it arrived by (a drop's
    /// device, on the input path, is the one it came in on).
    pub fn flow(&self) -> Flow<'_> {
        Flow {
            src: Some(self.packet.packet.src),
            dst: self.packet.packet.dst,
            iif: (self.direction != Direction::Egress).then_some(&*self.iface),
            mark: self.mark,
        }
    }
}

impl Snapshot {
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The first `snaplen` bytes only (what `--snaplen` writes).
    pub fn truncate(&mut self, snaplen: u32) {
        self.bytes.truncate(snaplen as usize);
    }

    /// The copied bytes that belong to the packet. A copy that starts at
    /// the IP header (a drop's, an L3 device's) ends where the outermost
    /// IP packet does: what the kernel copied past it is other memory,
    /// never the packet's, and must not reach a capture file.
    pub fn of_packet(copied: &[u8], has_l2: bool, packet: &Decoded) -> Self {
        let end = if has_l2 {
            copied.len()
        } else {
            usize::from(packet.outermost().total_len).min(copied.len())
        };
        Self {
            bytes: copied[..end].to_vec(),
            has_l2,
        }
    }

    /// The packet's length on the wire, as far as the snapshot tells: an
    /// L3 snapshot's IP total length, else what the skb said.
    pub fn original_len(&self, packet: &Decoded, skb_len: u32) -> u32 {
        let copied = self.bytes.len() as u32;
        if self.has_l2 {
            skb_len.max(copied)
        } else {
            u32::from(packet.outermost().total_len).max(copied)
        }
    }
}

/// Why a record could not become a hop (counted in the summary).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unplaced {
    /// Seen on an interface podtrace no longer knows (it vanished).
    UnknownInterface,
    /// The headers did not parse.
    Undecodable,
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
/// hop that nothing else reads.
pub fn place(
    s: &Sighting,
    nodes: &[impl NodeLinks],
    others: &OtherNamespaces,
    kernel: &Kernel,
    keep_snapshot: bool,
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
    // Only a packet the kernel matched as encapsulated is read as a tunnel.
    let decoded = if s.match_kind == match_kind::INNER {
        decode_tunnel(snapshot, s.has_l2 != 0)
    } else {
        decode(snapshot, s.has_l2 != 0)
    };
    let packet = decoded.map_err(|_| Unplaced::Undecodable)?;
    let (direction, drop) = direction_of(s, kernel);
    let route = route_of(s, node, packet.packet.dst);
    Ok(Hop {
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
    })
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

#[cfg(test)]
pub(crate) mod tests {
    use podtrace_common::sighting::SNAPSHOT_LEN;

    use super::*;

    pub(crate) fn hop(
        t: u64,
        node: &str,
        iface: &str,
        role: Role,
        dir: Direction,
        frame: &[u8],
    ) -> Hop {
        Hop {
            ktime_ns: t,
            node: node.into(),
            iface: iface.into(),
            role,
            direction: dir,
            skb_len: frame.len() as u32,
            mark: 0,
            // Recorded hops stand for what the kernel matched: a tunnel
            // frame here is one it would decapsulate.
            packet: decode_tunnel(&frame[..frame.len().min(SNAPSHOT_LEN)], true).unwrap(),
            drop: None,
            route: None,
            snapshot: Snapshot {
                bytes: frame[..frame.len().min(SNAPSHOT_LEN)].to_vec(),
                has_l2: true,
            },
        }
    }

    /// A drop of `frame` at `iface`, freed in nf_hook_slow+0x9c.
    pub(crate) fn drop_hop(
        t: u64,
        node: &str,
        iface: &str,
        role: Role,
        frame: &[u8],
        reason: &str,
    ) -> Hop {
        let mut h = hop(t, node, iface, role, Direction::Drop, frame);
        h.drop = Some(DropInfo {
            reason: reason.into(),
            reason_from_location: false,
            location: "nf_hook_slow+0x9c".into(),
            by_socket: false,
        });
        h
    }
}
