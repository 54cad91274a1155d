//! How to reach the Kubernetes API, as kubectl takes it: a kubeconfig
//! (`--kubeconfig`, `KUBECONFIG`, `~/.kube/config`) or the pod's service
//! account, its context, kubectl's global flags over it, and the
//! namespace a pod name without one is in.

use std::path::PathBuf;

use anyhow::{anyhow, Result};
use kube::{config::Kubeconfig, Config};

use crate::cli::KubeArgs;

/// How to reach the API, as kubectl takes it.
#[derive(Clone, Debug, Default)]
pub struct Access {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// kubectl's global flags over the kubeconfig: `--cluster`, `--user`,
    /// `--as`, `--as-group`, `--token`, `--server`, `--request-timeout`.
    pub cluster: Option<String>,
    pub user: Option<String>,
    pub impersonate: Option<String>,
    pub impersonate_groups: Vec<String>,
    pub token: Option<String>,
    pub server: Option<String>,
    pub request_timeout: Option<std::time::Duration>,
    /// The node an agent runs on: named in the requests' User-Agent, so
    /// that the API server's audit log tells the agents apart.
    pub agent_on: Option<String>,
}

impl Access {
    /// The way to the API that the flags (of a trace or the doctor) give.
    pub fn of(kube: &KubeArgs) -> Self {
        Self {
            kubeconfig: kube.kubeconfig.clone(),
            context: kube.context.clone(),
            cluster: kube.cluster.clone(),
            user: kube.user.clone(),
            impersonate: kube.impersonate.clone(),
            impersonate_groups: kube.impersonate_groups.clone(),
            token: kube.token.clone(),
            server: kube.server.clone(),
            request_timeout: kube.request_timeout,
            agent_on: kube.agent_on.clone(),
        }
    }

    /// `--request-timeout`, where it sets a limit (0 is none, as kubectl's).
    pub(super) fn request_limit(&self) -> Option<std::time::Duration> {
        self.request_timeout.filter(|t| !t.is_zero())
    }

    /// The kubeconfig's (or the pod's) configuration with kubectl's global
    /// flags over it, as kubectl applies them.
    pub(super) fn overridden(&self, mut config: Config) -> Result<Config> {
        if let Some(server) = &self.server {
            config.cluster_url =
                (server.parse()).map_err(|e| anyhow!("--server {server:?}: not a URL ({e})"))?;
        }
        let auth = &mut config.auth_info;
        if let Some(token) = &self.token {
            // The token is who podtrace is: no other credential of the
            // kubeconfig's user is tried before it.
            auth.token = Some(token.clone().into());
            (auth.token_file, auth.exec, auth.auth_provider) = (None, None, None);
            (auth.username, auth.password) = (None, None);
        }
        if let Some(user) = &self.impersonate {
            auth.impersonate = Some(user.clone());
        }
        if !self.impersonate_groups.is_empty() {
            auth.impersonate_groups = Some(self.impersonate_groups.clone());
        }
        // Connecting only: a read timeout would be an idle one, and end the
        // watches and the agents' followed logs that are quiet for longer.
        if let Some(limit) = self.request_limit() {
            config.connect_timeout = Some(limit);
        }
        Ok(config)
    }

    /// `podtrace/<version> (linux/<arch>)`, as kubectl names itself, and
    /// `agent/<node>` for an agent.
    pub(super) fn user_agent(&self) -> String {
        let agent =
            (self.agent_on.as_deref()).map_or(String::new(), |node| format!(" agent/{node}"));
        format!(
            "podtrace/{} ({}/{}){agent}",
            env!("CARGO_PKG_VERSION"),
            std::env::consts::OS,
            std::env::consts::ARCH
        )
    }

    /// Whether any way to the API is configured: a kubeconfig (flag,
    /// KUBECONFIG, ~/.kube/config) or the in-cluster service account.
    pub fn configured(&self) -> bool {
        self.kubeconfig.is_some()
            || self.server.is_some()
            || std::env::var_os("KUBECONFIG").is_some()
            || home_kubeconfig().is_some_and(|p| p.exists())
            || std::env::var_os("KUBERNETES_SERVICE_HOST").is_some()
    }
}

impl Access {
    /// The namespace kubectl would use: the kubeconfig context's
    /// (`--context`, else the current one); in a pod with no kubeconfig,
    /// the pod's own (its service account's namespace file).
    pub fn context_namespace(&self) -> Option<String> {
        let kubeconfig = match &self.kubeconfig {
            Some(path) => Kubeconfig::read_from(path).ok(),
            None => Kubeconfig::read().ok(),
        };
        match kubeconfig {
            Some(config) => {
                let name = (self.context.clone()).or(config.current_context.clone())?;
                let named = config.contexts.iter().find(|c| c.name == name)?;
                named.context.as_ref()?.namespace.clone()
            }
            None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
                let file = std::fs::read_to_string(IN_CLUSTER_NAMESPACE).ok()?;
                Some(file.trim().to_string()).filter(|ns| !ns.is_empty())
            }
            None => None,
        }
    }
}

/// Where a pod's service account says its namespace.
const IN_CLUSTER_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// `-n` where none was given, as kubectl takes it: the context's
/// namespace, where names are resolved through the API (a pods file
/// names its own namespaces, and `default` stays its default).
pub fn settle_namespace(kube: &mut KubeArgs) {
    if kube.namespace.is_none() && kube.pods_file.is_none() {
        kube.namespace = Access::of(kube).context_namespace();
    }
}

pub(super) fn home_kubeconfig() -> Option<PathBuf> {
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config"))
}
