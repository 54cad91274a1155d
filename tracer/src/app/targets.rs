//! From the two pod arguments to the traced endpoints and what is known of
//! the cluster around them: from a pods file, from the Kubernetes API, or
//! from plain IPs with no Kubernetes at all (Services then read from the
//! traced nodes' kube-proxy rules).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{bail, Result};

use super::service_target::{
    api_destination, known_services, name_backends, refuse_probe_port, service_destination,
};
use crate::{
    cli::Args,
    cluster::{
        access::Access,
        api::Cluster,
        argument::Target,
        inventory::{Endpoint, Inventory},
        nodes,
        policy_book::PolicyBook,
        services::{Catalog, Service},
    },
    model::NodeSubnet,
    story::nat::NatBook,
};

pub struct Targets {
    pub src: Endpoint,
    pub dst: Endpoint,
    /// Pods known by name (the pods file, or the two resolved ones).
    pub inventory: Inventory,
    /// Every node's pod subnet, IP and CNI (nodes file or API).
    pub subnets: Vec<NodeSubnet>,
    /// Every node's IPv6 address (nodes file or API).
    pub nodes6: Vec<(String, Ipv6Addr)>,
    /// Set when names came from the API: it also watches the pods.
    pub cluster: Option<Cluster>,
    /// The destination Service, when DST names one (`svc/…`, a ClusterIP).
    pub service: Option<Service>,
    /// What kube-proxy translates the destination to (every backend; for
    /// a node, its NodePorts').
    pub nat: NatBook,
    /// Which families of the pair are traced (`-4`, `-6`; both by
    /// default, where both ends have IPv6).
    pub families: Families,
    /// The traced pods' namespaces' NetworkPolicies and the pods' labels.
    pub policies: PolicyBook,
}

/// The address families a trace follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Families {
    pub ipv4: bool,
    pub ipv6: bool,
}

impl Families {
    pub const BOTH: Self = Self {
        ipv4: true,
        ipv6: true,
    };

    /// The families `-4`/`-6` leave in; an IPv6 address argument asks for
    /// IPv6 alone, as `-6` does.
    fn asked(args: &Args, targets: [&Target; 2]) -> Result<Self> {
        let ipv6_named = targets.iter().find_map(|t| t.ipv6());
        if let (Some(ip), true) = (ipv6_named, args.ipv4_only) {
            bail!("-4 leaves out IPv6, and {ip} is an IPv6 address: give the pod's IPv4 address or its name");
        }
        if let [Some(IpAddr::V4(v4)), Some(IpAddr::V6(v6))]
        | [Some(IpAddr::V6(v6)), Some(IpAddr::V4(v4))] = targets.map(Target::address)
        {
            bail!("{v4} is an IPv4 address and {v6} an IPv6 one: a packet has both ends in one family, so give two addresses of one family (or the pods' names)");
        }
        Ok(Self {
            ipv4: !args.ipv6_only && ipv6_named.is_none(),
            ipv6: !args.ipv4_only,
        })
    }
}

/// A pod on the host network is traced on the node's own interfaces:
/// said, as its story has no pod veth.
fn note_host_network(src: &Endpoint, dst: &Endpoint) {
    for pod in [src, dst].into_iter().filter_map(|e| e.pod.as_ref()) {
        if pod.host_network {
            eprintln!(
                "podtrace: note: {} uses the host network: its packets use the node's own interfaces, not a pod veth",
                pod.qualified()
            );
        }
    }
}

impl Targets {
    /// The IPv6 pair of two dual-stack pods, traced beside their IPv4
    /// pair: each one's first IPv6 address (Kubernetes gives a pod one
    /// per family).
    pub fn ipv6_pair(&self) -> Option<(Ipv6Addr, Ipv6Addr)> {
        Some((self.ipv6_of(&self.src)?, self.ipv6_of(&self.dst)?))
    }

