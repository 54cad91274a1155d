//! Which CNI config the container runtime uses: the lexically first valid
//! `.conflist` / `.conf` / `.json` in its CNI config directory
//! (`/etc/cni/net.d` unless its config names another: `cni_dirs`). A leftover file of
//! a CNI that no longer runs (`10-calico.conflist` after a move to
//! Flannel) shadows the one that does, and every new sandbox fails.

use std::fs;

use serde_json::Value;

use super::{node::NodeFacts, Check};
use crate::model::bounded;

const FAMILY: &str = "cni-config";

/// One config file: its plugin chain, or why it is not valid.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    pub file: String,
    pub parsed: Result<Vec<Value>, String>,
}

impl ConfigFile {
    /// The plugin `type`s, in order.
    pub fn types(&self) -> Vec<String> {
        self.parsed
            .as_ref()
            .map(|plugins| {
                plugins
                    .iter()
                    .filter_map(|p| p["type"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The plugins' IPAM `type`s (`calico-ipam`, `host-local`).
    pub fn ipam_types(&self) -> Vec<String> {
        let plugins = self.parsed.as_deref().unwrap_or_default();
        plugins
            .iter()
            .filter_map(|p| p["ipam"]["type"].as_str().map(String::from))
            .collect()
    }

    /// The CNI that owns it, by its main plugin.
    pub fn cni(&self) -> Option<&'static str> {
        let types = self.types();
        let first = types.first()?;
        ["calico", "flannel", "cilium", "weave-net"]
            .into_iter()
            .find(|cni| first.starts_with(cni))
    }
}

/// CNI configs are kilobytes: a larger file is not one.
const CONFIG_MAX: u64 = 1 << 20;

/// The config files, sorted as libcni sorts them; none where the folder
/// is missing, and why not where it cannot be read.
pub fn files(facts: &NodeFacts) -> Result<Vec<ConfigFile>, String> {
    let cannot = |e: std::io::Error| format!("{} cannot be read: {e}", facts.cni_dirs.conf);
    let dir = facts.path(&facts.cni_dirs.conf).map_err(cannot)?;
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(cannot(e)),
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".conflist") || n.ends_with(".conf") || n.ends_with(".json"))
        .collect();
    names.sort();
    Ok(names
        .into_iter()
        .map(|file| {
            // Non-blocking, regular files only, and capped: a FIFO or a
            // link to /dev/zero there must not wedge the doctor or an agent.
            // Through the root too: a link there is the node's.
            let path = facts.path(&format!("{}/{file}", facts.cni_dirs.conf));
            let text = path.map_err(|e| e.to_string()).and_then(|path| {
                bounded::read_regular_text(&path, CONFIG_MAX).map_err(|e| e.to_string())
            });
            let parsed = text.and_then(|t| parse(&file, &t));
            ConfigFile { file, parsed }
        })
        .collect())
}

/// A conflist's `plugins`, or a single-plugin `.conf` as a chain of one.
fn parse(file: &str, text: &str) -> Result<Vec<Value>, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let plugins = if file.ends_with(".conflist") {
        if value["name"].as_str().is_none() {
            return Err("no \"name\"".into());
        }
        value["plugins"].as_array().cloned().unwrap_or_default()
    } else {
        vec![value]
    };
    if plugins.is_empty() || plugins.iter().any(|p| p["type"].as_str().is_none()) {
        return Err("a plugin without a \"type\"".into());
    }
    Ok(plugins)
}

/// The file the runtime uses.
pub fn chosen(facts: &NodeFacts) -> Option<ConfigFile> {
    files(facts).ok()?.into_iter().find(|f| f.parsed.is_ok())
}

/// Which CNI actually runs on the node, by its links and annotations.
pub fn running(facts: &NodeFacts, cni: &str) -> bool {
    let links = facts.view.links.iter().map(|l| l.name.as_str());
    let annotations = facts.me.as_ref().map(|m| m.annotations.to_string());
    let annotated = |key: &str| annotations.as_deref().is_some_and(|a| a.contains(key));
    match cni {
        "calico" => {
            links
                .clone()
                .any(|l| l.starts_with("cali") || l == "vxlan.calico")
                || annotated("projectcalico.org")
        }
        "flannel" => {
            links.clone().any(|l| l == "flannel.1" || l == "cni0")
                || annotated("flannel.alpha.coreos.com")
        }
        _ => true,
    }
}

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    if !facts.files {
        return Vec::new();
    }
    let node = facts.name.as_str();
    let dir = facts.cni_dirs.conf.as_str();
    let all = match files(facts) {
        Ok(all) => all,
        Err(why) => {
            return vec![Check::fail(
                FAMILY,
                node,
                "config the runtime uses",
                format!("{why}: which config the runtime uses cannot be told"),
                format!("make {dir} a readable directory holding the CNI's config"),
            )]
        }
    };
    let mut checks: Vec<Check> = all
        .iter()
        .filter_map(|f| f.parsed.as_ref().err().map(|e| (f, e)))
        .map(|(f, e)| {
            Check::fail(
                FAMILY,
                node,
                "config file parses",
                format!("{dir}/{}: {e}", f.file),
                format!("fix or remove {dir}/{}: the runtime skips it", f.file),
            )
        })
        .collect();
    let Some(chosen) = all.iter().find(|f| f.parsed.is_ok()) else {
        checks.push(Check::fail(FAMILY, node, "config the runtime uses",
            format!("{dir}{} has no valid .conflist or .conf: the runtime reports \"cni plugin not initialized\" and no pod gets a sandbox", facts.cni_dirs.said_from()),
            "start the CNI's DaemonSet pod on this node: it installs its config".into()));
        return checks;
    };
    checks.push(judge_chosen(facts, chosen, &all));
    checks
}

