//! Builds the eBPF object (tracer-ebpf) for bpfel-unknown-none with the
//! nightly toolchain and bpf-linker, as aya-template does; the userspace
//! binary embeds it. Built for another OS (macOS, for `kubectl podtrace`
//! from a laptop) there is no kernel half to embed: that build is the
//! cluster-mode front-end only (app/elsewhere.rs).
fn main() -> anyhow::Result<()> {
    commit();
    // The target's OS, not the host's: this script runs on the host.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() != Ok("linux") {
        return Ok(());
    }
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tracer-ebpf");
    println!("cargo:rerun-if-changed={root}");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracer-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}

/// The commit built, for `--version` (`PODTRACE_COMMIT`): `unknown` out of
/// a git checkout (a source tarball). Rebuilt when HEAD moves: only files
/// that exist are watched (a missing one would rebuild every time).
fn commit() {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PODTRACE_COMMIT={commit}");
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for watched in ["HEAD".to_string(), "packed-refs".into()]
        .into_iter()
        .chain(branch)
    {
        if let Some(path) = git(&["rev-parse", "--git-path", &watched]) {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
}
