//! A WireGuard encrypted leg's packet. The kernel writes two sightings on
//! one node: the traced packet going into the WireGuard device, with the
//! tag it wrote into its hash, and later the UDP packet leaving by the
//! underlay with that hash (`podtrace_common::wireguard`). The second is
//! told as the first's packet inside a WireGuard tunnel. A receiving
//! node's kernel cannot know the tag (the wire recomputes the hash): a
//! data message dropped there is the leg that left with its addresses,
//! receiver index and counter, or none of the trace's. Each node's
//! records come by their own ring, so such a drop may be read before its
//! leg: it waits for it (a second of the kernel's time at most).

use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
};

use super::{hop::Hop, Decoded, IpPacket, WireguardData};

/// Tags remembered at once: far more than a ring of sightings holds
/// between a packet going into WireGuard and its leaving encrypted.
const REMEMBERED: usize = 4096;

/// How long a drop waits for its leg, by the kernel's clock: far longer
/// than one ring's records wait behind another's.
const WAIT_NS: u64 = 1_000_000_000;

/// A tag as the node whose kernel wrote it names it: (node, tag). Two
/// nodes' probes choose their prefixes apart, and may choose alike.
type NodeTag = (u32, u32);

/// A data message as every node sees it: outer source and destination,
/// receiver index, counter. A counter is used once per session.
type Message = (IpAddr, IpAddr, u32, u64);

fn message_of(outer: &IpPacket, data: &WireguardData) -> Message {
    (outer.src, outer.dst, data.receiver, data.counter)
}

/// The data message a decoded packet travels in, if it is in one.
fn carrying_message(packet: &Decoded) -> Option<Message> {
    let t = packet.tunnel.as_ref()?;
    t.wireguard.map(|data| message_of(&t.outer, &data))
}

/// The packets that went into WireGuard, by tag, oldest forgotten first.
#[derive(Debug, Default)]
pub struct EncryptedLegs {
    by_tag: HashMap<NodeTag, Plaintext>,
    order: VecDeque<NodeTag>,
    /// The legs told, by their data message.
    by_message: HashMap<Message, NodeTag>,
    /// Drops of data messages read before any leg of theirs: their hop,
    /// its packet still the UDP one.
    waiting: HashMap<Message, Hop>,
    /// Their messages and times, oldest first.
    waiting_since: VecDeque<(u64, Message)>,
    /// Those whose leg has come since, their packet the traced one.
    paired: Vec<Hop>,
}

