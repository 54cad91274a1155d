//! A list in pages, as kube-apiserver serves `limit` and `continue`:
//! items in key order (namespace/name), at most `limit` of them, and
//! while more remain an opaque `metadata.continue` token that resumes
//! after the last key, with `remainingItemCount` when the list has no
//! selector (the server counts the rest only then). A continued list
//! answers at the resourceVersion of its first page; once history up to
//! it is compacted, the token is 410 Expired. kubectl pages with
//! `--chunk-size` (500 by default), client-go's and kube-rs' lists too.

use std::{collections::HashMap, sync::Arc};

use base64::Engine;
use hyper::StatusCode;
use serde_json::{json, Value};

use super::{selectors::object_matches, store::Key, State};

/// One page: its items and the list's metadata.
pub(crate) struct Page {
    pub items: Vec<Arc<Value>>,
    /// resourceVersion, and continue (and remainingItemCount) when more remain.
    pub metadata: Value,
}

/// Why a page is refused: the Status code, reason and message.
pub(crate) type Refusal = (StatusCode, &'static str, String);

/// The page the query asks for of `resource` in `namespace` (all, when
/// `None`), or why it is refused.
pub(crate) fn page(
    state: &State,
    resource: &str,
    namespace: Option<&str>,
    q: &HashMap<String, String>,
) -> Result<Page, Refusal> {
    let limit = q
        .get("limit")
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n > 0);
    let (start, version) = match q.get("continue").filter(|t| !t.is_empty()) {
        Some(token) => {
            let (start, version) = decode(token).map_err(|why| {
                let message = format!("invalid continue token: {why}");
                (StatusCode::BAD_REQUEST, "BadRequest", message)
            })?;
            if version < state.oldest_watchable {
                return Err((StatusCode::GONE, "Expired", EXPIRED.into()));
            }
            (Some(start), version)
        }
        None => (None, state.resource_version),
    };
    let selected = q.contains_key("labelSelector") || q.contains_key("fieldSelector");
    let mut items = Vec::new();
    let (mut last, mut remaining) = (None, 0u64);
    let objects = state.objects.get(resource);
    let after = objects.into_iter().flat_map(|o| o.after(start.as_ref()));
    for (key, object) in after.filter(|(_, o)| object_matches(resource, o, namespace, q)) {
        if limit.is_some_and(|n| items.len() == n) {
            remaining += 1;
            // With a selector the server does not count the rest.
            if selected {
                break;
            }
            continue;
        }
        items.push(object.clone());
        last = Some(key);
    }
    let mut metadata = json!({"resourceVersion": version.to_string()});
    if let (Some(last), true) = (last, remaining > 0) {
        metadata["continue"] = encode(last, version).into();
        if !selected {
            metadata["remainingItemCount"] = remaining.into();
        }
    }
    Ok(Page { items, metadata })
}

const EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.";

/// The token: base64url of the resourceVersion and the key to resume
/// after, the shape the real server's tokens have.
fn encode(after: &Key, version: u64) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": version, "start": format!("{}/{}\u{0}", after.0, after.1)});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

fn decode(token: &str) -> Result<(Key, u64), String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| format!("continue key is not valid: {e}"))?;
    let token: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("continue key is not valid: {e}"))?;
    let version = token["rv"].as_u64().filter(|rv| *rv > 0);
    let start = token["start"]
        .as_str()
        .and_then(|s| s.strip_suffix('\u{0}'));
    let key = start.and_then(|s| s.split_once('/'));
    match (key, version) {
        (Some((ns, name)), Some(version)) => Ok(((ns.into(), name.into()), version)),
        _ => Err("continue key is not valid: no start key or resourceVersion".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api_stub::record;

    fn state_with_pods(n: usize) -> State {
        let mut state = State::default();
        for i in 0..n {
            let ns = if i % 2 == 0 { "a" } else { "b" };
            let pod = json!({"metadata": {"namespace": ns, "name": format!("p-{i:03}"), "labels": {"even": (i % 2 == 0).to_string()}}});
            record(&mut state, "pods", "ADDED", pod);
        }
        state
    }

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn names(page: &Page) -> Vec<String> {
        let name = |p: &Arc<Value>| {
            format!(
                "{}/{}",
                p["metadata"]["namespace"].as_str().unwrap(),
                p["metadata"]["name"].as_str().unwrap()
            )
        };
        page.items.iter().map(name).collect()
    }

    #[test]
    fn pages_cover_the_list_once_in_key_order() {
        let state = state_with_pods(25);
        let mut seen = Vec::new();
        let mut token = String::new();
        let first_version = state.resource_version.to_string();
        loop {
            let q = query(&[("limit", "10"), ("continue", &token)]);
            let page = page(&state, "pods", None, &q).unwrap_or_else(|_| panic!("a page"));
            assert!(page.items.len() <= 10);
            assert_eq!(page.metadata["resourceVersion"], first_version);
            seen.extend(names(&page));
            match page.metadata["continue"].as_str() {
                Some(next) => {
                    let left = 25 - seen.len();
                    assert_eq!(page.metadata["remainingItemCount"], left as u64);
                    token = next.to_string();
                }
                None => break,
            }
        }
        let mut sorted = seen.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(seen, sorted, "in key order, each once");
        assert_eq!(seen.len(), 25);
        assert!(seen[0].starts_with("a/") && seen[24].starts_with("b/"));
    }

    #[test]
    fn a_selected_page_has_no_remaining_count_and_a_namespace_stays_in_it() {
        let state = state_with_pods(25);
        let q = query(&[("limit", "5"), ("labelSelector", "even=true")]);
        let first = page(&state, "pods", None, &q).unwrap_or_else(|_| panic!("a page"));
        assert_eq!(first.items.len(), 5);
        assert!(first.metadata["continue"].is_string());
        assert!(first.metadata.get("remainingItemCount").is_none());
        let q = query(&[("limit", "100")]);
        let in_b = page(&state, "pods", Some("b"), &q).unwrap_or_else(|_| panic!("a page"));
        assert_eq!(in_b.items.len(), 12);
        assert!(in_b.metadata.get("continue").is_none());
    }

    #[test]
    fn a_bad_or_compacted_token_is_refused() {
        let mut state = state_with_pods(5);
        let q = query(&[("continue", "not-a-token")]);
        let bad = page(&state, "pods", None, &q).err().expect("refused");
        assert_eq!(bad.0, StatusCode::BAD_REQUEST);
        let q = query(&[("limit", "2")]);
        let first = page(&state, "pods", None, &q).unwrap_or_else(|_| panic!("a page"));
        let token = first.metadata["continue"].as_str().unwrap().to_string();
        state.oldest_watchable = state.resource_version + 1;
        let q = query(&[("limit", "2"), ("continue", &token)]);
        let gone = page(&state, "pods", None, &q).err().expect("expired");
        assert_eq!(gone.0, StatusCode::GONE);
    }
}
