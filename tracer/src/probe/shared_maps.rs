//! A bpffs of podtrace's own, where the probes of one run share a map
//! (profile mode's packet stamps, so that a step may cross from one node's
//! namespace to another's: the wire). It is mounted in a mount namespace
//! private to the process, so it and everything pinned in it go away with
//! the process, even after `kill -9`; nothing appears on the host.

use std::{ffi::CString, path::PathBuf};

use anyhow::{bail, Result};

/// Where the private bpffs is mounted, inside podtrace's own mount
/// namespace (the host's /sys/fs/bpf is only hidden from podtrace).
const MOUNT_POINT: &str = "/sys/fs/bpf";

/// Moves the process into a mount namespace of its own and mounts a fresh
/// bpffs there; its path. Must run while the process has one thread
/// (unshare(CLONE_NEWNS) refuses a shared filesystem context).
pub fn private_bpffs() -> Result<PathBuf> {
    let c = |s: &str| CString::new(s).expect("no NUL");
    let (root, target, bpf) = (c("/"), c(MOUNT_POINT), c("bpf"));
    // SAFETY: plain syscalls on NUL-terminated strings that outlive them.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            bail!("unshare(CLONE_NEWNS): {}", std::io::Error::last_os_error());
        }
        // Nothing mounted from here on propagates back to the host.
        let private = libc::MS_REC | libc::MS_PRIVATE;
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            private,
            std::ptr::null(),
        ) != 0
        {
            bail!("making mounts private: {}", std::io::Error::last_os_error());
        }
        if libc::mount(
            bpf.as_ptr(),
            target.as_ptr(),
            bpf.as_ptr(),
            0,
            std::ptr::null(),
        ) != 0
        {
            bail!("mounting a bpffs: {}", std::io::Error::last_os_error());
        }
    }
    Ok(PathBuf::from(MOUNT_POINT))
}
