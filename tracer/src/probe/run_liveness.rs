//! A run's sign of life inside each network namespace it attaches in.
//!
//! Run files (`run_registry`) tell dead runs from live ones only to a
//! podtrace that sees the same /run/podtrace. A podtrace in a container
//! that has a /run/podtrace of its own leaves its file where no later run
//! looks, and after kill -9 its filters and table would stay attached,
//! running and unexplained.
//!
//! So every run also binds, in every network namespace where it attaches
//! anything, an abstract unix socket named after its filter handle
//! (`podtrace-run-<handle>`). An abstract name belongs to the network
//! namespace, not to a file system or a PID namespace, and the kernel
//! frees it when its holder dies, SIGKILL included. Any podtrace in that
//! namespace, whatever its mounts and PIDs, can ask whether the run that
//! left a filter or a table there is alive: if it can bind the name
//! itself, nobody holds it.

use std::{
    io,
    os::unix::net::{SocketAddr, UnixDatagram},
    time::Duration,
};

use anyhow::{Context, Result};

fn name(handle: u32) -> String {
    format!("podtrace-run-{handle:08x}")
}

fn bind(handle: u32) -> io::Result<UnixDatagram> {
    UnixDatagram::bind_addr(&abstract_address(&name(handle))?)
}

#[cfg(target_os = "linux")]
fn abstract_address(name: &str) -> io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name.as_bytes())
}

/// Abstract names are Linux's (so is everything a run attaches).
#[cfg(not(target_os = "linux"))]
fn abstract_address(_: &str) -> io::Result<SocketAddr> {
    Err(io::ErrorKind::Unsupported.into())
}

/// Binds this run's name in the current thread's network namespace; the
/// name lives as long as the socket returned.
pub fn hold(handle: u32) -> Result<UnixDatagram> {
    // Another run asking whether this one lives binds the name for an
    // instant: the name is free again a moment later.
    let mut tries = 0;
    loop {
        match bind(handle) {
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 200 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            held => {
                return held
                    .with_context(|| format!("cannot bind the abstract socket @{}", name(handle)))
            }
        }
    }
}

/// Whether the run with this filter handle lives, as far as the current
/// thread's network namespace tells: it holds its name there. Anything but
/// a bind that succeeds counts as alive, so that a doubt never removes a
/// live run's filters.
pub fn alive(handle: u32) -> bool {
    // A socket that bound is dropped at once, freeing the name.
    bind(handle).is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_alive_while_it_holds_its_name_and_dead_once_it_let_go() {
        let handle = 0x7000_0000 | std::process::id();
        assert!(!alive(handle));
        let held = hold(handle).unwrap();
        assert!(alive(handle));
        // Asking did not take the name from its holder.
        assert!(alive(handle));
        drop(held);
        assert!(!alive(handle));
    }
}
