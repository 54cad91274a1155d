//! The plugins the chosen CNI config names must be executables in
//! `/opt/cni/bin`: kubelet's `failed to find plugin "flannel" in path
//! [/opt/cni/bin]` otherwise. An empty directory (a volume mounted over
//! it) hides them all.

use std::{fs, os::unix::fs::PermissionsExt};

use super::{cni_config, node::NodeFacts, Check};

const FAMILY: &str = "plugins";
pub const BIN: &str = "opt/cni/bin";

/// Every executable the chain runs: the plugins, their IPAM, and
/// Flannel's delegate (bridge, with host-local).
pub fn needed(config: &cni_config::ConfigFile) -> Vec<String> {
    let mut names = Vec::new();
    for plugin in config.parsed.as_deref().unwrap_or_default() {
        names.extend(plugin["type"].as_str().map(String::from));
        names.extend(plugin["ipam"]["type"].as_str().map(String::from));
        if plugin["type"] == "flannel" {
            let delegate = plugin["delegate"]["type"].as_str().unwrap_or("bridge");
            names.push(delegate.into());
            names.push("host-local".into());
        }
    }
    let mut seen = Vec::new();
    names.retain(|n| {
        let new = !seen.contains(n);
        seen.push(n.clone());
        new
    });
    names
}

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    let node = facts.name.as_str();
    let Some(config) = cni_config::chosen(facts).filter(|_| facts.files) else {
        return Vec::new();
    };
    let bin = facts.path(BIN);
    let shown = NodeFacts::shown(BIN);
    let present = fs::read_dir(&bin).map(|d| d.count()).unwrap_or(0);
    if present == 0 {
        return vec![Check::fail(FAMILY, node, "plugin directory",
            format!("{shown} is empty or missing: kubelet says failed to find plugin \"{}\" in path [{shown}] (a volume mounted over it hides the plugins)", config.types().first().cloned().unwrap_or_default()),
            format!("check the mounts on {shown} (findmnt {shown}) and reinstall the CNI plugins (restart the CNI DaemonSet pod on this node)"))];
    }
    needed(&config)
        .into_iter()
        .map(|name| {
            let path = bin.join(&name);
            let executable = fs::metadata(&path)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .ok();
            let evidence = match executable {
                Some(true) => format!("{shown}/{name} is executable ({} names it)", config.file),
                Some(false) => format!("{shown}/{name} is not executable"),
                None => format!("{shown} has no {name} binary: kubelet says failed to find plugin \"{name}\" in path [{shown}]"),
            };
            Check::judge(FAMILY, node, &format!("plugin {name}"), executable == Some(true), evidence, || {
                format!("install {name} into {shown} (the CNI's DaemonSet init container copies it; restart that pod on this node)")
            })
        })
        .collect()
}
