//! The Services a node's kube-proxy has programmed, read back from its
//! ruleset: what a ClusterIP or a NodePort is translated to, when no
//! Services list is known (no API, no `--services-file`).
//!
//! It reads one node's kernel state (inside the node's network namespace,
//! as rule tracing does), and yields a `cluster::services::Catalog`, so
//! that the rest of podtrace treats the rules exactly as Services and EndpointSlices: the same translations,
//! the kernel filter tracing every backend from the first SYN.
//!
//! Both kube-proxy modes, as kube-proxy lays them out:
//! - iptables (`iptables-save -t nat`): `KUBE-SERVICES` sends
//!   `-d <ClusterIP>/32 --dport <port>` (comment `"ns/name:port cluster
//!   IP"`) to `KUBE-SVC-…`, which picks a `KUBE-SEP-…` (`-j DNAT
//!   --to-destination ip:port`); `KUBE-NODEPORTS` sends `--dport
//!   <nodePort>` (comment `"ns/name:port"`) to `KUBE-EXT-…`.
//! - nftables (`nft list table ip kube-proxy`): the verdict maps
//!   `service-ips` (`ip . proto . port : goto service-<hash>-ns/name/proto/port`)
//!   and `service-nodeports` (`proto . port : goto external-…`); the
//!   service chains `numgen … vmap` to `endpoint-…` chains that `dnat to
//!   ip:port`.
//!
//! Backends are found by following every jump from the front's chain to
//! the DNATs it reaches, whatever chains lie between (`KUBE-SVL-…`,
//! `KUBE-FW-…`, affinity), so a layout kube-proxy adds later still
//! resolves. Pods are not named here: the rules only hold addresses.
//!
//! A dual-stack node has a second proxier's rules for IPv6, in the same
//! layout: `ip6tables-save -t nat` (`-d <ClusterIP>/128`, DNATs to
//! `[ip]:port`) or `nft list table ip6 kube-proxy`.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
    process::Command,
};

use super::services::{protocol_number, Backend, Catalog, Service, ServicePort};
use crate::{
    model::text::shell_words,
    node::netns::Namespace,
    probe::iptables::{output, NodeIptables},
};

/// Where kube-proxy sends one frontend: a Service port's ClusterIP or
/// NodePort, and the chain that picks its backend.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Front {
    /// `namespace/name`.
    service: String,
    /// The Service port's name ("" when unnamed).
    port_name: String,
    protocol: u8,
    /// The ClusterIP (of the proxier's family); None for a NodePort (on
    /// every node address).
    ip: Option<IpAddr>,
    port: u16,
    chain: String,
}

/// One node's kube-proxy rules: its frontends, and each chain's jumps and
/// DNATs.
#[derive(Debug, Default)]
pub struct ProxyRules {
    fronts: Vec<Front>,
    /// chain → the chains it jumps or goes to.
    jumps: HashMap<String, Vec<String>>,
    /// chain → the (ip, port) its DNATs translate to.
    dnats: HashMap<String, Vec<(IpAddr, u16)>>,
}

/// The Services kube-proxy programmed in the traced nodes, or None (said
/// once on stderr) when no node has rules podtrace can read: a node
/// without kube-proxy (Cilium's replacement), or no iptables-save/nft.
pub fn read_nodes(namespaces: &[Namespace]) -> Option<Catalog> {
    let mut rules = ProxyRules::default();
    for ns in namespaces {
        if let Ok(Some(node)) = ns.run(|| Ok(read_here())) {
            rules.extend(node);
        }
    }
    if rules.fronts.is_empty() {
        eprintln!("podtrace: note: no kube-proxy rules on the traced node(s): a Service's translations are learnt from conntrack as its connections open");
        return None;
    }
    Some(rules.catalog())
}

/// This namespace's rules, in either mode (both when a node has both),
/// of both families' proxiers.
fn read_here() -> Option<ProxyRules> {
    let mut rules = ProxyRules::default();
    // The backend the node runs (a container's own `iptables-save` may
    // be the other one).
    if let Some(backend) = NodeIptables::detect().backend {
        for ipv6 in [false, true] {
            if let Some(text) = backend.save_table(ipv6, "nat") {
                rules.extend(parse_iptables_save(&text));
            }
        }
    }
    for family in ["ip", "ip6"] {
        let listed = output(Command::new("nft").args(["list", "table", family, "kube-proxy"]));
        if let Some(text) = listed {
            rules.extend(parse_nft(&text));
        }
    }
    (!rules.fronts.is_empty()).then_some(rules)
}

