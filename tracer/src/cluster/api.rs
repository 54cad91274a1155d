//! The Kubernetes API: pods and nodes by name, and watching the traced
//! pods while podtrace runs (kube-rs over the real REST wire format).
//! A trace asks for what it traces, by name, field selector or label
//! (`scoped`); a list that remains is paged, as kubectl pages it.

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::{anyhow, bail, Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod as KubePod, Service};
use kube::{
    api::ListParams,
    config::{KubeConfigOptions, Kubeconfig},
    runtime::watcher,
    Api, Client, Config,
};
use tokio::sync::mpsc;

use super::{
    access::{home_kubeconfig, Access},
    argument::Target,
    inventory::{not_found, pod_from_json, Endpoint, Pod},
    nodes::nodes_from_items,
};

pub struct Cluster {
    client: Client,
    url: String,
}

/// Items per page of a list that remains (kubectl's default chunk).
const PAGE: u32 = 500;

/// A traced pod changed its IP (it was recreated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMoved {
    pub pod: String,
    pub old: Ipv4Addr,
    pub new: Ipv4Addr,
}

impl Cluster {
    /// `--kubeconfig`, then KUBECONFIG, then ~/.kube/config, then the
    /// in-cluster service account.
    pub async fn connect(access: &Access) -> Result<Self> {
        let options = KubeConfigOptions {
            context: access.context.clone(),
            cluster: access.cluster.clone(),
            user: access.user.clone(),
        };
        let config = match &access.kubeconfig {
            Some(path) => {
                let file = Kubeconfig::read_from(path)
                    .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
                Config::from_custom_kubeconfig(file, &options).await?
            }
            None if std::env::var_os("KUBECONFIG").is_some()
                || home_kubeconfig().is_some_and(|p| p.exists()) =>
            {
                Config::from_kubeconfig(&options).await?
            }
            // `--server` alone, as kubectl takes it with no kubeconfig.
            None if access.server.is_some()
                && std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() =>
            {
                Config::new(http::Uri::from_static("https://localhost"))
            }
            None => Config::incluster().context("no kubeconfig, and not running in a pod")?,
        };
        let mut config = access.overridden(config)?;
        if let Ok(agent) = access.user_agent().parse() {
            config.headers.push((http::header::USER_AGENT, agent));
        }
        let url = config.cluster_url.to_string();
        let client = Client::try_from(config).context("cannot set up the Kubernetes client")?;
        let cluster = Self { client, url };
        // One cheap request, so that an unreachable API, TLS or credentials
        // fail here, in one line, before anything is attached.
        let asked = cluster.client.apiserver_version();
        let answered = match access.request_limit() {
            Some(limit) => tokio::time::timeout(limit, asked).await.map_err(|_| {
                anyhow!(
                    "the Kubernetes API at {} did not answer within --request-timeout {}",
                    cluster.url,
                    humantime::format_duration(limit)
                )
            })?,
            None => asked.await,
        };
        answered.map_err(|e| cluster.explain(e, "get", "version", None))?;
        Ok(cluster)
    }

    /// The client, for what cluster mode asks of the API.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// An endpoint argument, through the API.
    pub async fn resolve(&self, target: &Target) -> Result<Endpoint> {
        match target {
            Target::Node(node) => self.node(node).await,
            Target::Service { namespace, name } => self.service(namespace, name).await,
            Target::Ip(ip) | Target::IpPort(ip, _) => self.pod_with_ip(*ip).await,
            Target::Ip6(ip) | Target::Ip6Port(ip, _) => self.pod_with_ipv6(*ip).await,
            Target::Pod { namespace, name } => self.pod(namespace, name).await,
        }
    }

    async fn node(&self, node: &str) -> Result<Endpoint> {
        {
            let nodes: Api<Node> = Api::all(self.client.clone());
            let found = nodes
                .get_opt(node)
                .await
                .map_err(|e| self.explain(e, "get", "nodes", None))?;
            let node_obj = found.ok_or_else(|| anyhow!("node {node} not found"))?;
            let ip = nodes_from_items(&[serde_json::to_value(&node_obj)?])?
                .first()
                .map(|s| s.node_ip)
                .or_else(|| internal_ip(&node_obj))
                .ok_or_else(|| anyhow!("node {node} has no InternalIP"))?;
            Ok(Endpoint {
                ip: ip.into(),
                pod: None,
                label: Some(format!("node/{node}")),
            })
        }
    }

