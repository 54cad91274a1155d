//! `cargo xtask test`'s check that podtrace still builds for macOS as the
//! cluster-mode front-end (`kubectl podtrace` from a laptop): everything
//! that loads programs or talks netlink is `cfg(target_os = "linux")`.
//!
//! A `cargo check`, not a build: nothing is linked, so no macOS SDK is
//! needed, and std comes from the nightly's rust-src (`cargo xtask setup`
//! installs it), built with `-Z build-std`. Two dependencies' build
//! scripts compile C or assembly with the host's `cc`, which knows none of
//! Apple's flags: ring's is skipped (its Rust needs nothing from it to be
//! checked: a `links` override stands in), and `CRATE_CC_NO_DEFAULTS`
//! keeps cc-rs from adding `-arch`, `-mmacosx-version-min` for psm's.

use std::process::Command;

use anyhow::{bail, Context, Result};

pub const TARGET: &str = "x86_64-apple-darwin";

/// `cargo check -p podtrace` for macOS.
pub fn check(workspace: &std::path::Path) -> Result<()> {
    let lock =
        std::fs::read_to_string(workspace.join("Cargo.lock")).context("cannot read Cargo.lock")?;
    let ring = ring_links(&lock).context("Cargo.lock has no ring")?;
    let skip_ring = format!("target.{TARGET}.{ring}.rustc-cfg=[]");
    let args = [
        "run",
        "nightly",
        "cargo",
        "check",
        "--package",
        "podtrace",
        "--target",
        TARGET,
        "-Z",
        "build-std=std,panic_abort",
        "--config",
        &skip_ring,
    ];
    let status = Command::new("rustup")
        .args(args)
        .current_dir(workspace)
        .env("CRATE_CC_NO_DEFAULTS", "1")
        .status()
        .context("cannot run rustup")?;
    if !status.success() {
        bail!(
            "podtrace does not build for {TARGET}: `rustup {}` failed ({status})",
            args.join(" ")
        );
    }
    Ok(())
}

/// ring's `links` name (`ring_core_0_17_14_`), from the version locked.
fn ring_links(lock: &str) -> Option<String> {
    let mut lines = lock.lines();
    lines.find(|line| *line == "name = \"ring\"")?;
    let version = lines
        .next()?
        .strip_prefix("version = \"")?
        .strip_suffix('"')?;
    Some(format!("ring_core_{}_", version.replace('.', "_")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_s_links_name_follows_the_locked_version() {
        let lock = "[[package]]\nname = \"ring\"\nversion = \"0.17.14\"\nsource = \"registry\"\n";
        assert_eq!(ring_links(lock).as_deref(), Some("ring_core_0_17_14_"));
        assert_eq!(ring_links("[[package]]\nname = \"rings\"\n"), None);
    }
}
