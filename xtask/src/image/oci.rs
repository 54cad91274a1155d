//! The OCI image layout, written as one tar (what `podman load`,
//! `docker load`, `ctr images import` and `kind load image-archive`
//! take), and read back: `oci-layout`, `index.json` naming the image,
//! and `blobs/sha256/` holding the manifest, the config and the gzip
//! layers. A `manifest.json` as `docker save` writes it rides along, so
//! that a Docker older than 25 (which knows no `index.json`) loads it too.

use std::{
    fs::File,
    io::{BufReader, BufWriter, Read, Write},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// One gzip layer on disk: its blob's digest and size, and the digest of
/// the tar inside (the config's `diff_id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    pub path: PathBuf,
    pub digest: String,
    pub diff_id: String,
    pub size: u64,
}

impl Layer {
    /// Writes a layer to `path`: `fill` appends its entries to the tar.
    pub fn write(
        path: &Path,
        fill: impl FnOnce(&mut tar::Builder<LayerWriter>) -> Result<()>,
    ) -> Result<Self> {
        let file = File::create(path).with_context(|| format!("create {}", path.display()))?;
        let gzip = flate2::write::GzEncoder::new(
            Hashing::new(BufWriter::new(file)),
            flate2::Compression::new(6),
        );
        let mut builder = tar::Builder::new(Hashing::new(gzip));
        builder.mode(tar::HeaderMode::Deterministic);
        fill(&mut builder)?;
        let tar = builder.into_inner()?;
        let diff_id = tar.digest();
        let compressed = tar.inner.finish()?;
        let (digest, size) = (compressed.digest(), compressed.len);
        compressed.inner.into_inner()?.sync_all()?;
        Ok(Self {
            path: path.into(),
            digest,
            diff_id,
            size,
        })
    }

    /// The tar inside the layer, to read.
    pub fn entries(&self) -> Result<tar::Archive<flate2::read::GzDecoder<BufReader<File>>>> {
        let file =
            File::open(&self.path).with_context(|| format!("open {}", self.path.display()))?;
        Ok(tar::Archive::new(flate2::read::GzDecoder::new(
            BufReader::new(file),
        )))
    }

    /// The layer as its blob descriptor names it.
    fn descriptor(&self) -> Value {
        json!({"mediaType": LAYER, "digest": self.digest, "size": self.size})
    }
}

/// What writes a layer's tar: hashed as the tar (diff_id), gzipped, and
/// hashed again as the blob.
pub type LayerWriter = Hashing<flate2::write::GzEncoder<Hashing<BufWriter<File>>>>;

/// A writer that keeps the SHA-256 and the length of what went through.
pub struct Hashing<W> {
    inner: W,
    sha: ring::digest::Context,
    len: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            sha: ring::digest::Context::new(&ring::digest::SHA256),
            len: 0,
        }
    }

    /// `sha256:<hex>`, as OCI names blobs.
    fn digest(&self) -> String {
        sha256_name(self.sha.clone().finish().as_ref())
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn sha256_name(hash: &[u8]) -> String {
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// `sha256:<hex>` of `bytes`.
pub fn digest_of(bytes: &[u8]) -> String {
    sha256_name(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// What the archive says about the image beside its layers.
pub struct Image<'a> {
    /// The full reference it loads as (`ghcr.io/podtrace/podtrace:0.1.0`).
    pub name: &'a str,
    /// The config's `config`: Env, Entrypoint, Labels.
    pub config: Value,
    /// The manifest's annotations.
    pub annotations: Value,
    /// RFC 3339; the same for every build of one commit.
    pub created: &'a str,
    /// How each layer was made, one per layer.
    pub history: Vec<String>,
}

/// The archive's blobs, in the order the archive holds them.
struct Blobs {
    config: Vec<u8>,
    manifest: Vec<u8>,
}

/// Writes the image as an OCI archive at `out`; its manifest's digest.
pub fn write_archive(out: &Path, image: &Image, layers: &[Layer]) -> Result<String> {
    let blobs = blobs(image, layers);
    let manifest_digest = digest_of(&blobs.manifest);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [{
            "mediaType": MANIFEST,
            "digest": manifest_digest,
            "size": blobs.manifest.len(),
            "annotations": {
                // containerd (ctr, kind) and Docker read the first,
                // podman the second; both as a full reference.
                "io.containerd.image.name": image.name,
                "org.opencontainers.image.ref.name": image.name,
            },
        }],
    });
    let docker = json!([{
        "Config": blob_path(&digest_of(&blobs.config)),
        "RepoTags": [image.name],
        "Layers": layers.iter().map(|l| blob_path(&l.digest)).collect::<Vec<_>>(),
    }]);
    let tmp = out.with_extension("partial");
    let file = File::create(&tmp).with_context(|| format!("create {}", tmp.display()))?;
    let mut tar = tar::Builder::new(BufWriter::new(file));
    tar.mode(tar::HeaderMode::Deterministic);
    let mut add = |path: &str, bytes: &[u8]| {
        let mut header = file_header(bytes.len() as u64);
        tar.append_data(&mut header, path, bytes)
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    add("index.json", &serde_json::to_vec(&index)?)?;
    add("manifest.json", &serde_json::to_vec(&docker)?)?;
    add(&blob_path(&digest_of(&blobs.config)), &blobs.config)?;
    add(&blob_path(&manifest_digest), &blobs.manifest)?;
    for layer in layers {
        let mut header = file_header(layer.size);
        let blob =
            File::open(&layer.path).with_context(|| format!("open {}", layer.path.display()))?;
        tar.append_data(&mut header, blob_path(&layer.digest), BufReader::new(blob))?;
    }
    tar.into_inner()?.into_inner()?.sync_all()?;
    std::fs::rename(&tmp, out).with_context(|| format!("rename to {}", out.display()))?;
    Ok(manifest_digest)
}

fn blobs(image: &Image, layers: &[Layer]) -> Blobs {
    let config = json!({
        "created": image.created,
        "architecture": oci_architecture(),
        "os": "linux",
        "config": image.config,
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| &l.diff_id).collect::<Vec<_>>()},
        "history": image.history.iter().map(|h| json!({"created": image.created, "created_by": h})).collect::<Vec<_>>(),
    });
    let config = serde_json::to_vec(&config).expect("JSON values serialize");
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": digest_of(&config), "size": config.len()},
        "layers": layers.iter().map(Layer::descriptor).collect::<Vec<_>>(),
        "annotations": image.annotations,
    });
    let manifest = serde_json::to_vec(&manifest).expect("JSON values serialize");
    Blobs { config, manifest }
}

