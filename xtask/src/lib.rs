//! Developer tasks for podtrace, and the netns lab that the integration
//! tests share with `cargo xtask lab`.

pub mod api_stub;
pub mod bench;
pub mod dist;
pub mod faults;
pub mod file_cycles;
pub mod image;
mod import_graph;
pub mod lab;
pub mod layers;
pub mod macos;
pub mod phases;
pub mod podtrace_run;
mod rust_tokens;
pub mod setup;
pub mod sizes;
pub mod vm;

use std::path::{Path, PathBuf};

/// The podtrace checkout this xtask works on, found at run time: the
/// nearest directory, from the current one up, whose Cargo.toml is the
/// podtrace workspace. Not the tree it was built in: a prebuilt xtask
/// copied with another checkout must work on that one.
pub fn workspace_root() -> anyhow::Result<PathBuf> {
    workspace_around(&std::env::current_dir()?)
}

/// The podtrace checkout holding `here`.
fn workspace_around(here: &Path) -> anyhow::Result<PathBuf> {
    here.ancestors()
        .find(|dir| is_podtrace_workspace(dir))
        .map(Path::to_path_buf)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no podtrace checkout at or above {}: run cargo xtask inside one",
                here.display()
            )
        })
}

fn is_podtrace_workspace(dir: &Path) -> bool {
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
    manifest.contains("[workspace]") && dir.join("tracer").is_dir() && dir.join("xtask").is_dir()
}

/// Where cargo builds the checkout at `root`: `CARGO_TARGET_DIR` when set
/// (relative to where cargo runs, as cargo reads it), else `root/target`.
pub fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => std::env::current_dir().unwrap_or_default().join(dir),
        None => root.join("target"),
    }
}

/// The podtrace already built in this checkout: release if there is one,
/// else debug.
pub fn built_podtrace() -> anyhow::Result<PathBuf> {
    let target = target_dir(&workspace_root()?);
    let release = target.join("release/podtrace");
    if release.exists() {
        return Ok(release);
    }
    let debug = target.join("debug/podtrace");
    if debug.exists() {
        return Ok(debug);
    }
    anyhow::bail!(
        "no podtrace built in {}: run cargo build --release first, or give --podtrace",
        target.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checkout_is_found_where_xtask_runs_not_where_it_was_built() {
        let copy = std::env::temp_dir().join(format!("podtrace-copy-{}", std::process::id()));
        for dir in ["tracer/src", "xtask"] {
            std::fs::create_dir_all(copy.join(dir)).unwrap();
        }
        std::fs::write(
            copy.join("Cargo.toml"),
            "[workspace]\nmembers = [\"tracer\", \"xtask\"]\n",
        )
        .unwrap();
        let found = workspace_around(&copy.join("tracer/src")).unwrap();
        assert_eq!(found, copy);
        assert_ne!(found, Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
        let outside = workspace_around(Path::new("/proc/self"));
        assert!(outside
            .unwrap_err()
            .to_string()
            .contains("no podtrace checkout"));
        std::fs::remove_dir_all(&copy).unwrap();
    }
}
