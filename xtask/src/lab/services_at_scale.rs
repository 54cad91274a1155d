//! Thousands of Services on the lab, as a busy cluster's kube-proxy
//! programs them: `install_services_at_scale` adds `n` Services
//! (`default/scale-<i>`, TCP 80 → 8080) to the lab's own, each with one
//! backend among the lab's backend pods, laid out by kube-proxy's rules in
//! either mode and listed in `services.json`. They carry no traffic: they
//! are what podtrace must read, load and look through while it follows
//! the lab's own Services.
//!
//! Their ClusterIPs are taken from [`SCALE_CIDR`], outside every lab's
//! pod CIDR. Concurrent labs may share them: no packet is ever sent to
//! one, and each lab's rules live in its own node namespaces.

use std::{fs, net::Ipv4Addr};

use anyhow::{ensure, Result};
use ipnet::Ipv4Net;

use super::{
    kube_proxy::{LabPort, LabService, ProxyMode, TCP_PORT},
    Lab,
};

/// Where the extra Services' ClusterIPs come from (the lab's own are in
/// 10.96.0.0/16, its pods in 10.100-10.199 or the topology's default).
pub const SCALE_CIDR: Ipv4Net = match Ipv4Net::new(Ipv4Addr::new(10, 97, 0, 0), 16) {
    Ok(net) => net,
    Err(_) => panic!("a /16"),
};

/// The state file that records how many extra Services the lab has.
const COUNT_FILE: &str = "extra-services";

impl Lab {
    /// The lab's Services plus `extra` more (see the module doc), in
    /// `mode`: rules on every node, listeners, `services.json`.
    pub fn install_services_at_scale(&self, mode: ProxyMode, extra: usize) -> Result<()> {
        let room = SCALE_CIDR.hosts().count();
        ensure!(
            extra <= room,
            "at most {room} extra Services fit in {SCALE_CIDR}"
        );
        fs::create_dir_all(self.state_dir())?;
        fs::write(self.state_dir().join(COUNT_FILE), extra.to_string())?;
        self.install_services(mode)
    }

    /// The extra Services `install_services_at_scale` recorded (none on a
    /// lab installed without it).
    pub(super) fn extra_services(&self) -> Vec<LabService> {
        let extra: usize = fs::read_to_string(self.state_dir().join(COUNT_FILE))
            .ok()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        if extra == 0 {
            return Vec::new();
        }
        let backends = ["db-0", "db-1", "web-1"].map(|name| self.pod(name));
        SCALE_CIDR
            .hosts()
            .take(extra)
            .enumerate()
            .map(|(i, cluster_ip)| LabService {
                name: format!("scale-{i}"),
                cluster_ip,
                cluster_ipv6: None,
                ports: vec![LabPort {
                    name: "http",
                    protocol: "tcp",
                    port: 80,
                    target: TCP_PORT,
                    node_port: None,
                }],
                backends: vec![backends[i % backends.len()].clone()],
            })
            .collect()
    }
}
