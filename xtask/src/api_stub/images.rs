//! The images the lab's nodes have, as a kubelet's container runtime
//! knows its image store: a pod whose image is not there is never run;
//! its container waits with the reasons and messages a real kubelet
//! writes (`InvalidImageName` for a reference that does not parse,
//! `ErrImagePull` then `ImagePullBackOff`, in turns, for one no registry
//! has: the lab reaches none).
//!
//! The lab's podtrace image is [`LAB_IMAGE`]; the stub serves the
//! `kube-system/podtrace` DaemonSet of deploy/daemonset.yaml with it
//! ([`lab_daemonset`]), as on a cluster where it was applied, so that
//! cluster mode finds its agents' image as it would there.

use std::time::Duration;

use serde_json::{json, Value};

use super::Shared;

/// The reference of the podtrace image the lab's nodes hold.
pub const LAB_IMAGE: &str = "localhost/podtrace:lab";

/// How long the stub's kubelet takes between a failed pull and its
/// back-off, and back (a real one backs off 10 s, doubling to 5 min).
const PULL_RETRY: Duration = Duration::from_secs(1);

/// The images every lab node has.
fn present(image: &str) -> bool {
    image == LAB_IMAGE
}

/// Whether `pod`'s image is on its node; if not, its container's status
/// says why from now on, as its kubelet's would.
pub(crate) fn pulled(shared: &Shared, pod: &Value) -> bool {
    let container = &pod["spec"]["containers"][0];
    let image = container["image"].as_str().unwrap_or_default().to_string();
    if present(&image) {
        return true;
    }
    let name = container["name"].as_str().unwrap_or_default().to_string();
    if let Some(why) = invalid(&image) {
        set_waiting(shared, pod, &name, &image, "InvalidImageName", &why);
        return false;
    }
    let failed = format!(
        "rpc error: code = NotFound desc = failed to pull and unpack image \"{full}\": failed to resolve reference \"{full}\": {full}: not found",
        full = normalized(&image)
    );
    let backing_off = format!("Back-off pulling image \"{image}\"");
    let (shared, pod) = (shared.clone(), pod.clone());
    set_waiting(&shared, &pod, &name, &image, "ErrImagePull", &failed);
    tokio::spawn(async move {
        // The kubelet retries for as long as the pod is there.
        for turn in 1.. {
            tokio::time::sleep(PULL_RETRY).await;
            let (reason, message) = if turn % 2 == 1 {
                ("ImagePullBackOff", &backing_off)
            } else {
                ("ErrImagePull", &failed)
            };
            if !set_waiting(&shared, &pod, &name, &image, reason, message) {
                return;
            }
        }
    });
    false
}

/// Writes the pod's container as waiting for `reason`; false once the pod
/// is gone.
fn set_waiting(
    shared: &Shared,
    pod: &Value,
    name: &str,
    image: &str,
    reason: &str,
    message: &str,
) -> bool {
    let current = {
        let state = shared.state.lock().unwrap();
        state.objects.get("pods").and_then(|all| {
            all.values()
                .find(|o| o["metadata"]["uid"] == pod["metadata"]["uid"])
                .cloned()
        })
    };
    let Some(mut current) = current else {
        return false;
    };
    current["status"]["phase"] = "Pending".into();
    current["status"]["startTime"] = current["metadata"]["creationTimestamp"].clone();
    current["status"]["containerStatuses"] = json!([{
        "name": name, "image": image, "imageID": "", "ready": false, "restartCount": 0, "started": false,
        "state": {"waiting": {"reason": reason, "message": message}}
    }]);
    shared.change("pods", "MODIFIED", current);
    true
}

/// Why a reference does not parse, as the kubelet says it; `None` if it
/// does: its path (past the registry, before the tag or digest) is lower
/// case, with no empty part and no space.
fn invalid(image: &str) -> Option<String> {
    let name = image.split('@').next().unwrap_or_default();
    let name = match name.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => repository,
        _ => name,
    };
    let mut path: Vec<&str> = name.split('/').collect();
    if path.len() > 1 && is_registry(path[0]) {
        path.remove(0);
    }
    let bad = image.contains(char::is_whitespace)
        || path
            .iter()
            .any(|p| p.is_empty() || p.chars().any(|c| c.is_ascii_uppercase()));
    bad.then(|| format!("Failed to apply default image tag \"{image}\": couldn't parse image name \"{image}\": invalid reference format"))
}

/// Whether a reference's first part names a registry rather than a path.
fn is_registry(first: &str) -> bool {
    first.contains(['.', ':']) || first == "localhost"
}

/// The reference as the runtime resolves it: docker.io's library and the
/// `latest` tag by default.
fn normalized(image: &str) -> String {
    let mut full = match image.split_once('/') {
        None => format!("docker.io/library/{image}"),
        Some((first, _)) if !is_registry(first) => format!("docker.io/{image}"),
        Some(_) => image.to_string(),
    };
    let last = full.rsplit('/').next().unwrap_or_default();
    if !last.contains([':', '@']) {
        full.push_str(":latest");
    }
    full
}

/// The `kube-system/podtrace` DaemonSet of deploy/daemonset.yaml, with
/// the lab's image.
pub(crate) fn lab_daemonset() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "podtrace", "namespace": "kube-system", "labels": {"app.kubernetes.io/name": "podtrace"}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "podtrace"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "podtrace"}},
                "spec": {"containers": [{"name": "podtrace", "image": LAB_IMAGE, "command": ["sleep", "infinity"]}]}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_resolve_and_fail_to_parse_as_the_runtime_says() {
        assert_eq!(normalized("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(normalized("me/podtrace:1"), "docker.io/me/podtrace:1");
        assert_eq!(
            normalized("registry.example:5000/podtrace"),
            "registry.example:5000/podtrace:latest"
        );
        assert_eq!(invalid("registry.example:5000/podtrace:1"), None);
        assert_eq!(invalid("ghcr.io/podtrace/podtrace:0.1.0"), None);
        assert!(invalid("ghcr.io/PodTrace/podtrace").is_some());
        assert!(invalid("Podtrace").is_some());
        assert!(invalid("").is_some());
    }
}
