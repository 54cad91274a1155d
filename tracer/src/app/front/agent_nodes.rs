//! Which nodes a cluster-mode trace starts agents on, and the arguments
//! each agent is started with.

use anyhow::{bail, Result};

use crate::{
    app::targets::Targets,
    cli::{AgentArgs, Args},
};

/// The nodes to trace (the pods' own, a Service's backends', then
/// `--nodes`), and the other nodes known (all of the cluster's only
/// where they were all asked for).
pub(super) fn pick_nodes(args: &Args, targets: &Targets) -> Result<(Vec<String>, Vec<String>)> {
    let all: Vec<String> = targets.subnets.iter().map(|s| s.node.clone()).collect();
    let mut nodes: Vec<String> = Vec::new();
    // A Service's backends run where its EndpointSlices say.
    let backends = targets
        .service
        .iter()
        .flat_map(|s| &s.backends)
        .filter_map(|b| b.node.as_deref());
    for node in [&targets.src, &targets.dst]
        .into_iter()
        .filter_map(Targets::node_of)
        .chain(backends)
    {
        if !nodes.iter().any(|n| n == node) {
            nodes.push(node.to_string());
        }
    }
    let extra: Vec<String> = match args.nodes.as_deref() {
        Some("all") => all.clone(),
        Some(list) => list
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect(),
        None => Vec::new(),
    };
    // The nodes named were asked of the API by name (with a nodes file,
    // every node is known).
    let known = !all.is_empty() || args.kube.nodes_file.is_some();
    for node in extra {
        if known && !all.contains(&node) {
            bail!("--nodes {node}: no such node in the cluster (kubectl get nodes lists them)");
        }
        if !nodes.contains(&node) {
            nodes.push(node);
        }
    }
    if nodes.is_empty() {
        bail!("cluster mode traces the nodes of pods: neither endpoint is a pod with a node; name one with --nodes");
    }
    let untraced = all.into_iter().filter(|n| !nodes.contains(n)).collect();
    Ok((nodes, untraced))
}

/// The agent's arguments: the pods by name (the agent resolves them
/// through the API too) and the trace flags that matter on a node.
pub(super) fn agent_args(args: &Args, targets: &Targets, node: &str) -> AgentArgs {
    let endpoint = |arg: &str, e: &crate::cluster::inventory::Endpoint| {
        e.pod.as_ref().map_or(arg.to_string(), |p| p.qualified())
    };
    let mut trace = args.for_agent(
        endpoint(&args.src, &targets.src),
        endpoint(&args.dst, &targets.dst),
    );
    // The families the front-end resolved: an IPv6 address argument asks
    // for IPv6 alone, and an agent is given the pod by name.
    trace.ipv6_only = targets.traced_ipv4_pair().is_none();
    trace.ipv4_only = targets.traced_ipv6_pair().is_none();
    if let Some(skew) = &args.clock_skew_for_testing {
        let (target, value) = match skew.split_once('=') {
            Some((n, v)) => (Some(n), v),
            None => (Targets::node_of(&targets.dst), skew.as_str()),
        };
        if target == Some(node) {
            trace.clock_skew_for_testing = Some(value.into());
        }
    }
    // The source's agent sends the probes, from the pod's namespace.
    if Targets::node_of(&targets.src) == Some(node) {
        trace.probe = args.probe.clone();
    }
    AgentArgs {
        trace,
        node: None,
        lease: None,
        pod: None,
        // `--write`: the front-end writes the agents' header bytes.
        send_headers: args.write.is_some(),
    }
}
