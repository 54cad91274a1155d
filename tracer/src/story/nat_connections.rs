//! The traced pair's translated connections, as conntrack reported them:
//! the last [`MAX_CONNECTIONS`], oldest first, indexed by their tuples.
//!
//! Every story asks for its packet's connection once per pair of
//! consecutive hops, and every conntrack event asks whether its
//! connection is known. A scan of the whole list cost each question up to
//! 4,096 comparisons: at 200 new connections a second, that was most of
//! podtrace's CPU, and a trace that fell behind told its stories later,
//! so each scan went deeper. The index answers both in constant time.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::model::conntrack::Tuple;

/// A translated connection, as conntrack reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Connection {
    pub orig: Tuple,
    pub reply: Tuple,
    pub zone: u16,
    pub mark: u32,
    /// Until when (kernel time) the translated addresses were not traced:
    /// a packet seen before then and not after its translation was out of
    /// podtrace's sight, not lost. 0 when they were traced all along.
    #[serde(default)]
    pub untraced_until_ns: u64,
}

/// Connections remembered: the oldest go first.
pub const MAX_CONNECTIONS: usize = 4096;

/// The connections, and where each tuple is (sequence numbers: the
/// `n`-th connection ever remembered is `n`).
#[derive(Clone, Debug, Default)]
pub struct Connections {
    remembered: VecDeque<Connection>,
    /// The sequence number of the oldest remembered.
    oldest: u64,
    /// (orig, reply) → its connection: each is remembered once.
    by_both: HashMap<(Tuple, Tuple), u64>,
    /// The newest connection with this original tuple.
    by_orig: HashMap<Tuple, u64>,
    /// The newest connection with this reply tuple.
    by_reply: HashMap<Tuple, u64>,
}

impl Connections {
    /// Remembers `c`, unless a connection with both its tuples is
    /// remembered already (then that one stays, as it was); the oldest
    /// goes when the list is full. Returns whether `c` was new.
    pub fn remember(&mut self, c: Connection) -> bool {
        if self.by_both.contains_key(&(c.orig, c.reply)) {
            return false;
        }
        if self.remembered.len() == MAX_CONNECTIONS {
            self.forget_oldest();
        }
        let seq = self.oldest + self.remembered.len() as u64;
        self.by_both.insert((c.orig, c.reply), seq);
        self.by_orig.insert(c.orig, seq);
        self.by_reply.insert(c.reply, seq);
        self.remembered.push_back(c);
        true
    }

    fn forget_oldest(&mut self) {
        let Some(c) = self.remembered.pop_front() else {
            return;
        };
        let seq = self.oldest;
        self.oldest += 1;
        self.by_both.remove(&(c.orig, c.reply));
        // A newer connection with the same tuple keeps its entry.
        if self.by_orig.get(&c.orig) == Some(&seq) {
            self.by_orig.remove(&c.orig);
        }
        if self.by_reply.get(&c.reply) == Some(&seq) {
            self.by_reply.remove(&c.reply);
        }
    }

    /// The newest connection whose original or reply tuple is `t`, with
    /// its sequence number (to compare with other answers: higher is
    /// newer).
    pub fn newest_with(&self, t: &Tuple) -> Option<(u64, &Connection)> {
        let seq = [self.by_orig.get(t), self.by_reply.get(t)]
            .into_iter()
            .flatten()
            .max()?;
        let at = usize::try_from(seq - self.oldest).ok()?;
        Some((*seq, self.remembered.get(at)?))
    }
}

/// On the wire and in files: the list alone, oldest first (the index is
/// rebuilt on reading).
impl Serialize for Connections {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.remembered.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Connections {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let listed = VecDeque::<Connection>::deserialize(deserializer)?;
        let mut connections = Self::default();
        for c in listed {
            connections.remember(c);
        }
        Ok(connections)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::story::nat::tests::tuple;

    fn connection(sport: u16, backend: u8) -> Connection {
        Connection {
            orig: tuple([10, 244, 1, 2], [10, 96, 7, 7], sport, 80),
            reply: tuple([10, 244, 2, backend], [10, 244, 1, 2], 8080, sport),
            zone: 0,
            mark: u32::from(backend),
            untraced_until_ns: 0,
        }
    }

    fn remembered(list: &[Connection]) -> Connections {
        let mut connections = Connections::default();
        for c in list {
            connections.remember(*c);
        }
        connections
    }

    fn reversed(t: Tuple) -> Tuple {
        Tuple {
            src: t.dst,
            dst: t.src,
            sport: t.dport,
            dport: t.sport,
            ..t
        }
    }

    #[test]
    fn each_connection_is_remembered_once_and_found_by_either_tuple() {
        let mut connections = Connections::default();
        let c = connection(40000, 2);
        assert!(connections.remember(c));
        assert!(!connections.remember(Connection { mark: 9, ..c }));
        assert_eq!(connections.remembered.len(), 1);
        for t in [c.orig, c.reply] {
            assert_eq!(connections.newest_with(&t), Some((0, &c)));
        }
        assert!(connections.newest_with(&reversed(c.orig)).is_none());
    }

    #[test]
    fn a_reused_port_finds_the_newest_connection() {
        let (first, second) = (connection(40000, 2), connection(40000, 3));
        let mut connections = remembered(&[first, second]);
        // Both share the original tuple; each has its own reply.
        assert_eq!(connections.newest_with(&first.orig), Some((1, &second)));
        assert_eq!(connections.newest_with(&first.reply), Some((0, &first)));
        // The same connection again: still the older one's entry.
        assert!(!connections.remember(first));
        assert_eq!(connections.newest_with(&first.orig).unwrap().1, &second);
    }

    #[test]
    fn the_oldest_go_first_and_a_newer_one_keeps_a_shared_tuple() {
        let (first, reused) = (connection(1, 2), connection(1, 3));
        let mut connections = remembered(&[first, reused]);
        for port in 2..=MAX_CONNECTIONS as u16 {
            connections.remember(connection(port, 2));
        }
        assert_eq!(connections.remembered.len(), MAX_CONNECTIONS);
        // `first` went: its reply is gone, the original tuple is the
        // reused port's.
        assert!(connections.newest_with(&first.reply).is_none());
        assert_eq!(connections.newest_with(&first.orig).unwrap().1, &reused);
        // It may be remembered again, as the newest.
        assert!(connections.remember(first));
        let newest = MAX_CONNECTIONS as u64 + 1;
        assert_eq!(
            connections.newest_with(&first.reply),
            Some((newest, &first))
        );
        assert_eq!(connections.newest_with(&first.orig).unwrap().0, newest);
    }

    #[test]
    fn the_index_is_rebuilt_from_the_wire() {
        let (a, b) = (connection(40000, 2), connection(40001, 3));
        let json = serde_json::to_string(&remembered(&[a, b])).unwrap();
        let read: Connections = serde_json::from_str(&json).unwrap();
        assert_eq!(read.remembered.len(), 2);
        assert_eq!(read.newest_with(&b.reply), Some((1, &b)));
        assert_eq!(read.newest_with(&a.orig), Some((0, &a)));
    }
}
