//! Network namespaces: the nodes podtrace traces (`--netns`, resolved
//! here and only here), and entering one for a while.
//!
//! setns(2) changes the namespace of the calling thread only; podtrace runs
//! on a current-thread runtime, so everything between enter and drop (link
//! discovery, rtnetlink sockets, tc attachment) happens inside the node.

use std::{
    fs::File,
    os::{fd::AsRawFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use podtrace_common::drops::MAX_NODES;

/// Where `ip netns add` puts its named namespaces.
const NAMED_NETNS_DIR: &str = "/run/netns";

/// A `--netns` argument: a path (`/proc/123/ns/net`, `/run/netns/x`) or a
/// name created by `ip netns add`.
pub fn resolve(arg: &str) -> PathBuf {
    if arg.contains('/') {
        PathBuf::from(arg)
    } else {
        Path::new(NAMED_NETNS_DIR).join(arg)
    }
}

/// One namespace to trace: a `--netns`, or podtrace's own.
#[derive(Clone, Debug)]
pub struct Namespace {
    /// None: the namespace podtrace runs in.
    pub path: Option<PathBuf>,
    /// What the user called it (the `--netns` argument), if anything.
    pub arg: Option<String>,
    /// Its inode number: what the kernel tags drops with.
    pub inum: u32,
}

impl Namespace {
    /// Each `--netns`, or podtrace's own namespace when none is given.
    pub fn all(args: &[String]) -> Result<Vec<Self>> {
        if args.len() > MAX_NODES {
            bail!("at most {MAX_NODES} --netns in one trace");
        }
        if args.is_empty() {
            return Ok(vec![Self {
                path: None,
                arg: None,
                inum: inode(Path::new("/proc/thread-self/ns/net"))?,
            }]);
        }
        let mut all: Vec<Self> = Vec::new();
        for arg in args {
            let path = resolve(arg);
            let inum = inode(&path)
                .with_context(|| format!("network namespace {} does not exist", path.display()))?;
            // Tracing one namespace twice would double every hop.
            if let Some(same) = all.iter().find(|ns| ns.inum == inum) {
                let first = same.arg.as_deref().unwrap_or_default();
                bail!("--netns {first} and --netns {arg} are the same network namespace: name each node once");
            }
            all.push(Self {
                path: Some(path),
                arg: Some(arg.clone()),
                inum,
            });
        }
        Ok(all)
    }

    /// Runs `f` inside this namespace.
    pub fn run<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        inside(self.path.as_deref(), f)
    }
}

fn inode(path: &Path) -> Result<u32> {
    Ok(std::fs::metadata(path)?.ino() as u32)
}

/// A namespace no traced node owns: its `ip netns` name if it has one.
pub fn describe_inode(inum: u32) -> String {
    let named = std::fs::read_dir(NAMED_NETNS_DIR).ok().and_then(|dir| {
        dir.flatten()
            .find(|e| e.metadata().is_ok_and(|m| m.ino() as u32 == inum))
            .map(|e| e.file_name().to_string_lossy().into_owned())
    });
    match named {
        Some(name) => format!("netns {name}"),
        None => format!("netns {inum}"),
    }
}

/// Back in the original namespace when dropped.
pub struct Entered {
    original: File,
}

pub fn enter(path: &Path) -> Result<Entered> {
    let original = File::open("/proc/thread-self/ns/net")
        .context("cannot open this thread's network namespace")?;
    let target = File::open(path)
        .with_context(|| format!("network namespace {} does not exist", path.display()))?;
    setns(&target).with_context(|| format!("cannot enter network namespace {}", path.display()))?;
    Ok(Entered { original })
}

#[cfg(target_os = "linux")]
fn setns(ns: &File) -> Result<()> {
    // SAFETY: plain syscall on a valid fd.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn setns(_: &File) -> Result<()> {
    Err(crate::model::needs_linux("entering a network namespace"))
}

impl Drop for Entered {
    fn drop(&mut self) {
        if let Err(e) = setns(&self.original) {
            // Staying in the wrong namespace would make every later step lie.
            eprintln!("podtrace: cannot return to the original network namespace: {e}");
            std::process::abort();
        }
    }
}

/// Runs `f` inside `path` (or where the thread already is, for None).
pub fn inside<T>(path: Option<&Path>, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let _entered = path.map(enter).transpose()?;
    f()
}
