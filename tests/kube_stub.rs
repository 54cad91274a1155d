//! A stub kube-apiserver for the tests: no real one can be installed here.
//!
//! It speaks the real wire format over HTTPS on a real socket, so kube-rs
//! talks to it as to a cluster: bearer-token auth, `GET` of one pod, node
//! or service, `LIST` of pods and nodes with label and field selectors and
//! a resourceVersion, `?watch=1` streams of ADDED / MODIFIED / DELETED /
//! BOOKMARK events (410 Gone for a stale resourceVersion), and `Status`
//! objects for 401, 403 and 404.

use std::{
    collections::{HashMap, HashSet},
    convert::Infallible,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::{body::Frame, service::service_fn, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::broadcast;

pub const TOKEN: &str = "podtrace-test-token";

type Body = BoxBody<Bytes, Infallible>;

#[derive(Default)]
struct State {
    pods: Vec<Value>,
    nodes: Vec<Value>,
    services: Vec<Value>,
    resource_version: u64,
    /// Oldest resourceVersion a watch may start from; older ones get 410.
    oldest_watchable: u64,
    /// (resourceVersion, type, object) for every pod change.
    events: Vec<(u64, String, Value)>,
    /// (verb, resource) pairs RBAC denies.
    forbidden: HashSet<(String, String)>,
}

pub struct Stub {
    pub addr: SocketAddr,
    ca_pem: String,
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<(u64, String, Value)>,
    /// Serves the stub; the server ends with it.
    /// Stops the server thread when the stub is dropped.
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl Stub {
    /// Starts the stub on 127.0.0.1 with the given pod and node lists
    /// (`kubectl get … -o json` shape), on a runtime of its own.
    pub fn start(pods: &Value, nodes: &Value) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
            .unwrap();
        let ca_pem = cert.cert.pem();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let mut state = State {
            resource_version: 100,
            oldest_watchable: 100,
            ..Default::default()
        };
        for (list, kind) in [(pods, "Pod"), (nodes, "Node")] {
            for item in list["items"].as_array().unwrap() {
                state.resource_version += 1;
                let mut item = item.clone();
                item["kind"] = kind.into();
                item["apiVersion"] = "v1".into();
                item["metadata"]["resourceVersion"] = state.resource_version.to_string().into();
                item["metadata"]["uid"] = format!("uid-{}", state.resource_version).into();
                if kind == "Pod" {
                    state.pods.push(item);
                } else {
                    state.nodes.push(item);
                }
            }
        }
        let state = Arc::new(Mutex::new(state));
        let (changes, _) = broadcast::channel(64);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (server_state, server_changes) = (state.clone(), changes.clone());
        let (shutdown, mut stop) = tokio::sync::oneshot::channel::<()>();
        // Its own thread and runtime: the tests themselves are synchronous.
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let accepted = tokio::select! {
                        accepted = listener.accept() => accepted,
                        _ = &mut stop => return,
                    };
                    let Ok((tcp, _)) = accepted else { return };
                    let (acceptor, state, changes) = (
                        acceptor.clone(),
                        server_state.clone(),
                        server_changes.clone(),
                    );
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let service = service_fn(move |req| {
                            let (state, changes) = (state.clone(), changes.clone());
                            async move { Ok::<_, Infallible>(handle(req, &state, &changes)) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    });
                }
            })
        });
        Self {
            addr,
            ca_pem,
            state,
            changes,
            _shutdown: shutdown,
        }
    }

    /// A kubeconfig for this stub: its CA, a bearer token, a context.
    pub fn kubeconfig(&self, dir: &Path, token: &str) -> PathBuf {
        self.kubeconfig_with(dir, token, &self.ca_pem, &format!("https://{}", self.addr))
    }

    /// A kubeconfig with a given CA and server (TLS and reachability cases).
    pub fn kubeconfig_with(&self, dir: &Path, token: &str, ca_pem: &str, server: &str) -> PathBuf {
        let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stub\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: podtrace\n  user:\n    token: {token}\ncontexts:\n- name: stub\n  context:\n    cluster: stub\n    user: podtrace\n    namespace: default\ncurrent-context: stub\n"
        );
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join(format!("kubeconfig-{}", rand_suffix()));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Another CA's certificate, for the TLS failure case.
    pub fn foreign_ca() -> String {
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()])
            .unwrap()
            .cert
            .pem()
    }

    /// Denies `verb` on `resource` to the test's service account.
    pub fn forbid(&self, verb: &str, resource: &str) {
        self.state
            .lock()
            .unwrap()
            .forbidden
            .insert((verb.into(), resource.into()));
    }

    /// Adds a pod object (`v1.Pod` JSON).
    pub fn add_pod(&self, pod: Value) {
        self.change("ADDED", pod);
    }

    /// Sets a pod's podIP, as a recreated pod would get a new one.
    pub fn set_pod_ip(&self, namespace: &str, name: &str, ip: &str) {
        let pod = {
            let state = self.state.lock().unwrap();
            state
                .pods
                .iter()
                .find(|p| matches_name(p, namespace, name))
                .cloned()
                .expect("a stub pod")
        };
        let mut pod = pod;
        pod["status"]["podIP"] = ip.into();
        pod["status"]["podIPs"] = json!([{ "ip": ip }]);
        self.change("MODIFIED", pod);
    }

    /// Forgets history up to now: a watch from an older resourceVersion
    /// gets 410 Gone.
    pub fn compact(&self) {
        let mut state = self.state.lock().unwrap();
        state.oldest_watchable = state.resource_version;
        state.events.clear();
    }

    fn change(&self, kind: &str, mut pod: Value) {
        let mut state = self.state.lock().unwrap();
        state.resource_version += 1;
        let rv = state.resource_version;
        pod["kind"] = "Pod".into();
        pod["apiVersion"] = "v1".into();
        pod["metadata"]["resourceVersion"] = rv.to_string().into();
        let (ns, name) = (
            namespace_of(&pod).to_string(),
            pod["metadata"]["name"].as_str().unwrap().to_string(),
        );
        state.pods.retain(|p| !matches_name(p, &ns, &name));
        if kind != "DELETED" {
            state.pods.push(pod.clone());
        }
        state.events.push((rv, kind.into(), pod.clone()));
        let _ = self.changes.send((rv, kind.into(), pod));
    }
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn namespace_of(v: &Value) -> &str {
    v["metadata"]["namespace"].as_str().unwrap_or("default")
}

