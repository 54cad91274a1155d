//! Cluster mode's agents: one short-lived pod per traced node, started,
//! followed and removed through the API, so that `kubectl podtrace` needs
//! no root and no node access.
//!
//! - An agent is `podtrace agent …` in a pod pinned to its node
//!   (`nodeName`, hostNetwork, hostPID, the capabilities node mode needs,
//!   /sys/kernel/btf read-only, the node's root read-only at [`HOST_ROOT`]
//!   for the doctor's checks of its files) in podtrace's own namespace. It writes
//!   JSON lines (`app::wire`) to stdout; the front-end follows
//!   `pods/<name>/log?follow=true`.
//! - Nothing lingers: the front-end deletes its pods on every exit it
//!   lives through. It also holds a coordination.k8s.io/v1 Lease, renewed
//!   every [`RENEW_EVERY`]; an agent that sees it unchanged for
//!   [`STALE_AFTER`] (front-end SIGKILLed, laptop gone) deletes its own
//!   pod and the lease, and exits; node mode's cleanup detaches. The pods
//!   are owned by the lease too, so a real cluster's garbage collector
//!   removes them with it.

use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::{coordination::v1::Lease, core::v1::Pod as KubePod};
use kube::{
    api::{DeleteParams, LogParams, Patch, PatchParams, PostParams},
    Api, Client,
};
use serde_json::json;
use tokio::sync::mpsc;

pub use super::agent_pod::{image, HOST_ROOT};
pub use super::agent_status::START_PATIENCE;
use super::{
    agent_pod::agent_pod,
    agent_status::{how_it_ended, refused, wait_started},
};
use crate::cli::AgentArgs;

/// How often the front-end renews its lease.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// An agent whose lease was not renewed for this long stops.
pub const STALE_AFTER: Duration = Duration::from_secs(30);
/// How long the front-end keeps trying to delete its agent pods while the
/// API fails.
pub const DELETE_PATIENCE: Duration = Duration::from_secs(20);

/// A skew for testing: `[-]DURATION` in ns.
pub fn parse_skew(text: &str) -> Result<i64> {
    let (sign, rest) = match text.strip_prefix('-') {
        Some(rest) => (-1, rest),
        None => (1, text),
    };
    let d = crate::cli::parse_duration(rest).map_err(|e| anyhow!(e))?;
    Ok(sign * d.as_nanos() as i64)
}

/// One run's agents: their namespace, lease and pods.
pub struct Agents {
    pub namespace: String,
    pub run: String,
    pub lease: String,
    pods: Api<KubePod>,
    leases: Api<Lease>,
    /// (node, pod name).
    pub started: Vec<(String, String)>,
    /// When the API last took the lease's renewal.
    renewed: std::sync::Arc<std::sync::Mutex<std::time::SystemTime>>,
}

impl Agents {
    /// Creates the run's lease (renewed from now on).
    pub async fn new(client: Client, namespace: &str) -> Result<Self> {
        let run = format!("{:08x}", rand_u32());
        let lease = format!("podtrace-{run}");
        let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let object: Lease = serde_json::from_value(json!({
            "metadata": {"name": lease, "labels": {"app.kubernetes.io/name": "podtrace"}},
            "spec": {"holderIdentity": format!("podtrace front-end {run}"),
                     "leaseDurationSeconds": STALE_AFTER.as_secs(), "renewTime": now_micro_time()}
        }))?;
        leases
            .create(&PostParams::default(), &object)
            .await
            .map_err(|e| refused(e, "create leases", namespace))?;
        Ok(Self {
            namespace: namespace.into(),
            run,
            lease,
            pods: Api::namespaced(client, namespace),
            leases,
            started: Vec::new(),
            renewed: std::sync::Arc::new(std::sync::Mutex::new(std::time::SystemTime::now())),
        })
    }

    /// Starts the agent for `node` with `agent`'s trace.
    pub async fn start(
        &mut self,
        node: &str,
        image: &str,
        agent: AgentArgs,
        deadline: Option<Duration>,
    ) -> Result<String> {
        let name = pod_name(&self.run, node);
        let owner = self
            .leases
            .get(&self.lease)
            .await
            .ok()
            .and_then(|l| l.metadata.uid);
        let argv = agent_argv(agent, node, &self.lease, &name, &self.namespace);
        let pod: KubePod = serde_json::from_value(agent_pod(
            &name,
            node,
            image,
            &argv,
            &self.lease,
            owner,
            deadline,
        ))?;
        self.pods
            .create(&PostParams::default(), &pod)
            .await
            .map_err(|e| refused(e, "create pods", &self.namespace))?;
        self.started.push((node.into(), name.clone()));
        Ok(name)
    }