impl ProxyRules {
    fn extend(&mut self, other: ProxyRules) {
        for front in other.fronts {
            if !self.fronts.contains(&front) {
                self.fronts.push(front);
            }
        }
        for (chain, to) in other.jumps {
            self.jumps.entry(chain).or_default().extend(to);
        }
        for (chain, to) in other.dnats {
            self.dnats.entry(chain).or_default().extend(to);
        }
    }

    /// Every DNAT destination `chain` leads to, through any chains.
    fn backends_of(&self, chain: &str) -> Vec<(IpAddr, u16)> {
        let mut seen = HashSet::new();
        let mut pending = vec![chain.to_string()];
        let mut out = Vec::new();
        while let Some(chain) = pending.pop() {
            if !seen.insert(chain.clone()) {
                continue;
            }
            for to in self.dnats.get(&chain).into_iter().flatten() {
                if !out.contains(to) {
                    out.push(*to);
                }
            }
            pending.extend(self.jumps.get(&chain).into_iter().flatten().cloned());
        }
        out.sort();
        out
    }

    /// The rules as Services: one per `namespace/name`, its ports from
    /// the fronts, its backends from the DNATs they lead to.
    pub fn catalog(&self) -> Catalog {
        let mut by_service: BTreeMap<&str, Service> = BTreeMap::new();
        for front in &self.fronts {
            let service = by_service
                .entry(&front.service)
                .or_insert_with(|| empty_service(&front.service));
            add_front(service, front);
            for (ip, port) in self.backends_of(&front.chain) {
                add_backend(service, front, ip, port);
            }
        }
        Catalog {
            services: by_service.into_values().collect(),
        }
    }
}

fn empty_service(qualified: &str) -> Service {
    let (namespace, name) = qualified.split_once('/').unwrap_or(("default", qualified));
    Service {
        namespace: namespace.into(),
        name: name.into(),
        cluster_ip: None,
        cluster_ipv6: Vec::new(),
        ports: Vec::new(),
        backends: Vec::new(),
    }
}

/// The front's port on its Service: the ClusterIP's port (of either
/// family) or the NodePort.
fn add_front(service: &mut Service, front: &Front) {
    match front.ip {
        Some(IpAddr::V4(ip)) => service.cluster_ip = Some(ip),
        Some(IpAddr::V6(ip)) if !service.cluster_ipv6.contains(&ip) => {
            service.cluster_ipv6.push(ip)
        }
        _ => {}
    }
    let index = match service
        .ports
        .iter()
        .position(|p| p.name == front.port_name && p.protocol == front.protocol)
    {
        Some(index) => index,
        None => {
            service.ports.push(ServicePort {
                name: front.port_name.clone(),
                protocol: front.protocol,
                port: 0,
                node_port: None,
            });
            service.ports.len() - 1
        }
    };
    let port = &mut service.ports[index];
    match front.ip {
        Some(_) => port.port = front.port,
        None => port.node_port = Some(front.port),
    }
}

fn add_backend(service: &mut Service, front: &Front, ip: IpAddr, port: u16) {
    let named = (front.port_name.clone(), front.protocol, port);
    match service.backends.iter_mut().find(|b| b.ip == ip) {
        Some(backend) if backend.ports.contains(&named) => {}
        Some(backend) => backend.ports.push(named),
        None => service.backends.push(Backend {
            ip,
            pod: None,
            node: None,
            ports: vec![named],
        }),
    }
}

/// `ip:port` (IPv6: `[ip]:port`) as DNAT writes it.
fn socket(text: &str) -> Option<(IpAddr, u16)> {
    let socket: SocketAddr = text.parse().ok()?;
    Some((socket.ip(), socket.port()))
}

/// kube-proxy's ServicePortName, `ns/name:port` (`ns/name` when the port
/// is unnamed), as (`ns/name`, port name).
fn service_port_name(text: &str) -> (String, String) {
    match text.split_once(':') {
        Some((service, port)) => (service.into(), port.into()),
        None => (text.into(), String::new()),
    }
}

