//! Watches: the history after the asked resourceVersion (410 Gone when
//! it is compacted), a bookmark, then live changes, one JSON line each,
//! until the timeout; a watcher too slow for the changes is ended, as
//! the real server ends one, and lists again.

use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::{body::Frame, Response, StatusCode};
use serde_json::{json, Value};

use super::{
    routes::{refused_fields, stream_of, Body, Target},
    selectors::object_matches,
    Shared,
};

/// A watch: history after resourceVersion, then live changes.
pub(crate) fn watch(shared: &Shared, t: &Target, q: &HashMap<String, String>) -> Response<Body> {
    let st = shared.state.lock().unwrap();
    if let Some(refused) = refused_fields(&st, t, q) {
        return refused;
    }
    let since: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(st.resource_version);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(64);
    let line = |v: Value| Ok(Frame::data(Bytes::from(format!("{v}\n"))));
    if since < st.oldest_watchable {
        let gone = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("too old resource version: {since} ({})", st.oldest_watchable), "reason": "Expired", "code": 410}});
        let _ = tx.try_send(line(gone));
    } else {
        let (resource, ns, q2) = (
            t.resource.to_string(),
            t.namespace.map(str::to_string),
            q.clone(),
        );
        let backlog: Vec<(String, Arc<Value>)> = st
            .events
            .iter()
            .filter(|(rv, r, _, o)| {
                *rv > since && *r == resource && object_matches(r, o, ns.as_deref(), &q2)
            })
            .map(|(_, _, kind, o)| (kind.clone(), o.clone()))
            .collect();
        let mut live = shared.changes.subscribe();
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(60u64)
            .min(60);
        let current = st.resource_version;
        tokio::spawn(async move {
            for (kind, object) in backlog {
                if tx.send(event(&kind, &object)).await.is_err() {
                    return;
                }
            }
            if bookmarks {
                let mark = json!({"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": current.to_string()}}});
                let _ = tx.send(line(mark)).await;
            }
            let deadline = tokio::time::sleep(Duration::from_secs(timeout));
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    change = live.recv() => {
                        let Ok((_, r, kind, object)) = change else { return };
                        if r == resource && object_matches(&r, &object, ns.as_deref(), &q2)
                            && tx.send(event(&kind, &object)).await.is_err()
                        {
                            return;
                        }
                    }
                    _ = &mut deadline => return,
                }
            }
        });
    }
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(StreamBody::new(stream_of(rx))))
        .unwrap()
}

/// A watch event's line, the object written as it is stored.
fn event(kind: &str, object: &Value) -> Result<Frame<Bytes>, Infallible> {
    let line = format!("{{\"type\":\"{kind}\",\"object\":{object}}}\n");
    Ok(Frame::data(Bytes::from(line)))
}
