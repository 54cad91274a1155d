//! A node's root filesystem as podtrace sees it: `/` on the node itself,
//! `/host` (`--host-root`) in the agent's pod, where the node's root is
//! mounted. Every path of the node is looked up through [`HostRoot::path`],
//! which follows its symlinks as the node would: inside the root. On
//! Debian, Ubuntu and Amazon Linux `/var/run` is a link to `/run`, so a
//! plain join (`/host/var/run/calico/bird.ctl`) would follow it into the
//! container's own `/run`, and the node's BIRD would never be found.
//!
//! The kernel resolves the path (openat2 with RESOLVE_IN_ROOT, Linux
//! 5.6): absolute links and `..` stay below the root. Where a container's
//! seccomp profile refuses openat2, the same walk is made here, one
//! component at a time.

use std::{
    ffi::{CString, OsStr},
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
    path::{Component, Path, PathBuf},
};

/// Symlinks followed in one lookup at most, as the kernel's MAXSYMLINKS.
const MAX_LINKS: usize = 40;

/// The directory a node's root is at, here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoot {
    dir: PathBuf,
}

impl HostRoot {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The directory itself (`/host`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the node's `node_path` (`/var/run/calico/bird.ctl`, or the
    /// same without the leading `/`) is here, its symlinks followed inside
    /// the root. A path that does not exist resolves as far as it exists,
    /// the rest appended: it does not exist here either. An error for a
    /// loop of links (ELOOP): the link's own path would be followed out of
    /// the root by whoever opens it.
    pub fn path(&self, node_path: impl AsRef<Path>) -> io::Result<PathBuf> {
        let relative = relative(node_path.as_ref());
        if self.dir == Path::new("/") {
            // The node's own root: the kernel follows links as the node does.
            return Ok(self.dir.join(relative));
        }
        match in_root_by_kernel(&self.dir, &relative) {
            Ok(path) => Ok(path),
            Err(_) => in_root_by_walk(&self.dir, &relative),
        }
    }
}

/// Off Linux there is no openat2: the walk resolves the path itself.
#[cfg(not(target_os = "linux"))]
fn in_root_by_kernel(_: &Path, _: &Path) -> io::Result<PathBuf> {
    Err(io::ErrorKind::Unsupported.into())
}

/// `node_path` without its root, `..` and `.` kept for the lookup.
fn relative(node_path: &Path) -> PathBuf {
    node_path
        .components()
        .filter(|c| !matches!(c, Component::RootDir | Component::Prefix(_)))
        .collect()
}

/// The kernel's resolution of a path that exists, named by
/// /proc/self/fd. An error where it does not (the walk then says where it
/// would be: a dangling link must not be appended to) or where openat2
/// cannot be used (no such syscall, or refused by seccomp).
#[cfg(target_os = "linux")]
fn in_root_by_kernel(root: &Path, relative: &Path) -> io::Result<PathBuf> {
    let root_fd = open_path(libc::AT_FDCWD, root.as_os_str(), 0)?;
    let fd = open_path(
        root_fd.as_raw_fd(),
        relative.as_os_str(),
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )?;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

#[cfg(target_os = "linux")]
/// openat2(dirfd, path, O_PATH) with `resolve` flags.
fn open_path(dirfd: libc::c_int, path: &OsStr, resolve: u64) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: open_how is plain data; zeroed is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = resolve;
    // SAFETY: the path is NUL-terminated and `how` outlives the call,
    // whose size argument is its size.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The same resolution made here: each component's link read and followed
/// with the root as `/`, `..` never above the root.
fn in_root_by_walk(root: &Path, relative: &Path) -> io::Result<PathBuf> {
    let mut resolved: Vec<std::ffi::OsString> = Vec::new();
    let mut pending: Vec<std::ffi::OsString> =
        relative.iter().rev().map(|c| c.to_owned()).collect();
    let mut links = 0;
    while let Some(part) = pending.pop() {
        match part.as_bytes() {
            b"." | b"" => continue,
            b".." => {
                resolved.pop();
                continue;
            }
            _ => {}
        }
        let here: PathBuf = root
            .iter()
            .chain(resolved.iter().map(|p| p.as_os_str()))
            .collect::<PathBuf>()
            .join(&part);
        match std::fs::read_link(&here) {
            Ok(_) if links == MAX_LINKS => return Err(io::Error::from_raw_os_error(libc::ELOOP)),
            Ok(target) => {
                links += 1;
                if target.is_absolute() {
                    resolved.clear();
                }
                pending.extend(
                    target
                        .iter()
                        .filter(|c| *c != "/")
                        .rev()
                        .map(|c| c.to_owned()),
                );
            }
            _ => resolved.push(part),
        }
    }
    Ok(resolved.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    /// A node root whose /var/run is Debian's absolute link to /run, with
    /// BIRD's socket directory, and links that try to leave the root.
    fn debian_like(name: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("podtrace-root-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("run/calico")).unwrap();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("var/lib/k3s/data/abc/bin")).unwrap();
        std::fs::write(root.join("run/calico/bird.ctl"), "").unwrap();
        symlink("/run", root.join("var/run")).unwrap();
        symlink(
            "/var/lib/k3s/data/abc",
            root.join("var/lib/k3s/data/current"),
        )
        .unwrap();
        symlink("../../../../../etc", root.join("var/lib/k3s/escape")).unwrap();
        root
    }

    #[test]
    fn absolute_links_and_dot_dots_resolve_inside_the_root() {
        let root = debian_like("resolve");
        let host = HostRoot::new(&root);
        for lookup in [
            |r: &Path, p: &Path| HostRoot::new(r).path(p).unwrap(),
            |r: &Path, p: &Path| in_root_by_walk(r, &relative(p)).unwrap(),
        ] {
            assert_eq!(
                lookup(&root, Path::new("/var/run/calico/bird.ctl")),
                root.join("run/calico/bird.ctl")
            );
            assert_eq!(
                lookup(&root, Path::new("var/lib/k3s/data/current/bin")),
                root.join("var/lib/k3s/data/abc/bin")
            );
            // `..` past the root stays at the root, as RESOLVE_IN_ROOT does.
            assert_eq!(
                lookup(&root, Path::new("var/lib/k3s/escape/os-release")),
                root.join("etc/os-release")
            );
            // Missing: resolved as far as it exists.
            assert_eq!(
                lookup(&root, Path::new("/var/run/flannel/subnet.env")),
                root.join("run/flannel/subnet.env")
            );
        }
        assert!(host.path("/var/run/calico/bird.ctl").unwrap().exists());
        // The node's own root is the machine's: nothing to resolve.
        assert_eq!(
            HostRoot::new("/").path("var/run").unwrap(),
            PathBuf::from("/var/run")
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_dangling_link_is_followed_inside_the_root_too() {
        let root = debian_like("dangling");
        std::fs::remove_dir_all(root.join("run")).unwrap();
        assert_eq!(
            HostRoot::new(&root)
                .path("/var/run/calico/bird.ctl")
                .unwrap(),
            root.join("run/calico/bird.ctl")
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_link_loop_is_an_error_never_the_links_own_path() {
        let root = debian_like("loop");
        symlink("/a", root.join("a")).unwrap();
        let looped = |e: io::Error| e.raw_os_error() == Some(libc::ELOOP);
        assert!(in_root_by_walk(&root, Path::new("a/x")).is_err_and(looped));
        assert!(HostRoot::new(&root).path("a/x").is_err_and(looped));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
