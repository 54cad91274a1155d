//! The doctor inside a trace: when a packet vanishes, finds no route or is
//! dropped, the node's own failing checks are added to the verdict; when a
//! pod argument has no IP, the trace ends with why (its sandbox failure,
//! confirmed on its node) instead of a bare error.

use super::{api, cluster::ClusterState, node, Check};
use crate::cli::DoctorArgs;
use crate::{
    cli::Args,
    cluster::{api::Cluster, argument::Target},
    model::{Finding, Format},
};

impl From<Check> for Finding {
    fn from(c: Check) -> Self {
        Self {
            family: c.family.into(),
            check: c.name,
            evidence: c.evidence,
            fix: c.fix,
        }
    }
}

/// The doctor's arguments for a trace's: the same pods, API and nodes;
/// `involved`, the nodes the trace involves (the API is asked for them
/// by name).
fn doctor_args(args: &Args, involved: Vec<String>) -> DoctorArgs {
    DoctorArgs {
        pods: [&args.src, &args.dst]
            .into_iter()
            // Pods only: not an address, a Service or a node.
            .filter(|a| {
                matches!(
                    Target::parse(a, args.kube.namespace()),
                    Ok(Target::Pod { .. })
                )
            })
            .cloned()
            .collect(),
        kube: args.kube.clone(),
        node: Vec::new(),
        output: Format::Json,
        api_only: false,
        conntrack_max_for_testing: None,
        trace_nodes: Some(involved),
    }
}

/// Each traced node's failing checks, in --netns order (none where the
/// doctor cannot look: it never stops a trace). `pods` and `nodes`: those
/// the trace resolved (pods named by address too); `connected`: the
/// resolution's connection to the API, if it made one.
pub async fn node_findings(
    args: &Args,
    pods: Vec<String>,
    nodes: Vec<String>,
    connected: Option<&Cluster>,
) -> Vec<Vec<Finding>> {
    let mut doctor = doctor_args(args, nodes);
    if !pods.is_empty() {
        doctor.pods = pods;
    }
    let Ok(cluster) = ClusterState::load(&doctor, connected).await else {
        return Vec::new();
    };
    let Ok(nodes) = node::gather_all(&doctor, &cluster).await else {
        return Vec::new();
    };
    nodes
        .iter()
        .map(|facts| {
            super::node_checks(facts)
                .into_iter()
                .filter(|c| c.failed())
                .map(Finding::from)
                .collect()
        })
        .collect()
}

/// Why a pod argument has no IP: its sandbox failure and the node check
/// that confirms it, or the node's failing CNI checks.
pub async fn no_ip(args: &Args) -> Option<String> {
    let doctor = doctor_args(args, Vec::new());
    let cluster = ClusterState::load(&doctor, None).await.ok()?;
    let pod = cluster
        .pods
        .iter()
        .find(|p| cluster.is_asked(&p.pod) && p.pod.ip.is_none())?;
    let examined = node::gather_all(&doctor, &cluster)
        .await
        .unwrap_or_default();
    api::explain_pod(pod, &examined)
}