/// The chosen file belongs to a CNI that runs here, or it shadows one.
fn judge_chosen(facts: &NodeFacts, chosen: &ConfigFile, all: &[ConfigFile]) -> Check {
    let node = facts.name.as_str();
    let dir = &facts.cni_dirs.conf;
    let owner = chosen.cni();
    let alive = owner.is_none_or(|cni| running(facts, cni));
    let evidence = format!(
        "the runtime uses {dir}/{} (plugins: {}){}",
        chosen.file,
        chosen.types().join(", "),
        facts.cni_dirs.said_from()
    );
    if alive {
        return Check::pass(FAMILY, node, "config the runtime uses", evidence);
    }
    let owner = owner.unwrap_or("?");
    let shadowed = all.iter().find(|f| {
        f.file != chosen.file && f.parsed.is_ok() && f.cni().is_some_and(|c| running(facts, c))
    });
    let evidence = match shadowed {
        Some(live) => format!(
            "{dir}/{} ({owner}) comes first and shadows {dir}/{}: {owner} is not running on this node (no {owner} links or annotations), so every new sandbox fails",
            chosen.file, live.file
        ),
        None => format!("{evidence}, but {owner} is not running on this node"),
    };
    Check::fail(FAMILY, node, "config the runtime uses", evidence,
        format!("remove the leftover {dir}/{} (a CNI that was replaced), then recreate the failing pods", chosen.file))
}

#[cfg(test)]
mod tests {
    use std::{
        path::{Path, PathBuf},
        time::{Duration, Instant},
    };

    use super::*;
    use crate::model::bounded::testing::{mkfifo, mkzero};

    /// The default config directory, under a test root.
    const NET_D: &str = "etc/cni/net.d";

    /// A node root of its own, with an empty etc/cni/net.d.
    fn root(name: &str) -> PathBuf {
        let root = std::env::temp_dir().join(format!("podtrace-cni-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join(NET_D)).unwrap();
        root
    }

    fn evidence(root: &Path) -> Vec<String> {
        checks(&NodeFacts::of_root(root))
            .into_iter()
            .map(|c| c.evidence)
            .collect()
    }

    const FLANNEL: &str = r#"{"name":"cbr0","plugins":[{"type":"flannel"}]}"#;

    #[test]
    fn a_fifo_config_is_named_at_once_and_the_next_file_is_chosen() {
        let root = root("fifo");
        mkfifo(&root.join(NET_D).join("05-stuck.conflist"));
        fs::write(root.join(NET_D).join("10-flannel.conflist"), FLANNEL).unwrap();
        let started = Instant::now();
        let seen = evidence(&root);
        assert!(started.elapsed() < Duration::from_secs(2), "it waited");
        assert_eq!(
            seen[0],
            "/etc/cni/net.d/05-stuck.conflist: is a FIFO, not a regular file"
        );
        assert!(seen[1].contains("10-flannel.conflist"), "{seen:?}");
    }

    #[test]
    fn a_config_that_is_a_dev_zero_is_not_read() {
        let root = root("zero");
        mkzero(&root.join(NET_D).join("00-zero.conflist"));
        let started = Instant::now();
        let seen = evidence(&root);
        assert!(started.elapsed() < Duration::from_secs(2), "it read on");
        assert_eq!(
            seen[0],
            "/etc/cni/net.d/00-zero.conflist: is a character device, not a regular file"
        );
    }

    #[test]
    fn a_huge_config_is_capped() {
        let root = root("huge");
        let file = fs::File::create(root.join(NET_D).join("00-huge.conflist")).unwrap();
        file.set_len(200 << 20).unwrap();
        let seen = evidence(&root);
        assert_eq!(
            seen[0],
            "/etc/cni/net.d/00-huge.conflist: is larger than 1 MiB"
        );
    }

    #[test]
    fn a_looping_net_d_says_it_cannot_be_read_not_that_it_is_empty() {
        let root = root("loop");
        let net_d = root.join(NET_D);
        fs::remove_dir(&net_d).unwrap();
        // A loop as the node sees it: links resolve inside its root.
        std::os::unix::fs::symlink("/etc/cni/net.d", &net_d).unwrap();
        let seen = evidence(&root);
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(
            seen[0].starts_with("/etc/cni/net.d cannot be read: "),
            "{seen:?}"
        );
        assert!(seen[0].contains("symbolic links"), "{seen:?}");
        assert!(!seen[0].contains("no valid"), "{seen:?}");
    }

    #[test]
    fn an_unreadable_net_d_says_why() {
        let root = root("file");
        let net_d = root.join(NET_D);
        fs::remove_dir(&net_d).unwrap();
        fs::write(&net_d, "not a directory").unwrap();
        let seen = evidence(&root);
        assert!(
            seen[0].starts_with("/etc/cni/net.d cannot be read: Not a directory"),
            "{seen:?}"
        );
    }
}
