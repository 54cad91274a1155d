//! `cargo xtask bench`'s figures against the baseline committed in the
//! repository (`xtask/bench-baseline.jsonl`): the bench's tests hand
//! each figure over as a JSON line (`{"name","value","unit","better"}`,
//! in the file `PODTRACE_BENCH_FIGURES` names), and this compares them
//! and marks what moved by more than [`MOVED`].

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anyhow::{Context, Result};
use serde_json::Value;

/// A change past this share of the baseline is marked.
pub const MOVED: f64 = 0.10;

/// Where the baseline lives, from the workspace root.
pub const BASELINE: &str = "xtask/bench-baseline.jsonl";

/// One measured figure.
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    pub name: String,
    pub value: f64,
    pub unit: String,
    /// Whether a lower value is the better one (ns, CPU, bytes); else a
    /// higher one is (throughput).
    pub lower_is_better: bool,
}

impl Figure {
    fn from_json(line: &str) -> Option<Self> {
        let v: Value = serde_json::from_str(line).ok()?;
        Some(Figure {
            name: v["name"].as_str()?.to_string(),
            value: v["value"].as_f64()?,
            unit: v["unit"].as_str().unwrap_or_default().to_string(),
            lower_is_better: v["better"] != "higher",
        })
    }

    fn to_json(&self) -> String {
        let better = if self.lower_is_better {
            "lower"
        } else {
            "higher"
        };
        serde_json::json!({"name": self.name, "value": self.value, "unit": self.unit, "better": better})
            .to_string()
    }
}

/// The figures of a file of JSON lines; a missing file has none. The last
/// of several figures of one name counts.
pub fn read(path: &Path) -> Result<Vec<Figure>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut by_name = BTreeMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let figure = Figure::from_json(line)
            .with_context(|| format!("{}:{}: not a bench figure", path.display(), i + 1))?;
        by_name.insert(figure.name.clone(), figure);
    }
    Ok(by_name.into_values().collect())
}

/// Writes `figures` as the baseline at `path`.
pub fn write(path: &Path, figures: &[Figure]) -> Result<()> {
    let text: String = figures.iter().map(|f| f.to_json() + "\n").collect();
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// How a figure stands against its baseline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Standing {
    /// No baseline figure of that name.
    New,
    Steady,
    Better,
    Worse,
}

/// A figure beside its baseline: (figure, baseline value, standing).
pub fn compare(baseline: &[Figure], now: &[Figure]) -> Vec<(Figure, Option<f64>, Standing)> {
    let before: BTreeMap<&str, f64> = baseline
        .iter()
        .map(|f| (f.name.as_str(), f.value))
        .collect();
    now.iter()
        .map(|figure| {
            let base = before.get(figure.name.as_str()).copied();
            let standing = match base {
                None => Standing::New,
                Some(base) => standing(figure, base),
            };
            (figure.clone(), base, standing)
        })
        .collect()
}

fn standing(figure: &Figure, base: f64) -> Standing {
    let change = relative_change(figure.value, base);
    if change.abs() <= MOVED {
        return Standing::Steady;
    }
    if (change < 0.0) == figure.lower_is_better {
        Standing::Better
    } else {
        Standing::Worse
    }
}

/// (now − base) / base; a move from 0 counts as whole.
fn relative_change(now: f64, base: f64) -> f64 {
    if base == 0.0 {
        if now == 0.0 {
            0.0
        } else {
            now.signum()
        }
    } else {
        (now - base) / base.abs()
    }
}

/// The comparison as a table, a line per figure, and the baseline's
/// figures that were not measured this time.
pub fn render(baseline: &[Figure], now: &[Figure]) -> String {
    let mut out = format!(
        "bench figures against {BASELINE} (marked: moved more than {:.0} %)\n",
        MOVED * 100.0
    );
    for (figure, base, standing) in compare(baseline, now) {
        let mark = match standing {
            Standing::New => "  new",
            Standing::Steady => "     ",
            Standing::Better => "  BETTER",
            Standing::Worse => "  WORSE",
        };
        let was = base.map_or_else(String::new, |b| {
            format!(
                " (baseline {}, {:+.0} %)",
                number(b),
                relative_change(figure.value, b) * 100.0
            )
        });
        let _ = writeln!(
            out,
            "  {:<60} {:>10} {:<7}{was}{mark}",
            figure.name,
            number(figure.value),
            figure.unit
        );
    }
    let measured: Vec<&str> = now.iter().map(|f| f.name.as_str()).collect();
    for gone in baseline
        .iter()
        .filter(|f| !measured.contains(&f.name.as_str()))
    {
        let _ = writeln!(out, "  {:<60} not measured this time", gone.name);
    }
    out
}

fn number(value: f64) -> String {
    if value.abs() >= 100.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figure(name: &str, value: f64, lower_is_better: bool) -> Figure {
        Figure {
            name: name.into(),
            value,
            unit: "ns/run".into(),
            lower_is_better,
        }
    }

    #[test]
    fn a_figure_that_moved_past_ten_percent_is_marked_by_which_way_is_better() {
        let baseline = [
            figure("kernel/trace/untraced-ipv4/podtrace_egress", 30.0, true),
            figure("line-rate/other-pair ratio", 0.95, false),
            figure("kernel/profile/traced/podtrace_egress", 110.0, true),
            figure("gone", 1.0, true),
        ];
        let now = [
            figure("kernel/trace/untraced-ipv4/podtrace_egress", 34.0, true),
            figure("line-rate/other-pair ratio", 0.80, false),
            figure("kernel/profile/traced/podtrace_egress", 112.0, true),
            figure("added", 5.0, true),
        ];
        let standings: Vec<Standing> = compare(&baseline, &now).iter().map(|r| r.2).collect();
        assert_eq!(
            standings,
            [
                Standing::Worse,
                Standing::Worse,
                Standing::Steady,
                Standing::New
            ]
        );
        let faster = [figure(
            "kernel/trace/untraced-ipv4/podtrace_egress",
            20.0,
            true,
        )];
        assert_eq!(compare(&baseline, &faster)[0].2, Standing::Better);
        let table = render(&baseline, &now);
        assert!(
            table.contains("WORSE") && table.contains("+13 %"),
            "{table}"
        );
        assert!(
            table.contains("gone") && table.contains("not measured"),
            "{table}"
        );
    }

    #[test]
    fn figures_read_back_as_written_the_last_of_a_name_counting() {
        let dir = std::env::temp_dir().join(format!("bench-figures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("figures.jsonl");
        let figures = [figure("a", 1.5, true), figure("b", 0.9, false)];
        write(&path, &figures).unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap();
        text += &figure("a", 2.5, true).to_json();
        std::fs::write(&path, text).unwrap();
        let read_back = read(&path).unwrap();
        assert_eq!(read_back, [figure("a", 2.5, true), figure("b", 0.9, false)]);
        assert!(read(&dir.join("none")).unwrap().is_empty());
        std::fs::write(&path, "not json\n").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains("figures.jsonl:1: not a bench figure"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
