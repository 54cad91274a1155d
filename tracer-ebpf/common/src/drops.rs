//! What the drop program (kfree_skb) needs from userspace, and how it
//! names a namespace no traced node owns.

/// `node_id` of a drop in a namespace that no traced node owns (a pod's).
pub const NODE_OTHER_NETNS: u32 = u32::MAX;

/// How many traced namespaces the drop program can tell apart.
pub const MAX_NODES: usize = 8;

/// Kernel layout the drop program needs, read from BTF by userspace (Rust
/// eBPF has no CO-RE). Byte offsets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLayout {
    pub skb_head: u32,
    pub skb_network_header: u32,
    pub skb_dev: u32,
    pub skb_len: u32,
    /// `sk_buff.tail`: where the linear data ends, as an offset from
    /// `head` (64-bit kernels). A drop's copy stops there: past it lies
    /// other memory, never the packet's.
    pub skb_tail: u32,
    pub skb_mark: u32,
    /// `sk_buff.hash`: where a WireGuard tag travels with the encrypted
    /// packet (`crate::wireguard`).
    pub skb_hash: u32,
    pub dev_ifindex: u32,
    pub dev_nd_net: u32,
    pub net_ns_inum: u32,
    /// Socket fields, to match a drop that has no IP header yet (a local
    /// sender's packet dropped before ip_queue_xmit built it). All zero
    /// when the kernel's layout could not be read: then such drops are
    /// not matched.
    pub skb_sk: u32,
    pub sk_rcv_saddr: u32,
    pub sk_daddr: u32,
    pub sk_num: u32,
    pub sk_dport: u32,
    pub sk_protocol: u32,
    pub sk_net: u32,
}
