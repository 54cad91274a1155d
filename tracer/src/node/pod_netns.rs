//! Pods' own namespaces, seen from the node:
//! - a local pod's host-side veth, found from the pod's namespace when the
//!   node's tables cannot tell (a pod that has not talked yet leaves no
//!   neighbour or FDB entry on the bridge): the namespace that holds the
//!   pod's IP, the veth there that holds it, and its peer on the node — the
//!   node's veth whose own peer is that very interface;
//! - who a namespace no traced node owns is, for a drop inside it: the pod
//!   whose IP it holds, and its interfaces' names.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::{netns, NodeView};

/// The host-side veth (its ifindex on `node`) of the pod with `ip`, if a
/// namespace on this machine holds `ip` behind a veth whose peer is on
/// `node`. Called inside the node's namespace, and returns there.
pub async fn host_veth(ip: IpAddr, node: &NodeView) -> Option<u32> {
    let own = std::fs::metadata("/proc/thread-self/ns/net").ok()?.ino();
    for candidate in namespaces(own) {
        let Ok(entered) = netns::enter(&candidate) else {
            continue;
        };
        // The cheap look first, where it answers (IPv4).
        let holds = match ip {
            IpAddr::V4(v4) => NodeView::read_addresses()
                .await
                .is_ok_and(|addresses| addresses.iter().any(|(_, a)| *a == v4)),
            IpAddr::V6(_) => NodeView::read().await.is_ok_and(|v| v.holds(ip)),
        };
        if !holds {
            drop(entered);
            continue;
        }
        let pod = NodeView::read().await.ok();
        drop(entered);
        let pod_end = pod.as_ref()?.link_with_address(ip)?;
        let host_end = node.link(pod_end.peer_index?)?;
        // Both ends name each other: not some other pair with the same
        // ifindexes in another node's namespace.
        if host_end.kind == "veth" && host_end.peer_index == Some(pod_end.index) {
            return Some(host_end.index);
        }
    }
    None
}

/// Every network namespace on this machine but `own`: named ones (`ip
/// netns`, and the container runtime's `cni-…`) first, then those of
/// running processes.
fn namespaces(own: u64) -> Vec<PathBuf> {
    let mut seen = HashSet::from([own]);
    let named = ["/run/netns", "/var/run/netns"]
        .iter()
        .filter_map(|dir| std::fs::read_dir(dir).ok())
        .flatten()
        .flatten()
        .map(|e| e.path());
    let of_processes = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .map(|e| e.path().join("ns/net"));
    named
        .chain(of_processes)
        .filter(|path| inode(path).is_some_and(|ino| seen.insert(ino)))
        .collect()
}

fn inode(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// The network namespace, other than this thread's, whose interfaces
/// hold `ip`: a pod's (`--probe` sends from there).
pub async fn holding(ip: Ipv4Addr) -> Option<PathBuf> {
    let own = std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| m.ino());
    for path in namespaces(own) {
        let Ok(entered) = netns::enter(&path) else {
            continue;
        };
        let view = NodeView::read().await.ok();
        drop(entered);
        if view.is_some_and(|view| view.own_addresses().any(|own| own == ip)) {
            return Some(path);
        }
    }
    None
}

/// Names of namespaces no traced node owns, learnt on first sight.
#[derive(Default)]
pub struct OtherNamespaces {
    /// Pod names by IP, to recognise a pod's namespace by its address.
    names: HashMap<IpAddr, String>,
    known: HashMap<u32, Other>,
}

/// What a namespace is called in stories, and its interfaces' names.
#[derive(Clone, Debug, Default)]
pub struct Other {
    pub label: String,
    pub links: HashMap<u32, String>,
}

impl OtherNamespaces {
    pub fn new(names: HashMap<IpAddr, String>) -> Self {
        Self {
            names,
            known: HashMap::new(),
        }
    }

    /// Learns namespace `inum`, once: `pod default/web-0` if it holds a
    /// known pod's IP, else its `ip netns` name, else its inode.
    pub async fn learn(&mut self, inum: u32) {
        if self.known.contains_key(&inum) {
            return;
        }
        let own = std::fs::metadata("/proc/thread-self/ns/net").map_or(0, |m| m.ino());
        let path = namespaces(own)
            .into_iter()
            .find(|p| inode(p) == Some(u64::from(inum)));
        let mut other = Other {
            label: netns::describe_inode(inum),
            links: HashMap::new(),
        };
        if inum == 0 {
            other.label = "an unknown namespace".into();
        } else if let Some(path) = path {
            if let Ok(entered) = netns::enter(&path) {
                let view = NodeView::read().await.ok();
                drop(entered);
                if let Some(view) = view {
                    let pod = view
                        .addresses
                        .iter()
                        .find_map(|(_, ip)| self.names.get(&(*ip).into()));
                    if let Some(pod) = pod {
                        other.label = format!("pod {pod}");
                    }
                    other.links = view.links.into_iter().map(|l| (l.index, l.name)).collect();
                }
            }
        }
        self.known.insert(inum, other);
    }

    /// What `learn` found for `inum`.
    pub fn get(&self, inum: u32) -> Option<&Other> {
        self.known.get(&inum)
    }
}
