//! The pre-filter of traced pairs (`TRACED_PAIRS`, one array entry),
//! asked before the `FLOWS` hash map.
//!
//! A packet's pair is asked on every hook it crosses, so what this costs
//! is what podtrace costs every packet on the node. An array lookup is
//! inlined by the verifier; a hash lookup is a call and a hash. So:
//! - a bitmap of the traced addresses turns most untraced packets away:
//!   a pair can be traced only if both its addresses' bits are set;
//! - while few pairs are traced (one pod pair is two, its Service a few
//!   more), the entry also lists them all and answers exactly: FLOWS is
//!   never asked, for a traced packet or one `--port` leaves out;
//! - with more, FLOWS decides what passes the bits.
//!
//! Written while programs read it, so userspace changes one part at a
//! time (`widened`, then `settled`): a reader that sees half of a write
//! still answers as the old or the new entry would.
//!
//! Each family has its own entry (`TRACED_PAIRS`, `TRACED_PAIRS6`) over
//! its own key, so an IPv4 packet never pays for IPv6's wider addresses.

use crate::packet6::{fold_addr, FlowKey6};
use crate::FlowKey;

/// A pair key of either family, as the pre-filter needs it.
pub trait PairKey: Copy + Default {
    /// Each address as one word, for its bit.
    fn addr_words(&self) -> [u32; 2];
    /// Equality without a byte-wise loop.
    fn same(&self, other: &Self) -> bool;
}

impl PairKey for FlowKey {
    #[inline(always)]
    fn addr_words(&self) -> [u32; 2] {
        [u32::from_ne_bytes(self.src), u32::from_ne_bytes(self.dst)]
    }
    #[inline(always)]
    fn same(&self, other: &Self) -> bool {
        word(self) == word(other)
    }
}

impl PairKey for FlowKey6 {
    #[inline(always)]
    fn addr_words(&self) -> [u32; 2] {
        [
            u32::from_ne_bytes(fold_addr(&self.src)),
            u32::from_ne_bytes(fold_addr(&self.dst)),
        ]
    }
    #[inline(always)]
    fn same(&self, other: &Self) -> bool {
        FlowKey6::same(self, other)
    }
}

/// Pairs (one direction each) listed exactly at most.
pub const EXACT_PAIRS: usize = 8;

/// Words of the address bitmap.
pub const ADDR_BITS_WORDS: usize = 16;
const ADDR_BITS_LOG2: u32 = 10;
const _: () = assert!(ADDR_BITS_WORDS * 64 == 1 << ADDR_BITS_LOG2);

/// The traced addresses as a bitmap, one bit per address hash.
pub type AddrBits = [u64; ADDR_BITS_WORDS];

/// The one entry of `TRACED_PAIRS` (IPv4) or `TRACED_PAIRS6` (IPv6).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TracedPairsOf<K> {
    /// How many of `exact` are set, when they are every traced pair; 0:
    /// FLOWS decides what passes the bits.
    pub exact_len: u32,
    pub _pad: u32,
    pub exact: [K; EXACT_PAIRS],
    pub bits: AddrBits,
}

pub type TracedPairs = TracedPairsOf<FlowKey>;
pub type TracedPairs6 = TracedPairsOf<FlowKey6>;

impl<K: PairKey> TracedPairsOf<K> {
    /// The entry for the traced pairs `keys`: listed when they fit.
    pub fn of(keys: &[K]) -> Self {
        let mut pairs = Self::bits_only(keys);
        if keys.len() <= EXACT_PAIRS {
            pairs.exact[..keys.len()].copy_from_slice(keys);
            pairs.exact_len = keys.len() as u32;
        }
        pairs
    }

    /// The entry that lists no pair: the bits of every address of `keys`.
    pub fn bits_only<'a>(keys: impl IntoIterator<Item = &'a K>) -> Self
    where
        K: 'a,
    {
        let mut pairs = Self::default();
        for key in keys {
            for ip in key.addr_words() {
                let bit = addr_bit(ip);
                pairs.bits[bit / 64] |= 1 << (bit % 64);
            }
        }
        pairs
    }

    /// The first write of a change of pairs, over this entry: the bits of
    /// every pair traced `during` the change (old and new), and no list
    /// in use. Only the length and the bits change, so a reader that sees
    /// half of it answers as before or turns nothing traced away.
    pub fn widened<'a>(&self, during: impl IntoIterator<Item = &'a K>) -> Self
    where
        K: 'a,
    {
        Self {
            exact: self.exact,
            ..Self::bits_only(during)
        }
    }

    /// The last writes of a change, once FLOWS holds `after`: the new list
    /// and bits with the list not in use (the length stays 0), then its
    /// length alone.
    pub fn settled(after: &[K]) -> [Self; 2] {
        let wanted = Self::of(after);
        [
            Self {
                exact_len: 0,
                ..wanted
            },
            wanted,
        ]
    }

    /// Whether `key` is traced, if this entry knows (`None`: ask FLOWS).
    #[inline(always)]
    pub fn answer(&self, key: &K) -> Option<bool> {
        // The bits first: they turn an untraced packet away in a few
        // instructions, and that is most packets on a node.
        if !self.maybe(key) {
            return Some(false);
        }
        let len = self.exact_len as usize;
        if len == 0 {
            return None;
        }
        let mut i = 0;
        while i < EXACT_PAIRS {
            if i >= len {
                break;
            }
            if self.exact[i].same(key) {
                return Some(true);
            }
            i += 1;
        }
        Some(false)
    }

    /// Whether the bits of both addresses of `key` are set: `false`
    /// means the pair is not traced; `true`, that it may be.
    #[inline(always)]
    pub fn maybe(&self, key: &K) -> bool {
        let set = |ip: u32| {
            let bit = addr_bit(ip);
            self.bits[(bit / 64) % ADDR_BITS_WORDS] & (1u64 << (bit % 64)) != 0
        };
        let [src, dst] = key.addr_words();
        set(src) && set(dst)
    }
}

/// The pair as one integer, compared in one instruction.
#[inline(always)]
fn word(key: &FlowKey) -> u64 {
    u64::from(u32::from_ne_bytes(key.src)) << 32 | u64::from(u32::from_ne_bytes(key.dst))
}

/// The bit of `ip` in [`AddrBits`]: a Fibonacci hash of the address.
#[inline(always)]
fn addr_bit(ip: u32) -> usize {
    let h = ip.wrapping_mul(0x9e37_79b1);
    (h >> (32 - ADDR_BITS_LOG2)) as usize
}
