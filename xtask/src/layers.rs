//! The layering of `tracer/src`: every import between its folders points
//! down. A folder may use the folders listed before it in [`LAYERS`] and
//! never one listed after it, so a newcomer can tell from this list alone
//! what a folder may use, and the folders form no cycle.
//!
//! The check reads the code as text: every `crate::…` path (in `use` lines
//! and inline) and every `super::…` path that climbs out of a folder. It
//! skips comments and string literals, so a path in prose or in a message
//! is not an import.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::rust_tokens::{is_ident, tokens, use_tree, InlineModules};

/// The folders (and single-file modules) of `tracer/src`, bottom first.
pub const LAYERS: &[&str] = &[
    "model",   // The nouns every layer shares.
    "node",    // What a node looks like: netlink, links, routes, namespaces.
    "probe",   // Kernel programs: load, attach, read.
    "cli",     // Arguments only, for every command.
    "cni",     // One file per CNI backend, and the interfaces to watch.
    "cluster", // The API, inventories, Services and their translations, agents.
    "doctor",  // Checks only.
    "decode",  // A kernel record into a hop.
    "story",   // Journeys, NAT, verdicts, notes.
    "output",  // One sink per format.
    "app",     // The run: resolve, attach, one stream loop, the wire.
];

/// One import that points up.
#[derive(Debug, PartialEq, Eq)]
pub struct Upward {
    pub file: PathBuf,
    pub line: usize,
    pub from: String,
    pub to: String,
}

impl std::fmt::Display for Upward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: {} imports {}, which sits above it",
            self.file.display(),
            self.line,
            self.from,
            self.to
        )
    }
}

/// The folder the layering is about.
pub fn tracer_src() -> Result<PathBuf> {
    Ok(crate::workspace_root()?.join("tracer/src"))
}

/// Fails, listing each one, when an import in tracer/src points up, or
/// when its modules and [`LAYERS`] differ.
pub fn check() -> Result<()> {
    let src = tracer_src()?;
    let mut problems = unlisted_modules(&src)?;
    problems.extend(upward_imports(&src)?.iter().map(|u| u.to_string()));
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "{} layering problem(s) (xtask/src/layers.rs has the order):\n{}",
        problems.len(),
        problems.join("\n")
    )
}

/// Each top-level module of `src` (a folder or file on disk, or a `mod`
/// line of lib.rs) that [`LAYERS`] leaves out, and each layer that is
/// neither: a module left out of the list would escape the check.
pub fn unlisted_modules(src: &Path) -> Result<Vec<String>> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).context("read tracer/src/lib.rs")?;
    let declared = declared_modules(&lib);
    let mut on_disk = Vec::new();
    for entry in std::fs::read_dir(src).with_context(|| format!("read {}", src.display()))? {
        let path = entry?.path();
        let name = path.file_stem().unwrap_or_default().to_string_lossy();
        if path.is_dir() || (name != "lib" && name != "main") {
            on_disk.push(name.into_owned());
        }
    }
    let mut unplaced: Vec<&String> = Vec::new();
    for module in declared.iter().chain(&on_disk) {
        if rank(module).is_none() && !unplaced.contains(&module) {
            unplaced.push(module);
        }
    }
    let mut problems: Vec<String> = (unplaced.iter())
        .map(|m| format!("{m} is a module of tracer/src that LAYERS does not place"))
        .collect();
    for layer in LAYERS {
        if !declared.iter().any(|d| d == layer) {
            problems.push(format!(
                "{layer} is in LAYERS but lib.rs declares no such module"
            ));
        }
    }
    Ok(problems)
}

/// The names of lib.rs's `mod` lines.
fn declared_modules(lib: &str) -> Vec<String> {
    let tokens = tokens(lib);
    (tokens.windows(3))
        .filter(|w| w[0].1 == "mod" && is_ident(&w[1].1) && (w[2].1 == ";" || w[2].1 == "{"))
        .map(|w| w[1].1.clone())
        .collect()
}

/// Every upward import under `src`, in file order.
pub fn upward_imports(src: &Path) -> Result<Vec<Upward>> {
    let mut files = Vec::new();
    rust_files(src, &mut files)?;
    files.sort();
    let mut upward = Vec::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap_or(&file);
        let module = module_path(relative);
        let Some(from) = module.first().filter(|m| rank(m).is_some()) else {
            // lib.rs and main.rs: the root declares and dispatches.
            continue;
        };
        let text =
            std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
        for (line, to) in imported_folders(&text, &module) {
            // A glob of the crate root, or a name the root re-exports,
            // hides which folder is used: as bad as an upward import.
            if rank(&to).is_none() || rank(&to) > rank(from) {
                upward.push(Upward {
                    file: file.clone(),
                    line,
                    from: from.clone(),
                    to,
                });
            }
        }
    }
    Ok(upward)
}

fn rank(folder: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == folder)
}

/// Every `.rs` file under `dir`, appended to `into`.
pub(crate) fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, into)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
    Ok(())
}

/// `story/verdict.rs` is `[story, verdict]`; `story/mod.rs` is `[story]`.
pub(crate) fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" && stem != "lib" && stem != "main" {
            parts.push(stem.to_string());
        }
    }
    parts
}

