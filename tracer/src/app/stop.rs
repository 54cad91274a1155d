//! Ctrl-C and SIGTERM, caught from before the first attach to the end.
//!
//! A signal must never kill podtrace with something attached: the nft
//! table, clsact filters and qdiscs would stay. So `main` blocks both
//! signals before anything else, and `Stop::catch` unblocks them only once
//! their handlers are in place: a signal that came meanwhile is then
//! pending, not lost. Attaching is never interrupted; the trace stops at
//! its first step and everything unwinds through the normal drop path.

use anyhow::Result;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Blocks SIGINT and SIGTERM for the calling thread (and the threads and
/// children it starts) until `Stop::catch`.
pub fn block_signals() {
    set_mask(libc::SIG_BLOCK);
}

fn set_mask(how: libc::c_int) {
    // SAFETY: a sigset on the stack, initialised by sigemptyset.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// The signals that end a trace.
pub struct Stop {
    sigint: Signal,
    sigterm: Signal,
}

impl Stop {
    /// Installs the handlers, then lets the signals through.
    pub fn catch() -> Result<Self> {
        let stop = Self {
            sigint: signal(SignalKind::interrupt())?,
            sigterm: signal(SignalKind::terminate())?,
        };
        set_mask(libc::SIG_UNBLOCK);
        Ok(stop)
    }

    /// Waits for either signal.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.sigint.recv() => {}
            _ = self.sigterm.recv() => {}
        }
    }
}
