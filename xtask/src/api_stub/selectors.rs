//! Label and field selectors, matched as the API server matches them
//! against an object's labels and fields.

use std::collections::HashMap;

use serde_json::Value;

use super::{fields, namespace_of};

/// Whether an object of `resource` is in `namespace` (any, when `None`)
/// and matches the query's label and field selectors (which
/// `fields::refusal` has checked).
pub(crate) fn object_matches(
    resource: &str,
    v: &Value,
    namespace: Option<&str>,
    q: &HashMap<String, String>,
) -> bool {
    namespace.is_none_or(|ns| namespace_of(v) == ns)
        // A label key is one key even with dots in it (`kubernetes.io/…`).
        && selector_matches(q.get("labelSelector"), |k| {
            v["metadata"]["labels"][k].as_str().map(str::to_string)
        })
        && selector_matches(q.get("fieldSelector"), |k| {
            Some(fields::value(resource, v, k))
        })
}

/// A label or field selector, matched against an object's labels or
/// fields: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`
/// (the last four are label-selector syntax only, but harmless on fields).
fn selector_matches(selector: Option<&String>, get: impl Fn(&str) -> Option<String>) -> bool {
    selector.is_none_or(|s| {
        selector_terms(s)
            .iter()
            .all(|term| term_matches(term, &get))
    })
}

/// The terms of a selector: split on the commas outside `( … )`.
fn selector_terms(selector: &str) -> Vec<&str> {
    let (mut terms, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(selector[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(selector[start..].trim());
    terms.retain(|t| !t.is_empty());
    terms
}

fn term_matches(term: &str, get: &impl Fn(&str) -> Option<String>) -> bool {
    let set = |list: &str| -> Vec<String> {
        list.trim()
            .trim_start_matches('(')
            .trim_end_matches(')')
            .split(',')
            .map(|v| v.trim().to_string())
            .collect()
    };
    if let Some((k, v)) = term.split_once("!=") {
        return get(k.trim()).as_deref() != Some(v.trim());
    }
    if let Some((k, v)) = term.split_once('=') {
        return get(k.trim()).as_deref() == Some(v.trim_start_matches('=').trim());
    }
    if let Some((k, list)) = term.split_once(" notin ") {
        return get(k.trim()).is_none_or(|v| !set(list).contains(&v));
    }
    if let Some((k, list)) = term.split_once(" in ") {
        return get(k.trim()).is_some_and(|v| set(list).contains(&v));
    }
    match term.strip_prefix('!') {
        Some(k) => get(k.trim()).is_none(),
        None => get(term).is_some(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labels(selector: &str) -> bool {
        let object = json!({"kubernetes.io/service-name": "db", "app": "db"});
        selector_matches(Some(&selector.to_string()), |k| {
            object[k].as_str().map(str::to_string)
        })
    }

    #[test]
    fn label_selectors_match_as_the_api_server_does() {
        assert!(labels("kubernetes.io/service-name=db"));
        assert!(labels("kubernetes.io/service-name==db,app"));
        assert!(!labels("kubernetes.io/service-name=web"));
        assert!(labels("app in (web, db),!tier"));
        assert!(!labels("app notin (db)"));
        assert!(labels("tier notin (front),app!=web"));
    }
}
