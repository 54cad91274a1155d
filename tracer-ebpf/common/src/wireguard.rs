//! Following a traced packet through WireGuard's encryption. WireGuard
//! keeps nothing of the packet readable in the UDP packet it sends, but
//! it keeps the skb's flow hash across encryption (upstream "wireguard:
//! queueing: preserve flow hash across packet scrubbing", in 5.7 and the
//! stable kernels before it), and an L4 hash also survives the UDP
//! tunnel's send. So the WireGuard device's egress hook writes a tag of
//! its own into a traced packet's hash (bpf_set_hash sets an L4 one),
//! and the underlay's egress hook knows the encrypted packet by it: the
//! kernel's own identity, not a guess by time. A pod cannot choose an
//! skb's hash, so it cannot forge one.

/// The bits of a tag that are the run's prefix, chosen at start; the
/// rest name the packet: the CPU that tagged it and that CPU's count,
/// unique among the packets in flight (a CPU would have to tag 65536
/// more before one leaves encrypted; tags older than [`TAG_LIFE_NS`]
/// are forgotten).
pub const PREFIX_MASK: u32 = 0xff00_0000;

/// How long a tag names its packet: far longer than WireGuard holds one
/// (a handshake's wait aside, microseconds), far shorter than a CPU takes
/// to count 65536 traced packets again at any rate a trace keeps.
pub const TAG_LIFE_NS: u64 = 1_000_000_000;

/// A WireGuard transport data message's type (its first byte).
pub const DATA_MESSAGE: u8 = 4;
/// Where its receiver index (little-endian u32) and counter (the nonce,
/// little-endian u64) sit in the UDP payload.
pub const RECEIVER_AT: usize = 4;
pub const COUNTER_AT: usize = 8;
/// A data message's clear header: type, reserved, receiver, counter.
pub const DATA_HEADER_LEN: usize = 16;

/// Whether an skb's `hash` may be one of this run's tags (`prefix`, 0
/// when the node has no WireGuard device): a natural hash has the prefix
/// once in 256, and the tag map then says.
#[inline(always)]
pub fn may_be_tag(hash: u32, prefix: u32) -> bool {
    prefix != 0 && hash & PREFIX_MASK == prefix
}

/// The tag under `prefix` of the `count`th packet `cpu` tagged.
#[inline(always)]
pub fn tag(prefix: u32, cpu: u32, count: u32) -> u32 {
    prefix | ((cpu & 0xff) << 16) | (count & 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_keeps_its_prefix_and_only_the_prefix_is_asked() {
        let prefix = 0xbe00_0000;
        let t = tag(prefix, 3, 0x1_5678);
        assert_eq!(t, 0xbe03_5678);
        assert_ne!(t, tag(prefix, 4, 0x5678), "another CPU's count");
        assert!(may_be_tag(t, prefix));
        assert!(!may_be_tag(0x1234_5678, prefix));
        assert!(!may_be_tag(t, 0), "no WireGuard device: nothing is a tag");
    }
}