/// `iptables-save -t nat` of a kube-proxy node in iptables mode.
pub fn parse_iptables_save(text: &str) -> ProxyRules {
    let mut rules = ProxyRules::default();
    for line in text.lines() {
        let words = shell_words(line);
        let ["-A", chain, ..] = words.iter().map(String::as_str).collect::<Vec<_>>()[..] else {
            continue;
        };
        let value = |flag: &str| {
            words
                .windows(2)
                .find(|w| w[0] == flag)
                .map(|w| w[1].as_str())
        };
        let Some(target) = value("-j").or_else(|| value("-g")) else {
            continue;
        };
        if target == "DNAT" {
            if let Some(to) = value("--to-destination").and_then(socket) {
                rules.dnats.entry(chain.into()).or_default().push(to);
            }
            continue;
        }
        rules
            .jumps
            .entry(chain.into())
            .or_default()
            .push(target.into());
        if let Some(front) = iptables_front(chain, target, &value) {
            rules.fronts.push(front);
        }
    }
    rules
}

/// A rule of `KUBE-SERVICES` (a ClusterIP) or `KUBE-NODEPORTS` as a
/// frontend: the chains kube-proxy enters a Service port by.
fn iptables_front<'a>(
    chain: &str,
    target: &str,
    value: &dyn Fn(&str) -> Option<&'a str>,
) -> Option<Front> {
    let comment = value("--comment")?;
    let protocol = protocol_number(value("-p")?)?;
    let port = value("--dport")?.parse().ok()?;
    let (ip, name) = match chain {
        "KUBE-SERVICES" => {
            let (ip, len) = value("-d")?.split_once('/')?;
            let ip: IpAddr = ip.parse().ok()?;
            // A ClusterIP is one address: /32, or /128 in ip6tables.
            if len != if ip.is_ipv6() { "128" } else { "32" } {
                return None;
            }
            (Some(ip), comment.strip_suffix(" cluster IP")?)
        }
        "KUBE-NODEPORTS" => (None, comment),
        _ => return None,
    };
    let (service, port_name) = service_port_name(name);
    Some(Front {
        service,
        port_name,
        protocol,
        ip,
        port,
        chain: target.into(),
    })
}

/// `nft list table ip kube-proxy` of a kube-proxy node in nftables mode.
pub fn parse_nft(text: &str) -> ProxyRules {
    let mut rules = ProxyRules::default();
    for block in nft_blocks(text) {
        match block.kind.as_str() {
            "map" if block.name == "service-ips" || block.name == "service-nodeports" => {
                rules
                    .fronts
                    .extend(elements(&block.body).iter().filter_map(|e| nft_front(e)));
            }
            "chain" => nft_chain(&mut rules, &block),
            _ => {}
        }
    }
    rules
}

/// A `map` or `chain` of an nft listing, its body as one line per rule.
struct NftBlock {
    kind: String,
    name: String,
    body: Vec<String>,
}

