//! The stub's kubelet: a pod created with `nodeName` set to a lab node
//! runs there as a real container, through Debian's runc
//! ([`runtime`](super::runtime)), from the Pod spec as written
//! ([`container_spec`](super::container_spec)): the agent image built from
//! the podtrace the lab was given, the pod's command, capabilities,
//! hostNetwork (its lab node's network namespace), hostPID, hostPath
//! mounts (the node's `/` is the lab node's host-root directory), a
//! default seccomp profile and the node runtime's memlock limit. A field
//! it cannot honour fails the pod with a message naming it, as does a
//! runtime that cannot run (runc missing, the image not built). The
//! container's stdout and stderr are the pod's log. Pending → Running →
//! Succeeded / Failed; deleting the pod sends SIGTERM (runc kill), then
//! SIGKILL after the grace period, and the pod goes once its container
//! has, its bundle removed.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use super::{
    container_spec,
    runtime::{Api, Runtime},
    store::Objects,
    Shared,
};
use crate::lab::Lab;

/// A pod's log so far, and whether its process has ended.
#[derive(Default)]
pub struct LogBuffer {
    pub data: Vec<u8>,
    pub done: bool,
}

type PodKey = (String, String);
type SharedLog = Arc<Mutex<LogBuffer>>;

/// Where a lab node's containers run: its network namespace, and the
/// directory that stands for its root filesystem.
pub struct LabNode {
    pub netns: String,
    pub root: PathBuf,
}

pub struct Kubelet {
    /// Lab node name → where it is.
    nodes: HashMap<String, LabNode>,
    pub state_dir: PathBuf,
    runtime: Runtime,
    /// (namespace, name) → its log, and `runc run`'s process while its
    /// container runs.
    pods: Mutex<HashMap<PodKey, (SharedLog, Option<u32>)>>,
}

impl Kubelet {
    pub fn new(podtrace: &Path, nodes: HashMap<String, LabNode>, state_dir: &Path) -> Self {
        Self {
            nodes,
            state_dir: state_dir.into(),
            runtime: Runtime::new(podtrace, &state_dir.join("runtime")),
            pods: Mutex::new(HashMap::new()),
        }
    }

    /// The kubelet of every node of `lab`.
    pub fn for_lab(podtrace: &Path, lab: &Lab, state_dir: &Path) -> Self {
        let nodes = lab
            .nodes()
            .map(|n| {
                let node = LabNode {
                    netns: lab.node_netns(n),
                    root: lab.host_root(n),
                };
                (Lab::node_name(n), node)
            })
            .collect();
        Self::new(podtrace, nodes, state_dir)
    }

    /// Where containers reach the API, with the service account's token.
    pub(crate) fn set_api(&self, addr: std::net::SocketAddr, ca_pem: &str, token: &str) {
        *self.runtime.api.lock().unwrap() = Some(Api {
            addr,
            ca_pem: ca_pem.into(),
            token: token.into(),
        });
    }

    /// Fails unless containers can run (runc, the image): the stub says
    /// so before any pod does.
    pub fn check_runtime(&self) -> anyhow::Result<()> {
        self.runtime
            .images()
            .map(|_| ())
            .map_err(anyhow::Error::msg)
    }

    /// The pod's log, once its container was started.
    pub(crate) fn log(&self, pod: &Value) -> Option<Arc<Mutex<LogBuffer>>> {
        let pods = self.pods.lock().unwrap();
        pods.get(&Objects::key_of(pod)).map(|(log, _)| log.clone())
    }

    /// Starts a new pod's container, if it is for a lab node.
    pub(crate) fn run(self: &Arc<Self>, shared: &Shared, pod: &Value) {
        if !super::images::pulled(shared, pod) {
            return;
        }
        let Some(node) = pod["spec"]["nodeName"]
            .as_str()
            .and_then(|n| self.nodes.get(n))
        else {
            return;
        };
        let spec = match container_spec::from_pod(pod, &node.root) {
            Ok(spec) => spec,
            Err(why) => {
                set_phase(shared, pod, "Failed", Some(&why));
                return;
            }
        };
        let (kubelet, shared, pod) = (self.clone(), shared.clone(), pod.clone());
        let netns = node.netns.clone();
        tokio::spawn(async move {
            if let Err(why) = kubelet.start(&shared, &pod, spec, netns).await {
                eprintln!("kubelet: pod {}: {why}", pod["metadata"]["name"]);
                set_phase(&shared, &pod, "Failed", Some(&why));
            }
        });
    }

    /// Creates the container (off the runtime's threads: the first one
    /// unpacks the image) and runs it; its output becomes the log.
    async fn start(
        self: &Arc<Self>,
        shared: &Shared,
        pod: &Value,
        mut spec: container_spec::ContainerSpec,
        netns: String,
    ) -> Result<(), String> {
        let id = container_id(&Objects::key_of(pod));
        let host_network = spec.host_network;
        let (kubelet, made_id, made_netns) = (self.clone(), id.clone(), netns.clone());
        let mut command = tokio::task::spawn_blocking(move || {
            kubelet.runtime.create(&made_id, &mut spec, &made_netns)
        })
        .await
        .map_err(|e| e.to_string())??;
        if host_network {
            self.runtime.open_api_in(&netns).await?;
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .map_err(|e| format!("cannot run runc: {e}"))?;
        let log = Arc::new(Mutex::new(LogBuffer::default()));
        self.pods
            .lock()
            .unwrap()
            .insert(Objects::key_of(pod), (log.clone(), child.id()));
        let running = set_phase(shared, pod, "Running", None);
        if let Some(deadline) = pod["spec"]["activeDeadlineSeconds"].as_u64() {
            self.deadline(&id, Duration::from_secs(deadline));
        }
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let (kubelet, shared) = (self.clone(), shared.clone());
        tokio::spawn(async move {
            let out = tokio::spawn(copy(stdout, log.clone()));
            let err = tokio::spawn(copy(stderr, log.clone()));
            let status = child.wait().await;
            let _ = (out.await, err.await);
            log.lock().unwrap().done = true;
            if let Err(e) = kubelet.runtime.remove(&id) {
                eprintln!("kubelet: cannot remove container {id}: {e:#}");
            }
            let why = runc_error(&log.lock().unwrap().data);
            kubelet.ended(
                &shared,
                &running,
                status.map(|s| s.success()).unwrap_or(false),
                why.as_deref(),
            );
        });
        Ok(())
    }

    /// activeDeadlineSeconds: the container is killed once it is past.
    fn deadline(self: &Arc<Self>, id: &str, after: Duration) {
        let (kubelet, id) = (self.clone(), id.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            kubelet.runtime.kill(&id, "KILL");
        });
    }

