//! What a trace asks of the API beyond its two endpoints, scoped to what
//! it traces: the Services its destination may name (by name, by the
//! `spec.clusterIP` field selector, or those with NodePorts), their
//! EndpointSlices by their Service's label, and the nodes involved, by
//! name. The whole cluster is listed (a page at a time) only where the
//! question is about all of it: `--nodes all`, an address that may be
//! any node's, or an API server too old to select Services by ClusterIP.

use std::{collections::BTreeMap, net::IpAddr};

use anyhow::Result;
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{api::ListParams, Api};
use serde_json::Value;

use super::{
    api::Cluster,
    argument::Target,
    nodes::{nodes_of, Nodes},
    services::Catalog,
};

/// The label the EndpointSlice controller gives each slice: its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Service names per label selector (`in (…)`): a query of a few KB.
const NAMES_PER_SELECTOR: usize = 50;
/// The Service types that have NodePorts.
const NODE_PORT_TYPES: [&str; 2] = ["NodePort", "LoadBalancer"];

impl Cluster {
    /// The Services `dst` may name, with their slices: `svc/…` by name;
    /// an address by its ClusterIP, else (it may be a node's) the
    /// Services with NodePorts; a node's NodePorts. A pod names none.
    pub async fn services_for(&self, dst: &Target) -> Result<Catalog> {
        let by_cluster_ip = match dst {
            Target::Pod { .. } => return Ok(Catalog::default()),
            Target::Node(_) => Vec::new(),
            Target::Service { namespace, name } => {
                let named = self.service_named(namespace, name).await?;
                return self.catalog_of(named.into_iter().collect()).await;
            }
            Target::Ip(ip) | Target::IpPort(ip, _) => self.with_cluster_ip((*ip).into()).await?,
            Target::Ip6(ip) | Target::Ip6Port(ip, _) => self.with_cluster_ip((*ip).into()).await?,
        };
        // (IPv6 NodePorts are not followed.)
        let services = match (by_cluster_ip.is_empty(), dst.address()) {
            (true, Some(IpAddr::V4(_)) | None) => self.with_node_ports().await?,
            _ => by_cluster_ip,
        };
        self.catalog_of(services).await
    }

    async fn service_named(&self, namespace: &str, name: &str) -> Result<Option<Service>> {
        let services: Api<Service> = Api::namespaced(self.client(), namespace);
        (services.get_opt(name).await)
            .map_err(|e| self.explain(e, "get", "services", Some(namespace)))
    }

    /// The Services with `ip` as a ClusterIP: by the `spec.clusterIP`
    /// field selector (Kubernetes 1.30 and later), which matches a
    /// Service's first ClusterIP. Where the API has no such selector, or
    /// for an IPv6 address (a dual-stack Service's second ClusterIP), every
    /// Service is looked through, a page at a time.
    async fn with_cluster_ip(&self, ip: IpAddr) -> Result<Vec<Service>> {
        let services: Api<Service> = Api::all(self.client());
        let selector = format!("spec.clusterIP={ip}");
        match self.selected(&services, &selector, "services").await? {
            Some(found) if !found.is_empty() || ip.is_ipv4() => return Ok(found),
            _ => {}
        }
        let every = (self.list_paged(&services, &ListParams::default(), "services", None)).await?;
        let has_ip = |s: &Service| {
            let ips = s.spec.as_ref().and_then(|spec| spec.cluster_ips.as_ref());
            ips.is_some_and(|ips| ips.iter().any(|c| c.parse() == Ok(ip)))
        };
        Ok(every.into_iter().filter(has_ip).collect())
    }

    /// The Services that have NodePorts (types NodePort and LoadBalancer,
    /// by the `spec.type` field selector; every Service where the API
    /// has none): what a node's address translates.
    async fn with_node_ports(&self) -> Result<Vec<Service>> {
        let services: Api<Service> = Api::all(self.client());
        let mut found = Vec::new();
        for kind in NODE_PORT_TYPES {
            let selector = format!("spec.type={kind}");
            match self.selected(&services, &selector, "services").await? {
                Some(listed) => found.extend(listed),
                None => {
                    let params = ListParams::default();
                    return self.list_paged(&services, &params, "services", None).await;
                }
            }
        }
        Ok(found)
    }

    /// `services` and their EndpointSlices, as one catalog: the slices
    /// asked for by their Service's label, namespace by namespace.
    async fn catalog_of(&self, services: Vec<Service>) -> Result<Catalog> {
        let mut by_namespace: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for service in &services {
            let (Some(namespace), Some(name)) =
                (&service.metadata.namespace, &service.metadata.name)
            else {
                continue;
            };
            by_namespace
                .entry(namespace.clone())
                .or_default()
                .push(name.clone());
        }
        let mut objects = Vec::new();
        for service in services {
            let mut object = serde_json::to_value(service)?;
            // Typed objects serialize without their kind.
            object["kind"] = "Service".into();
            objects.push(object);
        }
        for (namespace, names) in by_namespace {
            let slices: Api<EndpointSlice> = Api::namespaced(self.client(), &namespace);
            for chunk in names.chunks(NAMES_PER_SELECTOR) {
                let selector = format!("{SERVICE_NAME_LABEL} in ({})", chunk.join(","));
                let params = ListParams::default().labels(&selector);
                let listed =
                    (self.list_paged(&slices, &params, "endpointslices", Some(&namespace))).await?;
                for slice in listed {
                    let mut object = serde_json::to_value(slice)?;
                    object["kind"] = "EndpointSlice".into();
                    objects.push(object);
                }
            }
        }
        Ok(Catalog::from_objects(&objects))
    }

    /// The nodes named (each by name; one the API does not have is left
    /// out), or with `every`, all of the cluster's, a page at a time.
    pub async fn nodes_for(&self, names: &[String], every: bool) -> Result<Nodes> {
        let nodes: Api<Node> = Api::all(self.client());
        let found = if every {
            self.list_paged(&nodes, &ListParams::default(), "nodes", None)
                .await?
        } else {
            self.nodes_named(names).await?
        };
        let items: Vec<Value> =
            (found.iter().map(serde_json::to_value)).collect::<Result<_, _>>()?;
        nodes_of(&items)
    }

    /// The nodes `names`, each by name, once; one the API does not have
    /// is left out.
    pub async fn nodes_named(&self, names: &[String]) -> Result<Vec<Node>> {
        let mut names = names.to_vec();
        names.sort();
        names.dedup();
        let nodes: Api<Node> = Api::all(self.client());
        let mut found = Vec::new();
        for name in names {
            let node =
                (nodes.get_opt(&name).await).map_err(|e| self.explain(e, "get", "nodes", None))?;
            found.extend(node);
        }
        Ok(found)
    }
}
