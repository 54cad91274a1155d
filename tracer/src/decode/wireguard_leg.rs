//! A WireGuard encrypted leg's packet. The kernel writes two sightings on
//! one node: the traced packet going into the WireGuard device, with the
//! tag it wrote into its hash, and later the UDP packet leaving by the
//! underlay with that hash (`podtrace_common::wireguard`). The second is
//! told as the first's packet inside a WireGuard tunnel.

use std::collections::{HashMap, VecDeque};

use super::Decoded;

/// Tags remembered at once: far more than a ring of sightings holds
/// between a packet going into WireGuard and its leaving encrypted.
const REMEMBERED: usize = 4096;

/// The packets that went into WireGuard, by tag, oldest forgotten first.
#[derive(Debug, Default)]
pub struct EncryptedLegs {
    by_tag: HashMap<u32, Plaintext>,
    order: VecDeque<u32>,
}

#[derive(Debug)]
struct Plaintext {
    packet: Decoded,
    /// Its encrypted leg was told already.
    told: bool,
}

/// Why an encrypted leg is not told (counted in the summary).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Untold {
    /// Its plaintext sighting was not seen (lost, or forgotten).
    UnknownTag,
    /// A further UDP packet of a segmented (GSO) packet: the story tells
    /// the first.
    FurtherSegment,
}

impl EncryptedLegs {
    /// The packet going into WireGuard under `tag`.
    pub fn went_in(&mut self, tag: u32, packet: &Decoded) {
        if self.by_tag.len() >= REMEMBERED {
            if let Some(oldest) = self.order.pop_front() {
                self.by_tag.remove(&oldest);
            }
        }
        let plaintext = Plaintext {
            packet: *packet,
            told: false,
        };
        if self.by_tag.insert(tag, plaintext).is_none() {
            self.order.push_back(tag);
        }
    }

    /// The packet inside the encrypted leg with `tag`: the first time it
    /// is seen on its way, and whenever it is dropped (a drop after the
    /// underlay's hook saw it ends the same story).
    pub fn inside(&mut self, tag: u32, dropped: bool) -> Result<Decoded, Untold> {
        let plaintext = self.by_tag.get_mut(&tag).ok_or(Untold::UnknownTag)?;
        if !dropped && std::mem::replace(&mut plaintext.told, true) {
            return Err(Untold::FurtherSegment);
        }
        Ok(plaintext.packet)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{decode, tests::icmp_echo};

    fn ping(seq: u16) -> Decoded {
        decode(&icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, seq), true).unwrap()
    }

    #[test]
    fn a_leg_is_the_packet_its_tag_went_in_with_and_is_told_once() {
        let mut legs = EncryptedLegs::default();
        legs.went_in(7, &ping(1));
        legs.went_in(8, &ping(2));
        assert_eq!(legs.inside(8, false), Ok(ping(2)));
        assert_eq!(legs.inside(7, false), Ok(ping(1)));
        assert_eq!(legs.inside(7, false), Err(Untold::FurtherSegment));
        // Its drop, after the underlay's hook saw it, is still told.
        assert_eq!(legs.inside(7, true), Ok(ping(1)));
        assert_eq!(legs.inside(9, false), Err(Untold::UnknownTag));
    }

    #[test]
    fn the_oldest_tags_are_forgotten_first() {
        let mut legs = EncryptedLegs::default();
        for tag in 0..=REMEMBERED as u32 {
            legs.went_in(tag, &ping(tag as u16));
        }
        assert_eq!(legs.inside(0, false), Err(Untold::UnknownTag));
        assert_eq!(legs.inside(1, false), Ok(ping(1)));
        assert_eq!(
            legs.inside(REMEMBERED as u32, false),
            Ok(ping(REMEMBERED as u16))
        );
    }
}
