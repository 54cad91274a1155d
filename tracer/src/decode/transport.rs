//! The layer-4 facts of a packet, as decoding and quoting both read them.

use serde::{Deserialize, Serialize};

/// The layer-4 facts that tell one packet of a flow from the next.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    schemars::JsonSchema,
    Deserialize,
)]
#[serde(tag = "proto", rename_all = "lowercase")]
pub enum Transport {
    Icmp {
        icmp_type: u8,
        code: u8,
        id: u16,
        seq: u16,
    },
    /// ICMPv6: echo is type 128 and its reply 129; errors are 1 to 4.
    Icmpv6 {
        icmp_type: u8,
        code: u8,
        id: u16,
        seq: u16,
    },
    Tcp {
        sport: u16,
        dport: u16,
        seq: u32,
        flags: u8,
    },
    Udp {
        sport: u16,
        dport: u16,
    },
    Other {
        number: u8,
    },
    /// A fragment after the first: it carries no transport header, only
    /// bytes of the middle of the payload.
    Fragment {
        number: u8,
        /// Bytes into the original payload.
        offset: u16,
    },
}

/// TCP's SYN, RST and ACK flag bits.
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

impl Transport {
    /// Whether this is a connection's first packet: a TCP SYN without ACK.
    pub fn opens_a_connection(&self) -> bool {
        matches!(self, Self::Tcp { flags, .. } if flags & (TCP_SYN | TCP_ACK) == TCP_SYN)
    }

    /// The IP protocol number.
    pub fn protocol(&self) -> u8 {
        match self {
            Self::Icmp { .. } => 1,
            Self::Icmpv6 { .. } => 58,
            Self::Tcp { .. } => 6,
            Self::Udp { .. } => 17,
            Self::Other { number } | Self::Fragment { number, .. } => *number,
        }
    }
}
