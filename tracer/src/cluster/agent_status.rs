//! What the cluster says of an agent pod, told for what it is: an
//! admission refusal (PodSecurity, RBAC), an image its node cannot pull,
//! a pod its kubelet refused, an agent evicted or OOM-killed. Each within
//! seconds of the API saying it, in one line.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod as KubePod};
use kube::Api;

/// How long an agent pod may stay Pending with nothing said against it
/// (its image pulled slowly, its node busy).
pub const START_PATIENCE: Duration = Duration::from_secs(120);
/// How long, after an agent's log ended, its pod's status is awaited for
/// how its container ended (the kubelet writes it after the log closes).
const END_STATUS_PATIENCE: Duration = Duration::from_secs(3);

/// Why the API refused `what` (`"create pods"`) in `namespace`.
pub fn refused(e: kube::Error, what: &str, namespace: &str) -> anyhow::Error {
    match &e {
        kube::Error::Api(s) if s.code == 403 && s.message.contains(": violates PodSecurity ") => anyhow!(
            "namespace {namespace}'s Pod Security level refuses agent pods, which need the host's network and PID namespaces, hostPath mounts and eBPF capabilities (only level \"privileged\" admits them); allow them with: kubectl label namespace {namespace} pod-security.kubernetes.io/enforce=privileged --overwrite (the API said: {})",
            s.message
        ),
        kube::Error::Api(s) if s.code == 403 => anyhow!("the Kubernetes API forbids this: cluster mode needs RBAC permission to {what} in namespace {namespace} (deploy/rbac-cluster.yaml): {}", s.message),
        kube::Error::Api(s) if s.code == 404 => anyhow!("cannot {what} in namespace {namespace}: {} (create it, or pass --agent-namespace)", s.message),
        _ => anyhow!("cannot {what} in namespace {namespace}: {e}"),
    }
}

