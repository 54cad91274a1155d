//! Each lab node's root filesystem, as `podtrace doctor --host-root` reads
//! a real node's (`/host` in a debug pod), shaped like one: `/var/run` an
//! absolute link to `/run` (Debian, Ubuntu, Amazon Linux), containerd's
//! `etc/containerd/config.toml` naming the CNI directories, the CNI
//! config the runtime picks from `etc/cni/net.d`, the plugins in
//! `opt/cni/bin` (Debian's reference plugins, which make the pods, and a
//! stub for the CNI's own plugin, which Debian does not package), and
//! flanneld's `run/flannel/subnet.env`. Faults that break a node's files
//! break these, never the machine's own. Nothing here writes through
//! `var/run`: from this machine that link leads to its own /run.

use std::{fs, os::unix::fs::PermissionsExt, path::Path};

use anyhow::Result;

use super::{cni_plugins, Lab, Topology};

/// Flannel's conflist, as its DaemonSet installs it.
pub const FLANNEL_CONFLIST: &str = r#"{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
"#;

/// Calico's conflist, as calico-node's install-cni writes it.
pub const CALICO_CONFLIST: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "calico", "log_level": "info", "datastore_type": "kubernetes",
     "ipam": {"type": "calico-ipam"}, "policy": {"type": "k8s"},
     "kubernetes": {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"}},
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}
  ]
}
"#;

/// The plugins a Flannel node has in /opt/cni/bin (flannel delegates to
/// bridge and host-local).
pub const FLANNEL_PLUGINS: &[&str] = &["flannel", "bridge", "portmap", "loopback", "host-local"];
pub const CALICO_PLUGINS: &[&str] = &["calico", "calico-ipam", "portmap", "loopback", "host-local"];

/// Where a node's CNI plugins are, under its root.
pub const PLUGIN_DIR: &str = "opt/cni/bin";

/// containerd's config as kubeadm's guides write it (version 2), with the
/// CRI plugin's CNI directories.
pub const CONTAINERD_CONFIG: &str = r#"version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/opt/cni/bin"
  conf_dir = "/etc/cni/net.d"
"#;

/// Lays out `node`'s root directory for the lab's CNI, before its pods
/// are made (their plugins run from it).
pub fn lay_out(lab: &Lab, node: u8) -> Result<()> {
    let root = lab.host_root(node);
    let net_d = root.join("etc/cni/net.d");
    let bin = root.join(PLUGIN_DIR);
    fs::create_dir_all(&net_d)?;
    fs::create_dir_all(&bin)?;
    fs::create_dir_all(root.join("run"))?;
    fs::create_dir_all(root.join("var"))?;
    let var_run = root.join("var/run");
    if fs::symlink_metadata(&var_run).is_err() {
        std::os::unix::fs::symlink("/run", &var_run)?;
    }
    fs::create_dir_all(root.join("etc/containerd"))?;
    fs::write(root.join("etc/containerd/config.toml"), CONTAINERD_CONFIG)?;
    let (conflist, name, plugins) = if lab.topology.is_calico_bgp() {
        (CALICO_CONFLIST, "10-calico.conflist", CALICO_PLUGINS)
    } else {
        (FLANNEL_CONFLIST, "10-flannel.conflist", FLANNEL_PLUGINS)
    };
    fs::write(net_d.join(name), conflist)?;
    for plugin in plugins.iter().filter(|p| !cni_plugins::REAL.contains(p)) {
        plugin_stub(&bin, plugin)?;
    }
    cni_plugins::install(&bin)?;
    if !lab.topology.is_calico_bgp() {
        write_subnet_env(lab, node)?;
    }
    Ok(())
}

/// A stand-in plugin: executable, answers as a CNI plugin would to VERSION.
pub fn plugin_stub(bin: &Path, name: &str) -> Result<()> {
    let path = bin.join(name);
    fs::write(
        &path,
        "#!/bin/sh\necho '{\"cniVersion\":\"0.3.1\",\"supportedVersions\":[\"0.3.1\"]}'\n",
    )?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// flanneld's /run/flannel/subnet.env for the node, from which the
/// flannel plugin gives each pod its subnet and MTU.
fn write_subnet_env(lab: &Lab, node: u8) -> Result<()> {
    let dir = lab.host_root(node).join("run/flannel");
    fs::create_dir_all(&dir)?;
    // The vxlan backend lowers the pods' MTU by the 50 B of VXLAN, the
    // wireguard backend by 80; host-gw does not encapsulate, so pods keep
    // the underlay's.
    let mtu = match lab.topology {
        Topology::FlannelVxlan => 1450,
        Topology::FlannelWireguard => super::flannel_wireguard::MTU,
        _ => 1500,
    };
    fs::write(
        dir.join("subnet.env"),
        format!(
            "FLANNEL_NETWORK={}\nFLANNEL_SUBNET={}/24\nFLANNEL_MTU={mtu}\nFLANNEL_IPMASQ=true\n",
            lab.pod_cidr,
            lab.subnet_host(node, 1)
        ),
    )?;
    Ok(())
}
