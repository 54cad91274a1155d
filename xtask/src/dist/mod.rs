//! `cargo xtask dist`: a release, built here. The tarball a user or krew
//! downloads (podtrace, the kubectl plugin under [`PLUGIN`]'s name, kubectl's
//! plugin completer, shell completions, man pages, the licence), its
//! `.sha256`, the krew manifest that names it ([`krew`]), and the agent
//! image archive (`cargo xtask image`'s).
//!
//! The plugin is `kubectl podpath`, not `kubectl podtrace`: krew's index
//! already has a `podtrace` (gma1k/podtrace, another tool). README.md,
//! "Not gma1k/podtrace", says why this name.

pub mod krew;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::image::{self, oci::Layer};

/// The kubectl plugin's name: `kubectl podpath`, installed by krew as
/// `kubectl-podpath` (podtrace runs as the plugin under any `kubectl-`
/// name, so `kubectl-podtrace` links keep working).
pub const PLUGIN: &str = "podpath";

/// Where the release's archives are published, when `--url-base` is not
/// given: the manifest's `uri` is `<base>/v<version>/<tarball>`.
pub const URL_BASE_ENV: &str = "PODTRACE_RELEASE_URL";

/// The base without `--url-base` or [`URL_BASE_ENV`]: podtrace has no
/// public home yet, and a `.invalid` host (RFC 2606) cannot be mistaken
/// for one.
pub const PLACEHOLDER_URL_BASE: &str = "https://podtrace-releases.invalid/download";

const SHORT_DESCRIPTION: &str = "Trace the packet path between two pods, hook by hook";

const DESCRIPTION: &str = "\
Traces packets between two pods through every hook of the nodes involved
(veth, bridge, VXLAN/IPIP tunnel, iptables/nftables, conntrack, routing)
with eBPF, and tells per packet where it went and what happened to it:
delivered, dropped by which rule, NATed by which Service, or lost for no
route. `kubectl podpath web-0 db-0` starts an agent pod on each node
involved and merges their sightings into one story per packet.
Also: `doctor` (why a pod has no IP), `profile` (per-step latency).
This is not the `podtrace` plugin of krew's index (gma1k/podtrace).
";

const CAVEATS: &str = "\
podpath starts an agent pod on each traced node: privileged, with the
host's network and PID namespaces, in the namespace `podtrace` (it
attaches eBPF programs, so it runs as root on the node). You need the
RBAC to create such pods, and Linux nodes with kernel 5.8 or later and BTF.
The agent image is given with --image or $PODTRACE_IMAGE.

Shell completion for `kubectl podpath`: put kubectl_complete-podpath,
from this plugin's directory, on your PATH (krew does not link it).
";

/// The licence a krew install must find (krew's validator looks for a
/// file named LICENSE): the two texts beside it, either at one's option.
const LICENSE: &str = "\
podtrace is licensed under either of

  * the Apache License, Version 2.0 (LICENSE-APACHE), or
  * the MIT license (LICENSE-MIT),

at your option.
";

/// `cargo xtask dist`'s arguments.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where the files go (default: target/dist).
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Where the tarball will be published: the manifest's uri is
    /// <base>/v<version>/<tarball> (default: $PODTRACE_RELEASE_URL, else a
    /// placeholder).
    #[arg(long)]
    pub url_base: Option<String>,
    /// Leave the agent image out (it takes a minute or more).
    #[arg(long)]
    pub no_image: bool,
}

impl Args {
    /// `--no-image`, the rest by default.
    pub fn without_image() -> Self {
        Self {
            output: None,
            url_base: None,
            no_image: true,
        }
    }
}

/// `cargo xtask dist` with a built podtrace: builds, then says what.
pub fn run(podtrace: &Path, args: Args) -> Result<()> {
    let root = crate::workspace_root()?;
    let output = args
        .output
        .unwrap_or_else(|| crate::target_dir(&root).join("dist"));
    let url_base = url_base(args.url_base);
    let request = Request {
        podtrace,
        output: &output,
        url_base: &url_base,
        image: !args.no_image,
    };
    build(&root, &request)?.tell()
}

