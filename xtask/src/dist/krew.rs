//! A krew plugin manifest, written and checked as krew checks one: the
//! rules of krew's `internal/index/validation` (ValidatePlugin) and of its
//! `validate-krew-manifest` (every platform's selector matches a platform
//! krew knows, none of those matched twice), read from krew's source and
//! written again here, since krew's Go validator cannot be built offline.

use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};

/// The manifest format krew reads (krew's `constants.CurrentAPIVersion`).
pub const API_VERSION: &str = "krew.googlecontainertools.github.com/v1alpha2";

/// The os/arch pairs krew's validator knows (its `allPlatforms`).
const KNOWN_PLATFORMS: &[(&str, &str)] = &[
    ("windows", "386"),
    ("windows", "amd64"),
    ("windows", "arm64"),
    ("linux", "386"),
    ("linux", "amd64"),
    ("linux", "arm"),
    ("linux", "arm64"),
    ("linux", "ppc64le"),
    ("darwin", "386"),
    ("darwin", "amd64"),
    ("darwin", "arm64"),
];

/// Names Windows cannot give a file: krew refuses them as plugin names.
const WINDOWS_FORBIDDEN: &[&str] = &[
    "CON", "PRN", "AUX", "NUL", "COM1", "COM2", "COM3", "COM4", "COM5", "COM6", "COM7", "COM8",
    "COM9", "LPT1", "LPT2", "LPT3", "LPT4", "LPT5", "LPT6", "LPT7", "LPT8", "LPT9",
];

/// What a manifest says about the plugin, beside its platforms.
pub struct Plugin<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub homepage: &'a str,
    pub short_description: &'a str,
    pub description: &'a str,
    pub caveats: &'a str,
}

/// One archive for one os/arch.
pub struct Platform<'a> {
    pub os: &'a str,
    pub arch: &'a str,
    pub uri: &'a str,
    /// The archive's SHA-256, 64 lowercase hex digits.
    pub sha256: &'a str,
    /// The executable inside the archive that krew links as `kubectl-<name>`.
    pub bin: &'a str,
}

/// The manifest as YAML.
pub fn manifest(plugin: &Plugin, platforms: &[Platform]) -> Result<String> {
    let platforms: Vec<Value> = platforms
        .iter()
        .map(|p| {
            json!({
                "selector": {"matchLabels": {"os": p.os, "arch": p.arch}},
                "uri": p.uri,
                "sha256": p.sha256,
                "bin": p.bin,
            })
        })
        .collect();
    let manifest = json!({
        "apiVersion": API_VERSION,
        "kind": "Plugin",
        "metadata": {"name": plugin.name},
        "spec": {
            "version": plugin.version,
            "homepage": plugin.homepage,
            "shortDescription": plugin.short_description,
            "description": plugin.description,
            "caveats": plugin.caveats,
            "platforms": platforms,
        },
    });
    Ok(serde_yaml_ng::to_string(&manifest)?)
}

/// Reads the manifest at `path` and checks it as krew would, the plugin's
/// name taken from the file's name (`<name>.yaml`); the manifest read.
pub fn validate_file(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let manifest: Value =
        serde_yaml_ng::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
    let name = match path.file_name().and_then(|n| n.to_str()) {
        Some(file) if file.ends_with(".yaml") => file.trim_end_matches(".yaml"),
        _ => bail!("{}: a krew manifest is named <plugin>.yaml", path.display()),
    };
    validate(name, &manifest)
        .with_context(|| format!("{} is no valid krew manifest", path.display()))?;
    Ok(manifest)
}

/// krew's checks of the manifest of the plugin `name`.
pub fn validate(name: &str, manifest: &Value) -> Result<()> {
    let text = |v: &Value| v.as_str().unwrap_or("").to_string();
    ensure!(
        text(&manifest["apiVersion"]) == API_VERSION,
        "apiVersion {:?} is not {API_VERSION}",
        manifest["apiVersion"]
    );
    ensure!(
        text(&manifest["kind"]) == "Plugin",
        "kind {:?} is not Plugin",
        manifest["kind"]
    );
    ensure!(
        is_safe_name(name),
        "the plugin name {name:?} is not allowed"
    );
    let named = text(&manifest["metadata"]["name"]);
    ensure!(
        named == name,
        "the plugin should be named {name:?}, not {named:?}"
    );
    let spec = &manifest["spec"];
    let short = text(&spec["shortDescription"]);
    ensure!(!short.is_empty(), "no shortDescription");
    ensure!(
        !short.contains(['\r', '\n']),
        "a line break in shortDescription"
    );
    let platforms = spec["platforms"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    ensure!(!platforms.is_empty(), "no platforms");
    let version = text(&spec["version"]);
    match version.strip_prefix('v') {
        Some(semantic) => semver::Version::parse(semantic)
            .map(drop)
            .with_context(|| format!("version {version:?} is not semantic"))?,
        None => bail!("version {version:?} does not start with v"),
    }
    for (i, platform) in platforms.iter().enumerate() {
        validate_platform(platform).with_context(|| format!("spec.platforms[{i}]"))?;
    }
    no_platform_matched_twice(platforms)
}

/// krew's `IsSafePluginName`: `^[\w-]+$`, and no name Windows forbids.
fn is_safe_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !WINDOWS_FORBIDDEN
            .iter()
            .any(|f| f.eq_ignore_ascii_case(name))
}