    /// The process has ended: the pod's phase, or its removal if it was
    /// being deleted.
    fn ended(&self, shared: &Shared, pod: &Value, success: bool, why: Option<&str>) {
        let k = Objects::key_of(pod);
        if let Some(entry) = self.pods.lock().unwrap().get_mut(&k) {
            entry.1 = None;
        }
        let current = {
            let st = shared.state.lock().unwrap();
            st.objects
                .get("pods")
                .and_then(|all| all.get(&k.0, &k.1).cloned())
        };
        let Some(current) = current else { return };
        if current["metadata"]["deletionTimestamp"].is_string() {
            self.pods.lock().unwrap().remove(&k);
            shared.change("pods", "DELETED", current);
        } else {
            set_phase(
                shared,
                &current,
                if success { "Succeeded" } else { "Failed" },
                why,
            );
        }
    }

    /// Deleting a pod: SIGTERM now, SIGKILL after the grace period. The
    /// pod, marked terminating, while its process lives; `None` when it
    /// has none.
    pub(crate) fn stop(self: &Arc<Self>, shared: &Shared, pod: &Value) -> Option<Value> {
        self.pods
            .lock()
            .unwrap()
            .get(&Objects::key_of(pod))
            .and_then(|(_, pid)| *pid)?;
        self.runtime
            .kill(&container_id(&Objects::key_of(pod)), "TERM");
        let mut terminating = pod.clone();
        terminating["metadata"]["deletionTimestamp"] = now().into();
        let grace = pod["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or(30);
        let (kubelet, k) = (self.clone(), Objects::key_of(pod));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(grace)).await;
            let alive = kubelet
                .pods
                .lock()
                .unwrap()
                .get(&k)
                .and_then(|(_, pid)| *pid);
            if alive.is_some() {
                kubelet.runtime.kill(&container_id(&k), "KILL");
            }
        });
        Some(shared.change("pods", "MODIFIED", terminating))
    }

    /// The stub is going: every container is stopped (SIGTERM, then
    /// SIGKILL after 10 s), waited for, and removed with its bundle.
    pub(crate) fn stop_all(&self) {
        let (ids, pids): (Vec<String>, Vec<u32>) = {
            let pods = self.pods.lock().unwrap();
            let ids = pods.keys().map(container_id).collect();
            (ids, pods.values().filter_map(|(_, pid)| *pid).collect())
        };
        let gone = || {
            pids.iter()
                .all(|pid| !Path::new(&format!("/proc/{pid}")).exists() || zombie(*pid))
        };
        for signal in ["TERM", "KILL"] {
            for id in &ids {
                self.runtime.kill(id, signal);
            }
            for _ in 0..100 {
                if gone() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        for id in &ids {
            if let Err(e) = self.runtime.remove(id) {
                eprintln!("kubelet: cannot remove container {id}: {e:#}");
            }
        }
        self.runtime.remove_all();
    }
}

/// runc's name for a pod's container.
fn container_id((namespace, name): &PodKey) -> String {
    format!("{namespace}_{name}")
}

/// runc's own error, when it failed before or instead of the container
/// (`level=error msg="…"` in its stderr, which is the log).
fn runc_error(log: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(log);
    let line = text.lines().rev().find(|l| l.contains("level=error"))?;
    let message = line.split_once("msg=")?.1.trim_matches('"');
    Some(format!("runc: {message}"))
}

fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}

/// Copies a stream into the log line by line, as a kubelet's log does:
/// stdout and stderr interleave by whole lines, never inside one.
async fn copy<R: tokio::io::AsyncRead + Unpin>(from: Option<R>, log: Arc<Mutex<LogBuffer>>) {
    let Some(from) = from else { return };
    let mut from = tokio::io::BufReader::with_capacity(256 * 1024, from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match from.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => log.lock().unwrap().data.extend_from_slice(&line),
        }
    }
}

fn set_phase(shared: &Shared, pod: &Value, phase: &str, message: Option<&str>) -> Value {
    let mut pod = pod.clone();
    let node = pod["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let host_ip = node
        .strip_prefix("node-")
        .and_then(|n| n.parse::<u8>().ok())
        .map(|n| crate::lab::Lab::node_ip(n).to_string());
    pod["status"]["phase"] = phase.into();
    pod["status"]["hostIP"] = json!(host_ip);
    if pod["spec"]["hostNetwork"] == true {
        pod["status"]["podIP"] = json!(host_ip);
    }
    pod["status"]["startTime"] = pod["metadata"]["creationTimestamp"].clone();
    if let Some(message) = message {
        pod["status"]["message"] = message.into();
    }
    shared.change("pods", "MODIFIED", pod)
}

/// Now, as the API writes times (RFC 3339, UTC).
pub(crate) fn now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
