//! `lab up … --services --proxy-mode nftables`: the lab's Services as
//! kube-proxy's nftables mode (≥ 1.31, `pkg/proxy/nftables`) programs
//! them, so that podtrace meets the table a real node has:
//!
//! - one table `ip kube-proxy`; base chains `filter-prerouting`,
//!   `filter-input`, `filter-forward`, `filter-output` (priority dstnat-10),
//!   `filter-output-post-dnat` (dstnat+10), `nat-prerouting`, `nat-output`
//!   (dstnat) and `nat-postrouting` (srcnat);
//! - dispatch: `services` looks `ip daddr . meta l4proto . th dport` up in
//!   the verdict map `service-ips`, local addresses' ports in
//!   `service-nodeports`;
//! - per Service port `service-<hash>-<ns>/<name>/<proto>/<port>`
//!   (mark-for-masquerade for traffic from outside the pod CIDR, then
//!   `numgen random mod N vmap` over the endpoints), `external-<hash>-…`
//!   for its NodePort, and per endpoint
//!   `endpoint-<hash>-…__<ip>/<port>` (mark-for-masquerade for hairpin,
//!   then `meta l4proto tcp dnat to ip:port`);
//! - Services without endpoints are elements of `no-endpoint-services`
//!   (commented with the Service port's name) that `goto reject-chain`;
//!   `cluster-ips-check` rejects the other ports of a ClusterIP and drops
//!   unallocated ClusterIPs (of the lab's Service CIDR, the /24 of its
//!   ClusterIPs);
//! - `mark-for-masquerade` sets 0x4000, `masquerading` masquerades it;
//! - `filter-forward` drops what conntrack finds INVALID (`ct state
//!   invalid drop`), kube-proxy's rule unless conntrack is TCP-liberal.
//!
//! Chain hashes are kube-proxy's: the first 8 characters of the base32 of
//! the SHA-256 of the name. Flannel's own MASQUERADE stays in iptables, as
//! on a real node.

use std::fmt::Write;

use anyhow::Result;
use ipnet::IpNet;

use super::{
    kube_proxy::{sha256_base32, LabPort, LabService},
    kube_proxy_family::Family,
    Lab,
};

/// kube-proxy's filter chains run just before DNAT (`dstnat - 10`); nft
/// 1.0 knows the name `dstnat` on prerouting only, so the others say -110.
const DSTNAT_MINUS_10: &str = "-110";
/// kube-proxy's masquerade mark (`--masquerade-bit 14`).
const MASQ_MARK: &str = "0x00004000";

/// Loads the table into node `ns`, and flannel's masquerade into its
/// iptables.
pub fn install(lab: &Lab, ns: &str) -> Result<()> {
    super::cmd::feed(ns, "nft", &["-f", "-"], &ruleset(lab))?;
    super::kube_proxy::install_flannel_masquerade(lab, ns)
}

/// kube-proxy's `hashAndTruncate`: `HASH-name`, the hash being the first
/// 8 characters of [`sha256_base32`] of the name.
fn hashed(name: &str) -> String {
    format!("{}-{name}", &sha256_base32(name)[..8])
}

/// `default/db/tcp/http`: a Service port as kube-proxy names its chains.
fn port_name(svc: &LabService, port: &LabPort) -> String {
    format!("{}/{}/{}", svc.qualified(), port.protocol, port.name)
}

/// The chain a Service port's ClusterIP traffic goes to.
pub fn service_chain(svc: &LabService, port: &LabPort) -> String {
    format!("service-{}", hashed(&port_name(svc, port)))
}

/// The chain that DNATs to one endpoint of a Service port (an IPv6
/// address with its colons made dots, as chain names cannot have them).
pub fn endpoint_chain(svc: &LabService, port: &LabPort, ip: std::net::IpAddr) -> String {
    let ip = ip.to_string().replace(':', ".");
    format!(
        "endpoint-{}",
        hashed(&format!("{}__{ip}/{}", port_name(svc, port), port.target))
    )
}

