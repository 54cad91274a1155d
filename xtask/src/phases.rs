//! The phases of a long task (`cargo xtask test`) and what each took,
//! printed as a table at its end, passed or not: CI's time limit is the
//! sum, and the table says which phase to look at when it grows.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::Result;

#[derive(Default)]
pub struct Phases {
    took: Vec<(String, Duration, bool)>,
}

impl Phases {
    /// Runs phase `name` (`f`), timed.
    pub fn run<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let started = Instant::now();
        let result = f();
        self.took
            .push((name.to_string(), started.elapsed(), result.is_ok()));
        result
    }

    /// A line per phase that ran, with its share of the whole.
    pub fn table(&self) -> String {
        let total: Duration = self.took.iter().map(|(_, took, _)| *took).sum();
        let mut out = format!("{:<36} {:>7}  {:>7}\n", "phase", "time", "share");
        for (name, took, passed) in &self.took {
            let share = took.as_secs_f64() / total.as_secs_f64().max(f64::EPSILON) * 100.0;
            let failed = if *passed { "" } else { "  FAILED" };
            let _ = writeln!(
                out,
                "{name:<36} {:>5.0} s  {share:>5.1} %{failed}",
                took.as_secs_f64()
            );
        }
        let _ = write!(out, "{:<36} {:>5.0} s", "total", total.as_secs_f64());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_phase_is_a_line_with_its_time_and_whether_it_failed() {
        let mut phases = Phases::default();
        phases.run("house checks", || Ok(())).unwrap();
        let failed = phases.run("kernel suite", || -> Result<()> {
            anyhow::bail!("5.10 failed")
        });
        assert!(failed.is_err());
        let table = phases.table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4, "{table}");
        assert!(lines[1].starts_with("house checks") && !lines[1].contains("FAILED"));
        assert!(lines[2].starts_with("kernel suite") && lines[2].ends_with("FAILED"));
        assert!(lines[3].starts_with("total"));
    }
}