    /// An endpoint's IPv6 address: a dual-stack pod's first (Kubernetes
    /// gives a pod one per family), or the destination Service's IPv6
    /// ClusterIP (a dual-stack Service has one per family too).
    pub fn ipv6_of(&self, e: &Endpoint) -> Option<Ipv6Addr> {
        if let Some(pod) = &e.pod {
            return pod.ipv6.first().copied();
        }
        if let IpAddr::V6(ip) = e.ip {
            return Some(ip);
        }
        let service = self.service.as_ref()?;
        (service.cluster_ip.map(IpAddr::V4) == Some(e.ip))
            .then(|| service.cluster_ipv6.first().copied())
            .flatten()
    }

    /// The IPv4 pair, where both ends have an IPv4 address.
    pub fn ipv4_pair(&self) -> Option<(Ipv4Addr, Ipv4Addr)> {
        Some((self.src.ipv4()?, self.dst.ipv4()?))
    }

    /// The IPv4 pair traced: both ends have IPv4 and neither `-6` nor an
    /// IPv6 address argument left it out.
    pub fn traced_ipv4_pair(&self) -> Option<(Ipv4Addr, Ipv4Addr)> {
        self.ipv4_pair().filter(|_| self.families.ipv4)
    }

    /// The (SRC, DST) pair of each family traced, IPv4's first.
    pub fn traced_pair_per_family(&self) -> impl Iterator<Item = (IpAddr, IpAddr)> {
        let ipv4 = self.traced_ipv4_pair().map(|(a, b)| (a.into(), b.into()));
        let ipv6 = self.traced_ipv6_pair().map(|(a, b)| (a.into(), b.into()));
        [ipv4, ipv6].into_iter().flatten()
    }

    /// The traced pairs as the start line names them: `A ⇄ B`, of each
    /// family traced.
    pub fn named_pairs(&self, ctx: &crate::story::Context) -> String {
        let pairs: Vec<String> = self
            .traced_pair_per_family()
            .map(|(src, dst)| format!("{} ⇄ {}", ctx.label(src), ctx.label(dst)))
            .collect();
        pairs.join(" and ")
    }

    /// Fails when no family asked for is one both ends have: IPv6 alone
    /// (`-6`, an IPv6 address) and an end without IPv6, `-4` and an end
    /// without IPv4, or an IPv4-only end and an IPv6-only one.
    fn has_the_asked_family(&self, args: &Args) -> Result<()> {
        if self.traced_ipv4_pair().is_some() || self.traced_ipv6_pair().is_some() {
            return Ok(());
        }
        let without_ipv4 = self.ends_without(|e| e.ipv4().is_some());
        let without_ipv6 = self.ends_without(|e| self.ipv6_of(e).is_some());
        if !self.families.ipv4 {
            let why = if args.ipv6_only {
                "-6"
            } else {
                "an IPv6 address"
            };
            bail!("{why}: {without_ipv6} no IPv6 address to trace");
        }
        if !self.families.ipv6 {
            bail!("-4: {without_ipv4} no IPv4 address to trace");
        }
        bail!("{without_ipv4} no IPv4 address and {without_ipv6} no IPv6 one: the two ends share no address family to trace")
    }

    /// The ends that lack what `has` asks, by name, with their verb: "A
    /// has", "A and B have".
    fn ends_without(&self, has: impl Fn(&Endpoint) -> bool) -> String {
        let names: Vec<String> = [&self.src, &self.dst]
            .into_iter()
            .filter(|e| !has(e))
            .map(|e| e.name().unwrap_or_else(|| e.ip.to_string()))
            .collect();
        let verb = if names.len() == 1 { "has" } else { "have" };
        format!("{} {verb}", names.join(" and "))
    }

    /// The IPv6 pair traced: both ends have IPv6 and `-4` did not leave
    /// it out.
    pub fn traced_ipv6_pair(&self) -> Option<(Ipv6Addr, Ipv6Addr)> {
        self.ipv6_pair().filter(|_| self.families.ipv6)
    }

