//! Every request the stub answers, recorded as kube-apiserver's audit log
//! records one: who asked (the user agent), the verb and resource, the
//! namespace, the list options that decide what the server must read and
//! send (selectors, limit, continue), the status, and the bytes of the
//! answer. Tests read it ([`super::Stub::requests`]) to count what a run
//! of podtrace costs the API: requests and bytes, per agent.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use http_body_util::BodyExt;
use hyper::{http::request::Parts, Response};

use super::{
    routes::{Body, Target},
    Stub,
};

impl Stub {
    /// Every request answered so far, in order: who asked, what, and what
    /// it cost (see [`ApiRequest`]).
    pub fn requests(&self) -> Vec<ApiRequest> {
        self.shared.requests.requests()
    }

    /// Forgets the requests answered so far.
    pub fn clear_requests(&self) {
        self.shared.requests.clear();
    }
}

/// One request the stub answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiRequest {
    /// The `user-agent` header, when the client sent one.
    pub user_agent: Option<String>,
    pub method: String,
    /// As RBAC and the audit log name it: get, list, watch, create,
    /// update, patch, delete; get for a path that names no resource
    /// (discovery, /version).
    pub verb: String,
    /// The resource, with its subresource ("pods", "pods/log"); empty for
    /// a path that names none.
    pub resource: String,
    /// `None` at the cluster scope.
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The URL path, without the query.
    pub path: String,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub limit: Option<u64>,
    /// The `continue` token of a list's next page.
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    /// The HTTP status of the answer.
    pub status: u16,
    /// The bytes of the answer's body sent so far: all of it once sent;
    /// for a watch or a followed log, what it has streamed until now.
    pub bytes: u64,
}

impl ApiRequest {
    /// A request as its head, its path's target and its verb tell it;
    /// the status and bytes come with the answer.
    pub(crate) fn new(
        head: &Parts,
        target: Option<&Target>,
        verb: &str,
        q: &HashMap<String, String>,
    ) -> Self {
        let header = |name: &str| {
            let value = head.headers.get(name)?;
            value.to_str().ok().map(str::to_string)
        };
        let resource = target.map_or(String::new(), |t| match t.subresource {
            Some(sub) => format!("{}/{sub}", t.resource),
            None => t.resource.to_string(),
        });
        Self {
            user_agent: header("user-agent"),
            method: head.method.to_string(),
            verb: verb.to_string(),
            resource,
            namespace: target.and_then(|t| t.namespace).map(str::to_string),
            name: target.and_then(|t| t.name).map(str::to_string),
            path: head.uri.path().to_string(),
            label_selector: q.get("labelSelector").cloned(),
            field_selector: q.get("fieldSelector").cloned(),
            limit: q.get("limit").and_then(|n| n.parse().ok()),
            continue_token: q.get("continue").cloned(),
            resource_version: q.get("resourceVersion").cloned(),
            status: 0,
            bytes: 0,
        }
    }
}

/// The requests answered so far, each with its body's byte counter.
#[derive(Default)]
pub(crate) struct RequestLog(Mutex<Vec<(ApiRequest, Arc<AtomicU64>)>>);

impl RequestLog {
    /// Records `request` as answered by `response`, whose body then
    /// counts its bytes into the record as they are sent.
    pub fn answered(&self, mut request: ApiRequest, response: Response<Body>) -> Response<Body> {
        request.status = response.status().as_u16();
        let sent = Arc::new(AtomicU64::new(0));
        self.0.lock().unwrap().push((request, sent.clone()));
        response.map(|body| {
            let counted = body.map_frame(move |frame| {
                if let Some(data) = frame.data_ref() {
                    sent.fetch_add(data.len() as u64, Ordering::Relaxed);
                }
                frame
            });
            counted.boxed()
        })
    }

    /// The requests so far, in the order they came, their bytes as of now.
    pub fn requests(&self) -> Vec<ApiRequest> {
        let log = self.0.lock().unwrap();
        let snapshot = |(request, sent): &(ApiRequest, Arc<AtomicU64>)| ApiRequest {
            bytes: sent.load(Ordering::Relaxed),
            ..request.clone()
        };
        log.iter().map(snapshot).collect()
    }

    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper::{Request, StatusCode};

    use super::*;

    #[tokio::test]
    async fn a_request_is_recorded_with_its_options_status_and_bytes() {
        let (head, _) = Request::get("/api/v1/namespaces/default/pods?limit=500")
            .header("user-agent", "podtrace/0.1")
            .body(())
            .unwrap()
            .into_parts();
        let target = Target {
            resource: "pods",
            namespace: Some("default"),
            name: None,
            subresource: None,
        };
        let q = HashMap::from([
            ("limit".to_string(), "500".to_string()),
            (
                "fieldSelector".to_string(),
                "status.podIP=10.0.0.1".to_string(),
            ),
        ]);
        let log = RequestLog::default();
        let request = ApiRequest::new(&head, Some(&target), "list", &q);
        let body = Full::new(Bytes::from_static(b"{\"items\":[]}")).boxed();
        let response = Response::builder().status(StatusCode::OK).body(body);
        let response = log.answered(request, response.unwrap());
        assert_eq!(log.requests()[0].bytes, 0, "nothing sent yet");
        let sent = response.into_body().collect().await.unwrap().to_bytes();
        let [recorded] = log.requests().try_into().unwrap();
        assert_eq!(recorded.bytes, sent.len() as u64);
        assert_eq!(recorded.user_agent.as_deref(), Some("podtrace/0.1"));
        assert_eq!(
            (recorded.verb.as_str(), recorded.resource.as_str()),
            ("list", "pods")
        );
        assert_eq!(recorded.namespace.as_deref(), Some("default"));
        assert_eq!(recorded.limit, Some(500));
        assert_eq!(
            recorded.field_selector.as_deref(),
            Some("status.podIP=10.0.0.1")
        );
        assert_eq!(recorded.status, 200);
        log.clear();
        assert!(log.requests().is_empty());
    }
}
