//! The kernel's clock read from userspace: the one place podtrace calls
//! `clock_gettime`.
//!
//! The kernel stamps every record with `bpf_ktime_get_ns()`,
//! CLOCK_MONOTONIC; userspace reads the same clock to compare with those
//! stamps, and CLOCK_REALTIME − CLOCK_MONOTONIC to put them on the wall
//! clock (pcapng timestamps, cluster mode's agents).

/// `clock`'s time now, in ns.
fn now_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

/// The kernel's clock (`bpf_ktime_get_ns`), now.
pub fn monotonic_ns() -> u64 {
    u64::try_from(now_ns(libc::CLOCK_MONOTONIC)).unwrap_or(0)
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC now, in ns: added to a kernel time,
/// the wall clock time it was.
pub fn realtime_offset_ns() -> i64 {
    let realtime = now_ns(libc::CLOCK_REALTIME);
    i64::try_from(realtime - i128::from(monotonic_ns())).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_puts_the_kernel_clock_on_the_wall_clock() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        let wall = i128::from(monotonic_ns()) + i128::from(realtime_offset_ns());
        let after = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        assert!(
            before - 1_000_000 <= wall && wall <= after + 1_000_000,
            "{before} {wall} {after}"
        );
        let (a, b) = (monotonic_ns(), monotonic_ns());
        assert!(0 < a && a <= b);
    }
}