    /// The traced pods' and Service's IPv6 addresses when their IPv6
    /// pair is not traced (`-4`, or one end without IPv6): said at start,
    /// so that a failing IPv6 connection (dual-stack clients often prefer
    /// it) is not mistaken for one that never happened.
    pub fn untraced_ipv6(&self) -> Option<String> {
        if self.traced_ipv6_pair().is_some() {
            return None;
        }
        let listed = |name: String, ips: &[Ipv6Addr]| {
            let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
            format!("{name} ({})", ips.join(", "))
        };
        let pods = [&self.src, &self.dst]
            .into_iter()
            .filter_map(|e| e.pod.as_ref())
            .filter(|p| !p.ipv6.is_empty())
            .map(|p| listed(p.qualified(), &p.ipv6));
        let service = self
            .service
            .iter()
            .filter(|s| !s.cluster_ipv6.is_empty())
            .map(|s| listed(format!("svc/{}", s.qualified()), &s.cluster_ipv6));
        let with_ipv6: Vec<String> = pods.chain(service).collect();
        let why = if self.families.ipv6 {
            format!("{} none", self.ends_without(|e| self.ipv6_of(e).is_some()))
        } else {
            "-4 leaves it out".into()
        };
        (!with_ipv6.is_empty()).then(|| {
            format!(
                "{} also {} IPv6, which is not traced: {why}",
                with_ipv6.join(" and "),
                if with_ipv6.len() == 1 { "has" } else { "have" }
            )
        })
    }

    /// The endpoints `args` name, resolved; `traced_addresses`: the
    /// traced nodes' own addresses (node mode), nodes too for a NodePort
    /// given as `nodeIP:port` when no node list names them.
    pub async fn resolve(args: &Args, traced_addresses: &[Ipv4Addr]) -> Result<Self> {
        let access = Access::of(&args.kube);
        // Garbage in an argument is said before anything else is tried.
        let src_target = Target::parse(&args.src, args.kube.namespace())?;
        let dst_target = Target::parse(&args.dst, args.kube.namespace())?;
        refuse_source_port(&args.src, &src_target)?;
        let mut listed = match &args.kube.nodes_file {
            Some(path) => nodes::load_nodes(path)?,
            None => nodes::Nodes::default(),
        };
        let plain_ips = src_target.address().is_some() && dst_target.address().is_some();
        let families = Families::asked(args, [&src_target, &dst_target])?;
        let mut catalog = known_services(args, &access, plain_ips, &dst_target)?;
        let (src, dst, inventory, cluster) = if let Some(path) = &args.kube.pods_file {
            let inventory = Inventory::load(path)?;
            if let Some(catalog) = &mut catalog {
                name_backends(catalog, &inventory);
            }
            let src = inventory.resolve(&src_target)?;
            let dst = match service_destination(&dst_target, catalog.as_ref())? {
                Some(dst) => dst,
                None => inventory.resolve(&dst_target)?,
            };
            (src, dst, inventory, None)
        } else if plain_ips && (catalog.is_some() || !access.configured()) {
            // Plain IPs and no Kubernetes at all.
            let src = Endpoint::of_ip(src_target.address().expect("an IP"), vec![])?;
            let dst = match service_destination(&dst_target, catalog.as_ref())? {
                Some(dst) => dst,
                None => Endpoint::of_ip(dst_target.address().expect("an IP"), vec![])?,
            };
            (src, dst, Inventory::default(), None)
        } else {
            let cluster = Cluster::connect(&access).await?;
            let src = cluster.resolve(&src_target).await?;
            let (dst, found) = api_destination(&cluster, &dst_target, catalog.take()).await?;
            catalog = Some(found);
            if args.kube.nodes_file.is_none() {
                let (names, every) = nodes_involved(args, [&src, &dst], catalog.as_ref());
                listed = cluster.nodes_for(&names, every).await?;
            }
            let inventory = Inventory {
                pods: [&src, &dst].iter().filter_map(|e| e.pod.clone()).collect(),
            };
            (src, dst, inventory, Some(cluster))
        };
        if src.ip == dst.ip {
            bail!("source and destination are the same address ({})", src.ip);
        }
        note_host_network(&src, &dst);
        let service = catalog
            .as_ref()
            .and_then(|c| match dst.ip {
                IpAddr::V4(ip) => c.by_cluster_ip(ip),
                IpAddr::V6(ip) => c.by_cluster_ipv6(ip),
            })
            .cloned();
        refuse_probe_port(args, service.as_ref(), cluster.is_some())?;
        let mut targets = Self {
            src,
            dst,
            inventory,
            subnets: listed.subnets,
            nodes6: listed.ipv6,
            cluster,
            service,
            nat: NatBook::default(),
            families,
            policies: PolicyBook::default(),
        };
        targets.has_the_asked_family(args)?;
        targets.policies = targets.policy_book(args).await;
        targets.nat =
            targets.destination_nat(catalog.as_ref(), dst_target.port(), traced_addresses);
        Ok(targets)
    }

