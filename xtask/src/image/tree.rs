//! An image's file tree as its layers' tars list it, without unpacking:
//! enough to tell whether a program is found on the image's PATH, through
//! symlinks (merged /usr, Debian's alternatives) as the kernel follows
//! them, rooted in the image.

use std::{
    collections::HashMap,
    path::{Component, Path, PathBuf},
};

use anyhow::Result;

use super::Layer;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Node {
    Dir,
    /// A regular file (or a hard link to one), and whether anyone may
    /// execute it.
    File {
        executable: bool,
    },
    Symlink(PathBuf),
}

/// Path inside the image (relative, no `./`) → what is there.
#[derive(Default)]
pub struct Tree(HashMap<PathBuf, Node>);

/// How many symlinks one lookup follows before it gives up, as the
/// kernel's ELOOP limit.
const MAX_LINKS: usize = 40;

impl Tree {
    /// The tree the layers make, later layers over earlier ones (a
    /// whiteout removes what it names).
    pub fn of_layers(layers: &[Layer]) -> Result<Self> {
        let mut tree = Self::default();
        for layer in layers {
            for entry in layer.entries()?.entries()? {
                let entry = entry?;
                let path = entry.path()?;
                let path = path.strip_prefix("./").unwrap_or(&path).to_path_buf();
                tree.add(path, entry.header())?;
            }
        }
        Ok(tree)
    }

    fn add(&mut self, path: PathBuf, header: &tar::Header) -> Result<()> {
        if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
            if let Some(hidden) = name.strip_prefix(".wh.") {
                self.0
                    .retain(|p, _| !p.starts_with(path.with_file_name(hidden)));
                return Ok(());
            }
        }
        let kind = header.entry_type();
        let node = if kind.is_dir() {
            Node::Dir
        } else if kind.is_symlink() {
            Node::Symlink(header.link_name()?.unwrap_or_default().into_owned())
        } else if kind.is_hard_link() {
            let target = header.link_name()?.unwrap_or_default();
            let target = target.strip_prefix("./").unwrap_or(&target);
            self.0
                .get(target)
                .cloned()
                .unwrap_or(Node::File { executable: false })
        } else {
            Node::File {
                executable: header.mode()? & 0o111 != 0,
            }
        };
        self.0.insert(path, node);
        Ok(())
    }

    /// Where `program` is found on `path_env` (the image's PATH, `:`
    /// separated), as the absolute path a shell would run.
    pub fn which(&self, program: &str, path_env: &str) -> Option<PathBuf> {
        path_env
            .split(':')
            .map(|dir| Path::new(dir).join(program))
            .find(|candidate| {
                self.resolve(candidate)
                    .is_some_and(|real| self.0.get(&real) == Some(&Node::File { executable: true }))
            })
    }

    /// `path` (absolute, in the image) with every symlink followed, as a
    /// key of the tree; `None` when a component is missing or the links
    /// loop.
    fn resolve(&self, path: &Path) -> Option<PathBuf> {
        let mut pending: Vec<PathBuf> = vec![path.to_path_buf()];
        let mut links = 0;
        let mut at = PathBuf::new();
        while let Some(next) = pending.pop() {
            let mut components: Vec<Component> = next.components().collect();
            components.reverse();
            if next.is_absolute() {
                at = PathBuf::new();
            }
            while let Some(component) = components.pop() {
                match component {
                    Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                    Component::ParentDir => {
                        at.pop();
                    }
                    Component::Normal(name) => {
                        let candidate = at.join(name);
                        match self.0.get(&candidate)? {
                            Node::Symlink(target) => {
                                links += 1;
                                if links > MAX_LINKS {
                                    return None;
                                }
                                // The rest of this path, after the link's target.
                                let rest: PathBuf = components.iter().rev().collect();
                                pending.push(rest);
                                pending.push(target.clone());
                                break;
                            }
                            _ => at = candidate,
                        }
                    }
                }
            }
        }
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(nodes: &[(&str, Node)]) -> Tree {
        Tree(
            nodes
                .iter()
                .map(|(p, n)| (PathBuf::from(p), n.clone()))
                .collect(),
        )
    }

    #[test]
    fn a_program_is_found_through_merged_usr_and_alternatives() {
        let image = tree(&[
            ("sbin", Node::Symlink("usr/sbin".into())),
            ("usr", Node::Dir),
            ("usr/sbin", Node::Dir),
            ("etc", Node::Dir),
            ("etc/alternatives", Node::Dir),
            (
                "usr/sbin/xtables-nft-multi",
                Node::File { executable: true },
            ),
            (
                "etc/alternatives/iptables",
                Node::Symlink("/usr/sbin/xtables-nft-multi".into()),
            ),
            (
                "usr/sbin/iptables",
                Node::Symlink("/etc/alternatives/iptables".into()),
            ),
            ("usr/sbin/dangling", Node::Symlink("../lib/nothing".into())),
            ("usr/sbin/data", Node::File { executable: false }),
            ("usr/sbin/loop", Node::Symlink("loop".into())),
        ]);
        assert_eq!(
            image.which("iptables", "/sbin"),
            Some("/sbin/iptables".into())
        );
        for absent in ["dangling", "data", "loop", "nft"] {
            assert_eq!(
                image.which(absent, "/usr/local/bin:/sbin"),
                None,
                "{absent}"
            );
        }
    }
}
