//! `lab up … --services --proxy-mode nftables`: the lab's Services as
//! kube-proxy's nftables mode programs them (pkg/proxy/nftables): one
//! table `ip kube-proxy`, a verdict map `service-ips` keyed by
//! `ip daddr . meta l4proto . th dport`, one `service-<hash>-<ns>/<name>/<proto>/<port>`
//! chain per Service port choosing an endpoint with `numgen random mod N
//! vmap`, one `endpoint-<hash>-…` chain per endpoint (mark-for-masquerade
//! for hairpin, then `dnat to`), a `no-endpoint-services` map that jumps
//! to a reject chain, and `ct state invalid drop` in filter-forward.
//! Flannel's MASQUERADE stays in iptables, as on a real node.

use anyhow::Result;

use super::{
    kube_proxy::{LabPort, LabService},
    Lab,
};

/// Loads the table into node `ns`.
pub fn install(lab: &Lab, ns: &str, _node: u8) -> Result<()> {
    super::cmd::feed(ns, "nft", &["-f", "-"], &ruleset(lab))?;
    // Flannel's own masquerade is an iptables rule on a real node too.
    let cidr = lab.pod_cidr;
    super::cmd::sh(&[
        "ip",
        "netns",
        "exec",
        ns,
        "iptables",
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-s",
        &cidr.to_string(),
        "!",
        "-d",
        &cidr.to_string(),
        "-m",
        "comment",
        "--comment",
        "flanneld masq",
        "-j",
        "MASQUERADE",
        "--random-fully",
    ])
}

fn chain_id(svc: &LabService, port: &LabPort, extra: &str) -> String {
    let hash = svc.chain_hash(port, extra);
    format!(
        "{}-{}/{}/{}",
        &hash[..8],
        svc.qualified(),
        port.protocol,
        port.port
    )
}

/// The whole table, as `nft -f` takes it.
pub fn ruleset(lab: &Lab) -> String {
    let mut chains = String::new();
    let mut service_ips = Vec::new();
    let mut no_endpoints = Vec::new();
    for svc in lab.services() {
        for port in &svc.ports {
            let key = format!("{} . {} . {}", svc.cluster_ip, port.protocol, port.port);
            if svc.backends.is_empty() {
                no_endpoints.push(format!("{key} : goto reject-chain"));
                continue;
            }
            let service = format!("service-{}", chain_id(&svc, port, ""));
            service_ips.push(format!("{key} : goto \"{service}\""));
            let mut picks = Vec::new();
            for (i, pod) in svc.backends.iter().enumerate() {
                let endpoint = format!("endpoint-{}", chain_id(&svc, port, &pod.ip.to_string()));
                picks.push(format!("{i} : goto \"{endpoint}\""));
                chains.push_str(&format!(
                    " chain \"{endpoint}\" {{\n  ip saddr {} jump mark-for-masquerade\n  meta l4proto {} dnat to {}:{}\n }}\n",
                    pod.ip, port.protocol, pod.ip, port.target
                ));
            }
            chains.push_str(&format!(
                " chain \"{service}\" {{\n  ip daddr {} {} dport {} ip saddr != {} jump mark-for-masquerade\n  numgen random mod {} vmap {{ {} }}\n }}\n",
                svc.cluster_ip, port.protocol, port.port, lab.pod_cidr, picks.len(), picks.join(", ")
            ));
        }
    }
    let elements = |v: &[String]| {
        if v.is_empty() {
            String::new()
        } else {
            format!("  elements = {{ {} }}\n", v.join(", "))
        }
    };
    format!(
        "table ip kube-proxy {{
 map service-ips {{
  type ipv4_addr . inet_proto . inet_service : verdict
  comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"
{}
 }}
 map no-endpoint-services {{
  type ipv4_addr . inet_proto . inet_service : verdict
  comment \"vmap to drop or reject packets to services with no endpoints\"
{}
 }}
 chain mark-for-masquerade {{
  meta mark set meta mark or 0x4000
 }}
 chain masquerading {{
  meta mark & 0x4000 == 0 return
  meta mark set meta mark xor 0x4000
  masquerade fully-random
 }}
 chain services {{
  ip daddr . meta l4proto . th dport vmap @service-ips
 }}
 chain reject-chain {{
  comment \"helper for @no-endpoint-services\"
  reject
 }}
{chains} chain nat-prerouting {{
  type nat hook prerouting priority dstnat; policy accept;
  jump services
 }}
 chain nat-output {{
  type nat hook output priority -100; policy accept;
  jump services
 }}
 chain nat-postrouting {{
  type nat hook postrouting priority srcnat; policy accept;
  jump masquerading
 }}
 chain filter-forward {{
  type filter hook forward priority -110; policy accept;
  ct state invalid drop
  ct state new ip daddr . meta l4proto . th dport vmap @no-endpoint-services
 }}
 chain filter-output {{
  type filter hook output priority -110; policy accept;
  ct state new ip daddr . meta l4proto . th dport vmap @no-endpoint-services
 }}
}}
",
        elements(&service_ips),
        elements(&no_endpoints)
    )
}
