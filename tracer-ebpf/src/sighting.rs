//! What a sighting says besides its header snapshot, written into the
//! record by one function for both programs, so that a field added to the
//! ABI is set in one place and no record leaves with stale bytes.

use podtrace_common::sighting::Sighting;

use crate::kernel::{ktime_ns, Route};

pub struct Meta {
    /// One of `sighting_kind`.
    pub kind: u8,
    /// One of `match_kind`.
    pub match_kind: u8,
    pub node_id: u32,
    pub ifindex: u32,
    pub skb_len: u32,
    pub mark: u32,
    pub location: u64,
    pub reason: u32,
    pub netns_inum: u32,
    pub direction: u8,
    pub has_l2: u8,
    pub route: Route,
    /// `Sighting::wireguard_tag`: 0 but into and out of WireGuard.
    pub wireguard_tag: u32,
}

impl Meta {
    /// Fills every field of `s` but the snapshot bytes, and stamps the time.
    #[inline(always)]
    pub fn write(&self, s: &mut Sighting, snapshot_len: u16) {
        let (fib_result, fib_ifindex, fib_nexthop) = self.route;
        s.ktime_ns = ktime_ns();
        s.location = self.location;
        s.ifindex = self.ifindex;
        s.skb_len = self.skb_len;
        s.mark = self.mark;
        s.node_id = self.node_id;
        s.reason = self.reason;
        s.netns_inum = self.netns_inum;
        s.fib_ifindex = fib_ifindex;
        s.fib_nexthop = fib_nexthop;
        s.direction = self.direction;
        s.has_l2 = self.has_l2;
        s.match_kind = self.match_kind;
        s.kind = self.kind;
        s.snapshot_len = snapshot_len;
        s.fib_result = fib_result;
        s._pad = 0;
        s.wireguard_tag = self.wireguard_tag;
    }
}
