//! Where the node's container runtime takes its CNI config and plugins
//! from: its own configuration says, and `/etc/cni/net.d` and
//! `/opt/cni/bin` are only the defaults when nothing does. GKE's
//! containerd runs plugins from `/home/kubernetes/bin`; k3s (and RKE2)
//! keep both under `/var/lib/rancher`, in the config of their own
//! containerd; CRI-O names them in `[crio.network]`.
//!
//! containerd's CRI section is read in each of its config versions:
//! `[plugins.cri.cni]` (1), `[plugins."io.containerd.grpc.v1.cri".cni]`
//! (2, `bin_dir` and `conf_dir`) and, in containerd 2.x,
//! `[plugins."io.containerd.cri.v1.runtime".cni]` (3, `bin_dirs`, a list).

use toml::{Table, Value};

use crate::{model::bounded, node::host_root::HostRoot};

pub const DEFAULT_CONF: &str = "/etc/cni/net.d";
pub const DEFAULT_BIN: &str = "/opt/cni/bin";

/// k3s's and RKE2's own containerd configs, and where they keep CNI's
/// files when the config is missing (k3s writes it at every start).
const RANCHER: [(&str, &str, &str); 2] = [
    (
        "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        "/var/lib/rancher/k3s/agent/etc/cni/net.d",
        "/var/lib/rancher/k3s/data/current/bin",
    ),
    (
        "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
        "/etc/cni/net.d",
        "/opt/cni/bin",
    ),
];
const CONTAINERD: &str = "/etc/containerd/config.toml";
const CRIO: &str = "/etc/crio/crio.conf";
const CRIO_DROP_INS: &str = "/etc/crio/crio.conf.d";
/// A runtime config is kilobytes.
const CONFIG_MAX: u64 = 1 << 20;

/// The node's CNI directories, as the node names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniDirs {
    /// Where the runtime reads the CNI config (`/etc/cni/net.d`).
    pub conf: String,
    /// Where it looks for plugins, in order.
    pub bins: Vec<String>,
    /// The file they were read from; None: the defaults.
    pub from: Option<String>,
}

impl Default for CniDirs {
    fn default() -> Self {
        Self {
            conf: DEFAULT_CONF.into(),
            bins: vec![DEFAULT_BIN.into()],
            from: None,
        }
    }
}

impl CniDirs {
    /// The plugin directories as kubelet's and containerd's errors list
    /// them: `[/opt/cni/bin]`.
    pub fn bin_path(&self) -> String {
        format!("[{}]", self.bins.join(" "))
    }

    /// ` (from /etc/containerd/config.toml)`, or nothing for the defaults.
    pub fn said_from(&self) -> String {
        self.from
            .as_ref()
            .map(|f| format!(" (from {f})"))
            .unwrap_or_default()
    }
}

/// The node's CNI directories: k3s's or RKE2's containerd, else the
/// node's containerd, else CRI-O, else the defaults.
pub fn of_node(root: &HostRoot) -> CniDirs {
    for (config, conf, bin) in RANCHER {
        let defaults = CniDirs {
            conf: conf.into(),
            bins: vec![bin.into()],
            from: Some(config.into()),
        };
        if let Some(text) = read(root, config) {
            return containerd(&text, defaults);
        }
    }
    let (_, k3s_conf, k3s_bin) = RANCHER[0];
    if root.path(k3s_conf).is_ok_and(|dir| dir.is_dir()) {
        // k3s not running now: its layout, without the config it writes.
        return CniDirs {
            conf: k3s_conf.into(),
            bins: vec![k3s_bin.into()],
            from: Some("k3s's layout (/var/lib/rancher/k3s)".into()),
        };
    }
    if let Some(text) = read(root, CONTAINERD) {
        return containerd(
            &text,
            CniDirs {
                from: Some(CONTAINERD.into()),
                ..CniDirs::default()
            },
        );
    }
    crio(root).unwrap_or_default()
}

fn read(root: &HostRoot, file: &str) -> Option<String> {
    bounded::read_regular_text(&root.path(file).ok()?, CONFIG_MAX).ok()
}

/// The CNI section of a containerd config, each field missing from it
/// left as in `defaults`. A config that does not parse is containerd's
/// problem (it would not start): the defaults are then said.
fn containerd(text: &str, defaults: CniDirs) -> CniDirs {
    let Ok(config) = text.parse::<Table>() else {
        return defaults;
    };
    let plugins = config.get("plugins");
    let section = [
        "io.containerd.cri.v1.runtime",
        "io.containerd.grpc.v1.cri",
        "cri",
    ]
    .into_iter()
    .find_map(|plugin| plugins?.get(plugin)?.get("cni"));
    let Some(cni) = section else {
        return defaults;
    };
    let bins = match (strings(cni.get("bin_dirs")), text_of(cni.get("bin_dir"))) {
        (Some(dirs), _) if !dirs.is_empty() => dirs,
        (_, Some(dir)) => vec![dir],
        _ => defaults.bins,
    };
    CniDirs {
        conf: text_of(cni.get("conf_dir")).unwrap_or(defaults.conf),
        bins,
        from: defaults.from,
    }
}