fn validate_platform(platform: &Value) -> Result<()> {
    let text = |key: &str| platform[key].as_str().unwrap_or("");
    ensure!(!text("uri").is_empty(), "`uri` has to be set");
    let sha256 = text("sha256");
    ensure!(
        sha256.len() == 64 && sha256.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')),
        "`sha256` {sha256:?} is not 64 lowercase hex digits"
    );
    ensure!(!text("bin").is_empty(), "`bin` has to be set");
    if let Some(files) = platform.get("files") {
        let files = files.as_array().context("`files` is no list")?;
        ensure!(!files.is_empty(), "`files` has to be absent or non-empty");
        for op in files {
            ensure!(
                op["from"].as_str().is_some_and(|s| !s.is_empty())
                    && op["to"].as_str().is_some_and(|s| !s.is_empty()),
                "a `files` entry needs `from` and `to`"
            );
        }
    }
    let labels = match &platform["selector"] {
        Value::Null => bail!("no selector"),
        selector if selector.get("matchExpressions").is_some() => {
            bail!("matchExpressions: this check reads matchLabels only")
        }
        selector => selector["matchLabels"]
            .as_object()
            .context("an empty selector")?,
    };
    ensure!(!labels.is_empty(), "`matchLabels` specified but empty");
    for key in labels.keys() {
        ensure!(
            key == "os" || key == "arch",
            "selector key {key:?} not supported"
        );
    }
    ensure!(
        KNOWN_PLATFORMS
            .iter()
            .any(|&known| matches(platform, known)),
        "its selector matches no platform krew knows"
    );
    Ok(())
}

/// Whether a platform's matchLabels select `os`/`arch`.
fn matches(platform: &Value, (os, arch): (&str, &str)) -> bool {
    let labels = &platform["selector"]["matchLabels"];
    [("os", os), ("arch", arch)]
        .iter()
        .all(|(key, value)| labels.get(key).is_none_or(|l| l == value))
}

/// krew's `isOverlappingPlatformSelectors`: no os/arch picks two archives.
fn no_platform_matched_twice(platforms: &[Value]) -> Result<()> {
    for &(os, arch) in KNOWN_PLATFORMS {
        let matched: Vec<usize> = (0..platforms.len())
            .filter(|&i| matches(&platforms[i], (os, arch)))
            .collect();
        ensure!(
            matched.len() < 2,
            "spec.platforms {matched:?} all select {os}/{arch}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plugin(version: &str) -> Plugin<'_> {
        Plugin {
            name: "podpath",
            version,
            homepage: "https://podtrace.invalid",
            short_description: "one line",
            description: "more",
            caveats: "root",
        }
    }

    fn platform<'a>(os: &'a str, arch: &'a str, sha256: &'a str) -> Platform<'a> {
        Platform {
            os,
            arch,
            uri: "https://podtrace.invalid/a.tar.gz",
            sha256,
            bin: "kubectl-podpath",
        }
    }

    const SHA: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn parsed(yaml: &str) -> Value {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn what_krew_refuses_is_refused() {
        let good = manifest(&plugin("v0.1.0"), &[platform("linux", "amd64", SHA)]).unwrap();
        validate("podpath", &parsed(&good)).unwrap();
        let said = |m: &str, name: &str| format!("{:#}", validate(name, &parsed(m)).unwrap_err());
        assert!(said(&good, "other").contains("should be named"));
        let unprefixed = manifest(&plugin("0.1.0"), &[platform("linux", "amd64", SHA)]).unwrap();
        assert!(said(&unprefixed, "podpath").contains("does not start with v"));
        let loose = manifest(&plugin("v0.1"), &[platform("linux", "amd64", SHA)]).unwrap();
        assert!(said(&loose, "podpath").contains("not semantic"));
        let short = manifest(&plugin("v0.1.0"), &[platform("linux", "amd64", "abc")]).unwrap();
        assert!(said(&short, "podpath").contains("64 lowercase hex"));
        let twice = manifest(
            &plugin("v0.1.0"),
            &[
                platform("linux", "amd64", SHA),
                platform("linux", "amd64", SHA),
            ],
        )
        .unwrap();
        assert!(said(&twice, "podpath").contains("all select linux/amd64"));
        let unknown = manifest(&plugin("v0.1.0"), &[platform("plan9", "amd64", SHA)]).unwrap();
        assert!(said(&unknown, "podpath").contains("no platform krew knows"));
        let none = manifest(&plugin("v0.1.0"), &[]).unwrap();
        assert!(said(&none, "podpath").contains("no platforms"));
        assert!(!is_safe_name("COM1") && !is_safe_name("a/b") && is_safe_name("pod-path_2"));
    }
}
