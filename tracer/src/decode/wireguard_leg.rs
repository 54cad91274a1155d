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

/// A tag as the node whose kernel wrote it names it: (node, tag). Two
/// nodes' probes choose their prefixes apart, and may choose alike.
type NodeTag = (u32, u32);

/// The packets that went into WireGuard, by tag, oldest forgotten first.
#[derive(Debug, Default)]
pub struct EncryptedLegs {
    by_tag: HashMap<NodeTag, Plaintext>,
    order: VecDeque<NodeTag>,
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
    /// The packet going into WireGuard under `tag` on `node`. (The same
    /// tag again is a new packet: the kernel reuses a tag only once the
    /// old one's life is over.)
    pub fn went_in(&mut self, node: u32, tag: u32, packet: &Decoded) {
        let key = (node, tag);
        let plaintext = Plaintext {
            packet: *packet,
            told: false,
        };
        if self.by_tag.insert(key, plaintext).is_some() {
            return;
        }
        self.order.push_back(key);
        if self.by_tag.len() > REMEMBERED {
            if let Some(oldest) = self.order.pop_front() {
                self.by_tag.remove(&oldest);
            }
        }
    }

    /// The packet inside the encrypted leg with `tag` on `node`, as
    /// `read` tells the leg (`None`: its bytes are no leg of it): the
    /// first time it is seen on its way, and whenever it is dropped (a
    /// drop after the underlay's hook saw it ends the same story).
    pub fn told<E>(
        &mut self,
        (node, tag): NodeTag,
        dropped: bool,
        read: impl FnOnce(&Decoded) -> Result<Decoded, E>,
    ) -> Result<Result<Decoded, E>, Untold> {
        let plaintext = self
            .by_tag
            .get_mut(&(node, tag))
            .ok_or(Untold::UnknownTag)?;
        if !dropped && plaintext.told {
            return Err(Untold::FurtherSegment);
        }
        let leg = read(&plaintext.packet);
        // Told only once its bytes are read as a leg of it.
        plaintext.told |= !dropped && leg.is_ok();
        Ok(leg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{decode, tests::icmp_echo};

    fn ping(seq: u16) -> Decoded {
        decode(&icmp_echo([10, 244, 1, 2], [10, 244, 2, 2], 63, seq), true).unwrap()
    }

    /// The leg `(node, tag)` as its plaintext packet, told unread.
    fn inside(legs: &mut EncryptedLegs, key: NodeTag, dropped: bool) -> Result<Decoded, Untold> {
        legs.told(key, dropped, |p| Ok::<_, ()>(*p))
            .map(|leg| leg.unwrap())
    }

    #[test]
    fn a_leg_is_the_packet_its_tag_went_in_with_on_its_node_and_is_told_once() {
        let mut legs = EncryptedLegs::default();
        legs.went_in(0, 7, &ping(1));
        legs.went_in(0, 8, &ping(2));
        legs.went_in(1, 7, &ping(3));
        assert_eq!(inside(&mut legs, (0, 8), false), Ok(ping(2)));
        assert_eq!(inside(&mut legs, (0, 7), false), Ok(ping(1)));
        assert_eq!(
            inside(&mut legs, (1, 7), false),
            Ok(ping(3)),
            "another node's"
        );
        assert_eq!(
            inside(&mut legs, (0, 7), false),
            Err(Untold::FurtherSegment)
        );
        // Its drop, after the underlay's hook saw it, is still told.
        assert_eq!(inside(&mut legs, (0, 7), true), Ok(ping(1)));
        assert_eq!(inside(&mut legs, (0, 9), false), Err(Untold::UnknownTag));
    }

    #[test]
    fn bytes_that_are_no_leg_leave_the_packets_leg_to_be_told() {
        let mut legs = EncryptedLegs::default();
        legs.went_in(0, 7, &ping(1));
        let refused = legs.told((0, 7), false, |_| Err::<Decoded, _>("not a data message"));
        assert_eq!(refused, Ok(Err("not a data message")));
        assert_eq!(inside(&mut legs, (0, 7), false), Ok(ping(1)));
    }

    #[test]
    fn the_oldest_tags_are_forgotten_first() {
        let mut legs = EncryptedLegs::default();
        for tag in 0..=REMEMBERED as u32 {
            legs.went_in(0, tag, &ping(tag as u16));
        }
        // A tag again is its new packet, and forgets nothing.
        legs.went_in(0, 5, &ping(5));
        assert_eq!(inside(&mut legs, (0, 0), false), Err(Untold::UnknownTag));
        assert_eq!(inside(&mut legs, (0, 1), false), Ok(ping(1)));
        let last = REMEMBERED as u32;
        assert_eq!(inside(&mut legs, (0, last), false), Ok(ping(last as u16)));
    }
}
