//! `--proto` and `--port`: which packets of a traced pair are reported.
//!
//! Judged in the kernel, on the header of the traced pair (the inner one
//! through a tunnel), so that a filtered-out packet costs about what an
//! untraced one does: no record, no copy, no story. Written over
//! [`Bytes`] like the rest of the parsing, so the host tests run this very
//! code.

use crate::headers::*;
use crate::packet::Bytes;
use crate::transport::{l4_of, L4};

/// Ports a filter holds at most: those asked for (`--port` repeated, at
/// most [`MAX_ASKED_PORTS`]) and as many Services' target ports they keep,
/// learnt as connections open. The loop stops at the ports set, so room
/// left empty costs nothing.
pub const MAX_FILTER_PORTS: usize = 2 * MAX_ASKED_PORTS;

/// `--port` given at most this often.
pub const MAX_ASKED_PORTS: usize = 8;

/// Bits of [`L4Filter::protocols`].
pub mod protocol_bit {
    pub const TCP: u32 = 1;
    pub const UDP: u32 = 2;
    pub const ICMP: u32 = 4;
}

/// The filter, as userspace writes it into the `L4_FILTER` map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct L4Filter {
    /// [`protocol_bit`]s of the protocols kept; 0: every protocol.
    pub protocols: u32,
    /// How many of `ports` are set; 0: every port.
    pub ports_len: u32,
    /// Ports kept, on either side of the packet (host order).
    pub ports: [u16; MAX_FILTER_PORTS],
}

impl L4Filter {
    /// Whether a packet of `protocol` with `ports` (none for ICMP or a
    /// later fragment) is kept: its protocol is one asked for (or none
    /// was), and it carries a port asked for on either side (or none was).
    /// A packet with no ports passes a port filter only if its protocol
    /// was asked for by name (`--proto icmp --port 8080`: pings and
    /// port 8080).
    #[inline(always)]
    pub fn keeps(&self, protocol: u8, ports: Option<(u16, u16)>) -> bool {
        let bit = match protocol {
            IPPROTO_TCP => protocol_bit::TCP,
            IPPROTO_UDP => protocol_bit::UDP,
            IPPROTO_ICMP | IPPROTO_ICMPV6 => protocol_bit::ICMP,
            _ => 0,
        };
        if self.protocols != 0 && self.protocols & bit == 0 {
            return false;
        }
        if self.ports_len == 0 {
            return true;
        }
        let Some((src, dst)) = ports else {
            return self.protocols & bit != 0;
        };
        let mut i = 0;
        while i < MAX_FILTER_PORTS {
            if i as u32 >= self.ports_len {
                break;
            }
            let port = self.ports[i];
            if port == src || port == dst {
                return true;
            }
            i += 1;
        }
        false
    }
}

/// Whether `filter` keeps the packet whose traced header's transport is
/// `l4` ([`l4_of`]); `None` when a byte it needs cannot be read (the
/// caller may read again through a slower path, else keeps the packet:
/// nothing is left out unseen). An ICMP error is judged by the header it
/// quotes: it is news about that packet, e.g. a port unreachable for
/// `--port 53`. `V6` as for [`l4_of`] (the quoted header's family).
#[inline(always)]
pub fn judge<B: Bytes + ?Sized, const V6: bool>(b: &B, l4: &L4, filter: &L4Filter) -> Option<bool> {
    let mut l4 = *l4;
    // The messages that quote the packet they are about: ICMP's
    // destination unreachable, time exceeded, parameter problem; ICMPv6's
    // the same and packet too big.
    let quotes = match l4.protocol {
        IPPROTO_ICMP => matches!(b.u8_at(l4.at)?, 3 | 11 | 12),
        IPPROTO_ICMPV6 if V6 => matches!(b.u8_at(l4.at)?, 1..=4),
        _ => false,
    };
    if quotes && l4.present {
        l4 = l4_of::<B, V6>(b, l4.at + ICMP_QUOTE)?;
    }
    let ports = if l4.present && (l4.protocol == IPPROTO_TCP || l4.protocol == IPPROTO_UDP) {
        // Source and destination port, read at once.
        let p = b.bytes_at::<4>(l4.at + L4_SPORT)?;
        Some((
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        ))
    } else {
        None
    };
    Some(filter.keeps(l4.protocol, ports))
}
