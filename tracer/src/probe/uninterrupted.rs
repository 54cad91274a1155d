//! Loading eBPF programs without a stop signal cutting the verifier short.
//!
//! The verifier gives up with EAGAIN when a signal is pending for the
//! loading thread: a Ctrl-C or SIGTERM in the fraction of a second a load
//! takes used to end podtrace with exit 1 and the verifier's whole log.
//! While programs load, this thread holds the stop signals back; they are
//! delivered when the load ends, and the run stops as it would at any
//! other moment, detaching what it attached.

/// Stop signals held back on this thread until dropped.
pub struct SignalsHeld {
    previous: libc::sigset_t,
}

impl SignalsHeld {
    pub fn now() -> Self {
        // SAFETY: sigemptyset/sigaddset write the set they are given;
        // pthread_sigmask changes only the calling thread's mask and
        // writes the old one into `previous`.
        unsafe {
            let mut held: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut held);
            for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut held, signal);
            }
            let mut previous: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &held, &mut previous);
            Self { previous }
        }
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        // SAFETY: restores the mask this thread had before `now`.
        unsafe {
            libc::pthread_sigmask(libc::SIG_SETMASK, &self.previous, std::ptr::null_mut());
        }
    }
}