/// The top-level modules that `text` (the file of module `module`) names,
/// with the line of each naming.
fn imported_folders(text: &str, module: &[String]) -> Vec<(usize, String)> {
    let tokens = tokens(text);
    let mut found = Vec::new();
    let mut inline_mods = InlineModules::default();
    let mut i = 0;
    while i < tokens.len() {
        inline_mods.step(&tokens, i);
        let (line, token) = (tokens[i].0, tokens[i].1.as_str());
        match token {
            "crate" | "super" if tokens.get(i + 1).is_some_and(|t| t.1 == "::") => {
                // `a::crate` cannot happen; `x::super` can (`super::super`).
                if i > 0 && tokens[i - 1].1 == "::" {
                    i += 1;
                    continue;
                }
                let mut base: Vec<String> = if token == "crate" {
                    Vec::new()
                } else {
                    let mut here = module.to_vec();
                    here.extend((0..inline_mods.len()).map(|_| String::new()));
                    here.pop();
                    here
                };
                let mut j = i + 2;
                while tokens.get(j).is_some_and(|t| t.1 == "super")
                    && tokens.get(j + 1).is_some_and(|t| t.1 == "::")
                {
                    base.pop();
                    j += 2;
                }
                if !base.is_empty() {
                    // Still inside a folder (or an inline module): no folder
                    // is crossed.
                    i = j;
                    continue;
                }
                for first in first_segments(&tokens, j) {
                    found.push((line, first));
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The first path segment at `tokens[at]`, or each one of a `{a::…, b}`
/// group: the `use` tree parser's, for a `use` line or an inline path.
fn first_segments(tokens: &[(usize, String)], at: usize) -> Vec<String> {
    let mut paths = Vec::new();
    use_tree(tokens, at, Vec::new(), &mut paths);
    let mut firsts: Vec<String> = paths
        .into_iter()
        .filter_map(|(p, _)| p.into_iter().next())
        .collect();
    firsts.retain(|first| is_ident(first) || first == "*");
    firsts.dedup();
    firsts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folders(text: &str, module: &[&str]) -> Vec<String> {
        let module: Vec<String> = module.iter().map(|m| m.to_string()).collect();
        imported_folders(text, &module)
            .into_iter()
            .map(|(_, f)| f)
            .collect()
    }

    #[test]
    fn crate_paths_in_use_lines_groups_and_inline() {
        let text = "use crate::{story::X, output::{a, b}};\n\
                    use crate::node;\n\
                    fn f() { crate::probe::load(); }";
        assert_eq!(
            folders(text, &["app", "run"]),
            ["story", "output", "node", "probe"]
        );
    }

    #[test]
    fn super_climbs_out_of_a_folder_only_from_its_mod_rs() {
        // story/verdict.rs: super is story, no folder crossed.
        assert!(folders("use super::journey::J;", &["story", "verdict"]).is_empty());
        // story/mod.rs: super is the crate root.
        assert_eq!(folders("use super::doctor::F;", &["story"]), ["doctor"]);
        assert_eq!(
            folders("use super::super::doctor::F;", &["story", "verdict"]),
            ["doctor"]
        );
        // Inside an inline module, super is the file's own module.
        assert!(folders("mod tests { use super::cli::X; }", &["story"]).is_empty());
    }

    #[test]
    fn comments_and_strings_are_not_imports() {
        let text = "// crate::app::x\n/* crate::app */ let s = \"crate::app::y\";\n\
                    let c = '\"'; let r = r#\"crate::app\"#; fn g<'a>() {}";
        assert!(folders(text, &["node"]).is_empty());
    }

    #[test]
    fn lines_are_counted() {
        let text = "\n\n/* a\nb */\nuse crate::app::X;";
        let module = vec!["node".to_string()];
        assert_eq!(imported_folders(text, &module), [(5, "app".to_string())]);
    }

    #[test]
    fn a_glob_of_the_crate_root_is_an_import_of_no_known_folder() {
        assert_eq!(folders("use crate::*;", &["node"]), ["*"]);
        assert_eq!(
            folders("use crate::{*, model::X};", &["node"]),
            ["*", "model"]
        );
    }

    #[test]
    fn a_module_left_out_of_layers_is_named() {
        let src = std::env::temp_dir().join(format!("layers-unlisted-{}", std::process::id()));
        std::fs::create_dir_all(src.join("extra")).unwrap();
        let mods: String = LAYERS.iter().map(|l| format!("pub mod {l};\n")).collect();
        std::fs::write(src.join("lib.rs"), format!("{mods}mod stray;\n")).unwrap();
        std::fs::write(src.join("main.rs"), "fn main() {}").unwrap();
        let problems = unlisted_modules(&src).unwrap();
        std::fs::remove_dir_all(&src).unwrap();
        assert_eq!(
            problems,
            [
                "stray is a module of tracer/src that LAYERS does not place",
                "extra is a module of tracer/src that LAYERS does not place"
            ]
        );
    }

    #[test]
    fn tracer_modules_are_exactly_the_layers() {
        assert_eq!(
            unlisted_modules(&tracer_src().unwrap()).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn tracer_imports_point_down() {
        let upward = upward_imports(&tracer_src().unwrap()).unwrap();
        for u in &upward {
            eprintln!("{u}");
        }
        assert!(upward.is_empty(), "{} upward import(s)", upward.len());
    }
}
