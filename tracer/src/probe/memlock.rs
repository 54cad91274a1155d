//! RLIMIT_MEMLOCK. Kernels before 5.11 charge every eBPF map's memory
//! against it (later ones charge the memory cgroup), and a container
//! runtime gives pods systemd's 8 MiB: less than one default ring buffer.
//! Raising it needs CAP_SYS_RESOURCE. Without it, the ring buffer shrinks
//! until the maps fit, and podtrace says so; it never fails on aya's raw
//! "failed to create map".

use std::sync::Once;

/// Raises the memlock limit as far as this process may: to unlimited
/// with CAP_SYS_RESOURCE, else the soft limit to the hard one. Returns
/// the soft limit now in force, `None` for unlimited.
pub fn raise() -> Option<u64> {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit/getrlimit read and write the rlimit they are given.
    unsafe {
        if libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) == 0 {
            return None;
        }
        let mut now: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut now) != 0 {
            return Some(0);
        }
        now.rlim_cur = now.rlim_max;
        libc::setrlimit(libc::RLIMIT_MEMLOCK, &now);
        (now.rlim_cur != libc::RLIM_INFINITY).then_some(now.rlim_cur)
    }
}

/// Whether `e` is a map the kernel would not create for lack of locked
/// memory (EPERM from BPF_MAP_CREATE, as kernels before 5.11 answer).
pub fn refused_map(e: &aya::EbpfError) -> bool {
    matches!(
        e,
        aya::EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. })
            if io_error.raw_os_error() == Some(libc::EPERM)
    )
}

/// The smallest ring buffer worth tracing with.
pub const SMALLEST_RING: u32 = 64 * 1024;

/// Says once that the ring buffer was shrunk to fit `limit`.
pub fn say_shrunk(asked: u32, got: u32, limit: u64) {
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        eprintln!(
            "podtrace: note: this kernel charges eBPF maps to RLIMIT_MEMLOCK ({} KiB here) and raising it needs CAP_SYS_RESOURCE: ring buffer {} KiB per node instead of {} KiB (bursts may be lost, and counted); add CAP_SYS_RESOURCE, or give the runtime an unlimited memlock limit, to keep it",
            limit / 1024,
            got / 1024,
            asked / 1024
        );
    });
}

/// The one-line error when even the smallest ring does not fit.
pub fn too_low(limit: u64) -> String {
    format!(
        "cannot create podtrace's eBPF maps: this kernel charges them to RLIMIT_MEMLOCK ({} KiB here), too low even with a {} KiB ring buffer, and raising it needs CAP_SYS_RESOURCE: add that capability, or run with a higher memlock limit (ulimit -l, LimitMEMLOCK= for the container runtime)",
        limit / 1024,
        SMALLEST_RING / 1024
    )
}
