//! The JSON lines format: one object per line, tagged with `type`
//! (`story`, `profile`, `probe`, `summary`) first; fields are only ever added.

use std::io::Write;

use serde::Serialize;

use super::sink::Sink;
use crate::model::{ProbeResult, Summary};
use crate::story::{profile::StepLatency, Story};

/// Writes stories for programs.
pub struct Json<W: Write> {
    out: W,
    /// One line, serialized here first and handed to `out` whole: serde
    /// writes a story in hundreds of small pieces, each a call through
    /// `out` otherwise.
    line: Vec<u8>,
}

impl<W: Write> Json<W> {
    pub fn new(out: W) -> Self {
        Json {
            out,
            line: Vec::with_capacity(4096),
        }
    }
}

/// A line's object: its `type`, then the value's own fields, serialized
/// straight to the output (no `serde_json::Value` built on the way, which
/// cost an allocation per field of every story).
#[derive(Serialize)]
struct Tagged<'a, T: Serialize> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(flatten)]
    value: &'a T,
}

/// A `profile` line's fields (`podtrace schema` names them from here).
#[derive(Serialize, schemars::JsonSchema)]
pub(super) struct Steps<'a> {
    steps: &'a [StepLatency],
}

impl<W: Write> Sink for Json<W> {
    fn story(&mut self, _n: u64, story: &Story) -> std::io::Result<()> {
        self.line("story", story)
    }

    fn profile(&mut self, steps: &[StepLatency]) -> std::io::Result<()> {
        self.line("profile", &Steps { steps })?;
        self.out.flush()
    }

    fn summary(&mut self, summary: &Summary) -> std::io::Result<()> {
        self.line("summary", summary)?;
        self.out.flush()
    }

    fn probe(&mut self, probe: &ProbeResult) -> std::io::Result<()> {
        self.line("probe", probe)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

impl<W: Write> Json<W> {
    fn line<T: Serialize>(&mut self, kind: &str, value: &T) -> std::io::Result<()> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, &Tagged { kind, value })?;
        self.line.push(b'\n');
        self.out.write_all(&self.line)
    }
}
