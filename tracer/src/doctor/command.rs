//! `podtrace doctor`: gathers the inputs (the API's view, each node's
//! facts), runs the check families and renders the report.

use anyhow::{bail, Result};

use super::{api, cluster, node, node_checks, render, Check};
use crate::{cli::DoctorArgs, cluster::argument::Target};

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
    let cluster = cluster::ClusterState::load(&args, None).await?;
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
    render::print(&checks, args.output)?;
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
