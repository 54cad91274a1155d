//! `podtrace doctor`: the node and CNI failures that leave no packet to
//! trace. A pod without an IP, a node whose CNI config names a plugin it
//! does not have, a flanneld that never wrote subnet.env: no tc hook ever
//! sees a packet, so the tracer has nothing to tell. The doctor looks
//! where a person would (the node's files, links, routes, sysctls and
//! firewall; the API's pods, events and nodes) and says, per check, ✓ or
//! ✗ with the evidence and the fix.
//!
//! One file per check family; this one gathers the inputs, runs the
//! families and renders the report (human: grouped by node, failing
//! checks first; JSON).

pub mod api;
pub mod bgp;
pub mod bird;
pub mod calico;
pub mod calico_tunnel;
pub mod cluster;
pub mod cni_config;
pub mod cni_dirs;
pub mod credentials;
pub mod firewall;
pub mod flannel;
pub mod ipv6;
pub mod kernel;
pub mod node;
pub mod plugins;
pub mod policy_routing;
pub mod render;
pub mod trace;

use anyhow::{bail, Result};
use serde::{Serialize, Serializer};

use crate::{cli::DoctorArgs, cluster::argument::Target};

/// A check's outcome: passed, failed, or not checked for want of data
/// (which is never a pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Fail,
    NotChecked,
    Pass,
}

/// In JSON, `ok`: true, false, or null when not checked.
impl Serialize for Status {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Pass => s.serialize_bool(true),
            Self::Fail => s.serialize_bool(false),
            Self::NotChecked => s.serialize_none(),
        }
    }
}

/// One check: ✓, ✗ or not checked, what was seen, and what to do.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Check {
    /// The family: cni-config, plugins, flannel, calico, bgp, kernel, firewall, api.
    pub family: &'static str,
    /// The node it ran on, or the pod / cluster it is about.
    pub node: String,
    pub name: String,
    #[serde(rename = "ok")]
    pub status: Status,
    pub evidence: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    pub fn pass(family: &'static str, node: &str, name: &str, evidence: String) -> Self {
        Self {
            family,
            node: node.into(),
            name: name.into(),
            status: Status::Pass,
            evidence,
            fix: None,
        }
    }

    /// No data to judge by: `not checked: <why>`, never a pass.
    pub fn not_checked(family: &'static str, node: &str, name: &str, why: &str) -> Self {
        Self {
            family,
            node: node.into(),
            name: name.into(),
            status: Status::NotChecked,
            evidence: format!("not checked: {why}"),
            fix: None,
        }
    }

    pub fn ok(&self) -> bool {
        self.status == Status::Pass
    }

    pub fn failed(&self) -> bool {
        self.status == Status::Fail
    }

    pub fn fail(
        family: &'static str,
        node: &str,
        name: &str,
        evidence: String,
        fix: String,
    ) -> Self {
        Self {
            family,
            node: node.into(),
            name: name.into(),
            status: Status::Fail,
            evidence,
            fix: Some(fix),
        }
    }

    /// A pass or a fail by a condition.
    pub fn judge(
        family: &'static str,
        node: &str,
        name: &str,
        ok: bool,
        evidence: String,
        fix: impl FnOnce() -> String,
    ) -> Self {
        if ok {
            Self::pass(family, node, name, evidence)
        } else {
            Self::fail(family, node, name, evidence, fix())
        }
    }
}

/// Every check a node's facts allow.
pub fn node_checks(facts: &node::NodeFacts) -> Vec<Check> {
    let mut checks = cni_config::checks(facts);
    checks.extend(plugins::checks(facts));
    checks.extend(flannel::checks(facts));
    checks.extend(calico::checks(facts));
    checks.extend(calico_tunnel::checks(facts));
    checks.extend(bgp::checks(facts));
    checks.extend(kernel::checks(facts));
    checks.extend(ipv6::checks(facts));
    checks.extend(firewall::checks(facts));
    checks
}

/// A pod argument, checked as a trace's SRC and DST are.
fn check_pod_arg(arg: &str, namespace: &str) -> Result<()> {
    match Target::parse(arg, namespace) {
        Ok(Target::Pod { .. }) => Ok(()),
        Ok(_) => bail!("{arg:?} is not a pod (namespace/name, or name with -n)"),
        Err(e) => bail!("{arg:?} is not a pod: {e}"),
    }
}

/// `podtrace doctor`: Ok(true) when every check passed.
pub async fn run(args: DoctorArgs) -> Result<bool> {
    let nodes = args.kube.netns.len().max(1);
    if args.node.len() > 1 && args.node.len() != nodes {
        bail!("give one --node per --netns");
    }
    if !args.kube.host_root.is_empty() && args.kube.host_root.len() != nodes {
        bail!("give one --host-root per --netns, in the same order");
    }
    // A mistyped root would read as a node with no CNI at all.
    if let Some(root) = args.kube.host_root.iter().find(|r| !r.is_dir()) {
        bail!("--host-root {}: no such directory", root.display());
    }
    for pod in &args.pods {
        check_pod_arg(pod, args.kube.namespace())?;
    }
    let cluster = cluster::ClusterState::load(&args).await?;
    cluster.check_asked(&args)?;
    // Said by the command only: a trace's own doctor stays quiet.
    if !args.api_only {
        for ns in args.kube.netns.iter().skip(args.kube.host_root.len()) {
            eprintln!("podtrace doctor: {ns}: no --host-root, so the node's files (etc/cni/net.d, opt/cni/bin, run/flannel) are not examined");
        }
    }
    let mut checks = Vec::new();
    let mut examined = Vec::new();
    if !args.api_only {
        for facts in node::gather_all(&args, &cluster).await? {
            checks.extend(node_checks(&facts));
            examined.push(facts);
        }
    }
    checks.extend(api::checks(&cluster, &examined));
    let failed = checks.iter().any(Check::failed);
    render::print(&checks, args.output);
    Ok(!failed)
}

#[cfg(test)]
mod tests {
    use super::check_pod_arg;

    #[test]
    fn a_pod_is_a_name_or_namespace_slash_name() {
        for ok in ["web-0", "default/web-0"] {
            assert!(check_pod_arg(ok, "default").is_ok(), "{ok}");
        }
        for bad in ["nope/x/y", "/web-0", "default/", "", "svc/db", "10.244.1.2"] {
            assert!(check_pod_arg(bad, "default").is_err(), "{bad:?}");
        }
    }
}
