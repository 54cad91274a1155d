//! A stub kube-apiserver for the lab and the tests: no real one can be
//! installed here.
//!
//! It speaks the real wire format over HTTPS on a real socket, so kube-rs
//! and the real `kubectl` talk to it as to a cluster: bearer-token auth,
//! discovery (`discovery`), `GET` / `LIST` (label selectors, field
//! selectors on the fields each resource registers (`fields`), pages
//! (`paging`), server-side tables for kubectl) / `?watch=1` streams
//! (`watches`), `POST`, merge `PATCH`, `PUT` and `DELETE`, for pods,
//! nodes, services, coordination.k8s.io leases and networking.k8s.io
//! NetworkPolicies (`network_policies`), and `Status` objects
//! for 400, 401, 403, 404 and 410. It plays kubelet too (`kubelet`): a
//! pod created on a lab node runs, and its output is its log. It records
//! every request it answers (`request_log`), and can hold a busy
//! cluster's crowd of pods and Services (`crowd`).
//!
//! `xtask api-stub` runs it as a standalone server (`lab up --api`); the
//! tests start it in-process.

mod admission;
mod capability_sets;
mod container_spec;
mod crowd;
mod discovery;
mod events;
mod fields;
mod images;
mod kubelet;
mod network_policies;
mod paging;
mod request_log;
mod routes;
mod runtime;
mod selectors;
mod services;
mod store;
mod tables;
mod watches;

