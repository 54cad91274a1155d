//! Entering another network namespace for a while (`--netns`).
//!
//! setns(2) changes the namespace of the calling thread only; podtrace runs
//! on a current-thread runtime, so everything between enter and drop (link
//! discovery, rtnetlink sockets, tc attachment) happens inside the node.

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};

/// A `--netns` argument: a path (`/proc/123/ns/net`, `/run/netns/x`) or a
/// name created by `ip netns add`.
pub fn resolve(arg: &str) -> PathBuf {
    if arg.contains('/') {
        PathBuf::from(arg)
    } else {
        Path::new("/run/netns").join(arg)
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

fn setns(ns: &File) -> Result<()> {
    // SAFETY: plain syscall on a valid fd.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!(std::io::Error::last_os_error());
    }
    Ok(())
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
