//! Where the cluster is, as kubectl takes it (kubeconfig, context and
//! kubectl's global flags), or the files in its place, and each traced
//! node's network namespace and root filesystem.

use std::{path::PathBuf, time::Duration};

use super::values;

/// Where the cluster is and which nodes to look at, for a trace and the
/// doctor alike: the API (or files in its place) and each node's network
/// namespace and root filesystem.
#[derive(Clone, Debug, clap::Args)]
pub struct KubeArgs {
    /// Namespace for pod names given without one (default: the
    /// kubeconfig context's, as kubectl's; else `default`).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Kubeconfig to reach the API (default: KUBECONFIG, ~/.kube/config,
    /// then the in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,
    /// Kubeconfig cluster to use (kubectl's `--cluster`).
    #[arg(long, value_name = "NAME")]
    pub cluster: Option<String>,
    /// Kubeconfig user to use (kubectl's `--user`).
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// User to impersonate (kubectl's `--as`).
    #[arg(long = "as", value_name = "USER")]
    pub impersonate: Option<String>,
    /// Group to impersonate, repeatable (kubectl's `--as-group`).
    #[arg(long = "as-group", value_name = "GROUP", requires = "impersonate")]
    pub impersonate_groups: Vec<String>,
    /// Bearer token for the API (kubectl's `--token`).
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// The API server's address (kubectl's `--server`, `-s`).
    #[arg(long, short = 's', value_name = "URL")]
    pub server: Option<String>,
    /// How long reaching the API may take, its first answer included
    /// (kubectl's `--request-timeout`: `30s`, `1m`; 0 for no limit).
    #[arg(long, value_name = "DURATION", value_parser = values::parse_duration)]
    pub request_timeout: Option<Duration>,
    /// Pod inventory in `kubectl get pods -A -o json` format, instead of
    /// the API.
    #[arg(long, value_name = "FILE")]
    pub pods_file: Option<PathBuf>,
    /// Node list in `kubectl get nodes -o json` format, instead of the
    /// API: each node's pod subnet, CNI annotations and conditions.
    #[arg(long, value_name = "FILE")]
    pub nodes_file: Option<PathBuf>,
    /// Trace (or examine) the node inside this network namespace: a name
    /// from `ip netns` or a path such as /proc/PID/ns/net. Repeat it for
    /// several nodes in one run.
    #[arg(long, value_name = "NETNS")]
    pub netns: Vec<String>,
    /// Each node's root filesystem, in --netns order (`/host` in a debug
    /// pod), for its etc/cni/net.d, opt/cni/bin and run/flannel; without
    /// it a --netns node's files are not examined (this host's are read
    /// from /).
    // The doctor's wording: the commands that flatten a trace's `Args`
    // say what it does for them (`HOST_ROOT_*`, with `mut_arg`).
    #[arg(long, value_name = "DIR")]
    pub host_root: Vec<PathBuf>,
    /// The node an agent runs on (its `--node`): the API is asked for
    /// it by name, and the agent names itself by it to the API.
    #[arg(skip)]
    pub agent_on: Option<String>,
}

impl KubeArgs {
    /// The namespace of pod names given without one: `-n`, else the
    /// kubeconfig context's once it is settled (`cluster::access`), else
    /// `default`.
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("default")
    }
}