fn external_chain(svc: &LabService, port: &LabPort) -> String {
    format!("external-{}", hashed(&port_name(svc, port)))
}

/// Map and set contents, and the per-Service chains.
#[derive(Default)]
struct Services {
    cluster_ips: Vec<String>,
    service_ips: Vec<String>,
    service_nodeports: Vec<String>,
    no_endpoint_services: Vec<String>,
    chains: String,
}

impl Services {
    fn port(&mut self, lab: &Lab, family: Family, svc: &LabService, port: &LabPort) {
        let Some(cluster_ip) = family.cluster_ip(svc) else {
            return;
        };
        let (ipx, _) = family.nft();
        let key = format!("{cluster_ip} . {} . {}", port.protocol, port.port);
        if svc.backends.is_empty() {
            self.no_endpoint_services.push(format!(
                "{key} comment \"{}:{}\" : goto reject-chain",
                svc.qualified(),
                port.name
            ));
            return;
        }
        let service = service_chain(svc, port);
        self.service_ips.push(format!("{key} : goto {service}"));
        let mut picks = Vec::new();
        for (i, pod) in svc.backends.iter().enumerate() {
            let ip = family.address(lab, pod);
            let endpoint = endpoint_chain(svc, port, ip);
            picks.push(format!("{i} : goto {endpoint}"));
            let _ = write!(
                self.chains,
                " chain {endpoint} {{\n  {ipx} saddr {ip} jump mark-for-masquerade\n  meta l4proto {} dnat to {}\n }}\n",
                port.protocol,
                std::net::SocketAddr::new(ip, port.target),
            );
        }
        let _ = write!(
            self.chains,
            " chain {service} {{\n  {ipx} daddr {cluster_ip} {} dport {} {ipx} saddr != {} jump mark-for-masquerade\n  numgen random mod {} vmap {{ {} }}\n }}\n",
            port.protocol,
            port.port,
            family.pod_cidr(lab),
            picks.len(),
            picks.join(", ")
        );
        if let Some(node_port) = port.node_port {
            let external = external_chain(svc, port);
            self.service_nodeports
                .push(format!("{} . {node_port} : goto {external}", port.protocol));
            let _ = write!(
                self.chains,
                " chain {external} {{\n  jump mark-for-masquerade\n  goto {service}\n }}\n"
            );
        }
    }
}

fn elements(items: &[String]) -> String {
    if items.is_empty() {
        String::new()
    } else {
        format!("  elements = {{ {} }}\n", items.join(", "))
    }
}

/// The IPv4 proxier's table, as `nft -f` takes it.
pub fn ruleset(lab: &Lab) -> String {
    ruleset_of(lab, Family::Ipv4)
}

/// One family's whole table, as `nft -f` takes it (the table is flushed
/// first, as kube-proxy's first sync does).
pub(super) fn ruleset_of(lab: &Lab, family: Family) -> String {
    let mut s = Services::default();
    for svc in lab.services() {
        if let Some(ip) = family.cluster_ip(&svc) {
            s.cluster_ips.push(ip.to_string());
        }
        for port in &svc.ports {
            s.port(lab, family, &svc, port);
        }
    }
    let verdict_map = |name: &str, key: &str, comment: &str, items: &[String]| {
        format!(
            " map {name} {{\n  type {key} : verdict\n  comment \"{comment}\"\n{}\n }}\n",
            elements(items)
        )
    };
    let (ipx, addr) = family.nft();
    let addr_key = format!("{addr} . inet_proto . inet_service");
    let addr_key = addr_key.as_str();
    let mut out = format!("table {ipx} kube-proxy\ndelete table {ipx} kube-proxy\n");
    out.push_str(&format!(
        "table {ipx} kube-proxy {{\n comment \"rules for kube-proxy\"\n"
    ));
    let _ = write!(
        out,
        " set cluster-ips {{\n  type {addr}\n  comment \"Active ClusterIPs\"\n{}\n }}\n",
        elements(&s.cluster_ips)
    );
    out.push_str(&verdict_map(
        "service-ips",
        addr_key,
        "ClusterIP, ExternalIP and LoadBalancer IP traffic",
        &s.service_ips,
    ));
    out.push_str(&verdict_map(
        "service-nodeports",
        "inet_proto . inet_service",
        "NodePort traffic",
        &s.service_nodeports,
    ));
    out.push_str(&verdict_map(
        "no-endpoint-services",
        addr_key,
        "vmap to drop or reject packets to services with no endpoints",
        &s.no_endpoint_services,
    ));
    out.push_str(&verdict_map(
        "no-endpoint-nodeports",
        "inet_proto . inet_service",
        "vmap to drop or reject packets to service nodeports with no endpoints",
        &[],
    ));
    out.push_str(&verdict_map(
        "firewall-ips",
        addr_key,
        "destinations that are subject to LoadBalancerSourceRanges",
        &[],
    ));
    out.push_str(&fixed_chains(family, service_cidr(lab, family)));
    out.push_str(&s.chains);
    out.push_str("}\n");
    out
}