fn matches_name(v: &Value, namespace: &str, name: &str) -> bool {
    namespace_of(v) == namespace && v["metadata"]["name"] == name
}

/// `a=b,c=d` selectors, matched against an object's labels or fields.
fn selector_matches(selector: Option<&String>, get: impl Fn(&str) -> Option<String>) -> bool {
    selector.is_none_or(|s| {
        s.split(',')
            .filter(|t| !t.is_empty())
            .all(|term| match term.split_once("!=") {
                Some((k, v)) => get(k).as_deref() != Some(v),
                None => {
                    let (k, v) = term.split_once('=').unwrap_or((term, ""));
                    let v = v.trim_start_matches('=');
                    get(k).as_deref() == Some(v)
                }
            })
    })
}

fn field(v: &Value, path: &str) -> Option<String> {
    let mut at = v;
    for part in path.split('.') {
        at = &at[part];
    }
    match at {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

fn object_matches(v: &Value, namespace: Option<&str>, q: &HashMap<String, String>) -> bool {
    namespace.is_none_or(|ns| namespace_of(v) == ns)
        && selector_matches(q.get("labelSelector"), |k| {
            field(&v["metadata"]["labels"], k)
        })
        && selector_matches(q.get("fieldSelector"), |k| match k {
            "metadata.namespace" => Some(namespace_of(v).to_string()),
            other => field(v, other),
        })
}

fn status(code: StatusCode, reason: &str, message: String, details: Value) -> Response<Body> {
    json_response(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details, "code": code.as_u16()
        }),
    )
}

fn json_response(code: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())).boxed())
        .unwrap()
}

