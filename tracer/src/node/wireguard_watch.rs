//! A node's WireGuard state kept fresh for the stories told while a
//! trace runs: read again when asked, taken when a story would be judged
//! otherwise by it, and a failing read told as such after a while.

use super::wireguard::{Reader, WireGuard};

/// How stale a state read again may be told: a state judged alike is
/// taken again at least this often (the handshake ages stories quote),
/// and reads that fail this long replace the last good one with why.
const REFRESH_SECS: u64 = 10;

/// A node's WireGuard state, read again whenever asked, and what is
/// held of it: a read that fails keeps the last good state for a while
/// (a device being recreated), then says why it is not read.
pub struct Watch {
    reader: Reader,
    /// The start's state until a read again is taken (`read_again`
    /// false: the next good read is a change).
    held: WireGuard,
    /// When a read last succeeded (seconds since the epoch).
    last_good: u64,
}

impl Watch {
    pub fn new(reader: Reader, at_start: WireGuard) -> Self {
        Self {
            reader,
            last_good: at_start.read_at,
            held: at_start,
        }
    }

    /// Reads again; true when the state held changed for a story (or is
    /// refreshed after `REFRESH_SECS`).
    pub fn refresh(&mut self) -> bool {
        let mut now = self.reader.read();
        now.read_again = true;
        if now.unread.is_some() {
            let failing_long = now.read_at >= self.last_good + REFRESH_SECS;
            if !failing_long || self.held.unread.is_some() {
                return false;
            }
        } else {
            self.last_good = now.read_at;
            let recent = now.read_at < self.held.read_at + REFRESH_SECS;
            if self.held.read_again && recent && now.judged_alike(&self.held) {
                return false;
            }
        }
        self.held = now;
        true
    }

    /// The state held: the last good one read, else why none is.
    pub fn state(&self) -> &WireGuard {
        &self.held
    }
}
