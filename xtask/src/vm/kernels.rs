//! The kernels of the matrix: Debian's generic amd64 images, fetched by
//! package name from the suite that ships each, and unpacked outside the
//! repository with their modules indexed (depmod), so that a VM can load
//! any module the tests need.
//!
//! apt is pointed at a private sources list and state directory: adding
//! bullseye or trixie to the machine's own sources would let an ordinary
//! `apt-get install` pull packages from another release.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

/// Where kernels are kept: outside the work tree, shared by every checkout.
pub const CACHE: &str = "/var/cache/podtrace-kernels";

/// A kernel of the matrix: the series clusters run, and the Debian suite
/// whose generic image has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Series {
    /// `5.10`, `6.1`, `6.12`.
    pub version: &'static str,
    pub suite: &'static str,
    /// The CPU model QEMU shows the guest under TCG.
    pub cpu: &'static str,
    /// It has TCX links (6.6), so the default attach mode is TCX.
    pub tcx: bool,
    /// Boots with the kernel's default CPU mitigations (retpolines and
    /// return thunks in the JIT's code and the BPF trampolines, as on real
    /// nodes); the others boot with `mitigations=off`, a third faster.
    pub mitigations: bool,
}

/// Nehalem: x86-64-v2, which 6.12 wants. Not more: with BMI1/BMI2 (which
/// the BPF JIT would use) or SMEP/SMAP added, 6.12 hung at boot under TCG
/// on this host, and on Skylake-Client-v4 a guest ran 4x slower (a static
/// `busybox true` took 135 ms to fork and exec, against 30-55 ms on
/// Nehalem or qemu64): QEMU emulates the newer model's extra state (AVX,
/// XSAVE, PCID) on every context switch, and the suite is mostly
/// processes starting.
const TCG_CPU: &str = "Nehalem";

pub const MATRIX: [Series; 3] = [
    Series {
        version: "5.10",
        suite: "bullseye",
        cpu: TCG_CPU,
        tcx: false,
        mitigations: false,
    },
    Series {
        version: "6.1",
        suite: "bookworm",
        cpu: TCG_CPU,
        tcx: false,
        mitigations: false,
    },
    Series {
        version: "6.12",
        suite: "trixie",
        cpu: TCG_CPU,
        tcx: true,
        mitigations: true,
    },
];

/// An unpacked kernel: its image and its indexed modules.
pub struct Unpacked {
    /// `uname -r` of the kernel (`5.10.0-32-amd64`).
    pub release: String,
    pub root: PathBuf,
}

impl Unpacked {
    pub fn vmlinuz(&self) -> PathBuf {
        self.root.join(format!("boot/vmlinuz-{}", self.release))
    }

    /// Its modules, under `lib/modules/<release>` of the unpacked root
    /// (a link to `usr/lib` where the package ships them there).
    pub fn modules(&self) -> PathBuf {
        self.root.join("lib/modules").join(&self.release)
    }
}

/// The kernel of `series`, fetched and unpacked unless it already is.
pub fn ensure(series: &Series) -> Result<Unpacked> {
    let marker = Path::new(CACHE).join(format!("{}.release", series.version));
    if let Ok(release) = std::fs::read_to_string(&marker) {
        let unpacked = Unpacked {
            root: Path::new(CACHE).join(release.trim()),
            release: release.trim().to_string(),
        };
        if unpacked.vmlinuz().exists() && unpacked.modules().join("modules.dep").exists() {
            return Ok(unpacked);
        }
    }
    let package = image_package(series)?;
    eprintln!(
        "vm: fetching {package} ({} from {})",
        series.version, series.suite
    );
    let debs = Path::new(CACHE).join("debs");
    std::fs::create_dir_all(&debs)?;
    let mut download = apt("apt-get");
    download.args(["download", &package]).current_dir(&debs);
    run(&mut download)?;
    let deb = std::fs::read_dir(&debs)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{package}_")))
        })
        .with_context(|| format!("apt-get download left no {package} package"))?;
    let release = package
        .strip_prefix("linux-image-")
        .context("an image package")?
        .to_string();
    let root = Path::new(CACHE).join(&release);
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    // trixie ships modules under usr/lib only.
    if !root.join("lib").exists() {
        std::os::unix::fs::symlink("usr/lib", root.join("lib"))?;
    }
    run(Command::new("depmod").arg("-b").arg(&root).arg(&release))?;
    let _ = std::fs::remove_file(&deb);
    std::fs::write(&marker, &release)?;
    Ok(Unpacked { release, root })
}

/// The versioned image package the suite's `linux-image-amd64` depends on
/// (`linux-image-5.10.0-32-amd64`).
fn image_package(series: &Series) -> Result<String> {
    let lists = Path::new(CACHE).join("apt/lists");
    std::fs::create_dir_all(lists.join("partial"))?;
    std::fs::create_dir_all(Path::new(CACHE).join("apt/cache/archives/partial"))?;
    let sources: String = MATRIX
        .iter()
        .map(|s| {
            format!(
                "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian {} main\n",
                s.suite
            )
        })
        .collect();
    std::fs::write(Path::new(CACHE).join("apt/sources.list"), sources)?;
    run(apt("apt-get").args(["update", "-qq"]))?;
    let shown = apt("apt-cache")
        .args(["show", "linux-image-amd64"])
        .output()
        .context("cannot run apt-cache")?;
    let text = String::from_utf8_lossy(&shown.stdout);
    let wanted = format!("linux-image-{}.", series.version);
    text.lines()
        .filter_map(|l| l.strip_prefix("Depends: "))
        .flat_map(|deps| deps.split(','))
        .map(|dep| dep.split_whitespace().next().unwrap_or("").to_string())
        .find(|name| name.starts_with(&wanted) && name.ends_with("-amd64"))
        .with_context(|| {
            format!(
                "{}'s linux-image-amd64 names no {wanted}*-amd64 image",
                series.suite
            )
        })
}

/// apt with the matrix's private sources and state.
fn apt(program: &str) -> Command {
    let mut command = Command::new(program);
    for (option, value) in [
        ("Dir::Etc::SourceList", format!("{CACHE}/apt/sources.list")),
        ("Dir::Etc::SourceParts", "/dev/null".to_string()),
        ("Dir::State::Lists", format!("{CACHE}/apt/lists")),
        ("Dir::Cache", format!("{CACHE}/apt/cache")),
        // Its own lists and cache: the machine's apt lock is not needed.
        ("Debug::NoLocking", "1".to_string()),
    ] {
        command.arg("-o").arg(format!("{option}={value}"));
    }
    command
}

fn run(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot run {:?}", command.get_program()))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}