#[derive(Debug)]
struct Plaintext {
    packet: Decoded,
    /// Its encrypted leg was told already.
    told: bool,
    /// That leg's data message.
    message: Option<Message>,
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
            message: None,
        };
        if let Some(old) = self.by_tag.insert(key, plaintext) {
            self.forget_message(old.message);
            return;
        }
        self.order.push_back(key);
        if self.by_tag.len() > REMEMBERED {
            if let Some(oldest) = self.order.pop_front() {
                let old = self.by_tag.remove(&oldest);
                self.forget_message(old.and_then(|p| p.message));
            }
        }
    }

    fn forget_message(&mut self, message: Option<Message>) {
        if let Some(message) = message {
            self.by_message.remove(&message);
        }
    }

    /// The traced packet inside the data message `outer` and `data`
    /// carry, dropped on a node its tag did not reach: the packet whose
    /// leg left with the same addresses, receiver index and counter.
    pub fn arrived(&self, outer: &IpPacket, data: &WireguardData) -> Option<Decoded> {
        let key = self.by_message.get(&message_of(outer, data))?;
        self.by_tag.get(key).map(|p| p.packet)
    }

    /// Keeps `drop`, a data message dropped on a node its tag did not
    /// reach and of no leg seen yet, until its leg is told (then it is
    /// [`Self::take_paired`]'s) or it has waited [`WAIT_NS`] (then it was
    /// another flow's, or its sending node is not traced).
    pub fn wait_for_leg(&mut self, drop: Hop) {
        let Some(message) = carrying_message(&drop.packet) else {
            return;
        };
        while let Some(&(since, oldest)) = self.waiting_since.front() {
            if drop.ktime_ns.saturating_sub(since) < WAIT_NS
                && self.waiting_since.len() < REMEMBERED
            {
                break;
            }
            self.waiting_since.pop_front();
            // Unless it was paired, or the same message dropped again since.
            if self
                .waiting
                .get(&oldest)
                .is_some_and(|h| h.ktime_ns == since)
            {
                self.waiting.remove(&oldest);
            }
        }
        self.waiting_since.push_back((drop.ktime_ns, message));
        self.waiting.insert(message, drop);
    }

    /// The waiting drops whose leg has been told since, as hops of the
    /// traced packet.
    pub fn take_paired(&mut self) -> Option<std::vec::Drain<'_, Hop>> {
        (!self.paired.is_empty()).then(|| self.paired.drain(..))
    }

    /// The drop waiting for the leg `inside` left as with `message`.
    fn leg_came(&mut self, message: Message, inside: &Decoded) {
        let Some(mut drop) = self.waiting.remove(&message) else {
            return;
        };
        if let Some(tunnel) = drop.packet.tunnel {
            if let Some(data) = tunnel.wireguard {
                drop.packet = super::in_wireguard(inside, tunnel.outer, data);
                self.paired.push(drop);
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
        if let (false, Ok(told)) = (dropped, &leg) {
            plaintext.told = true;
            if let Some(message) = carrying_message(told) {
                plaintext.message = Some(message);
                let inside = plaintext.packet;
                self.by_message.insert(message, (node, tag));
                if !self.waiting.is_empty() {
                    self.leg_came(message, &inside);
                }
            }
        }
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

    /// `inside` in a data message from node-1 to node-2 (`receiver`,
    /// `counter`).
    fn leg(inside: &Decoded, receiver: u32, counter: u64) -> Decoded {
        let outer = decode(&icmp_echo([192, 0, 2, 11], [192, 0, 2, 12], 64, 1), true)
            .unwrap()
            .packet;
        let data = WireguardData {
            receiver,
            counter,
            known_by: crate::decode::KnownBy::FlowHashTag,
        };
        crate::decode::in_wireguard(inside, outer, data)
    }

    fn message(leg: &Decoded) -> (IpPacket, WireguardData) {
        let t = leg.tunnel.unwrap();
        (t.outer, t.wireguard.unwrap())
    }

    #[test]
    fn a_message_dropped_elsewhere_is_the_leg_that_left_with_its_receiver_and_counter() {
        let mut legs = EncryptedLegs::default();
        legs.went_in(0, 7, &ping(1));
        legs.went_in(0, 8, &ping(2));
        let (first, second) = (leg(&ping(1), 0xab, 41), leg(&ping(2), 0xab, 42));
        for (tag, sent) in [(7, first), (8, second)] {
            let told = legs.told((0, tag), false, |_| Ok::<_, ()>(sent));
            assert_eq!(told, Ok(Ok(sent)));
        }
        let (outer, data) = message(&second);
        assert_eq!(legs.arrived(&outer, &data), Some(ping(2)));
        // Another counter, receiver or sender is no leg of the trace's.
        let (outer, data) = message(&leg(&ping(3), 0xab, 43));
        assert_eq!(legs.arrived(&outer, &data), None);
        let (outer, data) = message(&leg(&ping(2), 0xac, 42));
        assert_eq!(legs.arrived(&outer, &data), None);
        let (mut outer, data) = message(&second);
        outer.src = IpAddr::from([192, 0, 2, 13]);
        assert_eq!(legs.arrived(&outer, &data), None);
        // A tag used again forgets its old packet's message.
        legs.went_in(0, 7, &ping(4));
        let (outer, data) = message(&first);
        assert_eq!(legs.arrived(&outer, &data), None);
    }

    /// node-2's drop at `t` of the data message `sent` carries.
    fn dropped_on_node_2(t: u64, sent: &Decoded) -> Hop {
        let frame = icmp_echo([192, 0, 2, 11], [192, 0, 2, 12], 64, 1);
        let mut drop = crate::decode::hop::tests::hop(
            t,
            "node-2",
            "eth0",
            crate::node::interfaces::Role::Underlay,
            crate::decode::hop::Direction::Drop,
            &frame,
        );
        let (outer, data) = message(sent);
        let udp = Decoded {
            packet: outer,
            tunnel: None,
            quoted: None,
        };
        drop.packet = crate::decode::in_wireguard(&udp, outer, data);
        drop
    }

    #[test]
    fn a_drop_read_before_its_leg_waits_for_it_and_no_longer_than_a_second() {
        let mut legs = EncryptedLegs::default();
        let sent = leg(&ping(1), 0xab, 41);
        legs.wait_for_leg(dropped_on_node_2(1_000, &leg(&ping(9), 0xab, 40)));
        legs.wait_for_leg(dropped_on_node_2(2_000, &sent));
        assert!(legs.take_paired().is_none(), "no leg read yet");
        legs.went_in(0, 7, &ping(1));
        let _ = legs.told((0, 7), false, |_| Ok::<_, ()>(sent));
        let paired: Vec<Hop> = legs.take_paired().expect("the drop paired").collect();
        assert_eq!(paired.len(), 1);
        assert_eq!(
            paired[0].packet, sent,
            "told as the traced packet, encrypted"
        );
        assert_eq!(&*paired[0].node, "node-2");
        assert!(legs.take_paired().is_none(), "handed over once");
        // The other drop waits a second at most, then is no one's.
        let later = leg(&ping(2), 0xab, 42);
        legs.wait_for_leg(dropped_on_node_2(WAIT_NS + 1_000, &later));
        assert_eq!(legs.waiting.len(), 1, "the drop of counter 40 forgotten");
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
