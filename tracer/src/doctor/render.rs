//! The doctor's report: human (grouped by node, failing checks first,
//! each with its evidence and fix) or JSON (one object).

use std::collections::BTreeMap;

use serde_json::json;

use super::Check;
use crate::model::Format;

pub fn print(checks: &[Check], format: Format) {
    match format {
        Format::Json => println!("{}", to_json(checks)),
        Format::Human => print!("{}", human(checks)),
    }
}

pub fn to_json(checks: &[Check]) -> serde_json::Value {
    let failed = checks.iter().filter(|c| !c.ok).count();
    json!({"type": "doctor", "ok": failed == 0, "failed": failed, "checks": checks})
}

pub fn human(checks: &[Check]) -> String {
    let mut by_node: BTreeMap<&str, Vec<&Check>> = BTreeMap::new();
    for check in checks {
        by_node.entry(check.node.as_str()).or_default().push(check);
    }
    let mut nodes: Vec<(&str, Vec<&Check>)> = by_node.into_iter().collect();
    // Nodes with failures first, then failing checks first within each.
    nodes.sort_by_key(|(_, c)| c.iter().all(|c| c.ok));
    let mut out = String::new();
    for (node, mut checks) in nodes {
        checks.sort_by_key(|c| c.ok);
        out.push_str(&format!("{node}\n"));
        for c in checks {
            let mark = if c.ok { '✓' } else { '✗' };
            out.push_str(&format!(
                "  {mark} {:<10} {}: {}\n",
                c.family, c.name, c.evidence
            ));
            if let Some(fix) = &c.fix {
                out.push_str(&format!("      fix: {fix}\n"));
            }
        }
    }
    let failed = checks.iter().filter(|c| !c.ok).count();
    out.push_str(&format!("{} checks, {failed} failed\n", checks.len()));
    out
}
