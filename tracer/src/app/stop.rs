//! Ctrl-C and SIGTERM, caught from before the first attach to the end.
//!
//! A signal must never kill podtrace with something attached: the nft
//! table, clsact filters and qdiscs would stay. So `main` blocks both
//! signals before anything else, and `Stop::catch` unblocks them only once
//! their handlers are in place: a signal that came meanwhile is then
//! pending, not lost. Attaching is never interrupted; the trace stops at
//! its first step and everything unwinds through the normal drop path.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use anyhow::Result;

use super::teller::Teller;
use crate::model::Summary;
use tokio::signal::unix::{signal, Signal, SignalKind};

/// What a stop before tracing says (a line on stderr): the resolve phase
/// attaches nothing.
pub const STOPPED_BEFORE_TRACING: &str = "stopped before tracing began: nothing was attached";

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

/// `work`, or `None` (said on stderr) when `stop` comes first: for the
/// phases before anything is attached.
pub(super) async fn unless_stopped<T>(
    work: impl std::future::Future<Output = T>,
    stop: impl std::future::Future<Output = ()>,
) -> Option<T> {
    tokio::select! {
        done = work => Some(done),
        () = stop => {
            eprintln!("podtrace: {STOPPED_BEFORE_TRACING}");
            None
        }
    }
}

/// Node mode stopped before tracing: its summary still ends the output
/// (0 stories), as every stop's does.
pub(super) fn stopped_before_tracing(teller: Teller<'_>) -> std::io::Result<()> {
    teller.finish(Summary::default()).map(|_| ())
}

/// The line [`die_saying`] writes, as the handler needs it: a pointer
/// and a length, set before the handler is installed.
static LAST_WORDS: AtomicPtr<u8> = AtomicPtr::new(std::ptr::null_mut());
static LAST_WORDS_LEN: AtomicUsize = AtomicUsize::new(0);

/// For the commands that attach nothing (`read`, `doctor`): SIGINT and
/// SIGTERM say `line` on stderr, then end the process as the signal does
/// (a shell sees 130 or 143), wherever it is, even blocked in a read.
pub fn die_saying(line: &'static str) {
    LAST_WORDS_LEN.store(line.len(), Ordering::SeqCst);
    LAST_WORDS.store(line.as_ptr().cast_mut(), Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a sigaction on the stack, initialised here; the handler
        // only calls async-signal-safe functions.
        unsafe {
            let mut action = std::mem::zeroed::<libc::sigaction>();
            action.sa_sigaction = say_and_die as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
    set_mask(libc::SIG_UNBLOCK);
}

extern "C" fn say_and_die(sig: libc::c_int) {
    let (line, len) = (
        LAST_WORDS.load(Ordering::SeqCst),
        LAST_WORDS_LEN.load(Ordering::SeqCst),
    );
    // SAFETY: write(2) and raise(3) are async-signal-safe; the line is
    // 'static. SA_RESETHAND has put the default action back, and the
    // signal raised here is delivered as the handler returns.
    unsafe {
        libc::write(2, line.cast(), len);
        libc::raise(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::Format,
        output::{self, testing::Kept},
    };

    #[tokio::test]
    async fn a_stop_while_resolving_ends_the_work_and_says_so_with_a_summary() {
        let resolved = unless_stopped(std::future::pending::<u32>(), async {}).await;
        assert_eq!(resolved, None);
        let done = unless_stopped(async { 7 }, std::future::pending()).await;
        assert_eq!(done, Some(7));
        for (format, said) in [
            (Format::Human, "podtrace: 0 stories"),
            (Format::Json, "\"stories\":0"),
        ] {
            let kept = Kept::default();
            let teller = Teller::plain(output::sink(format, Box::new(kept.clone()), false));
            stopped_before_tracing(teller).unwrap();
            let out = kept.text();
            assert!(out.contains(said), "{out}");
        }
    }

    #[test]
    fn a_command_with_nothing_attached_ends_on_a_signal_saying_so() {
        for sig in [libc::SIGINT, libc::SIGTERM] {
            let mut pipe = [0; 2];
            let mut ready = [0; 2];
            // SAFETY: two pipes, then a child that only makes syscalls
            // until the signal ends it; it says when its handler is set,
            // so the signal never finds the default action.
            unsafe {
                assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
                assert_eq!(libc::pipe(ready.as_mut_ptr()), 0);
                let child = libc::fork();
                if child == 0 {
                    libc::dup2(pipe[1], 2);
                    block_signals();
                    die_saying("podtrace: stopped by a signal\n");
                    libc::write(ready[1], b"r".as_ptr().cast(), 1);
                    loop {
                        libc::pause();
                    }
                }
                libc::close(pipe[1]);
                libc::close(ready[1]);
                let mut byte = [0u8; 1];
                assert_eq!(libc::read(ready[0], byte.as_mut_ptr().cast(), 1), 1);
                libc::close(ready[0]);
                libc::kill(child, sig);
                let mut status = 0;
                assert_eq!(libc::waitpid(child, &mut status, 0), child);
                assert!(libc::WIFSIGNALED(status), "{status:#x}");
                assert_eq!(libc::WTERMSIG(status), sig);
                let mut said = [0u8; 64];
                let n = libc::read(pipe[0], said.as_mut_ptr().cast(), said.len());
                libc::close(pipe[0]);
                assert_eq!(&said[..n as usize], b"podtrace: stopped by a signal\n");
            }
        }
    }
}