/// Waits until the pod's container has started: its phase then. What
/// keeps it from starting (its image, its kubelet's refusal) ends the
/// wait at once, said.
pub async fn wait_started(pods: &Api<KubePod>, pod: &str) -> Result<String> {
    let until = tokio::time::Instant::now() + START_PATIENCE;
    loop {
        let object = pods
            .get(pod)
            .await
            .with_context(|| format!("agent pod {pod}"))?;
        if let Some(why) = not_starting(&object) {
            bail!("agent pod {pod} {why}");
        }
        let phase = object.status.and_then(|s| s.phase).unwrap_or_default();
        if matches!(phase.as_str(), "Running" | "Succeeded" | "Failed") {
            return Ok(phase);
        }
        if tokio::time::Instant::now() > until {
            bail!(
                "agent pod {pod} did not start within {} s (phase {phase})",
                START_PATIENCE.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Once an agent's log has ended: how its pod ended, when that is what
/// killed it (evicted, OOM-killed); `None` for an agent that ended by
/// itself or was deleted.
pub async fn how_it_ended(pods: &Api<KubePod>, pod: &str) -> Option<String> {
    let until = tokio::time::Instant::now() + END_STATUS_PATIENCE;
    loop {
        let object = pods.get_opt(pod).await.ok()??;
        if object.metadata.deletion_timestamp.is_some() {
            return None;
        }
        if let Some(why) = killed(&object) {
            return Some(why);
        }
        // Its kubelet has said how it ended once the pod's phase is final
        // or its container's state terminated.
        let phase = object.status.as_ref().and_then(|s| s.phase.as_deref());
        let said = matches!(phase, Some("Succeeded" | "Failed")) || terminated(&object).is_some();
        if said || tokio::time::Instant::now() > until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What keeps a pod's container from starting, as its status says it:
/// an image that cannot be pulled, a container that cannot be created,
/// a pod its kubelet refused or evicted.
fn not_starting(pod: &KubePod) -> Option<String> {
    if let Some(why) = killed(pod) {
        return Some(why);
    }
    let status = pod.status.as_ref()?;
    let container = pod.spec.as_ref()?.containers.first()?;
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .find(|w| w.reason.as_deref().is_some_and(never_starts));
    if let Some(waiting) = waiting {
        let reason = waiting.reason.as_deref().unwrap_or_default();
        let message = waiting.message.as_deref().unwrap_or("(no message)");
        let image = container.image.as_deref().unwrap_or_default();
        return Some(if reason.contains("Image") {
            format!("cannot pull its image {image}: {reason}: {message} (--image, or {}, names another)", super::agent_pod::IMAGE_ENV)
        } else {
            format!("cannot start its container: {reason}: {message}")
        });
    }
    // Refused by its node's kubelet before any container (NodeAffinity,
    // OutOfmemory, …): Failed, with a reason and no container status.
    let failed = status.phase.as_deref() == Some("Failed");
    if failed && status.container_statuses.as_ref().is_none_or(Vec::is_empty) {
        return Some(format!(
            "was refused by its node: {}: {}",
            status.reason.as_deref().unwrap_or("Failed"),
            status.message.as_deref().unwrap_or("(no message)")
        ));
    }
    None
}

/// The container waiting reasons a kubelet does not get past by waiting
/// (it retries pulls with a back-off, but a missing image stays missing).
fn never_starts(reason: &str) -> bool {
    matches!(
        reason,
        "ErrImagePull"
            | "ImagePullBackOff"
            | "InvalidImageName"
            | "ErrImageNeverPull"
            | "CreateContainerConfigError"
            | "CreateContainerError"
            | "RunContainerError"
    )
}

/// An agent killed by its node: evicted (status.reason Evicted), or its
/// container OOM-killed (now or last time).
fn killed(pod: &KubePod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if status.reason.as_deref() == Some("Evicted") {
        let message = status.message.as_deref().unwrap_or("(no message)");
        return Some(format!("was evicted by its node: {message}"));
    }
    let oom = terminated(pod).filter(|t| t.reason.as_deref() == Some("OOMKilled"))?;
    let limit = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| {
            c.resources
                .as_ref()?
                .limits
                .as_ref()?
                .get("memory")
                .cloned()
        })
        .map_or("its memory limit".to_string(), |q| {
            format!("its memory limit {}", q.0)
        });
    Some(format!(
        "was OOM-killed (exit code {}): the agent used more than {limit}",
        oom.exit_code
    ))
}

/// Its container's terminated state, now or the last one.
fn terminated(pod: &KubePod) -> Option<&ContainerStateTerminated> {
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find_map(|c| {
        c.state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .or_else(|| c.last_state.as_ref()?.terminated.as_ref())
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(status: serde_json::Value) -> KubePod {
        serde_json::from_value(json!({
            "metadata": {"name": "a"},
            "spec": {"containers": [{"name": "agent", "image": "reg.example/podtrace:1",
                      "resources": {"limits": {"memory": "256Mi"}}}]},
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn an_image_pull_failure_names_the_image_and_the_kubelets_message() {
        let waiting = pod(
            json!({"phase": "Pending", "containerStatuses": [{"name": "agent", "ready": false,
            "restartCount": 0, "image": "reg.example/podtrace:1", "imageID": "",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"reg.example/podtrace:1\""}}}]}),
        );
        assert_eq!(
            not_starting(&waiting).unwrap(),
            "cannot pull its image reg.example/podtrace:1: ImagePullBackOff: Back-off pulling image \"reg.example/podtrace:1\" (--image, or PODTRACE_IMAGE, names another)"
        );
        // Still creating: nothing to say yet.
        let creating = pod(
            json!({"phase": "Pending", "containerStatuses": [{"name": "agent", "ready": false,
            "restartCount": 0, "image": "x", "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
        );
        assert_eq!(not_starting(&creating), None);
    }

    #[test]
    fn evictions_oom_kills_and_kubelet_refusals_are_told_as_such() {
        let evicted = pod(
            json!({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}),
        );
        assert_eq!(
            not_starting(&evicted).unwrap(),
            "was evicted by its node: The node was low on resource: memory."
        );
        let oom = pod(
            json!({"phase": "Failed", "containerStatuses": [{"name": "agent", "ready": false,
            "restartCount": 0, "image": "x", "imageID": "",
            "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}),
        );
        assert_eq!(
            killed(&oom).unwrap(),
            "was OOM-killed (exit code 137): the agent used more than its memory limit 256Mi"
        );
        let refused = pod(
            json!({"phase": "Failed", "reason": "NodeAffinity", "message": "Pod Predicate NodeAffinity failed"}),
        );
        assert_eq!(
            not_starting(&refused).unwrap(),
            "was refused by its node: NodeAffinity: Pod Predicate NodeAffinity failed"
        );
    }

    #[test]
    fn a_pod_security_refusal_is_told_with_the_label_that_fixes_it() {
        let status = |message: &str| {
            kube::Error::Api(
                serde_json::from_value(json!({"status": "Failure", "message": message, "reason": "Forbidden", "code": 403}))
                    .unwrap(),
            )
        };
        let said = refused(status("pods \"p\" is forbidden: violates PodSecurity \"baseline:latest\": host namespaces (hostNetwork=true)"), "create pods", "tools").to_string();
        assert!(
            said.starts_with("namespace tools's Pod Security level refuses agent pods"),
            "{said}"
        );
        assert!(said.contains("kubectl label namespace tools pod-security.kubernetes.io/enforce=privileged --overwrite"), "{said}");
        let rbac = refused(
            status("pods is forbidden: User \"me\" cannot create resource \"pods\""),
            "create pods",
            "tools",
        )
        .to_string();
        assert!(
            rbac.contains("needs RBAC permission to create pods"),
            "{rbac}"
        );
    }
}