    async fn service(&self, ns: &str, name: &str) -> Result<Endpoint> {
        {
            let services: Api<Service> = Api::namespaced(self.client.clone(), ns);
            let svc = services
                .get_opt(name)
                .await
                .map_err(|e| self.explain(e, "get", "services", Some(ns)))?
                .ok_or_else(|| anyhow!("service {ns}/{name} not found"))?;
            let ip = serde_json::to_value(&svc)
                .ok()
                .and_then(|v| super::services::service_of(&v))
                .and_then(|s| s.cluster_address())
                .ok_or_else(|| anyhow!("service {ns}/{name} has no ClusterIP (headless)"))?;
            eprintln!(
                "podtrace: warning: svc/{name} is traced by its ClusterIP {ip}; kube-proxy DNAT rewrites it to a pod IP on the way, so name the pod to follow the packet after that"
            );
            Ok(Endpoint {
                ip,
                pod: None,
                label: Some(format!("svc/{ns}/{name}")),
            })
        }
    }

    /// The pods with `ip`, found by the `status.podIP` field selector (the
    /// API has none for podIPs). On an IPv6-primary cluster podIP is each
    /// pod's IPv6 address: there, and only there (one pod asked tells),
    /// an IPv4 address the selector does not find is looked for in every
    /// pod's podIPs.
    async fn pod_with_ip(&self, ip: Ipv4Addr) -> Result<Endpoint> {
        let found = self.list_pods(&by_pod_ip(ip)).await?;
        if !found.is_empty() {
            return Endpoint::of_ip(ip, found);
        }
        let pods: Api<KubePod> = Api::all(self.client.clone());
        let sample = (pods.list(&ListParams::default().limit(1)).await)
            .map_err(|e| self.explain(e, "list", "pods", None))?;
        let sample: Vec<Pod> = sample
            .items
            .into_iter()
            .map(convert)
            .collect::<Result<_>>()?;
        let ipv6_primary = sample.first().is_some_and(|p| p.ip_is_secondary);
        if !ipv6_primary {
            return Endpoint::of_ip(ip, found);
        }
        let all = self.list_pods(&ListParams::default()).await?;
        Endpoint::of_ip(ip, all.into_iter().filter(|p| p.holds(ip.into())).collect())
    }

    /// The pod with IPv6 address `ip`: by the `status.podIP` field
    /// selector where it is the pod's first address (IPv6-primary), else
    /// looked for in every pod's podIPs.
    async fn pod_with_ipv6(&self, ip: Ipv6Addr) -> Result<Endpoint> {
        for params in [by_pod_ip(ip), ListParams::default()] {
            let found: Vec<Pod> = (self.list_pods(&params).await?.into_iter())
                .filter(|p| p.holds(ip.into()))
                .collect();
            if !found.is_empty() {
                return Endpoint::of_ip(ip, found);
            }
        }
        Endpoint::of_ip(ip, Vec::new())
    }

    /// The pods of every namespace `params` selects, as podtrace keeps them.
    async fn list_pods(&self, params: &ListParams) -> Result<Vec<Pod>> {
        let pods: Api<KubePod> = Api::all(self.client.clone());
        let listed = self.list_paged(&pods, params, "pods", None).await?;
        listed.into_iter().map(convert).collect()
    }