    /// The NetworkPolicies of the traced pods' namespaces, from the API;
    /// without it, why not (the story says so under a policy drop).
    async fn policy_book(&self, args: &Args) -> PolicyBook {
        let pods: Vec<_> = [&self.src, &self.dst]
            .into_iter()
            .filter_map(|e| e.pod.as_ref())
            .collect();
        match (&self.cluster, &args.kube.pods_file) {
            (Some(cluster), _) => cluster.policy_book(&pods).await,
            (None, Some(_)) => PolicyBook::without_api(
                "no Kubernetes API in this mode (the pods came from --pods-file)",
                &pods,
            ),
            (None, None) => PolicyBook::without_api(
                "no Kubernetes API in this mode (the ends were given as IPs)",
                &pods,
            ),
        }
    }

    /// What kube-proxy translates the destination to: a Service's
    /// backends, or else a node's NodePorts (on `port` only, when the
    /// argument named one).
    fn destination_nat(
        &self,
        catalog: Option<&Catalog>,
        port: Option<u16>,
        traced_addresses: &[Ipv4Addr],
    ) -> NatBook {
        match (&self.service, catalog) {
            (None, Some(catalog)) => self.node_ports(catalog, port, traced_addresses),
            _ => self.translations(port),
        }
    }

    /// DST a node (a known node's IP, or a traced node's own address):
    /// the NodePorts it translates (on `port` only, when the argument
    /// named one), unless there are too many to trace.
    fn node_ports(
        &self,
        catalog: &Catalog,
        port: Option<u16>,
        traced_addresses: &[Ipv4Addr],
    ) -> NatBook {
        /// Backends to trace at most: two kernel filter pairs each.
        const MAX_BACKENDS: usize = 64;
        // (IPv6 NodePorts are not followed.)
        let IpAddr::V4(node) = self.dst.ip else {
            return NatBook::default();
        };
        let known = self.known_nodes().iter().any(|(_, ip)| *ip == node);
        if !known && !traced_addresses.contains(&node) {
            return NatBook::default();
        }
        let translations: Vec<_> = catalog
            .services
            .iter()
            .flat_map(|s| s.translations(&[node.into()]))
            .filter(|t| t.front.ip == node && port.is_none_or(|p| t.front.port == p))
            .collect();
        if translations.len() > MAX_BACKENDS {
            eprintln!(
                "podtrace: note: {node} has {} NodePort backends, too many to trace ahead: translations are learnt from conntrack",
                translations.len()
            );
            return NatBook::default();
        }
        NatBook {
            translations,
            ..NatBook::default()
        }
    }

