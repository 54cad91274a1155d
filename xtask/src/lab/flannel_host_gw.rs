//! Flannel's host-gw backend: no tunnel; each node routes a remote pod
//! subnet straight to the remote node's underlay address.

use anyhow::Result;

use super::{flannel::Backend, ip, Lab};

pub struct HostGw;

impl Backend for HostGw {
    fn name(&self) -> &'static str {
        "flannel-host-gw"
    }

    fn backend_type(&self) -> &'static str {
        "host-gw"
    }

    fn routes(&self, lab: &Lab, ns: &str, node: u8) -> Result<()> {
        for remote in lab.remotes(node) {
            ip(
                ns,
                &format!(
                    "route add {} via {} dev eth0",
                    lab.node_subnet(remote),
                    Lab::node_ip(remote)
                ),
            )?;
        }
        Ok(())
    }
}