/// What to build and where.
pub struct Request<'a> {
    pub podtrace: &'a Path,
    pub output: &'a Path,
    pub url_base: &'a str,
    /// Also the agent image archive (a minute or more).
    pub image: bool,
}

/// A built release: its files in the output directory.
#[derive(Debug)]
pub struct Release {
    pub tarball: PathBuf,
    /// The tarball's SHA-256, in hex.
    pub sha256: String,
    pub checksum: PathBuf,
    pub manifest: PathBuf,
    pub image: Option<PathBuf>,
    /// The tarball's files, as named inside it.
    pub contents: Vec<String>,
}

/// The base of the release URLs: `--url-base`, else [`URL_BASE_ENV`], else
/// [`PLACEHOLDER_URL_BASE`].
pub fn url_base(flag: Option<String>) -> String {
    flag.or_else(|| std::env::var(URL_BASE_ENV).ok())
        .unwrap_or_else(|| PLACEHOLDER_URL_BASE.into())
        .trim_end_matches('/')
        .to_string()
}

/// Builds the release of the checkout at `root` from a built podtrace.
pub fn build(root: &Path, request: &Request) -> Result<Release> {
    let version = image::version_of(request.podtrace)?;
    let arch = krew_arch(std::env::consts::ARCH)?;
    let output = request.output;
    std::fs::create_dir_all(output).with_context(|| format!("create {}", output.display()))?;
    let staging = output.join(format!(".staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let tarball = output.join(format!("podtrace-{version}-linux-{arch}.tar.gz"));
    let packed = stage(root, request.podtrace, &staging).and_then(|contents| {
        let layer = Layer::write(&tarball, |tar| {
            for name in &contents {
                tar.append_path_with_name(staging.join(name), name)?;
            }
            Ok(())
        })?;
        Ok((contents, layer))
    });
    let _ = std::fs::remove_dir_all(&staging);
    let (contents, layer) = packed?;
    let sha256 = layer.digest.trim_start_matches("sha256:").to_string();
    let tarball_name = file_name(&tarball);
    let checksum = output.join(format!("{tarball_name}.sha256"));
    std::fs::write(&checksum, format!("{sha256}  {tarball_name}\n"))?;
    let manifest = output.join(format!("{PLUGIN}.yaml"));
    let tag = format!("v{version}");
    let uri = format!("{}/{tag}/{tarball_name}", request.url_base);
    let bin = format!("kubectl-{PLUGIN}");
    let yaml = krew::manifest(
        &krew::Plugin {
            name: PLUGIN,
            version: &tag,
            homepage: request.url_base,
            short_description: SHORT_DESCRIPTION,
            description: DESCRIPTION,
            caveats: CAVEATS,
        },
        &[krew::Platform {
            os: "linux",
            arch,
            uri: &uri,
            sha256: &sha256,
            bin: &bin,
        }],
    )?;
    std::fs::write(&manifest, yaml)?;
    krew::validate_file(&manifest)?;
    let image = match request.image {
        true => Some(agent_image(root, request.podtrace, output)?),
        false => None,
    };
    Ok(Release {
        tarball,
        sha256,
        checksum,
        manifest,
        image,
        contents,
    })
}

impl Release {
    /// Says what was built: each file, the digest, the manifest's uri.
    pub fn tell(&self) -> Result<()> {
        let size = |path: &Path| -> Result<f64> { Ok(std::fs::metadata(path)?.len() as f64 / 1e6) };
        println!(
            "dist: {} ({:.1} MB)",
            self.tarball.display(),
            size(&self.tarball)?
        );
        for name in &self.contents {
            println!("  {name}");
        }
        println!("  sha256 {}", self.sha256);
        println!("dist: {}", self.checksum.display());
        println!(
            "dist: {} (krew manifest, checked as krew checks it)",
            self.manifest.display()
        );
        if let Some(image) = &self.image {
            println!("dist: {} ({:.1} MB)", image.display(), size(image)?);
        }
        Ok(())
    }
}

/// krew's name (Go's GOARCH) for the machine this builds on.
fn krew_arch(rust_arch: &str) -> Result<&'static str> {
    match rust_arch {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        other => bail!("no release for {other}: podtrace is built for x86_64 and aarch64"),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Lays the tarball's files out under `staging`; their names, sorted.
fn stage(root: &Path, podtrace: &Path, staging: &Path) -> Result<Vec<String>> {
    let completions = staging.join("completions");
    std::fs::create_dir_all(&completions)?;
    let copy = |from: &Path, to: &str| -> Result<()> {
        std::fs::copy(from, staging.join(to))
            .map(drop)
            .with_context(|| format!("copy {}", from.display()))
    };
    copy(podtrace, "podtrace")?;
    // A copy, not a link: krew unpacks regular files and folders only.
    copy(podtrace, &format!("kubectl-{PLUGIN}"))?;
    copy(&root.join("LICENSE-MIT"), "LICENSE-MIT")?;
    copy(&root.join("LICENSE-APACHE"), "LICENSE-APACHE")?;
    copy(&root.join("README.md"), "README.md")?;
    std::fs::write(staging.join("LICENSE"), LICENSE)?;
    let completer = staging.join(format!("kubectl_complete-{PLUGIN}"));
    std::fs::write(&completer, kubectl_completer())?;
    make_executable(&completer)?;
    for (shell, file) in [
        ("bash", "podtrace.bash"),
        ("zsh", "_podtrace"),
        ("fish", "podtrace.fish"),
    ] {
        let script = podtrace_says(podtrace, &["completions", shell])?;
        std::fs::write(completions.join(file), script)?;
    }
    let man = staging.join("man");
    podtrace_says(podtrace, &["man".as_ref(), man.as_os_str()])?;
    let mut names = Vec::new();
    files_under(staging, staging, &mut names)?;
    names.sort();
    Ok(names)
}

/// `kubectl_complete-<plugin>`: kubectl (1.26 and later) runs it for
/// `kubectl <plugin> <TAB>` with the words typed after the plugin's name,
/// and passes on what it prints (cobra's format, which `podtrace
/// __complete` writes). kubectl-<plugin> is on the PATH wherever kubectl
/// finds the plugin.
fn kubectl_completer() -> String {
    format!(
        "#!/bin/sh\n\
         # kubectl runs this for `kubectl {PLUGIN} <TAB>`: the plugin answers.\n\
         exec kubectl-{PLUGIN} __complete \"$@\"\n"
    )
}

fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// What podtrace prints for `args`; an error saying so when it fails.
fn podtrace_says<S: AsRef<std::ffi::OsStr>>(podtrace: &Path, args: &[S]) -> Result<Vec<u8>> {
    let out = Command::new(podtrace)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {}", podtrace.display()))?;
    if !out.status.success() {
        let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
        bail!(
            "podtrace {} failed: {}",
            shown.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// Every file under `dir`, named from `base`.
fn files_under(base: &Path, dir: &Path, names: &mut Vec<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files_under(base, &path, names)?;
        } else {
            let name = path.strip_prefix(base).unwrap_or(&path);
            names.push(name.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

/// The agent image archive beside the tarball (`cargo xtask image`'s).
fn agent_image(root: &Path, podtrace: &Path, output: &Path) -> Result<PathBuf> {
    let archive = output.join("podtrace.oci.tar");
    let built = image::build(
        root,
        &image::Request {
            podtrace,
            output: &archive,
            name: None,
            fresh_base: false,
        },
    )?;
    Ok(built.archive)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo xtask dist --no-image` from the podtrace built here, into a
    /// folder of its own.
    fn built_release(name: &str) -> (Release, PathBuf) {
        let root = crate::workspace_root().unwrap();
        let podtrace = crate::built_podtrace().unwrap();
        let output = std::env::temp_dir().join(format!("podtrace-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&output);
        let request = Request {
            podtrace: &podtrace,
            output: &output,
            url_base: "https://example.invalid/podtrace/releases",
            image: false,
        };
        (build(&root, &request).unwrap(), output)
    }

    fn run_in(dir: &Path, program: &str, args: &[&str]) -> std::process::Output {
        Command::new(program)
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
    }

    #[test]
    fn the_release_is_what_krew_and_sha256sum_accept() {
        let (release, output) = built_release("dist");
        let manifest = krew::validate_file(&release.manifest).unwrap();
        assert_eq!(manifest["metadata"]["name"], PLUGIN);
        let platform = &manifest["spec"]["platforms"][0];
        // The digest krew checks is the tarball's own, and sha256sum agrees.
        let bytes = std::fs::read(&release.tarball).unwrap();
        let digest = image::oci::digest_of(&bytes);
        assert_eq!(platform["sha256"], digest.trim_start_matches("sha256:"));
        let checked = run_in(&output, "sha256sum", &["-c", &file_name(&release.checksum)]);
        assert!(checked.status.success(), "{checked:?}");
        let version = image::version_of(&crate::built_podtrace().unwrap()).unwrap();
        let uri = platform["uri"].as_str().unwrap();
        assert_eq!(
            uri,
            format!(
                "https://example.invalid/podtrace/releases/v{version}/{}",
                file_name(&release.tarball)
            )
        );
        // krew unpacks regular files and folders only, and links `bin`.
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
        let mut inside = Vec::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let kind = entry.header().entry_type();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            assert!(kind.is_file() || kind.is_dir(), "{name} is a {kind:?}");
            inside.push((name, entry.header().mode().unwrap()));
        }
        let names: Vec<&str> = inside.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, release.contents);
        let bin = platform["bin"].as_str().unwrap();
        for wanted in [
            bin,
            "podtrace",
            "LICENSE",
            "LICENSE-MIT",
            "LICENSE-APACHE",
            "completions/podtrace.bash",
            "completions/_podtrace",
            "completions/podtrace.fish",
            "man/podtrace.1",
            "man/podtrace-doctor.1",
            &format!("kubectl_complete-{PLUGIN}"),
        ] {
            let mode = inside.iter().find(|(n, _)| n == wanted).map(|(_, m)| *m);
            assert!(mode.is_some(), "{wanted} is not in the tarball: {names:?}");
            if wanted == bin || wanted.starts_with("kubectl_complete") {
                assert_eq!(mode.unwrap() & 0o111, 0o111, "{wanted} is not executable");
            }
        }
        std::fs::remove_dir_all(&output).unwrap();
    }

    /// A user's steps: unpack, put the folder on PATH; then `kubectl podpath`
    /// runs podtrace, and kubectl's completion asks kubectl_complete-podpath.
    #[test]
    fn kubectl_runs_and_completes_the_unpacked_plugin() {
        let (release, output) = built_release("unpacked");
        let unpacked = output.join("unpacked");
        std::fs::create_dir_all(&unpacked).unwrap();
        let tarball = release.tarball.display().to_string();
        let untar = run_in(&unpacked, "tar", &["-xzf", &tarball]);
        assert!(untar.status.success(), "{untar:?}");
        let path = format!(
            "{}:{}",
            unpacked.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let kubectl = |args: &[&str]| {
            Command::new("kubectl")
                .args(args)
                .env("PATH", &path)
                .env("KUBECONFIG", "/dev/null")
                .output()
                .expect("kubectl is installed by cargo xtask setup (package kubernetes-client)")
        };
        let version = kubectl(&[PLUGIN, "--version"]);
        let said = String::from_utf8_lossy(&version.stdout);
        assert!(said.starts_with("podtrace "), "{version:?}");
        let completed = kubectl(&["__complete", PLUGIN, "doctor", "--out"]);
        let said = String::from_utf8_lossy(&completed.stdout);
        assert!(said.starts_with("--output\t"), "{completed:?}");
        assert!(said.contains("\n:4\n"), "{completed:?}");
        let values = kubectl(&["__complete", PLUGIN, "web-0", "db-0", "-o", ""]);
        let said = String::from_utf8_lossy(&values.stdout);
        assert!(said.starts_with("human\njson\n:4\n"), "{values:?}");
        std::fs::remove_dir_all(&output).unwrap();
    }
}
