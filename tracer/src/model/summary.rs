//! The counts shown at exit, for every output and the wire alike.

use serde::{Deserialize, Serialize};

/// What to do about records lost to a full ring buffer: said on stderr
/// at the first loss, and in the summary.
pub const KEEP_UP: &str = "podtrace: to lose nothing at this rate: --sample N (one packet in N, every hop of it kept), or a larger --ring-buffer (16MiB by default)";

/// Counts shown at exit: nothing is lost silently.
#[derive(Clone, Debug, Default, PartialEq, Serialize, schemars::JsonSchema, Deserialize)]
#[serde(default)]
pub struct Summary {
    pub sightings: u64,
    pub stories: u64,
    /// Matching packets the kernel could not report: the ring buffer was full.
    pub lost_ringbuf_full: u64,
    /// Matching packets whose headers could not be copied.
    pub lost_snapshot: u64,
    /// Sightings whose headers could not be decoded.
    pub undecodable: u64,
    /// Sightings on an interface podtrace does not know.
    pub unknown_interface: u64,
    /// Tunnel packets between two traced addresses (nodes' own) carrying
    /// other pairs' packets: left out in the kernel, one per hook crossed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub other_pairs_encapsulated: u64,
    /// Drops of the traced addresses in namespaces that are neither a
    /// traced node's nor behind a traced pod's veth: a router or another
    /// namespace on the host that the packets crossed, or a duplicate
    /// address (another cluster or lab on the host). Left out of the
    /// stories: podtrace cannot tell which.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drops_elsewhere: u64,
    /// Drops of the traced addresses where the kernel knew no network
    /// namespace (no device: a socket's queue freed as it closed, a reply
    /// it never read): no hop of a path, left out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drops_without_netns: u64,
    /// UDP packets WireGuard sent with a traced packet inside that no
    /// story tells: the plaintext's sighting was lost, or the packet was
    /// segmented and its story tells the first segment's leg.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wireguard_legs_untold: u64,
    /// Traced interfaces that vanished during the trace.
    pub interfaces_vanished: u64,
    /// Interfaces that appeared during the trace and were attached.
    pub interfaces_added: u64,
    pub hooks_attached: usize,
    /// Stories of the traced pair that a filter left untold (`--probe`:
    /// the pair's traffic other than the probes').
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_by_filter: u64,
    /// `--proto`/`--port`: sightings of the traced pairs the kernel left
    /// out (one per hook a packet crossed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub filtered_in_kernel: u64,
    /// `--sample N`: one traced packet in N was told (absent: all).
    #[serde(skip_serializing_if = "all_told")]
    pub sample: u32,
    /// Cluster mode: records the agents could not queue for output.
    pub lost_agent: u64,
    /// Cluster mode: records lost between the agents and the front-end.
    pub lost_transport: u64,
    /// Cluster mode: each traced node's counts.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeCounts>,
    /// The kernel traced on, and what podtrace did without there (node
    /// mode; cluster mode has each node's in `nodes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelSummary>,
    /// Node mode: each traced node's conntrack over the run (its failure
    /// counters' growth, its table's fill at the end).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conntrack: Vec<super::conntrack::ConntrackRun>,
    /// Cluster mode: the cluster's nodes that were not traced.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub untraced_nodes: Vec<String>,
    /// Each packet too big for its path: what its sender sent next on
    /// the same flow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pmtu_after: Vec<SenderAfterPmtu>,
}

/// After a packet too big for its path, its sender's next packet of the
/// same flow: whether the path MTU the kernel's error told it lowered
/// its size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct SenderAfterPmtu {
    /// `10.244.1.2 → 10.244.2.3 TCP 40000 → 5201`, `… echo id 7`.
    pub flow: String,
    /// The story of the packet too big.
    pub story: u64,
    /// Its IP length.
    pub size: u16,
    /// The MTU the kernel's error told its sender, where one was seen.
    pub mtu: Option<u32>,
    /// Whether that error reached the sender's pod.
    pub error_reached_sender: bool,
    #[serde(flatten)]
    pub next: NextPacket,
}

impl SenderAfterPmtu {
    /// One line: the packet too big, its error, and what the sender did.
    pub fn words(&self) -> String {
        let error = match (self.mtu, self.error_reached_sender) {
            (Some(mtu), true) => format!("the kernel's error (MTU {mtu}) reached the sender"),
            (Some(mtu), false) => {
                format!("the kernel's error (MTU {mtu}) never reached the sender")
            }
            (None, _) => "no error about it was seen".to_string(),
        };
        let next = match self.next {
            NextPacket::Lowered {
                next_size,
                next_story,
            } => format!("its next packet (#{next_story}) was {next_size} B: it lowered its size"),
            NextPacket::KeptTooBig {
                next_size,
                next_story,
            } => format!(
                "its next packet (#{next_story}) was {next_size} B, too big again: it did not learn the path MTU"
            ),
            NextPacket::NoneSeen => "no later packet of the flow was seen".to_string(),
        };
        format!(
            "PMTU after #{} ({}, {} B): {error}, and {next}",
            self.story, self.flow, self.size
        )
    }
}

/// What the sender sent next on the flow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
#[serde(tag = "sender", rename_all = "snake_case")]
pub enum NextPacket {
    /// Its next packet fit the path (the MTU told, else smaller than the
    /// packet dropped): it learnt the path MTU.
    Lowered { next_size: u16, next_story: u64 },
    /// Its next packet was too big again: it did not learn the path MTU.
    KeptTooBig { next_size: u16, next_story: u64 },
    /// No later packet of the flow was seen (a sender that learnt the MTU
    /// and still asks to send too big fails locally, with EMSGSIZE, and
    /// sends nothing).
    NoneSeen,
}

/// A kernel, and what it lacks that podtrace worked around.
#[derive(Clone, Debug, Default, PartialEq, Serialize, schemars::JsonSchema, Deserialize)]
#[serde(default)]
pub struct KernelSummary {
    /// `uname -r`.
    pub release: String,
    /// Each: what podtrace does instead, and the version that brings the
    /// feature (`clsact instead of TCX (needs 6.6)`).
    pub degraded: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn all_told(sample: &u32) -> bool {
    *sample <= 1
}

/// One traced node's part of a cluster-mode summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct NodeCounts {
    pub node: String,
    /// The agent pod.
    pub agent: String,
    pub sightings: u64,
    /// Ring buffer full or header copy failed.
    pub lost_kernel: u64,
    pub lost_agent: u64,
    pub lost_transport: u64,
    /// Its clock against the common timeline ("+3000000.0 µs ±11.0 µs").
    pub clock: Option<String>,
    /// Its kernel, and what podtrace did without there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelSummary>,
    /// Its agent was lost mid-trace: what became of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<String>,
}
