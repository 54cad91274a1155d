//! The lab nodes' container runtime: Debian's runc, as containerd drives
//! it. The image is the agent image `cargo xtask image` builds, made from
//! the podtrace the lab was given (cached per binary); its layers are
//! unpacked once per digest and stacked with overlayfs under each
//! container, as containerd's overlay snapshotter does. A container's
//! service account is mounted where a kubelet mounts it, with the API at
//! `KUBERNETES_SERVICE_HOST`; with hostNetwork it joins its lab node's
//! network namespace, where the kubelet opens the API's address too (a
//! proxy to the stub), as a real node reaches its apiserver.
//!
//! One thing is the lab's own: its pods are named network namespaces
//! without processes (a real node's hold a pause container, which hostPID
//! shows in /proc), so /run/netns is bound into the container for podtrace
//! to find them.

use std::{
    collections::{HashMap, HashSet},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::{Mutex, OnceLock},
};

use anyhow::{bail, Context, Result};

use super::container_spec::{runc_config, Bind, ContainerSpec};
use crate::image;

/// Where the service account is in every container.
const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How containers reach the API: its address, CA and token.
#[derive(Clone)]
pub struct Api {
    pub addr: SocketAddr,
    pub ca_pem: String,
    pub token: String,
}

/// Image name → its unpacked layers, top first.
type Images = HashMap<String, Vec<PathBuf>>;

pub struct Runtime {
    podtrace: PathBuf,
    dir: PathBuf,
    images: OnceLock<Result<Images, String>>,
    pub api: Mutex<Option<Api>>,
    proxied: Mutex<HashSet<String>>,
}

impl Runtime {
    /// A runtime whose state is under `dir`, its image made of `podtrace`.
    pub fn new(podtrace: &Path, dir: &Path) -> Self {
        Self {
            podtrace: podtrace.into(),
            dir: dir.into(),
            images: OnceLock::new(),
            api: Mutex::new(None),
            proxied: Mutex::new(HashSet::new()),
        }
    }

    fn runc_root(&self) -> PathBuf {
        self.dir.join("runc")
    }

    fn bundle(&self, id: &str) -> PathBuf {
        self.dir.join("containers").join(id)
    }

    /// The images this node has, made on first use; why it cannot run
    /// containers otherwise (runc missing, the image not built).
    pub fn images(&self) -> Result<&Images, String> {
        self.images
            .get_or_init(|| {
                self.prepare()
                    .map_err(|e| format!("the lab's container runtime cannot run: {e:#}"))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn prepare(&self) -> Result<Images> {
        let version = Command::new("runc")
            .arg("--version")
            .output()
            .context("cannot run runc (cargo xtask setup installs it)")?;
        if !version.status.success() {
            bail!(
                "runc --version failed: {}",
                String::from_utf8_lossy(&version.stderr).trim()
            );
        }
        let archive = lab_image(&self.podtrace)?;
        let loaded = image::oci::read_archive(&archive, &self.dir.join("blobs"))?;
        let name = loaded.index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
            .as_str()
            .context("the image has no name")?
            .to_string();
        let mut layers = Vec::new();
        for layer in &loaded.layers {
            layers.push(self.unpacked(layer)?);
        }
        layers.reverse();
        let _ = std::fs::remove_dir_all(self.dir.join("blobs"));
        Ok(HashMap::from([(name, layers)]))
    }

    /// `layer` unpacked under the runtime's directory, once per digest.
    fn unpacked(&self, layer: &image::Layer) -> Result<PathBuf> {
        let dir = self
            .dir
            .join("layers")
            .join(layer.digest.trim_start_matches("sha256:"));
        if dir.is_dir() {
            return Ok(dir);
        }
        let partial = dir.with_extension("partial");
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial)?;
        let mut tar = layer.entries()?;
        tar.set_preserve_permissions(true);
        tar.set_preserve_ownerships(true);
        tar.unpack(&partial)
            .with_context(|| format!("unpack layer {}", layer.digest))?;
        std::fs::rename(&partial, &dir)?;
        Ok(dir)
    }

    /// Makes the container's bundle: its root (the image's layers under a
    /// writable overlay), its service account, runc's config. Returns the
    /// command that runs it in the foreground (its stdout and stderr are
    /// the container's).
    pub fn create(
        &self,
        id: &str,
        spec: &mut ContainerSpec,
        node_netns: &str,
    ) -> Result<tokio::process::Command, String> {
        let images = self.images()?;
        let layers = images.get(&spec.image).ok_or_else(|| {
            let have: Vec<&String> = images.keys().collect();
            format!("image {} is not on the node (the lab's nodes have {have:?}; --image names another)", spec.image)
        })?;
        let api = self
            .api
            .lock()
            .unwrap()
            .clone()
            .ok_or("the kubelet has no API to give containers")?;
        self.bundle_for(id, spec, layers, &api, node_netns)
            .map_err(|e| format!("cannot create the container: {e:#}"))?;
        let mut command = tokio::process::Command::new("runc");
        command
            .arg("--root")
            .arg(self.runc_root())
            .args(["run", "--bundle"])
            .arg(self.bundle(id))
            .arg(id);
        Ok(command)
    }

    fn bundle_for(
        &self,
        id: &str,
        spec: &mut ContainerSpec,
        layers: &[PathBuf],
        api: &Api,
        node_netns: &str,
    ) -> Result<()> {
        let bundle = self.bundle(id);
        let _ = self.remove(id);
        let rootfs = bundle.join("rootfs");
        for dir in [&rootfs, &bundle.join("upper"), &bundle.join("work")] {
            std::fs::create_dir_all(dir)?;
        }
        let lower: Vec<String> = layers.iter().map(|l| l.display().to_string()).collect();
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.join(":"),
            bundle.join("upper").display(),
            bundle.join("work").display()
        );
        crate::lab::run(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o", &options])
                .arg(&rootfs),
        )?;
        let account = bundle.join("serviceaccount");
        std::fs::create_dir_all(&account)?;
        std::fs::write(account.join("token"), &api.token)?;
        std::fs::write(account.join("ca.crt"), &api.ca_pem)?;
        std::fs::write(account.join("namespace"), "podtrace")?;
        for bind in spec.binds.iter().filter(|b| b.create) {
            std::fs::create_dir_all(&bind.source)?;
        }
        spec.env
            .push(format!("KUBERNETES_SERVICE_HOST={}", api.addr.ip()));
        spec.env
            .push(format!("KUBERNETES_SERVICE_PORT={}", api.addr.port()));
        let lab_binds = [
            Bind {
                source: account,
                destination: SERVICE_ACCOUNT.into(),
                read_only: true,
                create: false,
            },
            Bind {
                source: "/run/netns".into(),
                destination: "/run/netns".into(),
                read_only: true,
                create: false,
            },
        ];
        let netns = Path::new("/run/netns").join(node_netns);
        let config = runc_config(spec, &rootfs, &netns, &lab_binds);
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&config)?,
        )?;
        Ok(())
    }

    /// Sends `signal` (`TERM`, `KILL`) to the container's process.
    pub fn kill(&self, id: &str, signal: &str) {
        let _ = Command::new("runc")
            .arg("--root")
            .arg(self.runc_root())
            .args(["kill", id, signal])
            .output();
    }

    /// The container and its bundle gone: runc's state, the overlay, the
    /// directories.
    pub fn remove(&self, id: &str) -> Result<()> {
        let _ = Command::new("runc")
            .arg("--root")
            .arg(self.runc_root())
            .args(["delete", "--force", id])
            .output();
        let bundle = self.bundle(id);
        let rootfs = bundle.join("rootfs");
        if is_mount_point(&rootfs) {
            crate::lab::run(Command::new("umount").arg(&rootfs))?;
        }
        if bundle.exists() {
            std::fs::remove_dir_all(&bundle)?;
        }
        Ok(())
    }

    /// Everything gone: called once every container was removed.
    pub fn remove_all(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// The API's address opened in the node's network namespace too, once
    /// per namespace: connections there are carried to the stub.
    pub async fn open_api_in(&self, netns: &str) -> Result<(), String> {
        if !self.proxied.lock().unwrap().insert(netns.to_string()) {
            return Ok(());
        }
        let api = self.api.lock().unwrap().clone().ok_or("no API")?;
        let path = Path::new("/run/netns").join(netns);
        let listener = tokio::task::spawn_blocking(move || listen_in(&path, api.addr))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot open the API in {netns}: {e:#}"))?;
        let listener = tokio::net::TcpListener::from_std(listener).map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            while let Ok((mut inside, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut stub) = tokio::net::TcpStream::connect(api.addr).await {
                        let _ = tokio::io::copy_bidirectional(&mut inside, &mut stub).await;
                    }
                });
            }
        });
        Ok(())
    }
}

