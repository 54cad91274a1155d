//! The kernel matrix: the kernel tests that matter most, run on each
//! kernel clusters run (Debian's 5.10, 6.1 and 6.12, under QEMU) and on
//! the host's own. `cargo xtask test` runs all of it; `cargo xtask test
//! --kernel 6.1` runs one kernel alone.
//!
//! Each guest boots the kernel with the host root shared read-only, runs
//! the work tree's own test binaries (built on the host, before booting)
//! and reports their exit code on its console.

mod boot;
pub mod kernels;
mod suite;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use boot::Accel;
use kernels::{Series, MATRIX};
use suite::suite_commands;
pub use suite::{ONE_KERNEL, SUITE, TCX_SUITE};

/// Time for one kernel's suite under TCG, at most. 5.10's (the slowest)
/// took 428 s alone on this 2-core machine, and CI's machine has run
/// the suite up to 1.3 times slower: 20 minutes leaves room, and three
/// kernels stuck at it still end within CI's 90.
const SUITE_DEADLINE: Duration = Duration::from_secs(20 * 60);

/// `--kernel` values: a series of the matrix, or `host`.
pub fn known() -> Vec<&'static str> {
    MATRIX.iter().map(|s| s.version).chain(["host"]).collect()
}

/// Runs the suite on `only` (a series or `host`), or on every kernel of
/// the matrix in VMs (`cargo xtask test` has run every test on the host's
/// kernel already).
/// `tests` narrows the suite to the tests whose names contain one of them
/// (all when empty): one test on one kernel while it is being written.
pub fn matrix(workspace: &Path, only: Option<&str>, tests: &[String]) -> Result<()> {
    let chosen: Vec<Option<&Series>> = match only {
        None => MATRIX.iter().map(Some).collect(),
        Some("host") => vec![None],
        Some(version) => vec![Some(
            MATRIX
                .iter()
                .find(|s| s.version == version)
                .with_context(|| {
                    format!(
                        "no kernel {version} in the matrix: --kernel takes one of {}",
                        known().join(", ")
                    )
                })?,
        )],
    };
    let binaries = build_suite(workspace)?;
    let podtrace = podtrace_beside(&binaries)?;
    let mut accel = None;
    let mut results = Vec::new();
    for series in chosen {
        let started = Instant::now();
        let (name, (passed, report)) = match series {
            // A kernel that cannot be fetched or booted fails alone.
            Some(series) => (
                series.version.to_string(),
                in_vm(workspace, series, &binaries, &podtrace, tests, &mut accel).unwrap_or_else(
                    |e| {
                        eprintln!("vm: kernel {}: {e:#}", series.version);
                        (false, None)
                    },
                ),
            ),
            None => (
                "host".to_string(),
                on_host(workspace, &binaries, &podtrace, tests)?,
            ),
        };
        results.push(Outcome {
            name,
            passed,
            took: started.elapsed(),
            report,
        });
    }
    if only.is_none() {
        // The host's kernel ran every test before the matrix.
        let report = kernel_report(&mut Command::new(&podtrace));
        results.insert(
            0,
            Outcome {
                name: "host".into(),
                passed: true,
                took: Duration::ZERO,
                report,
            },
        );
    }
    let table = table(&results);
    println!("\nkernel matrix:\n{table}");
    let file = workspace.join("target/vm/kernels.md");
    std::fs::create_dir_all(file.parent().expect("a directory"))?;
    std::fs::write(&file, &table)?;
    println!("(also in {})", file.display());
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| !r.passed)
        .map(|r| r.name.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("the kernel suite failed on {}", failed.join(", "));
    }
    Ok(())
}

/// One kernel's run of the suite.
struct Outcome {
    name: String,
    passed: bool,
    took: Duration,
    /// `podtrace kernel -o json` on that kernel.
    report: Option<String>,
}

