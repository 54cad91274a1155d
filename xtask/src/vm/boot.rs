//! Booting one kernel under QEMU with the host's root filesystem: an
//! initramfs made from that kernel's own modules (virtio, 9p, overlay)
//! mounts the host root read-only over 9p under a tmpfs overlay, so the
//! guest runs the work tree's own binaries and the host's tools, and
//! writes nothing back. The guest runs one script and powers off; its
//! console is the only channel back.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::kernels::{Series, Unpacked};

/// The guest's first line once its kernel and modules are up.
const BOOTED: &str = "podtrace-vm: booted";
/// The guest's last line: the script's exit code.
const EXIT: &str = "podtrace-vm: exit ";

/// Modules the initramfs loads before it can mount the host root (with
/// what they depend on, in order); built-in ones are skipped.
const EARLY_MODULES: &[&str] = &["virtio_pci", "9pnet_virtio", "9p", "overlay", "virtio_rng"];

/// /init of the initramfs (busybox). The mounts a booted system has are
/// made under the new root before switching to it (/tmp a tmpfs of its
/// own: the API stub's kubelet mounts its containers' overlays there, and
/// an overlay's upper directory cannot be on the root's overlay); the modules of the
/// running kernel are linked where modprobe looks, so the tests' `ip link
/// add type vxlan` and nft rules load what they need.
const INIT: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /sys /dev /lower /rw /newroot
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
for m in $($B cat /modules.list); do $B insmod /mod/$m; done
v=$($B uname -r)
fail() { echo "podtrace-vm: $*"; echo "podtrace-vm: exit 125"; echo o > /proc/sysrq-trigger; $B sleep 60; }
echo "podtrace-vm: booted $v"
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose host /lower || fail "cannot mount the host root over 9p"
$B mount -t tmpfs -o size=8g rw /rw
$B mkdir -p /rw/upper /rw/work
$B mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot || fail "cannot mount the overlay"
$B mount -t proc proc /newroot/proc
$B mount -t sysfs sys /newroot/sys
$B mount -t devtmpfs dev /newroot/dev
$B mkdir -p /newroot/dev/pts /newroot/dev/shm
$B mount -t devpts devpts /newroot/dev/pts
$B mount -t tmpfs shm /newroot/dev/shm
$B mount -t tmpfs run /newroot/run
$B mount -t tmpfs tmp /newroot/tmp
$B mount -t bpf bpf /newroot/sys/fs/bpf
$B mount -t tracefs tracefs /newroot/sys/kernel/tracing 2>/dev/null
$B mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup 2>/dev/null
$B mkdir -p /newroot/usr/lib/modules
$B ln -sfn "$($B sed -n 's/.*podtrace.modules=\([^ ]*\).*/\1/p' /proc/cmdline)" /newroot/usr/lib/modules/$v
run=$($B sed -n 's/.*podtrace.run=\([^ ]*\).*/\1/p' /proc/cmdline)
exec $B switch_root /newroot /bin/sh "$run"
"#;

/// What ends the guest's script: its exit code on the console, then off.
pub const SCRIPT_END: &str =
    "echo \"podtrace-vm: exit $status\"\necho o > /proc/sysrq-trigger\nsleep 60\n";

/// Builds the initramfs of `kernel` into `dir`; returns its path.
pub fn initramfs(kernel: &Unpacked, dir: &Path) -> Result<PathBuf> {
    let tree = dir.join("initramfs");
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(tree.join("bin"))?;
    std::fs::create_dir_all(tree.join("mod"))?;
    std::fs::copy("/bin/busybox", tree.join("bin/busybox"))
        .context("no /bin/busybox (busybox-static, which `cargo xtask setup` installs)")?;
    let init = tree.join("init");
    std::fs::write(&init, INIT)?;
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let mut order: Vec<PathBuf> = Vec::new();
    for module in EARLY_MODULES {
        let shown = Command::new("modprobe")
            .arg("-d")
            .arg(&kernel.root)
            .args(["-S", &kernel.release, "--show-depends", module])
            .output()
            .context("cannot run modprobe (kmod)")?;
        for line in String::from_utf8_lossy(&shown.stdout).lines() {
            if let Some(path) = line.strip_prefix("insmod ") {
                let path = PathBuf::from(path.trim());
                if !order.contains(&path) {
                    order.push(path);
                }
            }
        }
    }
    let mut list = String::new();
    for path in &order {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .context("a module")?;
        // busybox insmod takes plain modules: trixie's are xz-compressed.
        let plain = name.trim_end_matches(".xz").trim_end_matches(".zst");
        let target = tree.join("mod").join(plain);
        if name.ends_with(".xz") {
            let out = Command::new("xz").arg("-dc").arg(path).output()?;
            if !out.status.success() {
                bail!("cannot decompress {}", path.display());
            }
            std::fs::write(&target, out.stdout)?;
        } else {
            std::fs::copy(path, &target)?;
        }
        list.push_str(plain);
        list.push('\n');
    }
    std::fs::write(tree.join("modules.list"), list)?;
    let image = dir.join("initramfs.cpio");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && find . | cpio -o -H newc --quiet > '{}'",
            tree.display(),
            image.display()
        ))
        .status()?;
    if !status.success() {
        bail!("cannot pack the initramfs (cpio)");
    }
    Ok(image)
}

