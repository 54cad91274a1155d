//! What the WireGuard labs share: a device keyed as its CNI keys it (any
//! 32 bytes are a private key, WireGuard clamps them; the lab's are the
//! node's number, so every node knows its peers'), and its peers, set by
//! `wg` from wireguard-tools as flanneld and Felix set them over netlink.
//!
//! It needs wireguard.ko, which this host's kernel lacks; Debian's 5.10,
//! 6.1 and 6.12 have it (the VM matrix runs the WireGuard labs).

use std::io::Write;

use anyhow::{Context, Result};

use super::{cmd, ip, Lab};

/// The UDP port both CNIs listen on by default.
pub const PORT: u16 = 51820;

/// `device` on `node`, keyed and listening on PORT; `fwmark` marks its
/// own encrypted packets (Felix's, so that they skip its routing table).
pub fn device(lab: &Lab, ns: &str, device: &str, node: u8, fwmark: Option<u32>) -> Result<()> {
    cmd::sh(&["modprobe", "wireguard"]).context(format!(
        "the {} lab needs the wireguard kernel module: this kernel has none; \
         the VM matrix's kernels do (cargo xtask test --kernel 6.1)",
        lab.topology.name()
    ))?;
    ip(ns, &format!("link add {device} type wireguard"))?;
    let key = lab.state_dir().join(format!("wg-node{node}.key"));
    std::fs::create_dir_all(lab.state_dir())?;
    std::fs::write(&key, private_key(node))?;
    let port = PORT.to_string();
    let mut set = cmd::in_netns(ns, "wg");
    set.args(["set", device, "listen-port", &port, "private-key"]);
    set.arg(&key);
    if let Some(mark) = fwmark {
        set.args(["fwmark", &format!("{mark:#x}")]);
    }
    cmd::run(&mut set)
}

/// `remote` as a peer of `device` in `ns`: its key, its underlay address
/// and port, and `allowed` as its allowed-ips.
pub fn peer(ns: &str, device: &str, remote: u8, allowed: &str) -> Result<()> {
    let endpoint = format!("{}:{PORT}", Lab::node_ip(remote));
    cmd::run(cmd::in_netns(ns, "wg").args([
        "set",
        device,
        "peer",
        &public_key(remote)?,
        "endpoint",
        &endpoint,
        "allowed-ips",
        allowed,
    ]))
}

/// Narrows `remote`'s allowed-ips on `device` in `ns` to `allowed`: the
/// fault of calico #9751, WireGuard then frees what it decrypts from a
/// source outside them, with no drop event.
pub fn allow_only(ns: &str, device: &str, remote: u8, allowed: &str) -> Result<()> {
    let key = public_key(remote)?;
    cmd::run(cmd::in_netns(ns, "wg").args(["set", device, "peer", &key, "allowed-ips", allowed]))
}

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
