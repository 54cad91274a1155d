//! The faults that are conntrack's own doing on node-1, for the traffic
//! web-0 → db-0: kube-proxy's INVALID drop of a connection whose entry
//! expired, and a source NAT with one port left.

use anyhow::Result;

use super::{iptables, Fault};
use crate::lab::{sysctl, Lab};

/// The one source port conntrack-snat-exhausted's MASQUERADE may use.
pub const SNAT_PORT: u16 = 40000;

pub fn apply(fault: Fault, lab: &Lab) -> Result<()> {
    let node1 = lab.node_netns(1);
    let (web, db) = (lab.pod("web-0"), lab.pod("db-0"));
    match fault {
        // kube-proxy's own rule, with conntrack strict about TCP: an
        // established connection idle for a second is forgotten, and its
        // next segment is taken up by no new entry.
        Fault::ConntrackInvalid => {
            iptables(
                &node1,
                r#"-A FORWARD -m conntrack --ctstate INVALID -m comment --comment "kubernetes forwarding conntrack rule" -j DROP"#,
            )?;
            sysctl(&node1, "net.netfilter.nf_conntrack_tcp_loose", "0")?;
            sysctl(
                &node1,
                "net.netfilter.nf_conntrack_tcp_timeout_established",
                "1",
            )?;
        }
        // web-0's UDP to db-0 masqueraded to one port: a second flow
        // finds no free tuple.
        Fault::SnatExhausted => iptables(
            &node1,
            &format!(
                "-t nat -I POSTROUTING 1 -s {}/32 -d {}/32 -p udp -j MASQUERADE --to-ports {SNAT_PORT}",
                web.ip, db.ip
            ),
        )?,
        other => anyhow::bail!("{} is not a conntrack fault", other.name()),
    }
    Ok(())
}
