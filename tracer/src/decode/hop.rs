//! A hop: a sighting placed on its node and interface (`sighting.rs`
//! places it), with what the headers say and the drop or route evidence
//! it carries. The hop is what correlation and stories work on.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::Decoded;
use crate::{
    model::Name,
    node::{interfaces::Role, rules::Flow},
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

impl DropInfo {
    /// The kernel function that freed it, without its offset.
    pub fn function(&self) -> &str {
        self.location.split('+').next().unwrap_or_default()
    }
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

#[cfg(test)]
pub(crate) mod tests {
    use podtrace_common::sighting::SNAPSHOT_LEN;

    use super::*;
    use crate::decode::decode_tunnel;

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