/// How QEMU runs the guest: KVM where it boots, else TCG.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

/// What the guest says of its kernel: `podtrace kernel -o json`.
pub const KERNEL_REPORT: &str = "podtrace-vm: kernel ";

/// A guest's end: the script's exit code, how long it took, and its
/// kernel report.
pub struct Ended {
    pub code: i32,
    pub took: Duration,
    pub report: Option<String>,
}

/// Boots `kernel` to run `script` (a path on the host, seen at the same
/// path in the guest), echoing its console with the kernel's version;
/// `None` if the guest did not boot within `boot_deadline` (the caller
/// may try TCG).
pub fn run(
    series: &Series,
    kernel: &Unpacked,
    initramfs: &Path,
    script: &Path,
    accel: Accel,
    boot_deadline: Duration,
    deadline: Duration,
) -> Result<Option<Ended>> {
    let started = Instant::now();
    let mut child = qemu(series, kernel, initramfs, script, accel)
        .spawn()
        .context("cannot start qemu-system-x86_64")?;
    let lines = crate::podtrace_run::lines_of(child.stdout.take().expect("piped"));
    // QEMU's own complaints (a CPU model, 9p, KVM) say why a guest never
    // booted: kept for the error.
    let complaints = crate::podtrace_run::lines_of(child.stderr.take().expect("piped"));
    let mut console = Console::default();
    loop {
        let limit = if console.booted {
            deadline
        } else {
            boot_deadline
        };
        let Some(left) = limit.checked_sub(started.elapsed()) else {
            let _ = child.kill();
            let _ = child.wait();
            if !console.booted {
                say_why(&complaints);
                return Ok(None);
            }
            bail!(
                "kernel {}: no end within {} s",
                series.version,
                deadline.as_secs()
            );
        };
        match lines.recv_timeout(left) {
            Ok(line) => console.read(series.version, started.elapsed(), &line),
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = child.wait();
    if !console.booted {
        say_why(&complaints);
        return Ok(None);
    }
    let code = console.code.with_context(|| {
        format!(
            "kernel {}: the guest stopped without its exit line (a panic?)",
            series.version
        )
    })?;
    Ok(Some(Ended {
        code,
        took: started.elapsed(),
        report: console.report,
    }))
}

/// QEMU's stderr, for a guest that did not boot (its TCG warnings
/// about CPU features are noise).
fn say_why(complaints: &mpsc::Receiver<String>) {
    for line in complaints.try_iter() {
        if !line.contains("doesn't support requested feature") {
            eprintln!("vm: qemu: {line}");
        }
    }
}

/// What the guest said so far.
#[derive(Default)]
struct Console {
    booted: bool,
    code: Option<i32>,
    report: Option<String>,
}

impl Console {
    /// Takes one console line, and echoes it once the kernel is up (the
    /// firmware's screen control codes before it are noise), with the
    /// seconds since QEMU started: where a kernel's suite spends its time.
    fn read(&mut self, tag: &str, since_start: Duration, line: &str) {
        let line = line.trim_end_matches('\r');
        if line.contains(BOOTED) {
            self.booted = true;
        }
        if let Some(rest) = line.split(EXIT).nth(1) {
            self.code = rest.trim().parse().ok();
        }
        if let Some(rest) = line.split(KERNEL_REPORT).nth(1) {
            self.report = Some(rest.trim().to_string());
        }
        if self.booted {
            println!("[{tag} {:>4}s] {line}", since_start.as_secs());
        }
    }
}

/// QEMU for one guest: 2 CPUs, 4 GiB, no network, the host root over 9p,
/// a virtio RNG (so that getrandom does not block an early guest), and
/// the console on stdout.
fn qemu(
    series: &Series,
    kernel: &Unpacked,
    initramfs: &Path,
    script: &Path,
    accel: Accel,
) -> Command {
    let mut qemu = Command::new("qemu-system-x86_64");
    match accel {
        Accel::Kvm => qemu.args(["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => qemu.args(["-accel", "tcg,thread=multi", "-cpu", series.cpu]),
    };
    // mitigations=off where the series allows: page-table isolation and
    // retpolines cost a third of the suite's time under TCG. What loads
    // does not change (the verifier's Spectre sanitising applies to
    // unprivileged loaders only, and podtrace loads as root); the code the
    // JIT and trampolines emit does, so one kernel keeps the defaults.
    let mitigations = if series.mitigations {
        ""
    } else {
        " mitigations=off"
    };
    let cmdline = format!(
        "console=ttyS0 quiet loglevel=1 panic=-1{mitigations} podtrace.run={} podtrace.modules={}",
        script.display(),
        kernel.modules().display()
    );
    qemu.args([
        "-smp",
        "2",
        "-m",
        "4G",
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
    ])
    .arg("-kernel")
    .arg(kernel.vmlinuz())
    .arg("-initrd")
    .arg(initramfs)
    .args(["-append", &cmdline])
    .args([
        "-fsdev",
        "local,id=host,path=/,security_model=none,readonly=on,multidevs=remap",
        "-device",
        "virtio-9p-pci,fsdev=host,mount_tag=host",
        "-device",
        "virtio-rng-pci",
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    qemu
}
