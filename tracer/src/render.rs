//! Rendering stories and the closing summary, for people or for programs.
//!
//! JSON lines schema (stable; fields are only ever added):
//! - `{"type":"story", ...Story}`: one per packet; see `story::Story`.
//! - `{"type":"summary", ...Summary}`: one at exit.

use std::io::Write;

use serde::Serialize;

use crate::{
    profile::StepLatency,
    story::{Outcome, Story},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Human,
    Json,
}

/// Counts shown at exit: nothing is lost silently.
#[derive(Clone, Debug, Default, Serialize)]
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
}

pub struct Renderer<W: Write> {
    out: W,
    format: Format,
    colour: bool,
    count: u64,
}

impl<W: Write> Renderer<W> {
    pub fn new(out: W, format: Format, colour: bool) -> Self {
        Self {
            out,
            format,
            colour,
            count: 0,
        }
    }

    pub fn story(&mut self, story: &Story) -> std::io::Result<()> {
        self.count += 1;
        match self.format {
            Format::Json => self.json("story", story),
            Format::Human => {
                let text = human_story(self.count, story, self.colour);
                self.out.write_all(text.as_bytes())?;
                self.out.flush()
            }
        }
    }

    pub fn summary(&mut self, summary: &Summary) -> std::io::Result<()> {
        match self.format {
            Format::Json => self.json("summary", summary),
            Format::Human => {
                let text = human_summary(summary);
                self.out.write_all(text.as_bytes())?;
                self.out.flush()
            }
        }
    }

    /// The `--profile` table: per hop-to-hop step, its latency percentiles.
    pub fn profile(&mut self, steps: &[StepLatency]) -> std::io::Result<()> {
        match self.format {
            Format::Json => self.json("profile", &serde_json::json!({ "steps": steps })),
            Format::Human => {
                let text = human_profile(steps);
                self.out.write_all(text.as_bytes())?;
                self.out.flush()
            }
        }
    }

    fn json<T: Serialize>(&mut self, kind: &str, value: &T) -> std::io::Result<()> {
        let mut object = serde_json::to_value(value)?;
        if let Some(map) = object.as_object_mut() {
            map.insert("type".into(), kind.into());
        }
        writeln!(self.out, "{object}")?;
        self.out.flush()
    }
}

fn paint(colour: bool, code: &str, text: &str) -> String {
    if colour {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

pub fn human_story(n: u64, s: &Story, colour: bool) -> String {
    let name = |ip: std::net::Ipv4Addr, name: &Option<String>| match name {
        Some(n) => format!("{ip} ({n})"),
        None => ip.to_string(),
    };
    let mut text = format!(
        "{} {} → {}: {}, IP id {}\n",
        paint(colour, "1", &format!("#{n}")),
        name(s.src, &s.src_name),
        name(s.dst, &s.dst_name),
        s.packet,
        s.ip_id
    );
    let node_w = s.hops.iter().map(|h| h.node.len()).max().unwrap_or(0);
    let iface_w = s.hops.iter().map(|h| h.iface.len()).max().unwrap_or(0);
    for hop in &s.hops {
        let dir = hop.direction.label();
        text.push_str(&format!(
            "  {:>10.1} µs  {:node_w$}  {:iface_w$}  {dir:7}  {:>5} B  {}\n",
            hop.t_us, hop.node, hop.iface, hop.skb_len, hop.note
        ));
    }
    let code = match s.verdict.outcome {
        Outcome::Delivered { .. } => "32",
        Outcome::LeftNode { .. } => "36",
        Outcome::Vanished { .. } | Outcome::Dropped { .. } | Outcome::NoRoute { .. } => "31",
    };
    for freed in &s.freed_after_delivery {
        text.push_str(&format!(
            "  (then freed inside the pod: {} in {}; the pod's own stack, not a drop on the path)\n",
            freed.reason, freed.location
        ));
    }
    text.push_str(&format!(
        "  verdict: {}\n\n",
        paint(colour, code, &s.verdict.summary)
    ));
    text
}

pub fn human_profile(steps: &[StepLatency]) -> String {
    let from_w = steps
        .iter()
        .map(|s| s.step.from.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let to_w = steps
        .iter()
        .map(|s| s.step.to.len())
        .max()
        .unwrap_or(2)
        .max(2);
    let mut text = format!(
        "datapath profile (µs per step)\n  {:from_w$}    {:to_w$}  {:>6}  {:>8}  {:>8}  {:>8}  {:>8}\n",
        "from", "to", "count", "p50", "p90", "p99", "max"
    );
    for s in steps {
        text.push_str(&format!(
            "  {:from_w$} →  {:to_w$}  {:>6}  {:>8.1}  {:>8.1}  {:>8.1}  {:>8.1}\n",
            s.step.from, s.step.to, s.count, s.p50_us, s.p90_us, s.p99_us, s.max_us
        ));
    }
    text.push('\n');
    text
}

pub fn human_summary(s: &Summary) -> String {
    format!(
        "podtrace: {} stories from {} sightings on {} hooks; lost: {} (ring buffer full), {} (header copy failed); undecodable: {}; on unknown interfaces: {}; interfaces vanished: {}, added: {}\n",
        s.stories,
        s.sightings,
        s.hooks_attached,
        s.lost_ringbuf_full,
        s.lost_snapshot,
        s.undecodable,
        s.unknown_interface,
        s.interfaces_vanished,
        s.interfaces_added
    )
}