    /// Every object `params` selects, a page at a time (`limit` and
    /// `continue`, as kubectl asks): the API server answers each page
    /// from its cache instead of building one answer of the whole list.
    pub async fn list_paged<K>(
        &self,
        api: &Api<K>,
        params: &ListParams,
        resource: &str,
        namespace: Option<&str>,
    ) -> Result<Vec<K>>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        (list_pages(api, params).await).map_err(|e| self.explain(e, "list", resource, namespace))
    }

    /// The objects of every namespace that field selector `fields`
    /// selects, a page at a time; `None` where the API server does not
    /// take that selector (400: the field is not one it selects by, as on
    /// servers older than the selector).
    pub(super) async fn selected<K>(
        &self,
        api: &Api<K>,
        fields: &str,
        resource: &str,
    ) -> Result<Option<Vec<K>>>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        match list_pages(api, &ListParams::default().fields(fields)).await {
            Ok(items) => Ok(Some(items)),
            Err(kube::Error::Api(status)) if status.code == 400 => Ok(None),
            Err(e) => Err(self.explain(e, "list", resource, None)),
        }
    }

    async fn pod(&self, ns: &str, name: &str) -> Result<Endpoint> {
        let in_ns: Api<KubePod> = Api::namespaced(self.client.clone(), ns);
        match in_ns
            .get_opt(name)
            .await
            .map_err(|e| self.explain(e, "get", "pods", Some(ns)))?
        {
            Some(pod) => Endpoint::of_pod(convert(pod)?),
            None => {
                // A page of them is enough to name the likely one.
                let others = in_ns
                    .list(&ListParams::default().limit(PAGE))
                    .await
                    .map_err(|e| self.explain(e, "list", "pods", Some(ns)))?;
                let candidates: Vec<Pod> = others
                    .items
                    .into_iter()
                    .map(convert)
                    .collect::<Result<_>>()?;
                bail!(not_found(ns, name, &candidates))
            }
        }
    }

    /// Watches `pod`; when it comes back with another IP, says so on `tx`.
    pub fn watch(&self, pod: &Pod, tx: mpsc::UnboundedSender<PodMoved>) {
        let api: Api<KubePod> = Api::namespaced(self.client.clone(), &pod.namespace);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", pod.name));
        let qualified = pod.qualified();
        let mut current = pod.ip;
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(api, config));
            while let Some(event) = events.next().await {
                let (watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) = (match event {
                    Ok(event) => event,
                    Err(e) => {
                        eprintln!("podtrace: watching {qualified}: {e}");
                        continue;
                    }
                }) else {
                    continue;
                };
                let Ok(seen) = convert(obj) else { continue };
                if let (Some(old), Some(new)) = (current, seen.ip) {
                    if old != new
                        && tx
                            .send(PodMoved {
                                pod: qualified.clone(),
                                old,
                                new,
                            })
                            .is_err()
                    {
                        return;
                    }
                }
                if seen.ip.is_some() {
                    current = seen.ip;
                }
            }
        });
    }

    /// One line for an API error: what failed, why, and what to do.
    pub(super) fn explain(
        &self,
        error: kube::Error,
        verb: &str,
        resource: &str,
        namespace: Option<&str>,
    ) -> anyhow::Error {
        let scope = namespace.map_or("at the cluster scope".to_string(), |ns| {
            format!("in namespace {ns}")
        });
        match &error {
            kube::Error::Api(status) if status.code == 403 => anyhow!(
                "the Kubernetes API forbids this: podtrace needs RBAC permission to {verb} {resource} {scope} ({})",
                status.message
            ),
            kube::Error::Api(status) if status.code == 401 => anyhow!(
                "the Kubernetes API at {} rejected podtrace's credentials (401 Unauthorized): check the token or certificate in the kubeconfig",
                self.url
            ),
            kube::Error::Api(status) => anyhow!("the Kubernetes API answered {} to {verb} {resource}: {}", status.code, status.message),
            other => {
                let text = format!("{other}");
                let text = error_chain(other).unwrap_or(text);
                if text.to_lowercase().contains("certificate") || text.contains("tls") || text.contains("TLS") {
                    anyhow!("TLS with the Kubernetes API at {} failed: {text}", self.url)
                } else {
                    anyhow!(
                        "cannot reach the Kubernetes API at {}: {text}; without the API, pass --pods-file and --nodes-file (kubectl get pods -A -o json, kubectl get nodes -o json) or pod IPs",
                        self.url
                    )
                }
            }
        }
    }
}

/// Every object `params` selects, following `continue` page by page.
pub async fn list_pages<K>(api: &Api<K>, params: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut page = params.clone().limit(params.limit.unwrap_or(PAGE));
    let mut items = Vec::new();
    loop {
        let listed = api.list(&page).await?;
        items.extend(listed.items);
        match listed.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => page = page.continue_token(&token),
            None => return Ok(items),
        }
    }
}

/// The innermost cause of an error, which says what really happened.
fn error_chain(error: &dyn std::error::Error) -> Option<String> {
    let mut source = error.source()?;
    while let Some(next) = source.source() {
        source = next;
    }
    Some(source.to_string())
}

fn internal_ip(node: &Node) -> Option<Ipv4Addr> {
    super::nodes::ipv4_internal_ip(&serde_json::to_value(node).ok()?)
}

/// The API's pod object as podtrace's own.
/// The API's field selector for a pod's podIP (its first address).
fn by_pod_ip(ip: impl std::fmt::Display) -> ListParams {
    ListParams::default().fields(&format!("status.podIP={ip}"))
}

fn convert(pod: KubePod) -> Result<Pod> {
    pod_from_json(serde_json::to_value(pod)?)
}
