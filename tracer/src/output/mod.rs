//! Writing stories, the profile and the closing summary: one file per
//! format (`human`, `json`), each a [`Sink`]; and the traced packets for
//! Wireshark (`pcapng`, read back by `pcapng_read`).
//!
//! JSON lines schema (stable; fields are only ever added):
//! - `{"type":"story", ...Story}`: one per packet; see `story::Story`.
//! - `{"type":"profile", "steps": [...]}`: with `--profile`, at exit.
//! - `{"type":"summary", ...Summary}`: one at exit.

mod human;
mod json;
pub mod pcapng;
pub mod pcapng_read;
pub mod plot;

use std::io::Write;

use serde::{Deserialize, Serialize};

pub use human::{human_profile, human_story, human_summary, Human};
pub use json::Json;

use crate::story::{profile::StepLatency, Story};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Human,
    Json,
}

/// What to do about records lost to a full ring buffer: said on stderr
/// at the first loss, and in the summary.
pub const KEEP_UP: &str = "podtrace: to lose nothing at this rate: --sample N (one packet in N, every hop of it kept), or a larger --ring-buffer (16MiB by default)";

/// Counts shown at exit: nothing is lost silently.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// Traced interfaces that vanished during the trace.
    pub interfaces_vanished: u64,
    /// Interfaces that appeared during the trace and were attached.
    pub interfaces_added: u64,
    pub hooks_attached: usize,
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
    /// Cluster mode: the cluster's nodes that were not traced.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub untraced_nodes: Vec<String>,
}

/// A kernel, and what it lacks that podtrace worked around.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KernelSummary {
    /// `uname -r`.
    pub release: String,
    /// Each: what podtrace does instead, and the version that brings the
    /// feature (`clsact instead of TCX (needs 6.6)`).
    pub degraded: Vec<String>,
}

fn all_told(sample: &u32) -> bool {
    *sample <= 1
}

/// One traced node's part of a cluster-mode summary.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
}

/// Where stories go, in one format.
pub trait Sink {
    /// The `n`th story told.
    fn story(&mut self, n: u64, story: &Story) -> std::io::Result<()>;
    /// The `--profile` table: per hop-to-hop step, its latency percentiles.
    fn profile(&mut self, steps: &[StepLatency]) -> std::io::Result<()>;
    fn summary(&mut self, summary: &Summary) -> std::io::Result<()>;
    /// Hands what was written to the output: stories are buffered until
    /// their batch is told; the profile and the summary are flushed.
    fn flush(&mut self) -> std::io::Result<()>;
}

/// The sink for `format`, writing to `out`.
pub fn sink<'a, W: Write + 'a>(format: Format, out: W, colour: bool) -> Box<dyn Sink + 'a> {
    match format {
        Format::Human => Box::new(Human { out, colour }),
        Format::Json => Box::new(Json::new(out)),
    }
}
