//! The doctor's report: human (grouped by node, failing checks first,
//! then those not checked, each with its evidence and fix) or JSON (one
//! object).

use std::collections::BTreeMap;

use serde_json::json;

use super::{Check, Status};
use crate::model::Format;

/// The report on stdout; an error if stdout is gone (`| head`), as a
/// trace says it, never a panic.
pub fn print(checks: &[Check], format: Format) -> std::io::Result<()> {
    let text = match format {
        Format::Json => format!("{}\n", to_json(checks)),
        Format::Human => human(checks),
    };
    std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())
}

/// How many failed, and how many could not be checked.
fn counts(checks: &[Check]) -> (usize, usize) {
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    (count(Status::Fail), count(Status::NotChecked))
}

pub fn to_json(checks: &[Check]) -> serde_json::Value {
    let (failed, not_checked) = counts(checks);
    json!({"type": "doctor", "ok": failed == 0, "failed": failed,
        "not_checked": not_checked, "checks": checks})
}

pub fn human(checks: &[Check]) -> String {
    let mut by_node: BTreeMap<&str, Vec<&Check>> = BTreeMap::new();
    for check in checks {
        by_node.entry(check.node.as_str()).or_default().push(check);
    }
    let mut nodes: Vec<(&str, Vec<&Check>)> = by_node.into_iter().collect();
    // Nodes with failures first, then failing checks first within each,
    // then those not checked.
    nodes.sort_by_key(|(_, c)| c.iter().map(|c| c.status).min());
    let mut out = String::new();
    for (node, mut checks) in nodes {
        checks.sort_by_key(|c| c.status);
        out.push_str(&format!("{node}\n"));
        for c in checks {
            let mark = match c.status {
                Status::Pass => '✓',
                Status::Fail => '✗',
                Status::NotChecked => '-',
            };
            out.push_str(&format!(
                "  {mark} {:<10} {}: {}\n",
                c.family, c.name, c.evidence
            ));
            if let Some(fix) = &c.fix {
                out.push_str(&format!("      fix: {fix}\n"));
            }
        }
    }
    let (failed, not_checked) = counts(checks);
    out.push_str(&format!("{} checks, {failed} failed", checks.len()));
    if not_checked > 0 {
        out.push_str(&format!(", {not_checked} not checked"));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_not_made_is_neither_a_pass_nor_a_failure() {
        let checks = [
            Check::pass("kernel", "node-1", "ip_forward", "1".into()),
            Check::not_checked("kernel", "node-1", "rp_filter", "no link to watch"),
            Check::fail("kernel", "node-1", "MTU", "too big".into(), "lower".into()),
        ];
        let text = human(&checks);
        assert!(
            text.contains("  - kernel     rp_filter: not checked: no link to watch"),
            "{text}"
        );
        assert!(!text.contains("✓ kernel     rp_filter"), "{text}");
        assert!(
            text.ends_with("3 checks, 1 failed, 1 not checked\n"),
            "{text}"
        );
        let json = to_json(&checks);
        assert_eq!(json["failed"], 1);
        assert_eq!(json["not_checked"], 1);
        assert_eq!(json["checks"][1]["ok"], serde_json::Value::Null);
        assert_eq!(json["checks"][0]["ok"], true);
    }
}
