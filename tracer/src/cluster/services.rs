//! Kubernetes Services and their EndpointSlices: what a ClusterIP or a
//! NodePort is translated to, and which pod each backend is. A Service is
//! a destination like a pod, but kube-proxy rewrites it on the way, so the
//! trace must know every backend up front (the kernel filter, the rule
//! tracing and the correlator all need the translated pairs).
//!
//! Read from `--services-file` (`kubectl get svc,endpointslices -A -o json`)
//! or the API (`cluster::api`), both as the same JSON objects.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;
use serde_json::Value;

use crate::model::{Frontend, Translation};

/// One port of a Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    /// 6 (TCP) or 17 (UDP).
    pub protocol: u8,
    pub port: u16,
    pub node_port: Option<u16>,
}

impl ServicePort {
    /// `tcp`, `udp` or `sctp`, as a Service and `--probe` name it.
    pub fn protocol_name(&self) -> &'static str {
        SERVICE_PROTOCOLS
            .iter()
            .find(|(number, _)| *number == self.protocol)
            .map_or("another protocol", |(_, name)| name)
    }
}

/// The protocols a Service port can have: IP protocol number and name.
const SERVICE_PROTOCOLS: [(u8, &str); 3] = [(6, "tcp"), (17, "udp"), (132, "sctp")];

/// A Service port's protocol by name, in either case (`TCP` as the API
/// writes it, `tcp` as kube-proxy's rules do).
pub fn protocol_number(name: &str) -> Option<u8> {
    SERVICE_PROTOCOLS
        .iter()
        .find(|(_, known)| known.eq_ignore_ascii_case(name))
        .map(|(number, _)| *number)
}

/// One ready endpoint (a backend pod) and its ports by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// Of either family: a dual-stack Service has a slice per family.
    pub ip: IpAddr,
    /// `namespace/name` of the pod, from the endpoint's targetRef.
    pub pod: Option<String>,
    pub node: Option<String>,
    /// (port name, protocol, port).
    pub ports: Vec<(String, u8, u16)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub namespace: String,
    pub name: String,
    pub cluster_ip: Option<Ipv4Addr>,
    /// Its IPv6 ClusterIPs (dual-stack), translated to its IPv6 backends.
    pub cluster_ipv6: Vec<std::net::Ipv6Addr>,
    pub ports: Vec<ServicePort>,
    pub backends: Vec<Backend>,
}

impl Service {
    pub fn qualified(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The ClusterIP it is traced by: its IPv4 one, else (an IPv6-only
    /// Service) its first IPv6 one.
    pub fn cluster_address(&self) -> Option<IpAddr> {
        (self.cluster_ip.map(IpAddr::V4)).or(self.cluster_ipv6.first().map(|ip| (*ip).into()))
    }

    /// Every frontend → backend translation kube-proxy makes for it:
    /// ClusterIP:port (each family's, to that family's backends: kube-proxy
    /// runs a proxier per family), and NodePorts on `node_ips`.
    pub fn translations(&self, node_ips: &[IpAddr]) -> Vec<Translation> {
        let mut out = Vec::new();
        for port in &self.ports {
            let mut fronts: Vec<(IpAddr, u16)> = Vec::new();
            if let Some(ip) = self.cluster_ip {
                fronts.push((ip.into(), port.port));
            }
            fronts.extend(self.cluster_ipv6.iter().map(|ip| ((*ip).into(), port.port)));
            if let Some(node_port) = port.node_port {
                fronts.extend(node_ips.iter().map(|ip| (*ip, node_port)));
            }
            for (ip, front_port) in fronts {
                let same_family = |b: &&Backend| b.ip.is_ipv6() == ip.is_ipv6();
                for backend in self.backends.iter().filter(same_family) {
                    let Some(target) = backend.port_for(port) else {
                        continue;
                    };
                    out.push(Translation {
                        protocol: port.protocol,
                        front: Frontend {
                            ip,
                            port: front_port,
                        },
                        back: Frontend {
                            ip: backend.ip,
                            port: target,
                        },
                        service: Some(self.qualified()),
                        backend: backend.pod.clone(),
                        source: false,
                    });
                }
            }
        }
        out
    }
}

impl Backend {
    /// The backend's port for a Service port: matched by name (the
    /// EndpointSlice names its ports after the Service's).
    fn port_for(&self, port: &ServicePort) -> Option<u16> {
        self.ports
            .iter()
            .find(|(name, protocol, _)| *name == port.name && *protocol == port.protocol)
            .map(|(_, _, p)| *p)
    }
}

/// The Services of a cluster.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub services: Vec<Service>,
}

impl Catalog {
    /// Parsed as it is read (see `cluster::parse_file`): each object is
    /// made what is kept of it before the next is read.
    pub fn load(path: &Path) -> Result<Self> {
        let list: List = super::parse_file(
            path,
            "services file",
            "a list of Services and EndpointSlices",
        )?;
        Self::of_list(list).map_err(|e| anyhow!("services file {} {e}", path.display()))
    }

