//! The faults that leave no packet to trace: a node's CNI files, its
//! annotations and BGP daemon, its FORWARD policy, conntrack and tunnel MTU — what
//! `podtrace doctor` finds. File faults touch only the lab node's own
//! host-root directory.

use std::{fs, path::Path};

use anyhow::{Context, Result};

use super::{iptables, Fault};
use crate::lab::{bird, host_root, ip, Lab};

/// The address calico-wrong-peer-ip annotates: no node has it.
pub const WRONG_PEER_IP: &str = "192.0.2.99";

pub fn apply(fault: Fault, lab: &Lab) -> Result<()> {
    let root2 = lab.host_root(2);
    match fault {
        Fault::StaleCniConflist => fs::write(
            root2.join("etc/cni/net.d/10-calico.conflist"),
            host_root::CALICO_CONFLIST,
        )?,
        Fault::CniPluginMissing => fs::remove_file(root2.join("opt/cni/bin/flannel"))?,
        Fault::CniBinMasked => mask(&root2.join("opt/cni/bin"), &lab.host_root(2))?,
        Fault::SubnetEnvMissing => fs::remove_file(root2.join("run/flannel/subnet.env"))?,
        Fault::CalicoWrongPeerIp => wrong_peer_ip(lab)?,
        Fault::CalicoBirdStopped => bird_stopped(lab)?,
        Fault::ForwardPolicyDrop => iptables(&lab.node_netns(1), "-P FORWARD DROP")?,
        Fault::ConntrackFull => conntrack_in_use(lab)?,
        Fault::MtuMismatch => ip(&lab.node_netns(1), "link set eth0 mtu 1400")?,
        other => anyhow::bail!("{} is not a node-files fault", other.name()),
    }
    Ok(())
}

/// Moves the plugins out of `bin` (to `<root>/../bin-masked`), leaving it
/// empty as a volume mounted over it would.
fn mask(bin: &Path, root: &Path) -> Result<()> {
    let aside = root.parent().context("a node dir")?.join("bin-masked");
    fs::create_dir_all(&aside)?;
    for entry in fs::read_dir(bin)?.flatten() {
        fs::rename(entry.path(), aside.join(entry.file_name()))?;
    }
    Ok(())
}

/// node-1's IPv4Address annotation names an address it does not have,
/// and confd builds every BIRD config from it: node-2 peers with
/// 192.0.2.99 (nobody), node-1's sessions bind to it (and fail). BIRD
/// withdraws both blocks' routes; the fault waits until it has.
fn wrong_peer_ip(lab: &Lab) -> Result<()> {
    let mut nodes = lab.node_list();
    nodes["items"][0]["metadata"]["annotations"]["projectcalico.org/IPv4Address"] =
        format!("{WRONG_PEER_IP}/24").into();
    fs::write(lab.nodes_file(), serde_json::to_string_pretty(&nodes)?)?;
    let mut announced = bird::announced(lab);
    announced[0] = WRONG_PEER_IP.parse()?;
    bird::reconfigure(lab, &announced)?;
    bird::wait_routes(lab, |_, _| false)?;
    bird::wait_said(lab, 1, "Last error:")
}

/// node-1's BIRD stopped (a crashed calico-node's, or `sv stop bird`):
/// its kernel routes stay (`persist`), node-2 withdraws node-1's block.
fn bird_stopped(lab: &Lab) -> Result<()> {
    bird::stop(lab, 1)?;
    bird::wait_routes(lab, |node, _| node == 1)?;
    bird::wait_said(lab, 2, "Last error:")
}

/// kube-proxy's `--ctstate INVALID -j DROP` makes node-1 track
/// connections; a few pings fill entries into its table.
fn conntrack_in_use(lab: &Lab) -> Result<()> {
    iptables(
        &lab.node_netns(1),
        "-A FORWARD -m conntrack --ctstate INVALID -j DROP",
    )?;
    let db = lab.pod("db-0");
    for _ in 0..3 {
        let _ = lab.ping("web-0", db.ip, &[]);
    }
    Ok(())
}
