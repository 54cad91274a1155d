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
    net::IpAddr,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::{
    netlink,
    netns::{self, Namespace},
    Link, NodeView,
};

/// The host-side veth (its ifindex on `node`) of the pod with `ip`, and
/// the pod's namespace, if a namespace on this machine holds `ip` behind
/// a veth whose peer is on `node`. Called inside the node's namespace,
/// and returns there.
pub async fn host_veth(ip: IpAddr, node: &NodeView) -> Option<(u32, PodNamespace)> {
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
        // Both ends name each other, and the node's end leads to this very
        // namespace: ifindexes repeat in every namespace, so another
        // node's pod (two labs, two kind clusters) can match by indexes.
        if host_end.kind == "veth"
            && host_end.peer_index == Some(pod_end.index)
            && leads_to(host_end, &candidate).await
        {
            let inode = u32::try_from(inode(&candidate)?).ok()?;
            let pod = PodNamespace {
                path: candidate,
                inode,
            };
            return Some((host_end.index, pod));
        }
    }
    None
}

/// The namespace of the pod with `ip`, behind a veth of one of the
/// `nodes`' namespaces: where a probe from that pod must leave. Not any
/// namespace holding `ip`: a duplicate address elsewhere (another
/// cluster's pod, a test namespace, 127.0.0.1 anywhere) is not the pod.
pub async fn of_pod_on(ip: IpAddr, nodes: &[Namespace]) -> Option<PodNamespace> {
    for node in nodes {
        let Ok(entered) = node.path.as_deref().map(netns::enter).transpose() else {
            continue;
        };
        let Ok(view) = NodeView::read().await else {
            continue;
        };
        let found = host_veth(ip, &view).await;
        drop(entered);
        if let Some((_, pod)) = found {
            return Some(pod);
        }
    }
    None
}

/// A traced pod's own network namespace, found behind its host veth.
#[derive(Clone, Debug)]
pub struct PodNamespace {
    pub path: PathBuf,
    pub inode: u32,
}

/// The namespace at the other end of the node's veth `veth`: the one the
/// node's kernel gives the veth's `link-netnsid`. Called inside the
/// node's namespace. A pod's drops, and its probes, belong to this
/// namespace alone, not to any that holds the same address.
pub async fn behind_veth(veth: &Link) -> Option<PodNamespace> {
    veth.peer_netns_id?;
    let own = std::fs::metadata("/proc/thread-self/ns/net").ok()?.ino();
    for path in namespaces(own) {
        if leads_to(veth, &path).await {
            let inode = u32::try_from(inode(&path)?).ok()?;
            return Some(PodNamespace { path, inode });
        }
    }
    None
}

/// Whether `link`'s other end is in the namespace at `path`, by the id the
/// calling thread's namespace gives that namespace.
async fn leads_to(link: &Link, path: &Path) -> bool {
    let Some(id) = link.peer_netns_id else {
        return false;
    };
    let Ok(handle) = std::fs::File::open(path) else {
        return false;
    };
    netlink::netns_id_of(&handle).await.ok().flatten() == Some(id)
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
