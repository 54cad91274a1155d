//! The stub's kubelet: a pod created with `nodeName` set to a lab node
//! runs its command there, as a kubelet would run its container.
//!
//! The image stands for podtrace: `command: ["podtrace"]` runs the local
//! podtrace binary. It runs in the root namespace, told its node's network
//! namespace by `PODTRACE_NETNS` (so that it still reaches the stub on
//! 127.0.0.1), and the stub's API by `KUBECONFIG` (a real kubelet mounts
//! the service account's token instead). A hostPath volume of `/` (the
//! node's root, which a real kubelet mounts where the pod says) is the lab
//! node's host-root directory, told by `PODTRACE_HOST_ROOT`: the process
//! shares this host's filesystem, so nothing is mounted; a pod that does
//! not mount the node's root is not told it. Its stdout and stderr are the
//! pod's log. Pending → Running → Succeeded / Failed; deleting the pod
//! sends SIGTERM, then SIGKILL after the grace period, and the pod goes
//! once its process has.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use super::{namespace_of, Shared};
use crate::lab::{Lab, NODES};

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
    podtrace: PathBuf,
    /// Lab node name → where it is.
    nodes: HashMap<String, LabNode>,
    pub state_dir: PathBuf,
    kubeconfig: Mutex<Option<PathBuf>>,
    /// (namespace, name) → its log, and its process while it runs.
    pods: Mutex<HashMap<PodKey, (SharedLog, Option<u32>)>>,
}

impl Kubelet {
    pub fn new(podtrace: &Path, nodes: HashMap<String, LabNode>, state_dir: &Path) -> Self {
        Self {
            podtrace: podtrace.into(),
            nodes,
            state_dir: state_dir.into(),
            kubeconfig: Mutex::new(None),
            pods: Mutex::new(HashMap::new()),
        }
    }

    /// The kubelet of every node of `lab`.
    pub fn for_lab(podtrace: &Path, lab: &Lab, state_dir: &Path) -> Self {
        let nodes = (1..=NODES)
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

    pub(crate) fn set_kubeconfig(&self, path: PathBuf) {
        *self.kubeconfig.lock().unwrap() = Some(path);
    }

    /// The pod's log, once its container was started.
    pub(crate) fn log(&self, pod: &Value) -> Option<Arc<Mutex<LogBuffer>>> {
        let pods = self.pods.lock().unwrap();
        pods.get(&key(pod)).map(|(log, _)| log.clone())
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
        let container = &pod["spec"]["containers"][0];
        if container["command"][0] != "podtrace" {
            set_phase(
                shared,
                pod,
                "Failed",
                Some("the lab's kubelet only runs podtrace"),
            );
            return;
        }
        let args: Vec<String> = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        let mut command = tokio::process::Command::new(&self.podtrace);
        command
            .args(&args)
            .env("PODTRACE_NETNS", &node.netns)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if mounts_host_path(pod, container, "/") {
            command.env("PODTRACE_HOST_ROOT", &node.root);
        }
        if let Some(kubeconfig) = self.kubeconfig.lock().unwrap().clone() {
            command.env("KUBECONFIG", kubeconfig);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                set_phase(shared, pod, "Failed", Some(&format!("cannot start: {e}")));
                return;
            }
        };
        let log = Arc::new(Mutex::new(LogBuffer::default()));
        self.pods
            .lock()
            .unwrap()
            .insert(key(pod), (log.clone(), child.id()));
        let running = set_phase(shared, pod, "Running", None);
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let (kubelet, shared) = (self.clone(), shared.clone());
        tokio::spawn(async move {
            let out = tokio::spawn(copy(stdout, log.clone()));
            let err = tokio::spawn(copy(stderr, log.clone()));
            let status = child.wait().await;
            let _ = (out.await, err.await);
            log.lock().unwrap().done = true;
            kubelet.ended(
                &shared,
                &running,
                status.map(|s| s.success()).unwrap_or(false),
            );
        });
    }

    /// The process has ended: the pod's phase, or its removal if it was
    /// being deleted.
    fn ended(&self, shared: &Shared, pod: &Value, success: bool) {
        let k = key(pod);
        if let Some(entry) = self.pods.lock().unwrap().get_mut(&k) {
            entry.1 = None;
        }
        let current = {
            let st = shared.state.lock().unwrap();
            st.objects
                .get("pods")
                .and_then(|all| all.iter().find(|o| key(o) == k).cloned())
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
                None,
            );
        }
    }

    /// Deleting a pod: SIGTERM now, SIGKILL after the grace period. The
    /// pod, marked terminating, while its process lives; `None` when it
    /// has none.
    pub(crate) fn stop(self: &Arc<Self>, shared: &Shared, pod: &Value) -> Option<Value> {
        let pid = self
            .pods
            .lock()
            .unwrap()
            .get(&key(pod))
            .and_then(|(_, pid)| *pid)?;
        // SAFETY: a process this kubelet started and has not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let mut terminating = pod.clone();
        terminating["metadata"]["deletionTimestamp"] = now().into();
        let grace = pod["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap_or(30);
        let (kubelet, k) = (self.clone(), key(pod));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(grace)).await;
            let alive = kubelet
                .pods
                .lock()
                .unwrap()
                .get(&k)
                .and_then(|(_, pid)| *pid);
            if let Some(pid) = alive {
                // SAFETY: as above; the process is still ours.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            }
        });
        Some(shared.change("pods", "MODIFIED", terminating))
    }

    /// The stub is going: every container is stopped (SIGTERM, then
    /// SIGKILL after 10 s), and waited for.
    pub(crate) fn stop_all(&self) {
        let pids: Vec<u32> = self
            .pods
            .lock()
            .unwrap()
            .values()
            .filter_map(|(_, pid)| *pid)
            .collect();
        for pid in &pids {
            // SAFETY: processes this kubelet started.
            unsafe { libc::kill(*pid as i32, libc::SIGTERM) };
        }
        for _ in 0..100 {
            if pids
                .iter()
                .all(|pid| !Path::new(&format!("/proc/{pid}")).exists() || zombie(*pid))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for pid in &pids {
            // SAFETY: as above.
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
    }
}

/// Whether `container` mounts the pod's hostPath volume of `path`.
fn mounts_host_path(pod: &Value, container: &Value, path: &str) -> bool {
    let volumes = pod["spec"]["volumes"].as_array().into_iter().flatten();
    let mut names = volumes
        .filter(|v| v["hostPath"]["path"] == path)
        .filter_map(|v| v["name"].as_str());
    let mounts = container["volumeMounts"].as_array();
    names.any(|name| mounts.into_iter().flatten().any(|m| m["name"] == name))
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

fn key(pod: &Value) -> (String, String) {
    (
        namespace_of(pod).to_string(),
        pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_container_that_mounts_the_nodes_root_is_told_where_it_is() {
        let pod = json!({"spec": {
            "volumes": [{"name": "btf", "hostPath": {"path": "/sys/kernel/btf"}},
                        {"name": "host", "hostPath": {"path": "/"}}],
            "containers": [
                {"volumeMounts": [{"name": "host", "mountPath": "/host", "readOnly": true}]},
                {"volumeMounts": [{"name": "btf", "mountPath": "/sys/kernel/btf"}]},
                {}
            ]
        }});
        let told: Vec<bool> = (0..3)
            .map(|c| mounts_host_path(&pod, &pod["spec"]["containers"][c], "/"))
            .collect();
        assert_eq!(told, [true, false, false]);
    }
}
