//! The `nft` program, run in the calling thread's network namespace:
//! a script applied atomically, and podtrace's own table deleted.

use std::{
    io::Write,
    process::{Command, Stdio},
};

use anyhow::{bail, Context, Result};

/// Runs an nft script atomically (`nft -f -`).
pub(super) fn nft_script(script: &str) -> Result<()> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run nft (package nftables)")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("nft: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Deletes a podtrace table of the current thread's namespace; absent
/// already is fine.
pub(super) fn delete_table(name: &str) -> Result<()> {
    match nft_script(&format!("delete table inet {name}\n")) {
        Err(e) if e.to_string().contains("No such file or directory") => Ok(()),
        other => other,
    }
}
