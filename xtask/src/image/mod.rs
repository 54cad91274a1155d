//! `cargo xtask image`: the agent image, built without a registry or a
//! container engine. Two layers: a Debian userland made by `mmdebstrap`
//! from Debian's packages (the tools podtrace runs, listed once in
//! [`PACKAGES_FILE`], which deploy/Dockerfile installs too), cached per
//! recipe since it takes a minute; and podtrace itself, rebuilt each time
//! in a second. Written as an OCI archive ([`oci`]).

pub mod oci;
pub mod programs;
pub mod tree;

use std::{
    fs::File,
    io::BufReader,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use serde_json::json;

pub use oci::Layer;

/// The Debian packages of the image, one a line (`#` comments), from the
/// workspace root: deploy/Dockerfile installs the same file.
pub const PACKAGES_FILE: &str = "deploy/image-packages.txt";

/// The repository the agents' default image names (tracer's
/// cluster/agents.rs): an image built here loads under that name.
pub const REPOSITORY: &str = "ghcr.io/podtrace/podtrace";

/// Where podtrace is in the image (on the image's PATH).
pub const BINARY: &str = "usr/local/bin/podtrace";

/// The image's PATH: the programs podtrace runs are found there.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Debian bookworm with its updates and security fixes, as
/// debian:bookworm-slim (deploy/Dockerfile's runtime stage) has them.
const SOURCES: [&str; 3] = [
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
];

/// A built image: its archive, the name it loads as, and what it holds.
#[derive(Debug)]
pub struct Built {
    pub archive: PathBuf,
    pub name: String,
    pub manifest_digest: String,
    pub version: String,
    pub revision: String,
}

impl Built {
    /// Says what was built and how to load it.
    pub fn tell(&self) -> Result<()> {
        let size = std::fs::metadata(&self.archive)?.len();
        println!(
            "image {} ({}, {:.1} MB, podtrace {} at {})",
            self.name,
            self.manifest_digest,
            size as f64 / 1e6,
            self.version,
            self.revision
        );
        println!("  archive: {}", self.archive.display());
        println!("  load it: podman load -i <archive> | docker load -i <archive>");
        println!(
            "           ctr -n k8s.io images import <archive> | kind load image-archive <archive>"
        );
        Ok(())
    }
}

/// The packages of [`PACKAGES_FILE`] under `root`.
pub fn packages(root: &Path) -> Result<Vec<String>> {
    let path = root.join(PACKAGES_FILE);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    let packages: Vec<String> = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect();
    if packages.is_empty() {
        bail!("{} lists no package", path.display());
    }
    Ok(packages)
}

/// mmdebstrap's arguments for `packages`, written to `out`: the essential
/// set only (no apt, no init), no recommends, no manuals or docs beyond
/// the copyright files, /usr merged without the usrmerge package (which
/// would pull in perl).
fn mmdebstrap_args(packages: &[String]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--quiet",
        "--variant=essential",
        "--aptopt=APT::Install-Recommends \"false\"",
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        "--dpkgopt=path-exclude=/usr/share/info/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/lintian/*",
    ]
    .map(String::from)
    .into();
    args.push(format!("--include={}", packages.join(",")));
    args.push("bookworm".into());
    args
}

/// Where images and their cached base layers go: the target directory.
pub fn image_dir(root: &Path) -> PathBuf {
    crate::target_dir(root).join("image")
}

/// The Debian layer for the current recipe: cached under [`image_dir`]
/// by a digest of the recipe (packages and mmdebstrap's arguments);
/// `fresh` builds it again (for Debian's newer updates).
pub fn base_layer(root: &Path, fresh: bool) -> Result<Layer> {
    let args = mmdebstrap_args(&packages(root)?);
    let key = oci::digest_of(args.join("\n").as_bytes());
    let dir = image_dir(root);
    std::fs::create_dir_all(&dir)?;
    let _lock = lock(&dir.join("base.lock"))?;
    let short = &key["sha256:".len()..][..16];
    let blob = dir.join(format!("base-{short}.tar.gz"));
    let meta = blob.with_extension("json");
    if !fresh {
        if let Ok(text) = std::fs::read_to_string(&meta) {
            let v: serde_json::Value = serde_json::from_str(&text)?;
            return Ok(Layer {
                path: blob,
                digest: v["digest"].as_str().unwrap_or_default().into(),
                diff_id: v["diff_id"].as_str().unwrap_or_default().into(),
                size: v["size"].as_u64().unwrap_or_default(),
            });
        }
    }
    let rootfs = dir.join("mmdebstrap-rootfs.tar");
    eprintln!("image: building the Debian userland with mmdebstrap (about a minute)");
    let status = Command::new("mmdebstrap")
        .args(&args)
        .arg(&rootfs)
        .args(SOURCES)
        .status()
        .context("cannot run mmdebstrap (cargo xtask setup installs it)")?;
    if !status.success() {
        bail!("mmdebstrap failed ({status})");
    }
    let layer = Layer::write(&blob, |tar| copy_rootfs(&rootfs, tar));
    let _ = std::fs::remove_file(&rootfs);
    let layer = layer?;
    // Another recipe's layer is not used again: only the current one stays.
    for other in std::fs::read_dir(&dir)?.flatten() {
        let name = other.file_name().to_string_lossy().into_owned();
        if name.starts_with("base-") && !name.starts_with(&format!("base-{short}.")) {
            let _ = std::fs::remove_file(other.path());
        }
    }
    let meta_json = json!({"digest": layer.digest, "diff_id": layer.diff_id, "size": layer.size});
    std::fs::write(&meta, serde_json::to_vec(&meta_json)?)?;
    Ok(layer)
}