use std::{
    collections::{BTreeMap, HashSet},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use base64::Engine;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::broadcast;

pub use crowd::{POD_RANGE, SERVICE_RANGE};
pub use images::LAB_IMAGE;
pub use kubelet::Kubelet;
pub use request_log::ApiRequest;
pub use runtime::lab_image;
use store::Objects;

pub const TOKEN: &str = "podtrace-test-token";
/// The environment variable that sets the lab API's default Pod Security
/// level (`baseline`, `restricted`) where a namespace's label names none.
pub const POD_SECURITY_DEFAULT: &str = "POD_SECURITY_DEFAULT";

/// A change: (resourceVersion, resource, ADDED|MODIFIED|DELETED, object),
/// the object shared with the store.
pub(crate) type Change = (u64, String, String, Arc<Value>);

#[derive(Default)]
pub(crate) struct State {
    /// Objects by resource ("pods", "nodes", "services", "leases").
    pub objects: BTreeMap<String, Objects>,
    pub resource_version: u64,
    /// Oldest resourceVersion a watch may start from; older ones get 410.
    pub oldest_watchable: u64,
    pub events: Vec<Change>,
    /// (verb, resource) pairs RBAC denies.
    pub forbidden: HashSet<(String, String)>,
    /// The Pod Security level enforced where a namespace's label names
    /// none (`admission`); privileged when `None`, as kube-apiserver's
    /// default is.
    pub pod_security_default: Option<String>,
    /// (resource, field label) pairs whose field selectors are refused,
    /// as by a server older than the label ([`Stub::refuse_field_selector`]).
    pub refused_fields: HashSet<(String, String)>,
}

/// What the server's handlers share.
#[derive(Clone)]
pub(crate) struct Shared {
    pub state: Arc<Mutex<State>>,
    pub changes: broadcast::Sender<Change>,
    pub kubelet: Option<Arc<Kubelet>>,
    /// The API is lost ([`Stub::go_dark`]): every connection is cut, and
    /// new ones are closed at once. Its kubelet's agents run on.
    pub dark: Arc<tokio::sync::watch::Sender<bool>>,
    /// Every request answered ([`Stub::requests`]).
    pub requests: Arc<request_log::RequestLog>,
}

impl Shared {
    /// Records a change of `resource` and tells the watches.
    pub fn change(&self, resource: &str, kind: &str, object: Value) -> Value {
        let mut state = self.state.lock().unwrap();
        let change = record(&mut state, resource, kind, object);
        let object = Value::clone(&change.3);
        let _ = self.changes.send(change);
        object
    }
}

/// Applies a change to the store; returns it as watches see it.
pub(crate) fn record(state: &mut State, resource: &str, kind: &str, mut object: Value) -> Change {
    state.resource_version += 1;
    let rv = state.resource_version;
    object["metadata"]["resourceVersion"] = rv.to_string().into();
    if object["metadata"]["uid"].is_null() {
        object["metadata"]["uid"] = format!("uid-{rv}").into();
    }
    let object = Arc::new(object);
    let objects = state.objects.entry(resource.to_string()).or_default();
    if kind == "DELETED" {
        objects.remove(&Objects::key_of(&object));
    } else {
        objects.put(object.clone());
    }
    let change = (rv, resource.to_string(), kind.to_string(), object);
    state.events.push(change.clone());
    change
}

pub struct Stub {
    pub addr: SocketAddr,
    ca_pem: String,
    shared: Shared,
    /// Stops the server thread when the stub is dropped.
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl Stub {
    /// Registers Services and EndpointSlices (a `kubectl get
    /// svc,endpointslices -A -o json` list).
    pub fn add_services(&self, list: &Value) {
        for item in list["items"].as_array().into_iter().flatten() {
            let mut item = item.clone();
            item["metadata"]["creationTimestamp"] = kubelet::now().into();
            match item["kind"].as_str() {
                Some("Service") => {
                    services::default_service(&mut item);
                    self.shared.change("services", "ADDED", item);
                }
                Some("EndpointSlice") => {
                    // The endpoints controller mirrors each Service's slices
                    // as core/v1 Endpoints, which `kubectl describe svc` reads.
                    let endpoints = services::endpoints_of(&item);
                    self.shared.change("endpointslices", "ADDED", item);
                    if let Some(endpoints) = endpoints {
                        self.shared.change("endpoints", "ADDED", endpoints);
                    }
                }
                _ => continue,
            }
        }
    }

    /// Starts the stub on 127.0.0.1 with the given pod and node lists
    /// (`kubectl get … -o json` shape), on a runtime of its own.
    pub fn start(pods: &Value, nodes: &Value) -> Self {
        Self::serve(pods, nodes, None, 0)
    }

    /// The same, as kubelet of the lab's nodes too.
    pub fn with_kubelet(pods: &Value, nodes: &Value, kubelet: Kubelet) -> Self {
        Self::serve(pods, nodes, Some(kubelet), 0)
    }

    /// Serves on 127.0.0.1:`port` (0: any).
    pub fn serve(pods: &Value, nodes: &Value, kubelet: Option<Kubelet>, port: u16) -> Self {
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
        for (list, kind, resource) in [(pods, "Pod", "pods"), (nodes, "Node", "nodes")] {
            for item in list["items"].as_array().unwrap() {
                let mut item = item.clone();
                item["kind"] = kind.into();
                item["apiVersion"] = "v1".into();
                item["metadata"]["creationTimestamp"] = kubelet::now().into();
                record(&mut state, resource, "ADDED", item);
            }
        }
        // The namespaces every cluster has, and podtrace's as deploy/
        // creates it; where it plays kubelet, the podtrace DaemonSet of
        // deploy/ names the image its nodes hold.
        for (name, level) in [
            ("default", None),
            ("kube-system", None),
            ("podtrace", Some("privileged")),
        ] {
            record(&mut state, "namespaces", "ADDED", namespace(name, level));
        }
        if kubelet.is_some() {
            record(&mut state, "daemonsets", "ADDED", images::lab_daemonset());
        }
        state.events.clear();
        state.oldest_watchable = state.resource_version;
        let (changes, _) = broadcast::channel(1024);
        let shared = Shared {
            state: Arc::new(Mutex::new(state)),
            changes,
            kubelet: kubelet.map(Arc::new),
            dark: Arc::new(tokio::sync::watch::Sender::new(false)),
            requests: Default::default(),
        };
        let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let server = shared.clone();
        // Its own thread and runtime: the tests themselves are synchronous.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(accept(listener, acceptor, server.clone(), stop));
            if let Some(kubelet) = &server.kubelet {
                kubelet.stop_all();
            }
        });
        let stub = Self {
            addr,
            ca_pem,
            shared,
            _shutdown: shutdown,
        };
        if let Some(kubelet) = &stub.shared.kubelet {
            kubelet.set_api(stub.addr, &stub.ca_pem, TOKEN);
        }
        stub
    }

    /// The API is lost from now on: open connections (log streams,
    /// watches) are cut and new ones closed at once, while the kubelet's
    /// agents run on, as when a cluster's apiserver goes away.
    pub fn go_dark(&self) {
        self.shared.dark.send_replace(true);
    }

    /// A kubeconfig for this stub: its CA, a bearer token, a context.
    pub fn kubeconfig(&self, dir: &Path, token: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        self.kubeconfig_at(&dir.join(format!("kubeconfig-{}", rand_suffix())), token)
    }

    /// The kubeconfig written at `path`.
    pub fn kubeconfig_at(&self, path: &Path, token: &str) -> PathBuf {
        let text = kubeconfig_text(token, &self.ca_pem, &format!("https://{}", self.addr));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, text).unwrap();
        path.to_path_buf()
    }

    /// A kubeconfig with a given CA and server (TLS and reachability cases).
    pub fn kubeconfig_with(&self, dir: &Path, token: &str, ca_pem: &str, server: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join(format!("kubeconfig-{}", rand_suffix()));
        std::fs::write(&path, kubeconfig_text(token, ca_pem, server)).unwrap();
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
        self.shared
            .state
            .lock()
            .unwrap()
            .forbidden
            .insert((verb.into(), resource.into()));
    }

    /// Enforces Pod Security `level` ("baseline", "restricted") where a
    /// namespace's label names none, as a cluster configured so does.
    pub fn set_pod_security_default(&self, level: &str) {
        self.shared.state.lock().unwrap().pod_security_default = Some(level.into());
    }

    /// Adds (or replaces) namespace `name`, its Pod Security label
    /// enforcing `level` if given.
    pub fn add_namespace(&self, name: &str, level: Option<&str>) {
        self.shared
            .change("namespaces", "ADDED", namespace(name, level));
    }

    /// Adds a pod object (`v1.Pod` JSON).
    pub fn add_pod(&self, mut pod: Value) {
        pod["kind"] = "Pod".into();
        pod["apiVersion"] = "v1".into();
        self.shared.change("pods", "ADDED", pod);
    }

    /// The objects of a resource now ("pods", "leases", …).
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        let state = self.shared.state.lock().unwrap();
        let objects = state.objects.get(resource);
        objects
            .into_iter()
            .flat_map(Objects::values)
            .cloned()
            .collect()
    }

    /// How many objects of a resource there are now.
    pub fn count(&self, resource: &str) -> usize {
        let state = self.shared.state.lock().unwrap();
        state.objects.get(resource).map_or(0, Objects::len)
    }

    /// One object of a resource now, by namespace and name.
    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let state = self.shared.state.lock().unwrap();
        state.objects.get(resource)?.get(namespace, name).cloned()
    }

    /// Merges `status` into a pod's status, as its kubelet records what
    /// became of it (an eviction, an OOM kill).
    pub fn merge_pod_status(&self, namespace: &str, name: &str, status: &Value) {
        let mut pod = self.object("pods", namespace, name).expect("a stub pod");
        for (field, value) in status.as_object().into_iter().flatten() {
            pod["status"][field] = value.clone();
        }
        self.shared.change("pods", "MODIFIED", pod);
    }

    /// Sets a pod's podIP, as a recreated pod would get a new one.
    pub fn set_pod_ip(&self, namespace: &str, name: &str, ip: &str) {
        let status = json!({"podIP": ip, "podIPs": [{ "ip": ip }]});
        self.merge_pod_status(namespace, name, &status);
    }

    /// Forgets history up to now: a watch from an older resourceVersion
    /// gets 410 Gone.
    pub fn compact(&self) {
        let mut state = self.shared.state.lock().unwrap();
        state.oldest_watchable = state.resource_version;
        state.events.clear();
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        if let Some(kubelet) = &self.shared.kubelet {
            kubelet.stop_all();
        }
    }
}