    /// Renews the lease every [`RENEW_EVERY`], for as long as it runs.
    pub fn renew(&self) -> tokio::task::JoinHandle<()> {
        let (leases, name) = (self.leases.clone(), self.lease.clone());
        let renewed = self.renewed.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(RENEW_EVERY);
            loop {
                tick.tick().await;
                let patch = json!({"spec": {"renewTime": now_micro_time()}});
                match leases
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => *renewed.lock().unwrap() = std::time::SystemTime::now(),
                    Err(e) => eprintln!("podtrace: cannot renew lease {name}: {e}"),
                }
            }
        })
    }

    /// Deletes every agent pod (their agents stop and say their summary),
    /// trying again for [`DELETE_PATIENCE`] while the API fails. What
    /// could not be deleted is said, with when it goes by itself; `Err`
    /// names the pods left.
    pub async fn stop(&self) -> Result<()> {
        let until = tokio::time::Instant::now() + DELETE_PATIENCE;
        let mut left: Vec<(&String, String)> = self
            .started
            .iter()
            .map(|(_, pod)| (pod, String::new()))
            .collect();
        let mut wait = Duration::from_millis(250);
        loop {
            let mut failed = Vec::new();
            for (pod, _) in left {
                // An API that drops packets rather than refusing them would
                // hold one call for minutes: each is bounded too.
                let left_time = until.saturating_duration_since(tokio::time::Instant::now());
                let params = DeleteParams::default();
                let deleting = self.pods.delete(pod, &params);
                match tokio::time::timeout(left_time.max(wait), deleting).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) if is_not_found(&e) => {}
                    Ok(Err(e)) => failed.push((pod, e.to_string())),
                    Err(_) => failed.push((pod, "the API did not answer".into())),
                }
            }
            left = failed;
            if left.is_empty() || tokio::time::Instant::now() + wait > until {
                break;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(4));
        }
        if left.is_empty() {
            return Ok(());
        }
        let stops_by = *self.renewed.lock().unwrap() + STALE_AFTER + super::lease::LEASE_POLL;
        for (pod, error) in &left {
            eprintln!(
                "podtrace: cannot delete agent pod {}/{pod} after {} s of trying: {error}",
                self.namespace,
                DELETE_PATIENCE.as_secs()
            );
        }
        eprintln!(
            "podtrace: an agent left stops by itself, detaching everything, once it has not seen lease {ns}/{lease} renewed for {} s (by {} at the latest); if the API cannot take its deletions then either, remove what is left with: kubectl delete -n {ns} lease/{lease} {}",
            STALE_AFTER.as_secs(),
            humantime::format_rfc3339_seconds(stops_by),
            left.iter().map(|(pod, _)| format!("pod/{pod}")).collect::<Vec<_>>().join(" "),
            ns = self.namespace,
            lease = self.lease,
        );
        Err(anyhow!(
            "{} agent pod(s) could not be deleted: the API failed",
            left.len()
        ))
    }

    /// Says on the lease that every agent traces ([`super::lease::ALL_TRACING`]).
    pub async fn say_all_tracing(&self) -> Result<()> {
        let patch = json!({"metadata": {"annotations": {super::lease::ALL_TRACING: "true"}}});
        self.leases
            .patch(&self.lease, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| {
                anyhow!(
                    "cannot tell the agents that all trace (lease {}): {e}",
                    self.lease
                )
            })?;
        Ok(())
    }

    /// Deletes the lease, last.
    pub async fn release(&self) {
        let _ = self
            .leases
            .delete(&self.lease, &DeleteParams::default())
            .await;
    }

    /// Waits until the pods are gone from the API, at most `patience`.
    pub async fn wait_gone(&self, patience: Duration) {
        let until = tokio::time::Instant::now() + patience;
        for (_, pod) in &self.started {
            while tokio::time::Instant::now() < until {
                match self.pods.get_opt(pod).await {
                    Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(200)).await,
                    _ => break,
                }
            }
        }
    }
}

/// What a followed agent pod said: a log line, or its end.
#[derive(Debug)]
pub enum Heard {
    Line(String, String),
    /// The agent's log ended (node, why, when it ended early).
    Ended(String, Option<String>),
}

/// Follows `pod`'s log once it runs, line by line, into `tx`.
pub fn follow(
    client: Client,
    namespace: &str,
    node: &str,
    pod: &str,
    tx: mpsc::UnboundedSender<Heard>,
) {
    let pods: Api<KubePod> = Api::namespaced(client, namespace);
    let (node, pod) = (node.to_string(), pod.to_string());
    tokio::spawn(async move {
        let ended = match follow_log(&pods, &node, &pod, &tx).await {
            Ok(()) => None,
            Err(e) => Some(format!("{e:#}")),
        };
        let _ = tx.send(Heard::Ended(node, ended));
    });
}