/// The table's blocks: `kind name {` … `}` (maps' element lists span
/// lines; nothing else nests).
fn nft_blocks(text: &str) -> Vec<NftBlock> {
    let mut blocks = Vec::new();
    let mut current: Option<NftBlock> = None;
    for line in text.lines().map(str::trim) {
        if let Some(block) = &mut current {
            if line == "}" {
                blocks.extend(current.take());
            } else {
                block.body.push(line.to_string());
            }
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        if let [kind @ ("map" | "chain" | "set"), name, "{"] = words[..] {
            current = Some(NftBlock {
                kind: kind.into(),
                name: name.into(),
                body: Vec::new(),
            });
        }
    }
    blocks
}

/// A map's elements (`elements = { a : b, c : d }`, over several lines).
fn elements(body: &[String]) -> Vec<String> {
    let joined = body.join(" ");
    let Some((_, rest)) = joined.split_once("elements = {") else {
        return Vec::new();
    };
    let list = rest.rsplit_once('}').map_or(rest, |(list, _)| list);
    list.split(',').map(|e| e.trim().to_string()).collect()
}

/// An element of `service-ips` (`ip . proto . port : goto chain`) or
/// `service-nodeports` (`proto . port : goto chain`).
fn nft_front(element: &str) -> Option<Front> {
    let (key, verdict) = element.split_once(" : ")?;
    let key = key.split(" comment ").next()?;
    let chain = verdict.split_whitespace().nth(1)?.to_string();
    let parts: Vec<&str> = key.split(" . ").map(str::trim).collect();
    let (ip, protocol, port) = match parts[..] {
        [ip, protocol, port] => (Some(ip.parse().ok()?), protocol, port),
        [protocol, port] => (None, protocol, port),
        _ => return None,
    };
    let (service, port_name) = nft_service_port(&chain)?;
    Some(Front {
        service,
        port_name,
        protocol: protocol_number(protocol)?,
        ip,
        port: port.parse().ok()?,
        chain,
    })
}

/// The Service port a chain is named after: `service-<hash>-ns/name/proto/port`
/// (or `external-…`) as (`ns/name`, port name).
fn nft_service_port(chain: &str) -> Option<(String, String)> {
    let (_, rest) = chain.split_once('-')?;
    let (_hash, name) = rest.split_once('-')?;
    let parts: Vec<&str> = name.split('/').collect();
    let [namespace, service, _protocol, port] = parts[..] else {
        return None;
    };
    Some((format!("{namespace}/{service}"), port.to_string()))
}

/// A chain's jumps (`jump`/`goto`, in vmaps too) and `dnat to ip:port`s.
fn nft_chain(rules: &mut ProxyRules, block: &NftBlock) {
    for rule in &block.body {
        let words: Vec<&str> = rule.split_whitespace().collect();
        for pair in words.windows(2) {
            match pair {
                ["jump" | "goto", to] => {
                    let to = to.trim_end_matches([',', '}']);
                    rules
                        .jumps
                        .entry(block.name.clone())
                        .or_default()
                        .push(to.into());
                }
                ["to", to] if rule.contains("dnat to") => {
                    if let Some(to) = socket(to) {
                        rules.dnats.entry(block.name.clone()).or_default().push(to);
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// Captured from the lab (`lab up flannel-vxlan --services`), as
    /// kube-proxy lays them out.
    const IPTABLES: &str = include_str!("kube_proxy_rules/lab-iptables-save-nat.txt");
    const NFT: &str = include_str!("kube_proxy_rules/lab-nft-kube-proxy.txt");

    /// What both modes say of the lab's default/db: its ClusterIP and
    /// NodePort, two backends.
    fn assert_lab_db(catalog: &Catalog) {
        let db = catalog.by_name("default", "db").expect("default/db");
        assert_eq!(db.cluster_ip, Some(Ipv4Addr::new(10, 96, 244, 7)));
        let http = db.ports.iter().find(|p| p.name == "http").unwrap();
        assert_eq!(
            (http.protocol, http.port, http.node_port),
            (6, 80, Some(30080))
        );
        let dns = db.ports.iter().find(|p| p.name == "dns").unwrap();
        assert_eq!((dns.protocol, dns.port, dns.node_port), (17, 53, None));
        let t = db.translations(&["192.0.2.11".parse().unwrap()]);
        let mut shown: Vec<String> = t
            .iter()
            .map(|t| format!("{} {} → {}", t.protocol, t.front, t.back))
            .collect();
        shown.sort();
        assert_eq!(
            shown,
            [
                "17 10.96.244.7:53 → 10.244.2.2:5353",
                "17 10.96.244.7:53 → 10.244.2.3:5353",
                "6 10.96.244.7:80 → 10.244.2.2:8080",
                "6 10.96.244.7:80 → 10.244.2.3:8080",
                "6 192.0.2.11:30080 → 10.244.2.2:8080",
                "6 192.0.2.11:30080 → 10.244.2.3:8080",
            ]
        );
        assert!(t.iter().all(|t| t.service.as_deref() == Some("default/db")));
        assert!(t.iter().all(|t| t.backend.is_none()), "pods are not named");
        // A Service without endpoints has no translation in the nat rules.
        assert!(catalog
            .by_cluster_ip("10.96.244.9".parse().unwrap())
            .is_none_or(|s| s.backends.is_empty()));
    }

    #[test]
    fn rules_of_either_mode_are_the_services_they_translate() {
        for catalog in [parse_iptables_save(IPTABLES), parse_nft(NFT)].map(|r| r.catalog()) {
            assert_lab_db(&catalog);
            let web = catalog
                .by_cluster_ip("10.96.244.8".parse().unwrap())
                .unwrap();
            assert_eq!(web.qualified(), "default/web");
        }
    }

    /// default/db's IPv6 proxier rules of a dual-stack node, in each
    /// mode's layout (ip6tables: /128 and `[ip]:port`; the `ip6
    /// kube-proxy` table: endpoint chains named with the address's `:`
    /// made `.`).
    const IP6TABLES: &str = r#"*nat
-A KUBE-SERVICES -d fd00:10:96::a60:f407/128 -p tcp -m comment --comment "default/db:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-6DB
-A KUBE-SVC-6DB -m comment --comment "default/db:http -> [fd00:10:244:2::3]:8080" -j KUBE-SEP-6DB3
-A KUBE-SEP-6DB3 -s fd00:10:244:2::3/128 -m comment --comment "default/db:http" -j KUBE-MARK-MASQ
-A KUBE-SEP-6DB3 -p tcp -m comment --comment "default/db:http" -m tcp -j DNAT --to-destination [fd00:10:244:2::3]:8080
COMMIT"#;
    const NFT6: &str = r#"table ip6 kube-proxy {
	map service-ips {
		type ipv6_addr . inet_proto . inet_service : verdict
		elements = { fd00:10:96::a60:f407 . tcp . 80 : goto service-ULMVA6XW-default/db/tcp/http }
	}
	chain service-ULMVA6XW-default/db/tcp/http {
		ip6 daddr fd00:10:96::a60:f407 tcp dport 80 ip6 saddr != fd00:10:244::/56 jump mark-for-masquerade
		numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-default/db/tcp/http__fd00.10.244.2..3/8080 }
	}
	chain endpoint-5OJB2KTY-default/db/tcp/http__fd00.10.244.2..3/8080 {
		ip6 saddr fd00:10:244:2::3 jump mark-for-masquerade
		meta l4proto tcp dnat to [fd00:10:244:2::3]:8080
	}
}"#;

    /// A dual-stack node's two proxiers read together: one Service with
    /// a ClusterIP of each family, each translated to its own family's
    /// backends.
    #[test]
    fn the_ipv6_proxiers_rules_give_the_services_ipv6_cluster_ip_and_backends() {
        for (ipv4, ipv6) in [(IPTABLES, IP6TABLES)]
            .map(|(a, b)| (parse_iptables_save(a), parse_iptables_save(b)))
            .into_iter()
            .chain([(parse_nft(NFT), parse_nft(NFT6))])
        {
            let mut rules = ipv4;
            rules.extend(ipv6);
            let catalog = rules.catalog();
            let cluster_ip: std::net::Ipv6Addr = "fd00:10:96::a60:f407".parse().unwrap();
            let db = catalog
                .by_cluster_ipv6(cluster_ip)
                .expect("db by its IPv6 ClusterIP");
            assert_eq!(db.qualified(), "default/db");
            let t = db.translations(&[]);
            let ipv6: Vec<String> = (t.iter())
                .filter(|t| t.front.ip.is_ipv6())
                .map(|t| format!("{} {} → {}", t.protocol, t.front, t.back))
                .collect();
            assert_eq!(
                ipv6,
                ["6 [fd00:10:96::a60:f407]:80 → [fd00:10:244:2::3]:8080"]
            );
            assert_eq!(db.cluster_ip, Some(Ipv4Addr::new(10, 96, 244, 7)));
            let ipv4 = t
                .iter()
                .filter(|t| t.front.ip.is_ipv4() && t.back.ip.is_ipv4());
            assert_eq!(ipv4.count(), 4, "the IPv4 ClusterIP's, as before: {t:?}");
        }
    }

    #[test]
    fn backends_are_followed_through_any_chain_between() {
        // externalTrafficPolicy: Local, as kube-proxy writes it: the
        // NodePort goes through KUBE-EXT to KUBE-SVL, not KUBE-SVC.
        let text = r#"-A KUBE-NODEPORTS -p tcp -m comment --comment "ns/a" -m tcp --dport 31000 -j KUBE-EXT-A
-A KUBE-EXT-A -j KUBE-SVL-A
-A KUBE-SVL-A -m comment --comment "ns/a -> 10.1.0.5:80" -j KUBE-SEP-X
-A KUBE-SEP-X -p tcp -m comment --comment "ns/a" -m tcp -j DNAT --to-destination 10.1.0.5:80
-A KUBE-SVL-A -j KUBE-SVL-A"#;
        let catalog = parse_iptables_save(text).catalog();
        let a = catalog.by_name("ns", "a").unwrap();
        assert_eq!(a.ports[0].name, "", "an unnamed port");
        assert_eq!(a.ports[0].node_port, Some(31000));
        assert_eq!(a.backends[0].ip, Ipv4Addr::new(10, 1, 0, 5));
    }

    #[test]
    fn no_rules_no_services() {
        assert!(
            parse_iptables_save("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n")
                .fronts
                .is_empty()
        );
        assert!(parse_nft("").fronts.is_empty());
    }
}
