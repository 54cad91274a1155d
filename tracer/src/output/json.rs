//! The JSON lines format: one object per line, tagged with `type`
//! (`story`, `profile`, `summary`); fields are only ever added.

use std::io::Write;

use serde::Serialize;

use super::{Sink, Summary};
use crate::story::{profile::StepLatency, Story};

/// Writes stories for programs.
pub struct Json<W: Write> {
    pub out: W,
}

impl<W: Write> Sink for Json<W> {
    fn story(&mut self, _n: u64, story: &Story) -> std::io::Result<()> {
        self.line("story", story)
    }

    fn profile(&mut self, steps: &[StepLatency]) -> std::io::Result<()> {
        self.line("profile", &serde_json::json!({ "steps": steps }))
    }

    fn summary(&mut self, summary: &Summary) -> std::io::Result<()> {
        self.line("summary", summary)
    }
}

impl<W: Write> Json<W> {
    fn line<T: Serialize>(&mut self, kind: &str, value: &T) -> std::io::Result<()> {
        let mut object = serde_json::to_value(value)?;
        if let Some(map) = object.as_object_mut() {
            map.insert("type".into(), kind.into());
        }
        writeln!(self.out, "{object}")?;
        self.out.flush()
    }
}