/// The lab's Service CIDR: the /24 its ClusterIPs are taken from, which
/// no lab's pod CIDR overlaps (the tests' pod CIDRs, 10.100-10.199/16,
/// would overlap kube-proxy's default 10.96.0.0/12, and its
/// `cluster-ips-check` would then drop DNATed packets to pods).
/// Of IPv6, the /112 of its IPv6 ClusterIPs (`Family::service_ipv6`).
fn service_cidr(lab: &Lab, family: Family) -> IpNet {
    let first = &lab.services()[0];
    let (ip, len) = match family {
        Family::Ipv4 => (first.cluster_ip.into(), 24),
        Family::Ipv6 => (Family::service_ipv6(first.cluster_ip).into(), 112),
    };
    let cidr = IpNet::new(ip, len).expect("a prefix").trunc();
    let pods: IpNet = family.pod_cidr(lab).parse().expect("a CIDR");
    assert!(
        !cidr.contains(&pods.network()) && !pods.contains(&cidr.network()),
        "the lab's Service CIDR {cidr} overlaps its pod CIDR {pods}"
    );
    cidr
}

/// The chains every kube-proxy table has, whatever its Services.
fn fixed_chains(family: Family, service_cidr: IpNet) -> String {
    base_chains() + &helper_chains(family, service_cidr)
}

/// A chain on a netfilter hook.
fn base(name: &str, kind: &str, hook: &str, priority: &str, rules: &[&str]) -> String {
    let head = format!(
        " chain {name} {{\n  type {kind} hook {hook} priority {priority}; policy accept;\n"
    );
    with_rules(head, rules)
}

/// A chain only jumped to.
fn plain(name: &str, rules: &[&str]) -> String {
    with_rules(format!(" chain {name} {{\n"), rules)
}

/// A chain's `head`, then its rules, one a line, and its end.
fn with_rules(mut head: String, rules: &[&str]) -> String {
    for rule in rules {
        let _ = writeln!(head, "  {rule}");
    }
    head.push_str(" }\n");
    head
}

/// The chains on the hooks, that send packets to the others.
fn base_chains() -> String {
    let new = "ct state new jump";
    [
        base(
            "filter-prerouting",
            "filter",
            "prerouting",
            "dstnat - 10",
            &[&format!("{new} firewall-check")],
        ),
        base(
            "filter-input",
            "filter",
            "input",
            DSTNAT_MINUS_10,
            &[
                &format!("{new} nodeport-endpoints-check"),
                &format!("{new} service-endpoints-check"),
            ],
        ),
        base(
            "filter-forward",
            "filter",
            "forward",
            DSTNAT_MINUS_10,
            &[
                &format!("{new} service-endpoints-check"),
                &format!("{new} cluster-ips-check"),
                // Unless nf_conntrack_tcp_be_liberal (kube-proxy's
                // `--conntrack-tcp-be-liberal`), as kube-proxy ≥ 1.31 adds it.
                "ct state invalid drop",
            ],
        ),
        base(
            "filter-output",
            "filter",
            "output",
            DSTNAT_MINUS_10,
            &[
                &format!("{new} service-endpoints-check"),
                &format!("{new} firewall-check"),
            ],
        ),
        base(
            "filter-output-post-dnat",
            "filter",
            "output",
            "-90",
            &[&format!("{new} cluster-ips-check")],
        ),
        base(
            "nat-prerouting",
            "nat",
            "prerouting",
            "dstnat",
            &["jump services"],
        ),
        base("nat-output", "nat", "output", "-100", &["jump services"]),
        base(
            "nat-postrouting",
            "nat",
            "postrouting",
            "srcnat",
            &["jump masquerading"],
        ),
    ]
    .concat()
}

