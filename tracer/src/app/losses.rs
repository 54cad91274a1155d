//! Kernel losses as they happen: the probes' counters are read on every
//! tick, a rise becomes a loss window for the correlator (so the stories
//! of packets in flight then say they may have gaps), and stderr hears of
//! it at most once a second.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::traced::TracedNode;

/// How often the loss is said on stderr, at most.
const REPORT_EVERY: Duration = Duration::from_secs(1);

pub(super) struct LossWatch {
    /// Per node: records lost so far (ring buffer full, header copy failed).
    seen: Vec<u64>,
    /// Kernel time of the last reading.
    read_at_ns: u64,
    /// Lost since the last line on stderr, per node name.
    unreported: Vec<u64>,
    reported_at: Instant,
    /// Whether a ring buffer was ever full (the loss advice is for that,
    /// not for headers that could not be copied).
    ring_was_full: bool,
    /// Whether stderr was told how to lose less (once is enough).
    advised: bool,
}

impl LossWatch {
    pub fn new(nodes: &[TracedNode], now_ns: u64) -> Self {
        Self {
            seen: vec![0; nodes.len()],
            read_at_ns: now_ns,
            unreported: vec![0; nodes.len()],
            reported_at: Instant::now(),
            ring_was_full: false,
            advised: false,
        }
    }

    /// Reads the counters; any rise since the last reading is a loss
    /// window in (last reading, now], returned with how many were lost.
    pub fn check(&mut self, nodes: &[TracedNode], now_ns: u64) -> Result<Option<(u64, u64, u64)>> {
        let mut lost_now = 0;
        for (i, node) in nodes.iter().enumerate() {
            let (ring_full, snapshot) = node.probe.losses()?;
            self.ring_was_full |= ring_full > 0;
            let total = ring_full + snapshot;
            if total > self.seen[i] {
                self.unreported[i] += total - self.seen[i];
                lost_now += total - self.seen[i];
                self.seen[i] = total;
            }
        }
        let window = (lost_now > 0).then_some((self.read_at_ns, now_ns, lost_now));
        self.read_at_ns = now_ns;
        if self.unreported.iter().any(|n| *n > 0) && self.reported_at.elapsed() >= REPORT_EVERY {
            self.report(nodes);
        }
        Ok(window)
    }

    fn report(&mut self, nodes: &[TracedNode]) {
        let elapsed = self.reported_at.elapsed().as_secs_f64();
        for (node, lost) in nodes.iter().zip(&mut self.unreported) {
            if *lost > 0 {
                eprintln!(
                    "podtrace: {}: {lost} records lost in the last {elapsed:.1} s (ring buffer full); stories of packets in flight then are marked incomplete",
                    node.name
                );
                *lost = 0;
            }
        }
        if self.ring_was_full && !self.advised {
            eprintln!("{}", crate::model::KEEP_UP);
            self.advised = true;
        }
        self.reported_at = Instant::now();
    }
}