/// Paths of mmdebstrap's tree a container must not carry: the runtime
/// gives its own.
const LEFT_OUT: [&str; 2] = ["etc/hostname", "etc/resolv.conf"];

/// mmdebstrap's tar as a layer: paths without `./`, and no device node
/// (the runtime makes /dev; a rootless engine cannot create them).
fn copy_rootfs(from: &Path, into: &mut tar::Builder<oci::LayerWriter>) -> Result<()> {
    let file = File::open(from).with_context(|| format!("open {}", from.display()))?;
    let mut archive = tar::Archive::new(BufReader::new(file));
    let relative = |p: &Path| p.strip_prefix("./").unwrap_or(p).to_path_buf();
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = relative(&entry.path()?);
        let kind = entry.header().entry_type();
        let device = kind.is_character_special() || kind.is_block_special() || kind.is_fifo();
        if path.as_os_str().is_empty() || device || LEFT_OUT.iter().any(|l| path == Path::new(l)) {
            continue;
        }
        let mut header = entry.header().clone();
        if kind.is_symlink() || kind.is_hard_link() {
            let target = entry.link_name()?.context("a link without a target")?;
            let target = if kind.is_hard_link() {
                relative(&target)
            } else {
                target.into_owned()
            };
            into.append_link(&mut header, &path, &target)?;
        } else {
            into.append_data(&mut header, &path, &mut entry)?;
        }
    }
    Ok(())
}

/// The layer holding podtrace at [`BINARY`] (and `kubectl-podtrace`, the
/// plugin's name, beside it), every entry dated `mtime`.
fn binary_layer(podtrace: &Path, path: &Path, mtime: u64) -> Result<Layer> {
    let binary = std::fs::read(podtrace).with_context(|| format!("read {}", podtrace.display()))?;
    Layer::write(path, |tar| {
        for dir in ["usr/", "usr/local/", "usr/local/bin/"] {
            let mut header = oci::file_header(0);
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_mtime(mtime);
            tar.append_data(&mut header, dir, std::io::empty())?;
        }
        let mut header = oci::file_header(binary.len() as u64);
        header.set_mode(0o755);
        header.set_mtime(mtime);
        tar.append_data(&mut header, BINARY, binary.as_slice())?;
        let mut link = oci::file_header(0);
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_mode(0o777);
        link.set_mtime(mtime);
        tar.append_link(&mut link, "usr/local/bin/kubectl-podtrace", "podtrace")?;
        Ok(())
    })
}

/// What to build: the podtrace binary, where the archive goes, and the
/// name it loads as (default `REPOSITORY:<podtrace's version>`).
pub struct Request<'a> {
    pub podtrace: &'a Path,
    pub output: &'a Path,
    pub name: Option<&'a str>,
    pub fresh_base: bool,
}

/// Builds the image archive of the checkout at `root`.
pub fn build(root: &Path, request: &Request) -> Result<Built> {
    let version = version_of(request.podtrace)?;
    let (revision, committed) = revision(root)?;
    let name = request
        .name
        .map_or_else(|| format!("{REPOSITORY}:{version}"), String::from);
    let base = base_layer(root, request.fresh_base)?;
    let dir = image_dir(root);
    let binary_blob = dir.join(format!("podtrace-layer-{}.tar.gz", std::process::id()));
    let binary = binary_layer(request.podtrace, &binary_blob, committed)?;
    let created = humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(committed),
    )
    .to_string();
    let labels = json!({
        "org.opencontainers.image.title": "podtrace",
        "org.opencontainers.image.description": "podtrace agent: eBPF packet tracer for Kubernetes pod traffic",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.licenses": "MIT OR Apache-2.0",
    });
    let image = oci::Image {
        name: &name,
        config: json!({"Env": [format!("PATH={PATH}")], "Entrypoint": ["podtrace"], "Labels": labels}),
        annotations: labels,
        created: &created,
        history: vec![
            format!("mmdebstrap {}", mmdebstrap_args(&packages(root)?).join(" ")),
            format!("podtrace {version} at /{BINARY}"),
        ],
    };
    let layers = vec![base, binary];
    if let Some(parent) = request.output.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let manifest_digest = oci::write_archive(request.output, &image, &layers);
    let _ = std::fs::remove_file(&binary_blob);
    Ok(Built {
        archive: request.output.into(),
        name,
        manifest_digest: manifest_digest?,
        version,
        revision,
    })
}

/// podtrace's version, as the binary says it (`podtrace 0.1.0 (commit …)`).
pub fn version_of(podtrace: &Path) -> Result<String> {
    let out = Command::new(podtrace)
        .arg("--version")
        .output()
        .with_context(|| format!("cannot run {}", podtrace.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.split_whitespace().nth(1) {
        Some(version) if out.status.success() => Ok(version.into()),
        _ => bail!("{} --version said {:?}", podtrace.display(), text.trim()),
    }
}

/// The checkout's commit (with `-dirty` when the tree has changes), and
/// its commit time: the image's date, so that a commit builds one image.
fn revision(root: &Path) -> Result<(String, u64)> {
    let git = |args: &[&str]| -> Result<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .context("cannot run git")?;
        if !out.status.success() {
            bail!(
                "git {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let head = git(&["log", "-1", "--format=%H %ct"])?;
    let (commit, time) = head.split_once(' ').context("git log said nothing")?;
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    let revision = if dirty {
        format!("{commit}-dirty")
    } else {
        commit.to_string()
    };
    Ok((revision, time.parse()?))
}

/// An exclusive lock on `path` while the guard lives (two test binaries
/// building the base layer at once build it once).
pub(crate) fn lock(path: &Path) -> Result<File> {
    use std::os::fd::AsRawFd;
    let file = File::create(path).with_context(|| format!("create {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; released on close.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        bail!(
            "cannot lock {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(file)
}
