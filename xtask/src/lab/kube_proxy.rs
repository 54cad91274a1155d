//! `lab up … --services`: Services on the lab, as kube-proxy (iptables
//! mode) lays them out on every node, with real listeners in the backend
//! pods, so podtrace can be shown a packet translated on its way.
//!
//! The chains follow kube-proxy's `proxier.go` layout: nat `KUBE-SERVICES`
//! (one rule per ClusterIP:port, the NodePorts last), `KUBE-SVC-<hash>`
//! (KUBE-MARK-MASQ for traffic from outside the pod CIDR, then one rule per
//! endpoint, `statistic --mode random --probability 1/n` for all but the
//! last), `KUBE-SEP-<hash>` (KUBE-MARK-MASQ for hairpin traffic, then the
//! DNAT), `KUBE-EXT-<hash>` for NodePorts, `KUBE-MARK-MASQ` and
//! `KUBE-POSTROUTING` (MASQUERADE of marked packets); filter
//! `KUBE-SERVICES` rejects Services without endpoints and `KUBE-FORWARD`
//! drops conntrack INVALID. Flannel's own MASQUERADE of pod traffic
//! leaving the pod CIDR is added too. `kube_proxy_nft` writes the same
//! Services as kube-proxy's nftables mode.
//!
//! The Services (their ClusterIPs derive from the pod CIDR, so that
//! concurrent labs never share one):
//! - `default/db`: TCP 80 → 8080 (`http`, NodePort 30080) and UDP 53 → 5353
//!   (`dns`), backends db-0 and db-1 on node-2;
//! - `default/web`: TCP 80 → 8080, backend web-0 on node-1 (same node,
//!   hairpin);
//! - `default/empty`: TCP 80, no endpoints;
//! - `default/iperf`: TCP 5201 → 5201, backend db-0 (the NAT bench runs
//!   iperf3 through it).

use std::{
    fs,
    net::{Ipv4Addr, Ipv6Addr},
};

use anyhow::Result;
use serde_json::{json, Value};

use super::{cmd, kube_proxy_family::Family, Lab, LabPod};

/// The backends' listening ports.
pub const TCP_PORT: u16 = 8080;
pub const UDP_PORT: u16 = 5353;
/// iperf3's port, for the NAT bench's Service.
pub const IPERF_PORT: u16 = 5201;
/// db's NodePort.
pub const NODE_PORT: u16 = 30080;
/// An address outside the cluster, on the underlay's namespace (the
/// nodes' default gateway), with a listener on [`TCP_PORT`]: what a pod
/// reaches through the CNI's MASQUERADE.
pub const OUTSIDE: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
/// kube-proxy's masquerade mark.
const MASQ_MARK: &str = "0x4000/0x4000";

/// How kube-proxy programs the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProxyMode {
    Iptables,
    Nftables,
    /// iptables mode on iptables-legacy nodes (kube-proxy's image picks
    /// legacy where kubelet's chains are in legacy's tables): the same
    /// rules through iptables-legacy-restore, kubelet's chains moved to
    /// legacy's mangle table.
    IptablesLegacy,
}

impl ProxyMode {
    /// The `iptables-restore` (`ip6tables-restore`) it writes with.
    pub(super) fn restore_program(self, ipv6: bool) -> &'static str {
        match (self, ipv6) {
            (Self::IptablesLegacy, false) => "iptables-legacy-restore",
            (Self::IptablesLegacy, true) => "ip6tables-legacy-restore",
            (_, false) => "iptables-restore",
            (_, true) => "ip6tables-restore",
        }
    }
}

/// One port of a lab Service.
#[derive(Clone, Debug)]
pub struct LabPort {
    pub name: &'static str,
    /// `tcp` or `udp`.
    pub protocol: &'static str,
    pub port: u16,
    pub target: u16,
    pub node_port: Option<u16>,
}