    /// A `List` of Services and EndpointSlices (either kind may be
    /// missing: a Service without slices has no endpoints).
    pub fn parse(json: &str) -> Result<Self> {
        Self::of_list(serde_json::from_str(json)?)
    }

    /// A list's Services; another kind's list alone (a pods file given
    /// as the services file) is said, not read as a cluster without
    /// Services.
    fn of_list(list: List) -> Result<Self> {
        let mut kinds = list.items.iter().map(|item| match item {
            Kept::Other(kind) => Some(kind),
            _ => None,
        });
        if let Some(Some(kind)) = kinds.next().filter(|_| kinds.all(|k| k.is_some())) {
            bail!("lists {kind} objects, not Services or EndpointSlices, each with its kind (kubectl get services,endpointslices -A -o json)");
        }
        Ok(Self::joined(list.items))
    }

    pub fn from_objects(items: &[Value]) -> Self {
        Self::joined(items.iter().map(Kept::of).collect())
    }

    /// The Services, each with the backends of its slices.
    fn joined(items: Vec<Kept>) -> Self {
        let mut services = Vec::new();
        let mut slices = Vec::new();
        for item in items {
            match item {
                Kept::Service(service) => services.push(service),
                Kept::Slice(slice) => slices.push(slice),
                Kept::Other(_) => {}
            }
        }
        for (ns, owner, backends) in slices {
            if let Some(svc) = services
                .iter_mut()
                .find(|s: &&mut Service| s.namespace == ns && Some(&s.name) == owner.as_ref())
            {
                svc.backends.extend(backends);
            }
        }
        Self { services }
    }

    pub fn by_name(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.services
            .iter()
            .find(|s| s.namespace == namespace && s.name == name)
    }

    /// The Service that has `port` as a NodePort.
    pub fn by_node_port(&self, port: u16) -> Option<&Service> {
        self.services
            .iter()
            .find(|s| s.ports.iter().any(|p| p.node_port == Some(port)))
    }

    pub fn by_cluster_ip(&self, ip: Ipv4Addr) -> Option<&Service> {
        self.services.iter().find(|s| s.cluster_ip == Some(ip))
    }

    pub fn by_cluster_ipv6(&self, ip: std::net::Ipv6Addr) -> Option<&Service> {
        self.services.iter().find(|s| s.cluster_ipv6.contains(&ip))
    }
}

/// A list of objects, each made what is kept of it as it is read.
#[derive(Deserialize)]
struct List {
    items: Vec<Kept>,
}

/// What is kept of one listed object.
enum Kept {
    Service(Service),
    /// An EndpointSlice: its namespace, its Service's name, its backends.
    Slice((String, Option<String>, Vec<Backend>)),
    /// Any other object: its kind.
    Other(String),
}

impl Kept {
    fn of(o: &Value) -> Self {
        if o["kind"] == "Service" {
            return service_of(o).map_or(Self::Other(kind_of(o)), Self::Service);
        }
        if o["kind"] == "EndpointSlice" {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or("default");
            let owner = o["metadata"]["labels"]["kubernetes.io/service-name"].as_str();
            return Self::Slice((ns.into(), owner.map(String::from), backends_of(o, ns)));
        }
        Self::Other(kind_of(o))
    }
}

/// An object's `kind`, as a list names it (an API list response's
/// items name none).
fn kind_of(o: &Value) -> String {
    o["kind"].as_str().unwrap_or("kind-less").to_string()
}

impl<'de> Deserialize<'de> for Kept {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self::of(&Value::deserialize(d)?))
    }
}