async fn accept(
    listener: std::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Shared,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stop => return,
        };
        let Ok((tcp, _)) = accepted else { return };
        let (acceptor, shared) = (acceptor.clone(), shared.clone());
        tokio::spawn(async move {
            let mut dark = shared.dark.subscribe();
            if *dark.borrow() {
                return;
            }
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(routes::handle(req, &shared).await) }
            });
            let serving = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service);
            // Going dark drops the connection mid-response, as a lost
            // apiserver does.
            tokio::select! {
                _ = serving => {}
                _ = dark.wait_for(|dark| *dark) => {}
            }
        });
    }
}

/// A Namespace, labelled as deploy/ labels podtrace's when `level` is
/// given (enforce, audit and warn).
fn namespace(name: &str, level: Option<&str>) -> Value {
    let labels: serde_json::Map<String, Value> = level
        .into_iter()
        .flat_map(|level| {
            ["enforce", "audit", "warn"]
                .map(|mode| (format!("pod-security.kubernetes.io/{mode}"), level.into()))
        })
        .chain([("kubernetes.io/metadata.name".to_string(), name.into())])
        .collect();
    json!({"apiVersion": "v1", "kind": "Namespace",
           "metadata": {"name": name, "labels": labels, "creationTimestamp": kubelet::now()},
           "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
}

fn kubeconfig_text(token: &str, ca_pem: &str, server: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: stub\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: podtrace\n  user:\n    token: {token}\ncontexts:\n- name: stub\n  context:\n    cluster: stub\n    user: podtrace\n    namespace: default\ncurrent-context: stub\n"
    )
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

pub(crate) fn namespace_of(v: &Value) -> &str {
    v["metadata"]["namespace"].as_str().unwrap_or("default")
}

/// Runs the stub as a server until SIGTERM or SIGINT (`xtask api-stub`):
/// the lab's pods and nodes, a kubelet for its nodes, a kubeconfig at
/// `kubeconfig`.
pub fn serve_lab(
    lab: &crate::lab::Lab,
    podtrace: &Path,
    port: u16,
    kubeconfig: &Path,
) -> anyhow::Result<()> {
    let kubelet = Kubelet::for_lab(podtrace, lab, &lab.state_dir());
    kubelet.check_runtime()?;
    let stub = Stub::serve(&lab.pod_list(), &lab.node_list(), Some(kubelet), port);
    // A cluster that enforces a stricter Pod Security level by default, as
    // many do (`POD_SECURITY_DEFAULT=baseline cargo xtask lab up --api`).
    if let Ok(level) = std::env::var(POD_SECURITY_DEFAULT) {
        stub.set_pod_security_default(&level);
    }
    if lab.services_file().exists() {
        stub.add_services(&lab.service_list());
    }
    stub.kubeconfig_at(kubeconfig, TOKEN);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        anyhow::Ok(())
    })?;
    drop(stub);
    Ok(())
}