#[derive(Clone, Debug)]
pub struct LabService {
    pub name: String,
    pub cluster_ip: Ipv4Addr,
    /// Its IPv6 ClusterIP once the lab is dual-stack (`PreferDualStack`).
    pub cluster_ipv6: Option<Ipv6Addr>,
    pub ports: Vec<LabPort>,
    pub backends: Vec<LabPod>,
}

impl LabService {
    pub fn qualified(&self) -> String {
        format!("default/{}", self.name)
    }

    /// kube-proxy's iptables chain suffix: the first 16 characters of
    /// [`sha256_base32`] of the service port name (`default/db:http`), the
    /// protocol and, for an endpoint's chain, the endpoint (`ip:port`).
    pub fn chain_hash(&self, port: &LabPort, endpoint: &str) -> String {
        let text = format!(
            "{}:{}{}{endpoint}",
            self.qualified(),
            port.name,
            port.protocol
        );
        sha256_base32(&text)[..16].to_string()
    }
}

/// How kube-proxy hashes its chain names, in both modes: base32 of the
/// SHA-256 of the name (each mode keeps a prefix of it).
pub fn sha256_base32(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    data_encoding::BASE32.encode(digest.as_ref())
}

impl Lab {
    /// The lab's Services (see the module doc).
    pub fn services(&self) -> Vec<LabService> {
        let octet = self.pod_cidr.network().octets()[1];
        let ip = |last| Ipv4Addr::new(10, 96, octet, last);
        let http = |node_port| LabPort {
            name: "http",
            protocol: "tcp",
            port: 80,
            target: TCP_PORT,
            node_port,
        };
        let dns = LabPort {
            name: "dns",
            protocol: "udp",
            port: 53,
            target: UDP_PORT,
            node_port: None,
        };
        let mut services = vec![
            LabService {
                name: "db".into(),
                cluster_ipv6: None,
                cluster_ip: ip(7),
                ports: vec![http(Some(NODE_PORT)), dns],
                backends: vec![self.pod("db-0"), self.pod("db-1")],
            },
            LabService {
                name: "web".into(),
                cluster_ipv6: None,
                cluster_ip: ip(8),
                ports: vec![http(None)],
                backends: vec![self.pod("web-0")],
            },
            LabService {
                name: "empty".into(),
                cluster_ipv6: None,
                cluster_ip: ip(9),
                ports: vec![http(None)],
                backends: vec![],
            },
            LabService {
                name: "iperf".into(),
                cluster_ipv6: None,
                cluster_ip: ip(10),
                ports: vec![LabPort {
                    name: "iperf",
                    protocol: "tcp",
                    port: IPERF_PORT,
                    target: IPERF_PORT,
                    node_port: None,
                }],
                backends: vec![self.pod("db-0")],
            },
        ];
        services.extend(self.extra_services());
        if self.is_dual_stack() {
            for svc in &mut services {
                svc.cluster_ipv6 = Some(Family::service_ipv6(svc.cluster_ip));
            }
        }
        services
    }

    pub fn service(&self, name: &str) -> LabService {
        self.services()
            .into_iter()
            .find(|s| s.name == name)
            .expect("a lab service")
    }

    pub fn services_file(&self) -> std::path::PathBuf {
        self.state_dir().join("services.json")
    }