/// CRI-O's `[crio.network]`: crio.conf, then its drop-ins in name order,
/// each overriding what it sets. None when CRI-O has no config here.
fn crio(root: &HostRoot) -> Option<CniDirs> {
    let mut files: Vec<String> = Vec::new();
    if root.path(CRIO).is_ok_and(|file| file.is_file()) {
        files.push(CRIO.into());
    }
    if let Ok(entries) = root.path(CRIO_DROP_INS).and_then(std::fs::read_dir) {
        let mut drop_ins: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".conf"))
            .map(|name| format!("{CRIO_DROP_INS}/{name}"))
            .collect();
        drop_ins.sort();
        files.extend(drop_ins);
    }
    if files.is_empty() {
        return None;
    }
    let mut dirs = CniDirs::default();
    for file in &files {
        let Some(config) = read(root, file).and_then(|t| t.parse::<Table>().ok()) else {
            continue;
        };
        let Some(network) = config.get("crio").and_then(|c| c.get("network")) else {
            continue;
        };
        if let Some(conf) = text_of(network.get("network_dir")) {
            dirs.conf = conf;
            dirs.from = Some(file.clone());
        }
        if let Some(bins) = strings(network.get("plugin_dirs")).filter(|b| !b.is_empty()) {
            dirs.bins = bins;
            dirs.from = Some(file.clone());
        }
    }
    Some(dirs)
}

/// A directory as the node names it, without a trailing `/`.
fn text_of(value: Option<&Value>) -> Option<String> {
    let dir = value?.as_str()?.trim_end_matches('/');
    (!dir.is_empty()).then(|| dir.to_string())
}

fn strings(value: Option<&Value>) -> Option<Vec<String>> {
    let list = value?.as_array()?;
    Some(list.iter().filter_map(|v| text_of(Some(v))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> CniDirs {
        CniDirs {
            from: Some(CONTAINERD.into()),
            ..CniDirs::default()
        }
    }

    #[test]
    fn each_containerd_config_version_names_its_cni_directories() {
        let v2 = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/home/kubernetes/bin\"\n  conf_dir = \"/etc/cni/net.d\"\n";
        assert_eq!(containerd(v2, defaults()).bins, ["/home/kubernetes/bin"]);
        let v3 = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\n  bin_dirs = ['/opt/cni/bin', '/usr/libexec/cni/']\n  conf_dir = '/etc/kubernetes/cni/net.d'\n";
        let dirs = containerd(v3, defaults());
        assert_eq!(dirs.bins, ["/opt/cni/bin", "/usr/libexec/cni"]);
        assert_eq!(dirs.conf, "/etc/kubernetes/cni/net.d");
        assert_eq!(dirs.bin_path(), "[/opt/cni/bin /usr/libexec/cni]");
        let v1 = "[plugins.cri.cni]\nbin_dir = \"/usr/lib/cni\"\n";
        let dirs = containerd(v1, defaults());
        assert_eq!(
            (dirs.conf.as_str(), dirs.bins[0].as_str()),
            (DEFAULT_CONF, "/usr/lib/cni")
        );
        // No CNI section, or no TOML at all: the defaults, said as such.
        assert_eq!(containerd("version = 2\n", defaults()), defaults());
        assert_eq!(containerd("[[[", defaults()), defaults());
        assert_eq!(
            defaults().said_from(),
            " (from /etc/containerd/config.toml)"
        );
    }

    /// A node root with `files` (path, content) written under it.
    fn node(name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let root =
            std::env::temp_dir().join(format!("podtrace-cni-dirs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let path = root.join(path.trim_start_matches('/'));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        root
    }

    #[test]
    fn k3s_crio_and_bare_nodes_are_read_where_their_runtime_keeps_cni() {
        let k3s = node("k3s", &[(RANCHER[0].0, "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/var/lib/rancher/k3s/data/abc/bin\"\n  conf_dir = \"/var/lib/rancher/k3s/agent/etc/cni/net.d\"\n")]);
        let dirs = of_node(&HostRoot::new(&k3s));
        assert_eq!(dirs.conf, "/var/lib/rancher/k3s/agent/etc/cni/net.d");
        assert_eq!(dirs.bins, ["/var/lib/rancher/k3s/data/abc/bin"]);
        // k3s stopped (no config written yet): its layout.
        std::fs::remove_file(k3s.join(RANCHER[0].0.trim_start_matches('/'))).unwrap();
        std::fs::create_dir_all(k3s.join("var/lib/rancher/k3s/agent/etc/cni/net.d")).unwrap();
        let dirs = of_node(&HostRoot::new(&k3s));
        assert_eq!(dirs.bins, ["/var/lib/rancher/k3s/data/current/bin"]);
        let crio = node("crio", &[
            (CRIO, "[crio.network]\nnetwork_dir = \"/etc/cni/net.d/\"\nplugin_dirs = [\"/opt/cni/bin/\"]\n"),
            ("/etc/crio/crio.conf.d/10-cni.conf", "[crio.network]\nplugin_dirs = [\"/usr/libexec/cni\"]\n"),
        ]);
        let dirs = of_node(&HostRoot::new(&crio));
        assert_eq!(
            (dirs.conf.as_str(), dirs.bins.clone()),
            (DEFAULT_CONF, vec!["/usr/libexec/cni".to_string()])
        );
        assert_eq!(
            dirs.from.as_deref(),
            Some("/etc/crio/crio.conf.d/10-cni.conf")
        );
        let bare = node("bare", &[]);
        assert_eq!(of_node(&HostRoot::new(&bare)), CniDirs::default());
        for root in [k3s, crio, bare] {
            let _ = std::fs::remove_dir_all(root);
        }
    }
}