    /// The destination Service's translations (on `port` only, when the
    /// argument named one), with the NodePorts on every known node.
    fn translations(&self, port: Option<u16>) -> NatBook {
        let Some(service) = &self.service else {
            return NatBook::default();
        };
        // The NodePorts followed are on the nodes' IPv4 addresses.
        let node_ips: Vec<IpAddr> = self
            .known_nodes()
            .into_iter()
            .map(|(_, ip)| ip.into())
            .collect();
        let translations = service
            .translations(&node_ips)
            .into_iter()
            .filter(|t| {
                let named = t.front.ip == self.dst.ip
                    || Some(t.front.ip) == self.ipv6_of(&self.dst).map(Into::into);
                port.is_none_or(|p| t.front.port == p && named)
            })
            .collect();
        NatBook {
            translations,
            ..NatBook::default()
        }
    }

    /// Node names and IPs, from the pods and the nodes.
    pub fn known_nodes(&self) -> Vec<(String, Ipv4Addr)> {
        let mut nodes = self.inventory.nodes();
        nodes.extend(self.subnets.iter().map(|s| (s.node.clone(), s.node_ip)));
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// Node names and IPv6 addresses, from the nodes and the pods.
    pub fn known_nodes6(&self) -> Vec<(String, Ipv6Addr)> {
        let mut nodes = self.inventory.nodes6();
        nodes.extend(self.nodes6.iter().cloned());
        nodes.sort();
        nodes.dedup();
        nodes
    }

    /// Where each endpoint runs, when known.
    pub fn node_of(endpoint: &Endpoint) -> Option<&str> {
        endpoint.pod.as_ref()?.node.as_deref()
    }
}

/// What the traced node(s) can see of the path, and where to run instead
/// when neither pod is local. `None` when nothing is known of the nodes.
pub fn vantage(ends: [(&str, Option<&str>); 2], traced: &[String]) -> Option<String> {
    let [(src, src_node), (dst, dst_node)] = ends;
    let (src_node, dst_node) = (src_node?, dst_node?);
    let here = traced.join(", ");
    let local = |node: &str| traced.iter().any(|t| t == node);
    Some(match (local(src_node), local(dst_node)) {
        (true, true) if src_node == dst_node => format!("{src} and {dst} are both on {src_node}: the whole path is on this node"),
        (true, true) => format!("{src} is on {src_node} and {dst} on {dst_node}: both ends are traced"),
        (true, false) => format!(
            "{src} is local ({src_node}); {dst} is on {dst_node}: {here} sees the packet up to where it leaves for {dst_node}; trace {dst_node} too to see it arrive"
        ),
        (false, true) => format!(
            "{dst} is local ({dst_node}); {src} is on {src_node}: {here} sees the packet from where it arrives from {src_node}"
        ),
        (false, false) => format!(
            "neither {src} ({src_node}) nor {dst} ({dst_node}) runs on {here}: run podtrace on {src_node} or {dst_node}"
        ),
    })
}

/// The nodes a trace asks the API for, by name: the pods', the
/// destination Service's backends', a node named as an end or by
/// `--nodes`, and the agent's own; and whether every node is asked for
/// instead (`--nodes all`, or an end that is a bare address, of no pod,
/// Service or named node: it may be any node's).
fn nodes_involved(
    args: &Args,
    ends: [&Endpoint; 2],
    catalog: Option<&Catalog>,
) -> (Vec<String>, bool) {
    let service = catalog.and_then(|c| match ends[1].ip {
        IpAddr::V4(ip) => c.by_cluster_ip(ip),
        IpAddr::V6(ip) => c.by_cluster_ipv6(ip),
    });
    let backends = service
        .into_iter()
        .flat_map(|s| &s.backends)
        .filter_map(|b| b.node.clone());
    let named_nodes =
        (ends.iter()).filter_map(|e| e.label.as_deref()?.strip_prefix("node/").map(String::from));
    let asked = (args.nodes.as_deref().filter(|n| *n != "all").into_iter())
        .flat_map(|list| list.split(','))
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty());
    let mut names: Vec<String> = (ends
        .iter()
        .filter_map(|e| Targets::node_of(e).map(String::from)))
    .chain(backends)
    .chain(named_nodes)
    .chain(asked)
    .chain(args.kube.agent_on.clone())
    .collect();
    names.sort();
    names.dedup();
    let bare_address = ends.iter().any(|e| e.pod.is_none() && e.label.is_none());
    (names, bare_address || args.nodes.as_deref() == Some("all"))
}