    /// Programs every node as kube-proxy would, starts the backends'
    /// listeners, and writes `services.json`.
    pub fn install_services(&self, mode: ProxyMode) -> Result<()> {
        for node in self.nodes() {
            let ns = self.node_netns(node);
            for pod in self.pods_on(node) {
                // As the CNI bridge plugin sets it (hairpinMode: true);
                // a routed veth (Calico's) has no bridge to hairpin on.
                if cmd::bridge_port(&ns, &pod.host_iface) {
                    cmd::ip(
                        &ns,
                        &format!("link set {} type bridge_slave hairpin on", pod.host_iface),
                    )?;
                }
            }
            match mode {
                ProxyMode::Iptables => restore(&ns, &self.iptables_rules(node))?,
                ProxyMode::IptablesLegacy => {
                    self.run_iptables_legacy(node)?;
                    let program = mode.restore_program(false);
                    cmd::feed(&ns, program, &["--noflush"], &self.iptables_rules(node))?;
                }
                ProxyMode::Nftables => super::kube_proxy_nft::install(self, &ns)?,
            }
            if self.is_dual_stack() {
                self.install_services6(&ns, mode)?;
            }
        }
        cmd::ip(
            &self.underlay_netns(),
            &format!("addr add {OUTSIDE}/32 dev lo"),
        )?;
        self.start_listeners()?;
        fs::create_dir_all(self.state_dir())?;
        fs::write(
            self.services_file(),
            serde_json::to_string_pretty(&self.service_list())?,
        )?;
        fs::write(self.state_dir().join("proxy-mode"), format!("{mode:?}"))?;
        Ok(())
    }

    /// `iptables-save` text for one node.
    pub fn iptables_rules(&self, node: u8) -> String {
        let _ = node;
        self.proxier_rules(Family::Ipv4)
    }

    /// `iptables-save` (or `ip6tables-save`) text of one family's proxier.
    pub(super) fn proxier_rules(&self, family: Family) -> String {
        let mut nat = NatRules::default();
        let mut filter = vec![
            "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".to_string(),
            "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".into(),
            "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".into(),
            "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD".into(),
            "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m comment --comment \"kubernetes forwarding conntrack rule\" -j DROP".into(),
        ];
        for svc in self.services() {
            let Some(cluster_ip) = family.cluster_ip(&svc) else {
                continue;
            };
            for port in &svc.ports {
                if svc.backends.is_empty() {
                    filter.push(format!(
                        "-A KUBE-SERVICES -d {cluster_ip}/{} -p {p} -m comment --comment \"{}:{} has no endpoints\" -m {p} --dport {} -j REJECT --reject-with {}",
                        family.host_len(), svc.qualified(), port.name, port.port, family.port_unreachable(), p = port.protocol
                    ));
                } else {
                    nat.service(self, family, &svc, port);
                }
            }
        }
        format!(
            "*nat\n{}COMMIT\n*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n{}\nCOMMIT\n",
            nat.text(self, family),
            filter.join("\n")
        )
    }

    /// The Services and EndpointSlices as `kubectl get
    /// svc,endpointslices -A -o json` prints them.
    pub fn service_list(&self) -> Value {
        let mut items = Vec::new();
        for svc in self.services() {
            items.push(service_object(&svc));
            if !svc.backends.is_empty() {
                items.push(slice_object(self, &svc, Family::Ipv4));
                if svc.cluster_ipv6.is_some() {
                    items.push(slice_object(self, &svc, Family::Ipv6));
                }
            }
        }
        json!({"apiVersion": "v1", "kind": "List", "items": items})
    }
}

fn service_object(svc: &LabService) -> Value {
    let ports: Vec<Value> = svc
        .ports
        .iter()
        .map(|p| {
            let mut port = json!({"name": p.name, "protocol": p.protocol.to_uppercase(), "port": p.port, "targetPort": p.target});
            if let Some(n) = p.node_port {
                port["nodePort"] = n.into();
            }
            port
        })
        .collect();
    let kind = if svc.ports.iter().any(|p| p.node_port.is_some()) {
        "NodePort"
    } else {
        "ClusterIP"
    };
    let mut object = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": svc.name, "namespace": "default"},
        "spec": {"type": kind, "clusterIP": svc.cluster_ip.to_string(), "clusterIPs": [svc.cluster_ip.to_string()],
                 "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                 "selector": {"app": svc.name}, "ports": ports},
        "status": {"loadBalancer": {}}
    });
    if let Some(ipv6) = svc.cluster_ipv6 {
        let spec = &mut object["spec"];
        spec["clusterIPs"] = json!([svc.cluster_ip.to_string(), ipv6.to_string()]);
        spec["ipFamilies"] = json!(["IPv4", "IPv6"]);
        spec["ipFamilyPolicy"] = "PreferDualStack".into();
    }
    object
}