/// This machine's architecture as OCI names it (mmdebstrap builds for it).
fn oci_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn blob_path(digest: &str) -> String {
    format!("blobs/{}", digest.replacen(':', "/", 1))
}

/// A regular file's header, owned by root, mode 0644, dated 1970.
pub fn file_header(size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header
}

/// An OCI archive read back: its index, the manifest and config it
/// names, and each layer's blob copied out (under `unpack`).
pub struct Loaded {
    pub index: Value,
    pub manifest: Value,
    pub config: Value,
    pub manifest_digest: String,
    pub layers: Vec<Layer>,
}

/// Reads the archive at `path`, checking every digest, and copies its
/// layers to `unpack_dir` (one file per layer digest).
pub fn read_archive(path: &Path, unpack_dir: &Path) -> Result<Loaded> {
    std::fs::create_dir_all(unpack_dir)?;
    let file = File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut small = std::collections::HashMap::new();
    let mut blobs = std::collections::HashMap::new();
    for entry in tar::Archive::new(BufReader::new(file)).entries()? {
        let mut entry = entry?;
        let name = entry.path()?.to_string_lossy().into_owned();
        if let Some(hex) = name.strip_prefix("blobs/sha256/") {
            let copy = unpack_dir.join(hex);
            let mut out = Hashing::new(BufWriter::new(File::create(&copy)?));
            std::io::copy(&mut entry, &mut out)?;
            out.flush()?;
            if out.digest() != format!("sha256:{hex}") {
                bail!("{}: blob {name} does not match its digest", path.display());
            }
            blobs.insert(format!("sha256:{hex}"), (copy, out.len));
        } else {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            small.insert(name, bytes);
        }
    }
    let json_of = |bytes: &[u8]| serde_json::from_slice::<Value>(bytes);
    let index = json_of(
        small
            .get("index.json")
            .context("no index.json: not an OCI archive")?,
    )?;
    let manifest_digest = index["manifests"][0]["digest"]
        .as_str()
        .context("index.json names no manifest")?
        .to_string();
    let blob = |digest: &str| {
        blobs
            .get(digest)
            .with_context(|| format!("no blob {digest}"))
    };
    let manifest = json_of(&std::fs::read(&blob(&manifest_digest)?.0)?)?;
    let config = json_of(&std::fs::read(
        &blob(manifest["config"]["digest"].as_str().unwrap_or_default())?.0,
    )?)?;
    let diff_ids = config["rootfs"]["diff_ids"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut layers = Vec::new();
    for (layer, diff_id) in manifest["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .zip(&diff_ids)
    {
        let digest = layer["digest"].as_str().unwrap_or_default();
        let (path, size) = blob(digest)?.clone();
        layers.push(Layer {
            path,
            digest: digest.into(),
            diff_id: diff_id.as_str().unwrap_or_default().into(),
            size,
        });
    }
    Ok(Loaded {
        index,
        manifest,
        config,
        manifest_digest,
        layers,
    })
}
