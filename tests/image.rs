//! The agent image (`cargo xtask image`), built once per run from the
//! podtrace under test, then checked as a cluster relies on it: every
//! program podtrace runs (read from its code) and every command deploy/
//! gives a container is found on the image's PATH, and `podman load`
//! takes the archive under its name, with its version and commit.

use std::{collections::BTreeMap, path::PathBuf, process::Command, sync::OnceLock};

use serde::Deserialize;
use serde_json::Value;
use xtask::image::{self, oci, tree::Tree, Built};

const PODTRACE: &str = env!("CARGO_BIN_EXE_podtrace");

fn root() -> PathBuf {
    xtask::workspace_root().expect("a podtrace checkout")
}

/// The image of this run's podtrace, and the archive read back.
fn built() -> &'static (Built, oci::Loaded) {
    static BUILT: OnceLock<(Built, oci::Loaded)> = OnceLock::new();
    BUILT.get_or_init(|| {
        // SAFETY: no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "building the image needs root (mmdebstrap): run `cargo xtask test` as root"
        );
        let root = root();
        let dir = image::image_dir(&root);
        let output = dir.join("tests.oci.tar");
        let request = image::Request {
            podtrace: PODTRACE.as_ref(),
            output: &output,
            name: None,
            fresh_base: false,
        };
        let built =
            image::build(&root, &request).unwrap_or_else(|e| panic!("cargo xtask image: {e:#}"));
        let loaded = oci::read_archive(&built.archive, &dir.join("tests-blobs"))
            .unwrap_or_else(|e| panic!("the archive does not read back: {e:#}"));
        (built, loaded)
    })
}

/// Each container command of deploy/'s manifests (`sleep` for the
/// DaemonSet, for one): the image runs those too.
fn deploy_commands() -> BTreeMap<String, Vec<String>> {
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(root().join("deploy")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let doc = Value::deserialize(doc).unwrap();
            let spec = if doc["spec"]["template"].is_object() {
                &doc["spec"]["template"]["spec"]
            } else {
                &doc["spec"]
            };
            for container in spec["containers"].as_array().into_iter().flatten() {
                if let Some(program) = container["command"][0].as_str() {
                    let site = path.file_name().unwrap().to_string_lossy().into_owned();
                    found
                        .entry(program.to_string())
                        .or_default()
                        .push(format!("deploy/{site}"));
                }
            }
        }
    }
    found
}

#[test]
fn every_program_podtrace_runs_is_in_the_image() {
    let mut programs =
        image::programs::executed(&root().join("tracer/src")).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(
        !programs.is_empty(),
        "no Command::new found in tracer/src: the scan is broken"
    );
    for (program, sites) in deploy_commands() {
        programs.entry(program).or_default().extend(sites);
    }
    let (_, loaded) = built();
    let env = loaded.config["config"]["Env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let path = env
        .iter()
        .filter_map(Value::as_str)
        .find_map(|e| e.strip_prefix("PATH="))
        .expect("the image's config sets PATH");
    let tree = Tree::of_layers(&loaded.layers).unwrap();
    let missing: Vec<String> = programs
        .iter()
        .filter(|(program, _)| tree.which(program, path).is_none())
        .map(|(program, sites)| format!("{program} (run at {})", sites.join(", ")))
        .collect();
    assert!(
        missing.is_empty(),
        "not on the image's PATH ({path}); add its package to {}:\n{}",
        image::PACKAGES_FILE,
        missing.join("\n")
    );
    let found: Vec<String> = programs
        .keys()
        .map(|p| format!("{p}={}", tree.which(p, path).unwrap().display()))
        .collect();
    eprintln!("image holds {}", found.join(" "));
    assert!(
        tree.which("podtrace", path).is_some() && tree.which("kubectl-podtrace", path).is_some(),
        "podtrace itself is not on the image's PATH"
    );
}

#[test]
fn podman_loads_it_under_its_name_with_version_and_commit() {
    let (built, loaded) = built();
    let out = Command::new("podman")
        .args(["load", "--quiet", "-i"])
        .arg(&built.archive)
        .output()
        .expect("podman (cargo xtask setup installs it)");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "podman load failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        said.contains(&built.name),
        "podman loaded {said:?}, not {}",
        built.name
    );
    let inspect = Command::new("podman")
        .args(["image", "inspect", &built.name])
        .output()
        .unwrap();
    assert!(
        inspect.status.success(),
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    let _ = Command::new("podman")
        .args(["rmi", "--force", &built.name])
        .output();
    let inspected: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let labels = &inspected[0]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    let head = Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["rev-parse", "HEAD"])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap_or_default();
    assert!(
        revision == head || revision == format!("{head}-dirty"),
        "revision {revision:?}, HEAD {head}"
    );
    assert_eq!(inspected[0]["Digest"], loaded.manifest_digest.as_str());
    assert_eq!(inspected[0]["Config"]["Entrypoint"][0], "podtrace");
}