/// A port's protocol as the API gives it: TCP when left out.
fn api_protocol(text: Option<&str>) -> u8 {
    text.and_then(protocol_number).unwrap_or(6)
}

/// A `v1.Service` object (JSON) as podtrace follows it.
pub fn service_of(o: &Value) -> Option<Service> {
    let meta = &o["metadata"];
    let spec = &o["spec"];
    let ports = spec["ports"]
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .map(|p| ServicePort {
                    name: p["name"].as_str().unwrap_or("").into(),
                    protocol: api_protocol(p["protocol"].as_str()),
                    port: p["port"].as_u64().unwrap_or(0) as u16,
                    node_port: p["nodePort"].as_u64().map(|n| n as u16),
                })
                .collect()
        })
        .unwrap_or_default();
    // clusterIP is the primary family's: on an IPv6-primary dual-stack
    // Service the IPv4 one is in clusterIPs only.
    let (cluster_ip, cluster_ipv6) = super::inventory::by_family(
        spec["clusterIP"].as_str().into_iter().chain(
            spec["clusterIPs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str),
        ),
    );
    Some(Service {
        namespace: meta["namespace"].as_str().unwrap_or("default").into(),
        name: meta["name"].as_str()?.into(),
        cluster_ip,
        cluster_ipv6,
        ports,
        backends: Vec::new(),
    })
}