/// The README's kernel table, from the kernels' own reports.
fn table(results: &[Outcome]) -> String {
    let mut out = String::from(
        "| kernel | release | attach | drop reasons | drops attach as | programs load | suite |\n|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let report: Value = r
            .report
            .as_deref()
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or(Value::Null);
        let text = |key: &str| report[key].as_str().unwrap_or("?").to_string();
        let yes_no = |key: &str| match report[key].as_bool() {
            Some(true) => "named",
            Some(false) => "not named (needs 5.17)",
            None => "?",
        };
        let suite = match (r.passed, r.took.is_zero()) {
            (true, true) => "every kernel test".to_string(),
            (true, false) => format!("passed in {:.0} s", r.took.as_secs_f64()),
            (false, _) => "FAILED".to_string(),
        };
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            text("release"),
            text("attach"),
            yes_no("drop_reasons"),
            text("drop_hook"),
            if report["loads"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            suite
        );
    }
    out
}

/// `podtrace kernel -o json`, run by `command`.
fn kernel_report(command: &mut Command) -> Option<String> {
    let out = command.args(["kernel", "-o", "json"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// Builds the suite's test binaries; returns (target, executable).
fn build_suite(workspace: &Path) -> Result<Vec<(String, PathBuf)>> {
    let targets = suite::targets();
    let mut cargo = Command::new(env!("CARGO"));
    cargo.current_dir(workspace).args([
        "test",
        "--no-run",
        // Release: a podtrace start under TCG took 23 s built for debug
        // and 10 s for release, and the suite starts podtrace dozens of
        // times; `cargo xtask demo` has built release's podtrace already.
        "--release",
        "--message-format=json",
        "--package",
        "podtrace",
    ]);
    for target in &targets {
        cargo.args(["--test", target]);
    }
    let out = cargo.output().context("cannot run cargo")?;
    if !out.status.success() {
        bail!(
            "cannot build the kernel suite: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let (Some(name), Some(exe)) = (
            message["target"]["name"].as_str(),
            message["executable"].as_str(),
        ) else {
            continue;
        };
        if targets.contains(&name) {
            binaries.push((name.to_string(), PathBuf::from(exe)));
        }
    }
    if binaries.len() != targets.len() {
        bail!(
            "cargo built {} of the suite's {} test binaries",
            binaries.len(),
            targets.len()
        );
    }
    Ok(binaries)
}

/// The podtrace the suite's binaries run: beside them in cargo's target
/// directory (wherever CARGO_TARGET_DIR puts it).
fn podtrace_beside(binaries: &[(String, PathBuf)]) -> Result<PathBuf> {
    let (_, exe) = binaries.first().context("no test binary")?;
    let profile = exe
        .parent()
        .and_then(Path::parent)
        .context("a test binary outside cargo's target directory")?;
    Ok(profile.join("podtrace"))
}

fn on_host(
    workspace: &Path,
    binaries: &[(String, PathBuf)],
    podtrace: &Path,
    tests: &[String],
) -> Result<(bool, Option<String>)> {
    let mut passed = true;
    let tcx = std::fs::read("/sys/kernel/btf/vmlinux")
        .is_ok_and(|btf| btf.windows(15).any(|w| w == b"BPF_TCX_INGRESS"));
    for argv in suite_commands(binaries, None, tcx, tests) {
        let status = Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(workspace.join("tracer"))
            .status()
            .with_context(|| format!("cannot run {}", argv[0]))?;
        passed &= status.success();
    }
    let report = kernel_report(&mut Command::new(podtrace));
    Ok((passed, report))
}

fn in_vm(
    workspace: &Path,
    series: &Series,
    binaries: &[(String, PathBuf)],
    podtrace: &Path,
    tests: &[String],
    accel: &mut Option<Accel>,
) -> Result<(bool, Option<String>)> {
    let kernel = kernels::ensure(series)?;
    let dir = workspace.join("target/vm").join(series.version);
    std::fs::create_dir_all(&dir)?;
    let initramfs = boot::initramfs(&kernel, &dir)?;
    let script = dir.join("run.sh");
    std::fs::write(
        &script,
        guest_script(workspace, series, binaries, podtrace, tests),
    )?;
    println!(
        "vm: kernel {} ({}): the suite",
        series.version, kernel.release
    );
    let tries: Vec<(Accel, Duration)> = match accel {
        Some(Accel::Tcg) => vec![(Accel::Tcg, Duration::from_secs(180))],
        _ if Path::new("/dev/kvm").exists() => vec![
            // Nested KVM hangs at boot on some hosts: TCG then. A
            // kernel that boots under KVM says so within a few seconds
            // (this host's nested KVM never does: 30 s were lost per run).
            (Accel::Kvm, Duration::from_secs(10)),
            (Accel::Tcg, Duration::from_secs(180)),
        ],
        _ => vec![(Accel::Tcg, Duration::from_secs(180))],
    };
    for (how, boot_deadline) in tries {
        let ended = boot::run(
            series,
            &kernel,
            &initramfs,
            &script,
            how,
            boot_deadline,
            SUITE_DEADLINE,
        )?;
        match ended {
            Some(ended) => {
                *accel = Some(how);
                println!(
                    "vm: kernel {}: exit {} after {:.0} s ({how:?})",
                    series.version,
                    ended.code,
                    ended.took.as_secs_f64()
                );
                return Ok((ended.code == 0, ended.report));
            }
            None => eprintln!(
                "vm: kernel {} did not boot under {how:?} in {} s",
                series.version,
                boot_deadline.as_secs()
            ),
        }
    }
    bail!("kernel {} boots under no accelerator", series.version)
}

/// Holds on, for the guest's life, the kernel's static branches that the
/// tests would otherwise switch on and off dozens of times: the receive
/// timestamp (every ping's SO_TIMESTAMP socket), netfilter's hooks and
/// rule tracing (every lab's rules, podtrace's nftrace table), the tc
/// hooks (every podtrace start and exit), and the kfree_skb tracepoint
/// (the drop program). Each switch patches kernel text through an int3, and under
/// QEMU's multi-threaded TCG a vCPU can still run the int3 after the patch
/// is done: 6.12 once panicked in `__netif_receive_skb_core` ("Oops: int3")
/// as netstamp_needed_key flipped (CI of stop 46). Real CPUs do not do
/// that; what the tests check does not depend on these branches' state,
/// which a real node also has on (chronyd, ping, any tc program).
/// SO_TIMESTAMP is 29 on x86-64; Python's socket module lacks the name.
const HOLD_PATCHED_BRANCHES: &str = r#"(python3 -c 'import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 29, 1)
time.sleep(1e9)' || echo "podtrace-vm: cannot hold the receive timestamp's branch") &
nft -f - <<'NFT' || echo "podtrace-vm: cannot hold netfilter's branches"
table inet podtrace_vm_hold {
  chain hold_prerouting { type filter hook prerouting priority 0; }
  chain hold_input { type filter hook input priority 0; }
  chain hold_forward { type filter hook forward priority 0; }
  chain hold_output { type filter hook output priority 0; ip daddr 0.0.0.0 meta nftrace set 1; }
  chain hold_postrouting { type filter hook postrouting priority 0; }
}
NFT
ip link add vm-hold type dummy && tc qdisc add dev vm-hold clsact || echo "podtrace-vm: cannot hold the tc hooks' branches"
echo 0 > /sys/kernel/tracing/tracing_on && echo 1 > /sys/kernel/tracing/events/skb/kfree_skb/enable || echo "podtrace-vm: cannot hold kfree_skb's branch"
"#;

/// The guest's script: the suite's binaries with their tests, in the
/// package's directory as cargo runs them, then the exit code.
fn guest_script(
    workspace: &Path,
    series: &Series,
    binaries: &[(String, PathBuf)],
    podtrace: &Path,
    tests: &[String],
) -> String {
    let mut script = format!(
        "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root RUST_BACKTRACE=1 PODTRACE_GUEST=1\ncd '{}'\nstatus=0\necho \"{}$('{}' kernel -o json)\"\n",
        workspace.join("tracer").display(),
        boot::KERNEL_REPORT,
        podtrace.display(),
    );
    // Up as on any booted system: cluster mode's tests reach the API
    // stub on 127.0.0.1.
    script.push_str("ip link set lo up\n");
    script.push_str(HOLD_PATCHED_BRANCHES);
    for mut argv in suite_commands(binaries, Some(series.version), series.tcx, tests) {
        // The tests that need a module this host lacks run here.
        argv.push("--include-ignored".into());
        let quoted: Vec<String> = argv.iter().map(|a| format!("'{a}'")).collect();
        script.push_str(&format!("{} || status=1\n", quoted.join(" ")));
    }
    script.push_str(boot::SCRIPT_END);
    script
}
