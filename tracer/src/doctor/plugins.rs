//! The plugins the chosen CNI config names must be executables in the
//! runtime's plugin directories (`/opt/cni/bin` unless its config names
//! others: `cni_dirs`), searched in order: kubelet's `failed to find
//! plugin "flannel" in path [/opt/cni/bin]` otherwise. Empty directories
//! (a volume mounted over one) hide them all.

use std::{fs, os::unix::fs::PermissionsExt};

use super::{cni_config, node::NodeFacts, Check};

const FAMILY: &str = "plugins";

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
    let dirs = &facts.cni_dirs;
    let path = dirs.bin_path();
    let present: usize = (dirs.bins.iter())
        .map(|bin| {
            facts
                .path(bin)
                .and_then(fs::read_dir)
                .map_or(0, |d| d.count())
        })
        .sum();
    if present == 0 {
        let shown = dirs.bins.join(", ");
        return vec![Check::fail(FAMILY, node, "plugin directory",
            format!("{shown} is empty or missing{}: kubelet says failed to find plugin \"{}\" in path {path} (a volume mounted over it hides the plugins)", dirs.said_from(), config.types().first().cloned().unwrap_or_default()),
            format!("check the mounts on {shown} (findmnt {}) and reinstall the CNI plugins (restart the CNI DaemonSet pod on this node)", dirs.bins[0]))];
    }
    needed(&config)
        .into_iter()
        .map(|name| {
            // The first directory that has it, as libcni searches.
            let found = (dirs.bins.iter())
                .map(|bin| (bin, facts.path(&format!("{bin}/{name}")).and_then(fs::metadata)))
                .find_map(|(bin, meta)| Some((bin, meta.ok()?)));
            let executable = found
                .as_ref()
                .map(|(_, m)| m.is_file() && m.permissions().mode() & 0o111 != 0);
            let evidence = match (executable, &found) {
                (Some(true), Some((bin, _))) => format!("{bin}/{name} is executable ({} names it)", config.file),
                (_, Some((bin, _))) => format!("{bin}/{name} is not executable"),
                _ => format!("{} has no {name} binary{}: kubelet says failed to find plugin \"{name}\" in path {path}", dirs.bins.join(", "), dirs.said_from()),
            };
            Check::judge(FAMILY, node, &format!("plugin {name}"), executable == Some(true), evidence, || {
                format!("install {name} into {} (the CNI's DaemonSet init container copies it; restart that pod on this node)", dirs.bins[0])
            })
        })
        .collect()
}
