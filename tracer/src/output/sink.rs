//! What every output format implements.

use crate::{
    model::{ProbeResult, Summary},
    story::{profile::StepLatency, Story},
};

/// Where stories go, in one format.
pub trait Sink {
    /// The `n`th story told.
    fn story(&mut self, n: u64, story: &Story) -> std::io::Result<()>;
    /// The `--profile` table: per hop-to-hop step, its latency percentiles.
    fn profile(&mut self, steps: &[StepLatency]) -> std::io::Result<()>;
    fn summary(&mut self, summary: &Summary) -> std::io::Result<()>;
    /// One `--probe`'s result.
    fn probe(&mut self, probe: &ProbeResult) -> std::io::Result<()>;
    /// Hands what was written to the output: stories are buffered until
    /// their batch is told; the profile and the summary are flushed.
    fn flush(&mut self) -> std::io::Result<()>;
}
