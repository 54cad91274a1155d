//! Flannel's wireguard backend: per node `flannel-wg` (kind wireguard,
//! UDP 51820, MTU 1420: the underlay's 1500 less WireGuard's 80 over
//! IPv6 or 60 over IPv4, flannel takes 80) holding the node's subnet
//! address, a peer per remote node (its public key, its underlay address
//! as endpoint, its pod subnet as allowed-ips) and one route for the
//! cluster's pod network through the device (cni0's /24 is more specific
//! for the node's own pods).
//!
//! It needs wireguard.ko, which this host's kernel lacks; Debian's 5.10,
//! 6.1 and 6.12 have it (the VM matrix runs it), and `wg` from
//! wireguard-tools sets the keys, as flanneld does through netlink.

use std::io::Write;

use anyhow::{Context, Result};

use super::{cmd, flannel::Backend, ip, Lab};

pub const DEVICE: &str = "flannel-wg";
pub const PORT: u16 = 51820;
pub const MTU: u32 = 1420;

pub struct Wireguard;

impl Backend for Wireguard {
    fn name(&self) -> &'static str {
        "flannel-wireguard"
    }

    fn backend_type(&self) -> &'static str {
        "wireguard"
    }

    fn routes(&self, lab: &Lab, ns: &str, node: u8) -> Result<()> {
        cmd::sh(&["modprobe", "wireguard"]).context(
            "the flannel-wireguard lab needs the wireguard kernel module: this kernel has none; \
             the VM matrix's kernels do (cargo xtask test --kernel 6.1)",
        )?;
        ip(ns, &format!("link add {DEVICE} type wireguard"))?;
        let key = lab.state_dir().join(format!("wg-node{node}.key"));
        std::fs::create_dir_all(lab.state_dir())?;
        std::fs::write(&key, private_key(node))?;
        wg(
            ns,
            &[
                "set",
                DEVICE,
                "listen-port",
                &PORT.to_string(),
                "private-key",
            ],
            &key,
        )?;
        for remote in lab.remotes(node) {
            wg_peer(lab, ns, remote)?;
        }
        ip(
            ns,
            &format!("addr add {}/32 dev {DEVICE}", lab.subnet_host(node, 0)),
        )?;
        ip(ns, &format!("link set {DEVICE} mtu {MTU} up"))?;
        ip(
            ns,
            &format!("route add {} dev {DEVICE} scope link", lab.pod_cidr),
        )
    }
}

/// A node's private key: any 32 bytes are one (WireGuard clamps them);
/// the lab's are the node's number, so that every node knows its peers'.
fn private_key(node: u8) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode([node; 32])
}

/// The public key of `node`'s private key, as `wg pubkey` derives it.
pub fn public_key(node: u8) -> Result<String> {
    let mut child = std::process::Command::new("wg")
        .arg("pubkey")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("cannot run wg (wireguard-tools)")?;
    child
        .stdin
        .take()
        .context("wg's stdin")?
        .write_all(private_key(node).as_bytes())?;
    let out = child.wait_with_output()?;
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// `remote` as a peer of the device in `ns`: its key, its underlay
/// address and port, its pod subnet.
pub fn wg_peer(lab: &Lab, ns: &str, remote: u8) -> Result<()> {
    let endpoint = format!("{}:{PORT}", Lab::node_ip(remote));
    let allowed = lab.node_subnet(remote).to_string();
    cmd::run(cmd::in_netns(ns, "wg").args([
        "set",
        DEVICE,
        "peer",
        &public_key(remote)?,
        "endpoint",
        &endpoint,
        "allowed-ips",
        &allowed,
    ]))
}

/// `wg ARGS FILE` in `ns`.
fn wg(ns: &str, args: &[&str], file: &std::path::Path) -> Result<()> {
    cmd::run(cmd::in_netns(ns, "wg").args(args).arg(file))
}
