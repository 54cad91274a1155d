//! Starting podtrace and knowing when it traces. Notes may come first on
//! stderr; the trace has started at the `podtrace: tracing` banner, and
//! only then may traffic be sent. `cargo xtask demo` and the kernel tests
//! both wait for it, here.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use anyhow::{bail, Context, Result};

/// The stderr line that says podtrace is attached and tracing.
pub const BANNER: &str = "podtrace: tracing";

/// A podtrace that has said it is tracing.
pub struct Started {
    pub child: Child,
    /// stderr after the banner, line by line, until podtrace exits.
    pub stderr_lines: mpsc::Receiver<String>,
    /// stderr up to and including the banner, each line ending in '\n'.
    pub banner: String,
}

/// The lines `reader` gives, from a thread of their own, so that waiting
/// for the next one can time out.
pub fn lines_of(reader: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        // Bytes that are not UTF-8 (a guest's console) do not end it.
        let mut reader = BufReader::new(reader);
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            let text = String::from_utf8_lossy(&line);
            if tx
                .send(text.trim_end_matches(['\n', '\r']).to_string())
                .is_err()
            {
                break;
            }
            line.clear();
        }
    });
    lines
}

/// Spawns `command` with stderr piped (stdout as the caller set it) and
/// waits at most `timeout` for each line until the banner; a podtrace that
/// exits or stalls before it is killed and the error says what it said.
pub fn start(mut command: Command, timeout: Duration) -> Result<Started> {
    let mut child = command
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start podtrace")?;
    let stderr_lines = lines_of(child.stderr.take().expect("piped"));
    let mut banner = String::new();
    loop {
        let Ok(line) = stderr_lines.recv_timeout(timeout) else {
            let _ = child.kill();
            bail!(
                "podtrace did not start within {} s: {banner}",
                timeout.as_secs()
            );
        };
        banner.push_str(&line);
        banner.push('\n');
        if line.starts_with(BANNER) {
            return Ok(Started {
                child,
                stderr_lines,
                banner,
            });
        }
    }
}