/// The ready endpoints of one slice (either family: `addressType` IPv4
/// or IPv6).
fn backends_of(slice: &Value, ns: &str) -> Vec<Backend> {
    let ports: Vec<(String, u8, u16)> = slice["ports"]
        .as_array()
        .map(|ports| {
            ports
                .iter()
                .map(|p| {
                    (
                        p["name"].as_str().unwrap_or("").to_string(),
                        api_protocol(p["protocol"].as_str()),
                        p["port"].as_u64().unwrap_or(0) as u16,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = Vec::new();
    for endpoint in slice["endpoints"].as_array().into_iter().flatten() {
        if endpoint["conditions"]["ready"] == false {
            continue;
        }
        let target = &endpoint["targetRef"];
        let pod = target["name"].as_str().map(|name| {
            let pod_ns = target["namespace"].as_str().unwrap_or(ns);
            format!("{pod_ns}/{name}")
        });
        for address in endpoint["addresses"].as_array().into_iter().flatten() {
            if let Some(ip) = address.as_str().and_then(|a| a.parse().ok()) {
                out.push(Backend {
                    ip,
                    pod: pod.clone(),
                    node: endpoint["nodeName"].as_str().map(String::from),
                    ports: ports.clone(),
                });
            }
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// As `kubectl get svc,endpointslices -A -o json` prints them.
    pub(crate) const LIST: &str = r#"{"apiVersion":"v1","kind":"List","items":[
 {"apiVersion":"v1","kind":"Service","metadata":{"name":"db","namespace":"default"},
  "spec":{"type":"NodePort","clusterIP":"10.96.7.7","ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080,"nodePort":30080}]}},
 {"apiVersion":"v1","kind":"Service","metadata":{"name":"empty","namespace":"default"},
  "spec":{"clusterIP":"10.96.9.9","ports":[{"name":"http","protocol":"TCP","port":80,"targetPort":8080}]}},
 {"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"db-x1","namespace":"default","labels":{"kubernetes.io/service-name":"db"}},
  "addressType":"IPv4","ports":[{"name":"http","protocol":"TCP","port":8080}],
  "endpoints":[{"addresses":["10.244.2.2"],"conditions":{"ready":true},"nodeName":"node-2","targetRef":{"kind":"Pod","name":"db-0","namespace":"default"}},
               {"addresses":["10.244.2.3"],"conditions":{"ready":true},"nodeName":"node-2","targetRef":{"kind":"Pod","name":"db-1","namespace":"default"}},
               {"addresses":["10.244.2.9"],"conditions":{"ready":false}}]}
]}"#;

    #[test]
    fn another_kinds_list_is_not_read_as_no_services() {
        let pods = r#"{"kind":"List","items":[{"kind":"Pod","metadata":{"name":"web-0"}}]}"#;
        let e = Catalog::parse(pods).unwrap_err().to_string();
        assert!(e.starts_with("lists Pod objects, not Services"), "{e}");
        // An empty list is a cluster without Services.
        assert!(Catalog::parse(r#"{"items":[]}"#)
            .unwrap()
            .services
            .is_empty());
    }

    #[test]
    fn services_get_their_ready_backends_and_translations() {
        let catalog = Catalog::parse(LIST).unwrap();
        let db = catalog.by_name("default", "db").unwrap();
        assert_eq!(db.cluster_ip, Some(Ipv4Addr::new(10, 96, 7, 7)));
        assert_eq!(db.backends.len(), 2, "the unready endpoint is left out");
        assert_eq!(db.backends[1].pod.as_deref(), Some("default/db-1"));
        let t = db.translations(&["192.0.2.11".parse().unwrap()]);
        // Two backends, each behind the ClusterIP and the NodePort.
        assert_eq!(t.len(), 4);
        assert_eq!(t[0].front.to_string(), "10.96.7.7:80");
        assert_eq!(t[0].back.to_string(), "10.244.2.2:8080");
        assert_eq!(t[3].front.to_string(), "192.0.2.11:30080");
        let empty = catalog.by_cluster_ip("10.96.9.9".parse().unwrap()).unwrap();
        assert!(empty.backends.is_empty() && empty.translations(&[]).is_empty());
    }

    /// An IPv6-primary dual-stack Service: clusterIP is its IPv6 address,
    /// and the IPv4 one is second in clusterIPs.
    #[test]
    fn a_dual_stack_service_is_found_by_its_ipv4_cluster_ip() {
        let list = r#"{"items":[{"kind":"Service","metadata":{"name":"db","namespace":"default"},
          "spec":{"ipFamilies":["IPv6","IPv4"],"clusterIP":"fd00:10:96::7","clusterIPs":["fd00:10:96::7","10.96.7.7"],
          "ports":[{"name":"http","protocol":"TCP","port":80}]}}]}"#;
        let catalog = Catalog::parse(list).unwrap();
        let db = catalog.by_name("default", "db").unwrap();
        assert_eq!(db.cluster_ip, Some(Ipv4Addr::new(10, 96, 7, 7)));
        assert_eq!(
            db.cluster_ipv6,
            ["fd00:10:96::7".parse::<std::net::Ipv6Addr>().unwrap()]
        );
    }

    /// A dual-stack Service has a slice per family; kube-proxy runs a
    /// proxier per family, so each ClusterIP goes to its own family's
    /// backends only.
    #[test]
    fn each_cluster_ip_is_translated_to_its_own_familys_backends() {
        let list = r#"{"items":[{"kind":"Service","metadata":{"name":"db","namespace":"default"},
          "spec":{"ipFamilies":["IPv4","IPv6"],"clusterIP":"10.96.7.7","clusterIPs":["10.96.7.7","fd00:10:96::7"],
          "ports":[{"name":"http","protocol":"TCP","port":80}]}},
         {"kind":"EndpointSlice","metadata":{"name":"db-v4","namespace":"default","labels":{"kubernetes.io/service-name":"db"}},
          "addressType":"IPv4","ports":[{"name":"http","protocol":"TCP","port":8080}],
          "endpoints":[{"addresses":["10.244.2.2"],"conditions":{"ready":true},"targetRef":{"kind":"Pod","name":"db-0"}}]},
         {"kind":"EndpointSlice","metadata":{"name":"db-v6","namespace":"default","labels":{"kubernetes.io/service-name":"db"}},
          "addressType":"IPv6","ports":[{"name":"http","protocol":"TCP","port":8080}],
          "endpoints":[{"addresses":["fd00:10:244:2::2"],"conditions":{"ready":true},"targetRef":{"kind":"Pod","name":"db-0"}}]}]}"#;
        let catalog = Catalog::parse(list).unwrap();
        let db = catalog.by_name("default", "db").unwrap();
        let shown: Vec<String> = db
            .translations(&[])
            .iter()
            .map(|t| format!("{} -> {}", t.front, t.back))
            .collect();
        assert_eq!(
            shown,
            [
                "10.96.7.7:80 -> 10.244.2.2:8080",
                "[fd00:10:96::7]:80 -> [fd00:10:244:2::2]:8080"
            ]
        );
    }
}