/// A port on SRC: nothing podtrace could use, so said rather than dropped.
fn refuse_source_port(arg: &str, src: &Target) -> Result<()> {
    match src.port() {
        Some(port) => bail!(
            "{arg}: a port on SRC is not used (a client's socket picks its own); to trace one port's traffic, give --port {port}"
        ),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traced_nodes_own_address_and_a_node_port_is_that_nodeport() {
        let catalog = Catalog::parse(crate::cluster::services::tests::LIST).unwrap();
        let node: Ipv4Addr = "192.0.2.12".parse().unwrap();
        let targets = bare(
            Endpoint::of_ip("192.0.2.99".parse::<IpAddr>().unwrap(), vec![]).unwrap(),
            Endpoint::of_ip(node, vec![]).unwrap(),
            Families::BOTH,
        );
        // No node list names it: only as a traced node's own address.
        assert!(targets
            .node_ports(&catalog, Some(30080), &[])
            .translations
            .is_empty());
        let book = targets.node_ports(&catalog, Some(30080), &[node]);
        let backends: Vec<String> = book
            .translations
            .iter()
            .map(|t| t.back.ip.to_string())
            .collect();
        assert_eq!(backends, ["10.244.2.2", "10.244.2.3"]);
        assert!(book
            .translations
            .iter()
            .all(|t| t.front.ip == node && t.front.port == 30080));
    }

    /// A pod on `node`, with `ip`.
    fn pod_on(node: &str, ip: &str) -> Endpoint {
        let pod = crate::cluster::inventory::pod_from_json(serde_json::json!({
            "metadata": {"name": format!("pod-{ip}"), "namespace": "default"},
            "spec": {"nodeName": node},
            "status": {"podIP": ip, "phase": "Running"}
        }))
        .unwrap();
        Endpoint::of_pod(pod).unwrap()
    }

    /// A pod→pod trace asks the API for the two pods' nodes by name (and
    /// an agent's own), never for every node; a Service's backends' nodes
    /// are asked too; a bare address, or `--nodes all`, asks for all.
    #[test]
    fn the_nodes_asked_of_the_api_are_the_traced_ones() {
        use clap::Parser;
        let mut args = Args::try_parse_from(["podtrace", "a", "b"]).unwrap();
        args.kube.agent_on = Some("node-9".into());
        let (src, dst) = (
            pod_on("node-1", "10.244.1.2"),
            pod_on("node-2", "10.244.2.3"),
        );
        let (names, every) = nodes_involved(&args, [&src, &dst], None);
        assert_eq!(
            (names, every),
            (
                vec!["node-1".into(), "node-2".into(), "node-9".into()],
                false
            )
        );

        let catalog = Catalog::parse(crate::cluster::services::tests::LIST).unwrap();
        let service = &catalog.services[0];
        let front = Endpoint {
            ip: service.cluster_address().unwrap(),
            pod: None,
            label: Some(format!("svc/{}", service.qualified())),
        };
        let (names, every) = nodes_involved(&args, [&src, &front], Some(&catalog));
        let backends: Vec<&str> = service
            .backends
            .iter()
            .filter_map(|b| b.node.as_deref())
            .collect();
        assert!(!backends.is_empty() && !every);
        assert!(
            backends.iter().all(|b| names.iter().any(|n| n == b)),
            "{names:?}"
        );

        let bare = Endpoint::of_ip("192.0.2.7".parse::<IpAddr>().unwrap(), vec![]).unwrap();
        assert!(
            nodes_involved(&args, [&src, &bare], None).1,
            "a bare address may be any node's"
        );
        args.nodes = Some("all".into());
        assert!(nodes_involved(&args, [&src, &dst], None).1);
    }

    /// The targets of two pods with `addresses` each (podIPs), tracing
    /// `families`.
    fn two_pods(addresses: [&[&str]; 2], families: Families) -> Targets {
        let [src, dst] = addresses.map(|ips| {
            let pod_ips: Vec<_> = ips.iter().map(|ip| serde_json::json!({"ip": ip})).collect();
            let pod = crate::cluster::inventory::pod_from_json(serde_json::json!({
                "metadata": {"name": format!("pod-{}", ips[0]), "namespace": "default"},
                "status": {"podIP": ips[0], "podIPs": pod_ips, "phase": "Running"}
            }))
            .unwrap();
            Endpoint::of_pod(pod).unwrap()
        });
        bare(src, dst, families)
    }

    /// The targets of `src` and `dst` alone: nothing known around them.
    fn bare(src: Endpoint, dst: Endpoint, families: Families) -> Targets {
        Targets {
            src,
            dst,
            inventory: Inventory::default(),
            subnets: Vec::new(),
            nodes6: Vec::new(),
            cluster: None,
            service: None,
            nat: NatBook::default(),
            families,
            policies: PolicyBook::default(),
        }
    }

    /// IPv6-only pods are traced over IPv6 alone; an IPv4-only pod and an
    /// IPv6-only one share no family, and `-4` on IPv6-only pods leaves
    /// nothing: each said in one line.
    #[test]
    fn ipv6_only_pods_are_traced_over_ipv6_and_a_family_they_lack_is_refused() {
        let args = |extra: &[&str]| {
            use clap::Parser;
            Args::try_parse_from([&["podtrace", "a", "b"], extra].concat()).unwrap()
        };
        let v6 = two_pods([&["fd00::2"], &["fd00::3"]], Families::BOTH);
        assert_eq!(v6.traced_ipv4_pair(), None);
        let pair6 = v6.traced_ipv6_pair().unwrap();
        assert_eq!(pair6.0.to_string(), "fd00::2");
        assert!(v6.has_the_asked_family(&args(&[])).is_ok());
        let dash4 = Families {
            ipv4: true,
            ipv6: false,
        };
        let refused = two_pods([&["fd00::2"], &["fd00::3"]], dash4)
            .has_the_asked_family(&args(&["-4"]))
            .unwrap_err()
            .to_string();
        assert_eq!(
            refused,
            "-4: default/pod-fd00::2 and default/pod-fd00::3 have no IPv4 address to trace"
        );
        let mixed = two_pods([&["10.0.0.2"], &["fd00::3"]], Families::BOTH)
            .has_the_asked_family(&args(&[]))
            .unwrap_err()
            .to_string();
        assert!(mixed.contains("share no address family"), "{mixed}");
        let dual = two_pods(
            [&["10.0.0.2", "fd00::2"], &["fd00::3", "10.0.0.3"]],
            Families::BOTH,
        );
        assert_eq!(
            dual.traced_ipv4_pair(),
            Some(("10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap()))
        );
        assert!(dual.traced_ipv6_pair().is_some());
    }

    #[test]
    fn vantage_says_what_this_node_sees_and_where_to_go() {
        let ends = [
            ("default/web-0", Some("node-1")),
            ("default/db-0", Some("node-2")),
        ];
        let one = vantage(ends, &["node-1".into()]).unwrap();
        assert!(
            one.starts_with("default/web-0 is local (node-1); default/db-0 is on node-2"),
            "{one}"
        );
        let neither = vantage(ends, &["node-3".into()]).unwrap();
        assert_eq!(neither, "neither default/web-0 (node-1) nor default/db-0 (node-2) runs on node-3: run podtrace on node-1 or node-2");
        assert!(vantage(ends, &["node-1".into(), "node-2".into()])
            .unwrap()
            .contains("both ends are traced"));
        assert!(vantage([("a", None), ("b", Some("n"))], &[]).is_none());
    }
}
