//! A destination that is a Service: the Services known before any API
//! is asked (a file, or kube-proxy's rules on the traced nodes), a
//! ClusterIP argument (`svc/…`, `ClusterIP:port`, `[ClusterIPv6]:port`)
//! checked against them, and backends known by address named after
//! their pods.

use anyhow::{bail, Result};

use crate::{
    cli::Args,
    cluster::{
        access::Access,
        api::Cluster,
        argument::Target,
        inventory::{Endpoint, Inventory},
        kube_proxy_rules,
        services::{Catalog, Service},
    },
    node::netns::Namespace,
};

/// Backends known only by address (read from kube-proxy's rules) named
/// after the pods that have them, with their nodes.
pub(super) fn name_backends(catalog: &mut Catalog, inventory: &Inventory) {
    let backends = catalog.services.iter_mut().flat_map(|s| &mut s.backends);
    for backend in backends.filter(|b| b.pod.is_none()) {
        if let Some(pod) = inventory.pods.iter().find(|p| p.holds(backend.ip)) {
            backend.pod = Some(pod.qualified());
            backend.node = pod.node.clone();
        }
    }
}

/// DST as a Service (`svc/…`, a ClusterIP, `ClusterIP:port`), when the
/// Services are known; `None` when it names something else.
pub(super) fn service_destination(
    target: &Target,
    catalog: Option<&Catalog>,
) -> Result<Option<Endpoint>> {
    let service = match (target, catalog) {
        (Target::Service { namespace, name }, Some(catalog)) => {
            match catalog.by_name(namespace, name) {
                Some(s) => s,
                None => bail!("service {namespace}/{name} not found"),
            }
        }
        (Target::Service { namespace, name }, None) => bail!(
            "svc/{namespace}/{name} needs the Kubernetes API or --services-file to find its ClusterIP and backends"
        ),
        (Target::Ip(ip), Some(catalog)) => match catalog.by_cluster_ip(*ip) {
            Some(s) => s,
            None => return Ok(None),
        },
        (Target::Ip6Port(ip, port), None) => bail!(
            "[{ip}]:{port}: a Service's IPv6 ClusterIP and port need --services-file or the Kubernetes API to be found"
        ),
        (Target::Ip6(ip), Some(catalog)) => match catalog.by_cluster_ipv6(*ip) {
            Some(s) => s,
            None => return Ok(None),
        },
        (Target::Ip6Port(ip, port), Some(catalog)) => match catalog.by_cluster_ipv6(*ip) {
            Some(s) if s.ports.iter().any(|p| p.port == *port) => s,
            Some(s) => bail!("[{ip}]:{port}: {} has no port {port}", s.qualified()),
            // (IPv6 NodePorts are not followed: their DNAT on the node is
            // not joined to the packet yet.)
            None => bail!("[{ip}]:{port}: {ip} is not a Service's IPv6 ClusterIP: give a pod's address without a port ({ip})"),
        },
        (Target::IpPort(ip, port), Some(catalog)) => match catalog.by_cluster_ip(*ip) {
            Some(s) if s.ports.iter().any(|p| p.port == *port) => s,
            Some(s) => bail!(
                "{ip}:{port}: {} has no port {port} (it has {})",
                s.qualified(),
                s.ports.iter().map(|p| p.port.to_string()).collect::<Vec<_>>().join(", ")
            ),
            // A node's address and one of the Services' NodePorts: traced
            // as the node, whose NodePort translations are followed.
            None if catalog.by_node_port(*port).is_some() => return Ok(None),
            None => bail!("{ip}:{port}: {ip} is not a Service's ClusterIP and {port} no Service's NodePort: give a pod's address without a port ({ip}); podtrace traces every port between the two"),
        },
        _ => return Ok(None),
    };
    let Some(ip) = service.cluster_address() else {
        bail!(
            "service {} has no ClusterIP (headless): name one of its pods",
            service.qualified()
        );
    };
    if service.backends.is_empty() {
        eprintln!(
            "podtrace: note: {} has no ready endpoints: kube-proxy rejects its traffic",
            service.qualified()
        );
    }
    Ok(Some(Endpoint {
        ip,
        pod: None,
        label: Some(format!("svc/{}", service.qualified())),
    }))
}