fn query(req: &Request<hyper::body::Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), percent_decode(v)))
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 3 <= bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn handle(
    req: Request<hyper::body::Incoming>,
    state: &Arc<Mutex<State>>,
    changes: &broadcast::Sender<(u64, String, Value)>,
) -> Response<Body> {
    let authorized = req
        .headers()
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| h == format!("Bearer {TOKEN}"));
    if !authorized {
        return status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized".into(),
            json!({}),
        );
    }
    let path: Vec<String> = req
        .uri()
        .path()
        .trim_matches('/')
        .split('/')
        .map(str::to_string)
        .collect();
    let q = query(&req);
    let watch = matches!(q.get("watch").map(String::as_str), Some("1" | "true"));
    let parts: Vec<&str> = path.iter().map(String::as_str).collect();
    // (resource, namespace, name)
    let (resource, namespace, name) = match parts.as_slice() {
        ["version"] => {
            return json_response(
                StatusCode::OK,
                &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-podtrace-stub", "platform": "linux/amd64"}),
            )
        }
        ["api", "v1", resource] => (*resource, None, None),
        ["api", "v1", resource, name] => (*resource, None, Some(*name)),
        ["api", "v1", "namespaces", ns, resource] => (*resource, Some(*ns), None),
        ["api", "v1", "namespaces", ns, resource, name] => (*resource, Some(*ns), Some(*name)),
        _ => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource".into(),
                json!({}),
            )
        }
    };
    let verb = match (name, watch) {
        (Some(_), _) => "get",
        (None, true) => "watch",
        (None, false) => "list",
    };
    let st = state.lock().unwrap();
    if st
        .forbidden
        .contains(&(verb.to_string(), resource.to_string()))
    {
        let scope = namespace.map_or("at the cluster scope".to_string(), |ns| {
            format!("in the namespace \"{ns}\"")
        });
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "{resource} is forbidden: User \"system:serviceaccount:podtrace:podtrace\" cannot {verb} resource \"{resource}\" in API group \"\" {scope}"
            ),
            json!({"kind": resource}),
        );
    }
    let objects = match resource {
        "pods" => &st.pods,
        "nodes" => &st.nodes,
        "services" => &st.services,
        _ => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("unknown resource {resource}"),
                json!({}),
            )
        }
    };
    if let Some(name) = name {
        return match objects.iter().find(|o| {
            o["metadata"]["name"] == name && namespace.is_none_or(|ns| namespace_of(o) == ns)
        }) {
            Some(o) => json_response(StatusCode::OK, o),
            None => status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("{resource} \"{name}\" not found"),
                json!({"name": name, "kind": resource}),
            ),
        };
    }
    if !watch {
        let items: Vec<&Value> = objects
            .iter()
            .filter(|o| object_matches(o, namespace, &q))
            .collect();
        let kind = match resource {
            "pods" => "PodList",
            "nodes" => "NodeList",
            _ => "ServiceList",
        };
        return json_response(
            StatusCode::OK,
            &json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": st.resource_version.to_string()}, "items": items}),
        );
    }

    // A watch: history after resourceVersion, then live changes.
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
        let (ns, q2) = (namespace.map(str::to_string), q.clone());
        let backlog: Vec<(u64, String, Value)> = st
            .events
            .iter()
            .filter(|(rv, _, o)| *rv > since && object_matches(o, ns.as_deref(), &q2))
            .cloned()
            .collect();
        let mut live = changes.subscribe();
        let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|v| v.parse().ok())
            .unwrap_or(60u64)
            .min(60);
        let current = st.resource_version;
        tokio::spawn(async move {
            for (_, kind, object) in backlog {
                if tx
                    .send(line(json!({"type": kind, "object": object})))
                    .await
                    .is_err()
                {
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
                        let Ok((_, kind, object)) = change else { return };
                        if object_matches(&object, ns.as_deref(), &q2)
                            && tx.send(line(json!({"type": kind, "object": object}))).await.is_err()
                        {
                            return;
                        }
                    }
                    _ = &mut deadline => return,
                }
            }
        });
    }
    let body = StreamBody::new(tokio_stream_from(rx));
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(body))
        .unwrap()
}

/// An mpsc receiver as a Stream of body frames.
fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