/// The Service's EndpointSlice of one family (the controller makes one
/// per family).
fn slice_object(lab: &Lab, svc: &LabService, family: Family) -> Value {
    let ports: Vec<Value> = svc
        .ports
        .iter()
        .map(|p| json!({"name": p.name, "protocol": p.protocol.to_uppercase(), "port": p.target}))
        .collect();
    let endpoints: Vec<Value> = svc
        .backends
        .iter()
        .map(|pod| {
            json!({
                "addresses": [family.address(lab, pod).to_string()],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": Lab::node_name(pod.node),
                "targetRef": {"kind": "Pod", "name": pod.name, "namespace": "default"}
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{}-{}", svc.name, family.slice_suffix()), "namespace": "default",
                     "labels": {"kubernetes.io/service-name": svc.name, "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": family.name(), "ports": ports, "endpoints": endpoints
    })
}

/// kube-proxy's nat table, built one Service port at a time.
#[derive(Default)]
struct NatRules {
    chains: Vec<String>,
    services: Vec<String>,
    nodeports: Vec<String>,
    rules: Vec<String>,
}

impl NatRules {
    fn service(&mut self, lab: &Lab, family: Family, svc: &LabService, port: &LabPort) {
        let name = format!("{}:{}", svc.qualified(), port.name);
        let p = port.protocol;
        let Some(cluster_ip) = family.cluster_ip(svc) else {
            return;
        };
        let host = family.host_len();
        let svc_chain = format!("KUBE-SVC-{}", svc.chain_hash(port, ""));
        self.chains.push(svc_chain.clone());
        self.services.push(format!(
            "-A KUBE-SERVICES -d {cluster_ip}/{host} -p {p} -m comment --comment \"{name} cluster IP\" -m {p} --dport {} -j {svc_chain}",
            port.port
        ));
        self.rules.push(format!(
            "-A {svc_chain} ! -s {} -d {cluster_ip}/{host} -p {p} -m comment --comment \"{name} cluster IP\" -m {p} --dport {} -j KUBE-MARK-MASQ",
            family.pod_cidr(lab), port.port
        ));
        if let Some(node_port) = port.node_port {
            let ext = format!("KUBE-EXT-{}", svc.chain_hash(port, ""));
            self.chains.push(ext.clone());
            self.nodeports.push(format!(
                "-A KUBE-NODEPORTS -p {p} -m comment --comment \"{name}\" -m {p} --dport {node_port} -j {ext}"
            ));
            self.rules.push(format!("-A {ext} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ"));
            self.rules.push(format!("-A {ext} -j {svc_chain}"));
        }
        let n = svc.backends.len();
        for (i, pod) in svc.backends.iter().enumerate() {
            let ip = family.address(lab, pod);
            // kube-proxy's endpoint string: `ip:port`, `[ip]:port` for IPv6.
            let to = std::net::SocketAddr::new(ip, port.target).to_string();
            let sep = format!("KUBE-SEP-{}", svc.chain_hash(port, &to));
            self.chains.push(sep.clone());
            let random = if i + 1 < n {
                format!(
                    " -m statistic --mode random --probability {:.11}",
                    1.0 / (n - i) as f64
                )
            } else {
                String::new()
            };
            self.rules.push(format!(
                "-A {svc_chain} -m comment --comment \"{name} -> {to}\"{random} -j {sep}"
            ));
            self.rules.push(format!(
                "-A {sep} -s {ip}/{host} -m comment --comment \"{name}\" -j KUBE-MARK-MASQ"
            ));
            self.rules.push(format!("-A {sep} -p {p} -m comment --comment \"{name}\" -m {p} -j DNAT --to-destination {to}"));
        }
    }

    /// The nat table; flannel's MASQUERADE is in the IPv4 one only (the
    /// lab's IPv6 pods reach nothing outside the cluster).
    fn text(&self, lab: &Lab, family: Family) -> String {
        let mut out = String::new();
        for chain in [
            "KUBE-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-POSTROUTING",
            "KUBE-MARK-MASQ",
            "FLANNEL-POSTRTG",
        ]
        .into_iter()
        .map(String::from)
        .chain(self.chains.iter().cloned())
        {
            out.push_str(&format!(":{chain} - [0:0]\n"));
        }
        let fixed = [
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".to_string(),
            "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES".into(),
            "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING".into(),
            format!("-A KUBE-MARK-MASQ -j MARK --set-xmark {MASQ_MARK}"),
            format!("-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK} -j RETURN"),
            "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0".into(),
            "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully".into(),
        ];
        let last = "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS".to_string();
        let flannel = match family {
            Family::Ipv4 => flannel_masquerade(lab.pod_cidr).to_vec(),
            Family::Ipv6 => Vec::new(),
        };
        for line in fixed
            .iter()
            .chain(&flannel)
            .chain(&self.services)
            .chain(std::iter::once(&last))
            .chain(&self.nodeports)
            .chain(&self.rules)
        {
            out.push_str(line);
            out.push('\n');
        }
        out
    }
}

/// Flannel's MASQUERADE of pod traffic leaving the pod CIDR (its
/// `FLANNEL-POSTRTG` chain, declared with kube-proxy's): iptables nat
/// rules, whichever mode kube-proxy runs in.
fn flannel_masquerade(cidr: ipnet::Ipv4Net) -> [String; 3] {
    [
        "-A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG".into(),
        format!("-A FLANNEL-POSTRTG -s {cidr} -d {cidr} -m comment --comment \"flanneld masq\" -j RETURN"),
        format!("-A FLANNEL-POSTRTG -s {cidr} ! -d 224.0.0.0/4 -m comment --comment \"flanneld masq\" -j MASQUERADE --random-fully"),
    ]
}

/// Flannel's MASQUERADE alone into node `ns` (kube-proxy's nftables mode
/// leaves iptables to the CNI).
pub(super) fn install_flannel_masquerade(lab: &Lab, ns: &str) -> Result<()> {
    let rules = flannel_masquerade(lab.pod_cidr).join("\n");
    restore(
        ns,
        &format!("*nat\n:FLANNEL-POSTRTG - [0:0]\n{rules}\nCOMMIT\n"),
    )
}

/// `iptables-restore --noflush` inside a node.
fn restore(ns: &str, rules: &str) -> Result<()> {
    cmd::feed(ns, "iptables-restore", &["--noflush"], rules)
}

/// `ip6tables-restore --noflush` inside a node.
pub(super) fn restore6(ns: &str, rules: &str) -> Result<()> {
    cmd::feed(ns, "ip6tables-restore", &["--noflush"], rules)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::Topology;

    #[test]
    fn kube_proxy_chains_are_laid_out_as_kube_proxy_does() {
        let lab = Lab::new("t", Topology::FlannelVxlan, None).unwrap();
        let rules = lab.iptables_rules(1);
        assert!(
            rules.contains("-m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-")
        );
        assert!(rules.contains("-j DNAT --to-destination 10.244.2.3:8080"));
        assert!(rules.contains("\"default/empty:http has no endpoints\""));
        assert!(rules.contains("--dport 30080 -j KUBE-EXT-"));
        // kube-proxy's own chain names for ns1/svc1:p80 and its endpoint
        // 10.180.0.1:80 (pkg/proxy/iptables/proxier_test.go).
        assert_eq!(&sha256_base32("ns1/svc1:p80tcp")[..16], "XPGD46QRK7WJZT7O");
        assert_eq!(
            &sha256_base32("ns1/svc1:p80tcp10.180.0.1:80")[..16],
            "SXIVWICOYRO3J4NJ"
        );
        let list = lab.service_list();
        assert_eq!(list["items"].as_array().unwrap().len(), 7);
    }
}
