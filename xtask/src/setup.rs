//! `cargo xtask setup`: everything a fresh machine lacks to build and test
//! podtrace. Idempotent: each step checks before it installs.

use std::{io::Write, process::Command};

use anyhow::{bail, Context, Result};

/// Debian packages: LLVM 22 for bpf-linker, and the tools the lab and the
/// tests drive (ip, bridge, ping, nft, iptables, bpftool, tshark to read
/// what `--write` writes; iperf3 and tcpdump for `cargo xtask bench`;
/// bird2 for the Calico lab; the CNI plugins that make the lab's pods).
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
    "iproute2",
    "iptables",
    "nftables",
    "iputils-ping",
    "bpftool",
    "procps",
    "tshark",
    // The tests' listeners and crafted packets inside lab pods.
    "python3",
    "iperf3",
    "tcpdump",
    // The Calico lab's BGP daemon, one per node (xtask/src/lab/bird.rs).
    "bird2",
    // `wg`, which sets the flannel-wireguard lab's keys and peers
    // (xtask/src/lab/flannel_wireguard.rs; the VMs run that lab).
    "wireguard-tools",
    // The reference CNI plugins (bridge, host-local, loopback, portmap in
    // /usr/lib/cni) that make the lab's pods (xtask/src/lab/cni_plugins.rs).
    "containernetworking-plugins",
    // The kernel matrix (xtask/src/vm): QEMU, and what builds a guest's
    // initramfs from a Debian kernel package (busybox, cpio, modprobe and
    // depmod, xz for trixie's modules).
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "kmod",
    "xz-utils",
    // The agent image (xtask/src/image): mmdebstrap makes its Debian
    // userland; podman loads it in tests/image.rs; runc runs the lab's
    // agent pods as containers (xtask/src/api_stub/kubelet.rs).
    "mmdebstrap",
    "podman",
    "runc",
];

/// Answers for debconf, so that installing stays non-interactive:
/// Wireshark's dumpcap is not made setuid (the tests run as root).
const DEBCONF: &str = "wireshark-common wireshark-common/install-setuid boolean false\n";

const BPF_LINKER_VERSION: &str = "0.13";

pub fn setup() -> Result<()> {
    rust_src()?;
    apt()?;
    kubectl()?;
    bpf_linker()?;
    for series in &crate::vm::kernels::MATRIX {
        crate::vm::kernels::ensure(series)?;
    }
    Ok(())
}

fn rust_src() -> Result<()> {
    let installed = output(
        "rustup",
        &["component", "list", "--installed", "--toolchain", "nightly"],
    )?;
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        return Ok(());
    }
    run(
        "rustup",
        &["component", "add", "rust-src", "--toolchain", "nightly"],
    )
}

fn apt() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    apt_install(&missing)
}

fn apt_install(packages: &[&str]) -> Result<()> {
    eprintln!("setup: installing {}", packages.join(" "));
    preseed()?;
    run("apt-get", &["update", "-qq"])?;
    let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
    args.extend(packages);
    let status = Command::new("apt-get")
        .args(&args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("cannot run apt-get")?;
    if !status.success() {
        bail!("apt-get install {} failed", packages.join(" "));
    }
    Ok(())
}

fn preseed() -> Result<()> {
    let mut child = Command::new("debconf-set-selections")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("cannot run debconf-set-selections")?;
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(DEBCONF.as_bytes())?;
    if !child.wait()?.success() {
        bail!("debconf-set-selections failed");
    }
    Ok(())
}

/// kubectl, for the plugin test: the machine image ships one; Debian's
/// kubernetes-client where it does not.
fn kubectl() -> Result<()> {
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Ok(());
    }
    apt_install(&["kubernetes-client"])
}

fn bpf_linker() -> Result<()> {
    let have = Command::new("bpf-linker").arg("--version").output();
    if have.is_ok_and(|o| {
        String::from_utf8_lossy(&o.stdout).contains(&format!("bpf-linker {BPF_LINKER_VERSION}"))
    }) {
        return Ok(());
    }
    eprintln!("setup: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about a minute)");
    // bpf-linker ignores LLVM_SYS_* and /usr/bin/llvm-config is LLVM 14:
    // LLVM_PREFIX is what points it at LLVM 22, the nightly's LLVM.
    let status = Command::new("cargo")
        .args([
            "install",
            "bpf-linker",
            "--version",
            &format!("~{BPF_LINKER_VERSION}"),
            "--no-default-features",
            "--features",
            "llvm-22",
        ])
        .env("LLVM_PREFIX", "/usr/lib/llvm-22")
        .status()
        .context("cannot run cargo install")?;
    if !status.success() {
        bail!("cargo install bpf-linker failed");
    }
    Ok(())
}

pub fn run(program: &str, args: &[&str]) -> Result<()> {
    let status = Command::new(program)
        .args(args)
        .status()
        .with_context(|| format!("cannot run {program}"))?;
    if !status.success() {
        bail!("`{program} {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

fn output(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {program}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// deploy/Dockerfile builds with the chain setup installs, and its
    /// image holds the packages `cargo xtask image` installs.
    #[test]
    fn the_dockerfile_pins_what_setup_installs() {
        let root = crate::workspace_root().unwrap();
        let dockerfile = std::fs::read_to_string(root.join("deploy/Dockerfile")).unwrap();
        assert!(dockerfile.contains(&format!("ARG BPF_LINKER_VERSION={BPF_LINKER_VERSION}\n")));
        assert!(dockerfile.contains("--features llvm-22") && APT_PACKAGES.contains(&"llvm-22-dev"));
        assert!(dockerfile.contains(&format!("COPY {} ", crate::image::PACKAGES_FILE)));
    }
}
