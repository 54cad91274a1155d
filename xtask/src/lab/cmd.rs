//! The shell commands the lab is built from (`ip`, `bridge`, `sysctl`),
//! in one place so that the topologies, the fault catalogue and the tests
//! that rewire a lab mid-trace all say the same thing the same way.

use std::{path::Path, process::Command};

use anyhow::{bail, Context, Result};

/// Runs a command; its stderr becomes the error.
pub fn sh(argv: &[&str]) -> Result<()> {
    run(Command::new(argv[0]).args(&argv[1..]))
}

/// Runs a built command; its stderr becomes the error.
pub fn run(command: &mut Command) -> Result<()> {
    let program = command.get_program().to_string_lossy().into_owned();
    let out = command
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    if !out.status.success() {
        let argv: Vec<_> = std::iter::once(command.get_program())
            .chain(command.get_args())
            .map(|a| a.to_string_lossy())
            .collect();
        bail!(
            "`{}` failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Runs `ip -n <ns> <args>`.
pub fn ip(ns: &str, args: &str) -> Result<()> {
    let mut argv = vec!["ip", "-n", ns];
    argv.extend(args.split_whitespace());
    sh(&argv)
}

/// `ip netns exec <ns> <program>`, for the caller to add arguments to:
/// tools without a `-n` of their own (ping, nft, tc, iptables) run inside
/// a namespace this way.
pub fn in_netns(ns: &str, program: &str) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns, program]);
    command
}

/// Sets a sysctl inside a namespace (each netns has its own `net.*`).
pub fn sysctl(ns: &str, key: &str, value: &str) -> Result<()> {
    run(in_netns(ns, "sysctl").args(["-qw", &format!("{key}={value}")]))
}

pub fn netns_add(name: &str) -> Result<()> {
    sh(&["ip", "netns", "add", name])
}

pub fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// `bridge fdb <action> <mac> dev <dev> dst <dst>` in a namespace: how a
/// VXLAN device learns (or forgets) which node a remote VTEP MAC is on.
pub fn fdb(ns: &str, action: &str, mac: &str, dev: &str, dst: &str) -> Result<()> {
    sh(&[
        "bridge", "-n", ns, "fdb", action, mac, "dev", dev, "dst", dst,
    ])
}

/// A veth pair: `host_end` stays in `ns`, its peer becomes `eth0` of
/// `peer_netns` (a node's uplink, or a pod's interface).
pub fn veth(ns: &str, host_end: &str, peer_netns: &str, mtu: Option<u16>) -> Result<()> {
    let mtu = mtu.map(|m| format!("mtu {m} ")).unwrap_or_default();
    ip(
        ns,
        &format!("link add {host_end} {mtu}type veth peer name eth0 netns {peer_netns}"),
    )
}

/// Runs `program args` inside `ns` with `input` on its stdin
/// (`iptables-restore`, `nft -f -`); fails with its stderr.
pub fn feed(ns: &str, program: &str, args: &[&str], input: &str) -> Result<()> {
    use std::io::Write;
    let mut child = in_netns(ns, program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {program}"))?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "{program} in {ns}: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Whether `iface` in `ns` is a bridge's port.
pub fn bridge_port(ns: &str, iface: &str) -> bool {
    in_netns(ns, "ip")
        .args(["-o", "link", "show", "dev", iface])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains(" master "))
}