/// A listener on `addr` inside the network namespace at `netns` (a
/// socket stays in the namespace it was made in).
fn listen_in(netns: &Path, addr: SocketAddr) -> Result<std::net::TcpListener> {
    let netns = netns.to_path_buf();
    std::thread::spawn(move || -> Result<std::net::TcpListener> {
        use std::os::fd::AsRawFd;
        let file =
            std::fs::File::open(&netns).with_context(|| format!("open {}", netns.display()))?;
        // SAFETY: this thread is ours alone and ends after the bind.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!(
                "setns {}: {}",
                netns.display(),
                std::io::Error::last_os_error()
            );
        }
        let listener = std::net::TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the listening thread panicked"))?
}

fn is_mount_point(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let path = path.display().to_string();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(path.as_str()))
}

/// The agent image of `podtrace`: built once per binary and per build of
/// the code that builds it (this executable), under the checkout's
/// target/image, as `cargo xtask image` builds it. Those of other builds
/// go after an hour.
pub fn lab_image(podtrace: &Path) -> Result<PathBuf> {
    let root = crate::workspace_root()?;
    let mut inputs =
        std::fs::read(podtrace).with_context(|| format!("read {}", podtrace.display()))?;
    inputs.extend(std::fs::read(std::env::current_exe()?)?);
    let key = image::oci::digest_of(&inputs);
    let dir = image::image_dir(&root);
    std::fs::create_dir_all(&dir)?;
    let archive = dir.join(format!("lab-{}.oci.tar", &key["sha256:".len()..][..16]));
    for old in std::fs::read_dir(&dir)?.flatten() {
        let name = old.file_name().to_string_lossy().into_owned();
        let stale = old
            .metadata()
            .ok()
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 3600);
        if name.starts_with("lab-") && old.path() != archive && stale {
            let _ = std::fs::remove_file(old.path());
        }
    }
    let _lock = image::lock(&archive.with_extension("lock"))?;
    if !archive.exists() {
        image::build(
            &root,
            &image::Request {
                podtrace,
                output: &archive,
                // The name the stub's nodes have it under, and the
                // DaemonSet it serves names (images.rs).
                name: Some(super::images::LAB_IMAGE),
                fresh_base: false,
            },
        )?;
    }
    Ok(archive)
}