/// The chains the hooked ones jump to: the checks, the dispatch to the
/// Services, masquerading and rejecting.
fn helper_chains(family: Family, service_cidr: IpNet) -> String {
    let (ipx, _) = family.nft();
    let loopback = family.loopback();
    [
        plain(
            "nodeport-endpoints-check",
            &[&format!("{ipx} daddr != {loopback} meta l4proto . th dport vmap @no-endpoint-nodeports")],
        ),
        plain(
            "service-endpoints-check",
            &[&format!("{ipx} daddr . meta l4proto . th dport vmap @no-endpoint-services")],
        ),
        plain(
            "firewall-check",
            &[&format!("{ipx} daddr . meta l4proto . th dport vmap @firewall-ips")],
        ),
        plain(
            "services",
            &[
                &format!("{ipx} daddr . meta l4proto . th dport vmap @service-ips"),
                &format!("fib daddr type local {ipx} daddr != {loopback} meta l4proto . th dport vmap @service-nodeports"),
            ],
        ),
        plain(
            "cluster-ips-check",
            &[
                &format!("{ipx} daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\""),
                &format!("{ipx} daddr {{ {service_cidr} }} drop comment \"Drop traffic to unallocated ClusterIPs\""),
            ],
        ),
        plain(
            "mark-for-masquerade",
            &[&format!("meta mark set meta mark or {MASQ_MARK}")],
        ),
        plain(
            "masquerading",
            &[
                &format!("meta mark and {MASQ_MARK} == 0 return"),
                &format!("meta mark set meta mark xor {MASQ_MARK}"),
                "masquerade fully-random",
            ],
        ),
        " chain reject-chain {\n  comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\"\n  reject\n }\n"
            .to_string(),
    ]
    .concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::Topology;

    #[test]
    fn chains_are_named_and_hashed_as_kube_proxy_names_them() {
        let lab = Lab::new("t", Topology::FlannelVxlan, None).unwrap();
        let db = lab.service("db");
        let http = &db.ports[0];
        // kube-proxy's own test vector (proxier_test.go): ns1/svc1/tcp/p80.
        assert_eq!(hashed("ns1/svc1/tcp/p80"), "ULMVA6XW-ns1/svc1/tcp/p80");
        let endpoint = endpoint_chain(&db, http, db.backends[0].ip.into());
        assert!(
            endpoint.starts_with("endpoint-")
                && endpoint.ends_with("-default/db/tcp/http__10.244.2.2/8080"),
            "{endpoint}"
        );
        let rules = ruleset(&lab);
        assert!(rules.contains("numgen random mod 2 vmap"));
        assert!(rules.contains("meta l4proto tcp dnat to 10.244.2.2:8080"));
        assert!(rules.contains("comment \"default/empty:http\" : goto reject-chain"));
        assert!(rules.contains("tcp . 30080 : goto external-"));
        assert!(rules.contains("  ct state invalid drop\n"));
        // Not 10.96.0.0/12: pod CIDRs such as 10.104.0.0/16 are in it.
        let busy = Lab::new(
            "t",
            Topology::FlannelVxlan,
            Some("10.104.0.0/16".parse().unwrap()),
        )
        .unwrap();
        assert!(ruleset(&busy).contains("ip daddr { 10.96.104.0/24 } drop"));
    }
}