async fn follow_log(
    pods: &Api<KubePod>,
    node: &str,
    pod: &str,
    tx: &mpsc::UnboundedSender<Heard>,
) -> Result<()> {
    let phase = wait_started(pods, pod).await?;
    let params = LogParams {
        follow: phase == "Running",
        ..Default::default()
    };
    let log = pods
        .log_stream(pod, &params)
        .await
        .with_context(|| format!("cannot read the log of agent pod {pod}"))?;
    let mut lines = log.lines();
    while let Some(line) = lines.next().await {
        let line = line.with_context(|| format!("the log of agent pod {pod} broke off"))?;
        if tx.send(Heard::Line(node.to_string(), line)).is_err() {
            return Ok(());
        }
    }
    // The log ends as the container does: killed by its node, it is said.
    match how_it_ended(pods, pod).await {
        Some(why) => Err(anyhow!("agent pod {pod} {why}")),
        None => Ok(()),
    }
}

/// Removes an agent's own pod, and the run's lease when the front-end is
/// gone.
pub async fn remove_self(client: Client, namespace: &str, pod: Option<&str>, lease: Option<&str>) {
    if let Some(lease) = lease {
        let leases: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let _ = leases.delete(lease, &DeleteParams::default()).await;
    }
    if let Some(pod) = pod {
        let pods: Api<KubePod> = Api::namespaced(client, namespace);
        let _ = pods.delete(pod, &DeleteParams::default()).await;
    }
}

/// `podtrace agent` with the front-end's trace for it, then who it is
/// and where its node's root is mounted.
fn agent_argv(
    mut agent: AgentArgs,
    node: &str,
    lease: &str,
    pod: &str,
    namespace: &str,
) -> Vec<String> {
    agent.node = Some(node.into());
    agent.lease = Some(lease.into());
    agent.pod = Some(pod.into());
    agent.trace.agent_namespace = namespace.into();
    agent.trace.kube.host_root = vec![HOST_ROOT.into()];
    agent.argv()
}

/// A pod name for the run's agent on `node` (DNS-1123, at most 63).
fn pod_name(run: &str, node: &str) -> String {
    let node: String = node
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let mut name = format!("podtrace-{run}-{node}");
    name.truncate(63);
    name.trim_end_matches('-').to_string()
}

fn now_micro_time() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (secs, micros) = (now.as_secs() as i64, now.subsec_micros());
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn rand_u32() -> u32 {
    let mut bytes = [0u8; 4];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut bytes);
    }
    u32::from_ne_bytes(bytes) ^ std::process::id()
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Args;

    #[test]
    fn names_times_and_skews() {
        assert_eq!(
            pod_name("0a1b2c3d", "Node_1.example"),
            "podtrace-0a1b2c3d-node-1-example"
        );
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_000), (2024, 10, 4));
        assert_eq!(parse_skew("-2s").unwrap(), -2_000_000_000);
        assert_eq!(parse_skew("3s").unwrap(), 3_000_000_000);
        assert!(now_micro_time().ends_with('Z'));
    }

    #[test]
    fn an_agent_pod_mounts_its_nodes_root_read_only_and_keeps_its_mounts() {
        let agent = AgentArgs {
            trace: Args::try_parse_from(["podtrace", "a", "b"]).unwrap(),
            node: None,
            lease: None,
            pod: None,
            send_headers: false,
        };
        let argv = agent_argv(agent, "node-1", "l", "p", "podtrace");
        assert!(
            argv.windows(2).any(|w| w == ["--host-root", HOST_ROOT]),
            "{argv:?}"
        );
        let pod = agent_pod("p", "node-1", "img", &argv, "l", None, None);
        let spec = &pod["spec"];
        let container = &spec["containers"][0];
        let mount = |path: &str| {
            let mounts = container["volumeMounts"].as_array().unwrap();
            let mount = mounts.iter().find(|m| m["mountPath"] == path);
            let mount = mount.unwrap_or_else(|| panic!("nothing mounted at {path}"));
            let volume = spec["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == mount["name"])
                .unwrap_or_else(|| panic!("no volume for {mount}"));
            (
                mount["readOnly"].clone(),
                volume["hostPath"]["path"].clone(),
            )
        };
        assert_eq!(mount("/host"), (json!(true), json!("/")));
        assert_eq!(
            mount("/sys/kernel/btf"),
            (json!(true), json!("/sys/kernel/btf"))
        );
        assert_eq!(mount("/run/podtrace").1, json!("/run/podtrace"));
        assert_eq!(container["args"], json!(argv));
    }
}