/// `--probe tcp:PORT`/`udp:PORT` to a Service on a port it does not
/// have: kube-proxy has no rule for it, so nothing translates the probe
/// and it goes wherever the ClusterIP routes (the default route, often
/// masqueraded off the node): refused up front, as `ClusterIP:port` is.
/// Only where the Service's ports are listed whole (the API, `by_api`,
/// or a services file): kube-proxy's nat rules have no port without
/// endpoints, which is a probe's very case.
pub(super) fn refuse_probe_port(
    args: &Args,
    service: Option<&Service>,
    by_api: bool,
) -> Result<()> {
    let listed = by_api || args.services_file.is_some();
    let (Some(service), Some(probe), true) = (service, args.probe.probe, listed) else {
        return Ok(());
    };
    let Some(port) = probe.port() else {
        return Ok(());
    };
    let asked = probe.protocol();
    if service
        .ports
        .iter()
        .any(|p| (p.protocol_name(), p.port) == (asked, port))
    {
        return Ok(());
    }
    let has: Vec<String> = service
        .ports
        .iter()
        .map(|p| format!("{}:{}", p.protocol_name(), p.port))
        .collect();
    bail!(
        "--probe {asked}:{port}: {} has no {asked} port {port} (it has {}): kube-proxy would not translate the probe",
        service.qualified(),
        has.join(", ")
    )
}

/// DST through the API, with the Services it involves: those `known`
/// (a services file, kube-proxy's rules) where there are; else a pod, by
/// name or by an address a pod holds, asks for no Service at all; else
/// the Service it names (by name or ClusterIP), else the node it may be,
/// with the Services that have NodePorts.
pub(super) async fn api_destination(
    cluster: &Cluster,
    target: &Target,
    known: Option<Catalog>,
) -> Result<(Endpoint, Catalog)> {
    if let Some(catalog) = known {
        let dst = match service_destination(target, Some(&catalog))? {
            Some(dst) => dst,
            None => cluster.resolve(target).await?,
        };
        return Ok((dst, catalog));
    }
    // (An address with a port names a Service's port, not a pod.)
    let pod_first = matches!(target, Target::Pod { .. } | Target::Ip(_) | Target::Ip6(_));
    let endpoint = match pod_first {
        true => Some(cluster.resolve(target).await?),
        false => None,
    };
    if let Some(endpoint) = endpoint.as_ref().filter(|e| e.pod.is_some()) {
        return Ok((endpoint.clone(), Catalog::default()));
    }
    let catalog = cluster.services_for(target).await?;
    let dst = match (service_destination(target, Some(&catalog))?, endpoint) {
        (Some(service), _) => service,
        (None, Some(endpoint)) => endpoint,
        (None, None) => cluster.resolve(target).await?,
    };
    Ok((dst, catalog))
}

/// The Services known before any API is asked: the `--services-file`,
/// else (with no API to ask, towards an IP) kube-proxy's rules on the
/// traced nodes.
pub(super) fn known_services(
    args: &Args,
    access: &Access,
    plain_ips: bool,
    dst_target: &Target,
) -> Result<Option<Catalog>> {
    if let Some(path) = &args.services_file {
        return Ok(Some(Catalog::load(path)?));
    }
    let without_api = args.kube.pods_file.is_some() || (plain_ips && !access.configured());
    if without_api && dst_target.address().is_some() && !args.no_kube_proxy_rules {
        return Ok(kube_proxy_rules::read_nodes(&Namespace::all(
            &args.kube.netns,
        )?));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn an_ip_and_port_is_a_cluster_ip_port_or_a_node_port() {
        let service = serde_json::json!({
            "kind": "Service",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.7", "ports": [{"port": 80, "nodePort": 30080}]}
        });
        let catalog = Catalog::from_objects(&[service]);
        let at = |arg: &str| {
            service_destination(&Target::parse(arg, "default").unwrap(), Some(&catalog))
        };
        assert_eq!(
            at("10.96.0.7:80").unwrap().unwrap().ip,
            Ipv4Addr::new(10, 96, 0, 7)
        );
        let wrong_port = at("10.96.0.7:81").unwrap_err().to_string();
        assert!(
            wrong_port.contains("default/db has no port 81"),
            "{wrong_port}"
        );
        // A node's address and a NodePort: resolved as the node.
        assert!(at("192.0.2.11:30080").unwrap().is_none());
        let neither = at("192.0.2.11:30081").unwrap_err().to_string();
        assert!(neither.contains("no Service's NodePort"), "{neither}");
    }
}
