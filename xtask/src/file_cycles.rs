//! No import cycle between the files of one folder of `tracer/src`.
//!
//! The layers check orders the folders; this one looks inside each
//! folder. A file's imports are every path it names into the crate
//! (`use` trees with their groups, globs and aliases, and inline paths),
//! resolved as rustc would: through `crate::`, `super::`, `self::` and a
//! folder's own child modules, then through re-exports (`pub use x::Y` in
//! a `mod.rs` leads to `x.rs`, where `Y` lives). So a `mod.rs` that only
//! declares and re-exports is an index, and a child that uses a type
//! defined in its `mod.rs` while that `mod.rs` calls the child is a cycle.
//! Test modules (`#[cfg(test)] mod … { … }`) are left out: a test may use
//! any sibling.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::{
    import_graph::{one_cycle, strongly_connected, Graph},
    rust_tokens::{is_ident, test_blocks, tokens, use_tree, InlineModules},
};

/// One cycle of imports between the files (or sub-folders) of a folder.
#[derive(Debug, PartialEq, Eq)]
pub struct FileCycle {
    /// The folder, relative to `tracer/src` (`.` for the root).
    pub folder: String,
    /// Each step: the file, and the line where it imports the next one.
    pub steps: Vec<(String, usize)>,
}

impl std::fmt::Display for FileCycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let steps: Vec<String> = self
            .steps
            .iter()
            .map(|(file, line)| format!("{file}:{line}"))
            .collect();
        let first = self.steps.first().map_or("", |s| s.0.as_str());
        write!(f, "{}: {} → {first}", self.folder, steps.join(" → "))
    }
}

/// The folders whose files still import each other in a circle, each to
/// be taken apart; the list may only shrink, and is empty: no folder of
/// tracer/src has a cycle. A cycle in any
/// other folder fails the check, and so does a folder listed here that
/// has none left.
pub const CYCLES_LEFT: &[&str] = &[];

/// Fails, naming each cycle, when files of one folder import each other
/// in a circle.
pub fn check() -> Result<()> {
    let cycles = file_cycles(&crate::layers::tracer_src()?)?;
    let problems = unlisted(&cycles, CYCLES_LEFT);
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "{} import cycle problem(s) between the files of a folder (each `file:line` imports \
         the next; move what both need into a file of its own; xtask/src/file_cycles.rs \
         lists the folders not yet clean):\n{}",
        problems.len(),
        problems.join("\n")
    )
}

/// The cycles outside the `left` folders, and each listed folder that
/// has no cycle any more.
pub fn unlisted(cycles: &[FileCycle], left: &[&str]) -> Vec<String> {
    let mut problems: Vec<String> = (cycles.iter())
        .filter(|c| !left.contains(&c.folder.as_str()))
        .map(|c| c.to_string())
        .collect();
    for folder in left {
        if !cycles.iter().any(|c| c.folder == *folder) {
            problems.push(format!(
                "{folder}: no cycle left, so take it off CYCLES_LEFT"
            ));
        }
    }
    problems
}

/// A source file read for its imports.
struct Source {
    /// Relative to `src`.
    relative: PathBuf,
    /// `story/verdict.rs` is `[story, verdict]`; `story/mod.rs` `[story]`.
    module: Vec<String>,
    /// The child modules this file's module may name bare.
    children: BTreeSet<String>,
    /// What a `use` of this file made a name stand for: a path in the
    /// crate, or `None` for a path outside it.
    aliases: BTreeMap<String, Option<Vec<String>>>,
    /// Every crate path the file names, with its line.
    references: Vec<(usize, Vec<String>)>,
}

/// Every file cycle under `src`, folder by folder.
pub fn file_cycles(src: &Path) -> Result<Vec<FileCycle>> {
    let mut files = Vec::new();
    crate::layers::rust_files(src, &mut files)?;
    files.sort();
    let mut sources = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(src).unwrap_or(file).to_path_buf();
        if relative == Path::new("main.rs") {
            // The binary's root is a crate of its own.
            continue;
        }
        let text =
            std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
        sources.push(read_source(src, relative, &text));
    }
    let by_module: BTreeMap<Vec<String>, usize> = sources
        .iter()
        .enumerate()
        .map(|(i, s)| (s.module.clone(), i))
        .collect();
    // Per folder: unit → unit → the first line of such an import.
    let mut graphs: BTreeMap<PathBuf, Graph> = BTreeMap::new();
    for (from, source) in sources.iter().enumerate() {
        for (line, path) in &source.references {
            let Some(to) = target(&sources, &by_module, path, 0) else {
                continue;
            };
            if to == from {
                continue;
            }
            let (folder, a, b) = units(&source.relative, &sources[to].relative);
            if a != b {
                graphs
                    .entry(folder)
                    .or_default()
                    .entry(a)
                    .or_default()
                    .entry(b)
                    .or_insert(*line);
            }
        }
    }
    let mut cycles = Vec::new();
    for (folder, graph) in &graphs {
        for component in strongly_connected(graph) {
            let steps = one_cycle(graph, &component);
            let folder = if folder.as_os_str().is_empty() {
                ".".to_string()
            } else {
                folder.display().to_string()
            };
            cycles.push(FileCycle { folder, steps });
        }
    }
    Ok(cycles)
}

fn read_source(src: &Path, relative: PathBuf, text: &str) -> Source {
    let module = crate::layers::module_path(&relative);
    let own_dir = if is_index(&relative) {
        relative.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        relative.with_extension("")
    };
    let children = child_modules(&src.join(own_dir));
    let mut source = Source {
        relative,
        module,
        children,
        aliases: BTreeMap::new(),
        references: Vec::new(),
    };
    scan(&mut source, text);
    source
}

/// `mod.rs` and `lib.rs` speak for their folder.
fn is_index(relative: &Path) -> bool {
    relative
        .file_name()
        .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
}

fn child_modules(dir: &Path) -> BTreeSet<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            let name = path.file_stem()?.to_string_lossy().into_owned();
            let is_module = path.is_dir() || path.extension().is_some_and(|x| x == "rs");
            (is_module && name != "mod" && name != "lib" && name != "main").then_some(name)
        })
        .collect()
}

/// Fills the file's references and aliases from its tokens, test modules
/// left out.
fn scan(source: &mut Source, text: &str) {
    let all = tokens(text);
    let tests = test_blocks(&all);
    let toks: Vec<(usize, String)> = all
        .into_iter()
        .filter(|(line, _)| !tests.iter().any(|(a, b)| line >= a && line <= b))
        .collect();
    let mut inline_mods = InlineModules::default();
    let mut i = 0;
    while i < toks.len() {
        inline_mods.step(&toks, i);
        let token = toks[i].1.as_str();
        // `pub(in crate::app)` names a module to say who sees an item,
        // not to use it (a `for x in super::f()` does use it).
        let visibility = i > 1 && toks[i - 1].1 == "in" && toks[i - 2].1 == "(";
        let after_colons = (i > 0 && toks[i - 1].1 == "::") || visibility;
        match token {
            "use" => {
                let line = toks[i].0;
                let mut trees = Vec::new();
                i = use_tree(&toks, i + 1, Vec::new(), &mut trees);
                for (path, alias) in trees {
                    let absolute = absolute(source, inline_mods.len(), &path);
                    if let Some(abs) = &absolute {
                        source.references.push((line, abs.clone()));
                    }
                    if let Some(name) = alias.or_else(|| path.last().cloned()) {
                        if name != "*" && inline_mods.is_empty() {
                            source.aliases.insert(name, absolute);
                        }
                    }
                }
                continue;
            }
            word if is_ident(word)
                && !after_colons
                && toks.get(i + 1).is_some_and(|t| t.1 == "::") =>
            {
                let line = toks[i].0;
                let mut path = vec![word.to_string()];
                let mut j = i + 2;
                while let Some(next) = toks.get(j).filter(|t| is_ident(&t.1)) {
                    path.push(next.1.clone());
                    if toks.get(j + 1).is_some_and(|t| t.1 == "::") {
                        j += 2;
                    } else {
                        j += 1;
                        break;
                    }
                }
                if let Some(abs) = absolute(source, inline_mods.len(), &path) {
                    source.references.push((line, abs));
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// `path` as named in `source`, made absolute in the crate; `None` when
/// it leaves the crate or stays inside the file (an inline module).
fn absolute(source: &Source, inline_depth: usize, path: &[String]) -> Option<Vec<String>> {
    let first = path.first()?.as_str();
    let mut rest = &path[1..];
    let base = match first {
        "crate" => Vec::new(),
        "super" => {
            let mut base = source.module.clone();
            let mut climbs = 1 + rest.iter().take_while(|s| *s == "super").count();
            rest = &rest[climbs - 1..];
            // An inline module's `super` is the file's own module.
            let inside = climbs.min(inline_depth);
            climbs -= inside;
            if inline_depth > inside {
                return None;
            }
            for _ in 0..climbs {
                base.pop()?;
            }
            base
        }
        "self" if inline_depth == 0 => source.module.clone(),
        name if inline_depth == 0 && source.children.contains(name) => {
            rest = path;
            source.module.clone()
        }
        // A module the file imported (`use crate::story;` then
        // `story::verdict::f()`).
        name if inline_depth == 0 => source.aliases.get(name).cloned().flatten()?,
        _ => return None,
    };
    let mut absolute = base;
    absolute.extend(rest.iter().cloned());
    Some(absolute)
}

/// The file `path` leads to: its module's file, or through that file's
/// `use`, the file the named item comes from.
fn target(
    sources: &[Source],
    by_module: &BTreeMap<Vec<String>, usize>,
    path: &[String],
    hops: usize,
) -> Option<usize> {
    let deepest = (0..=path.len())
        .rev()
        .find(|k| by_module.contains_key(&path[..*k]))?;
    let file = by_module[&path[..deepest]];
    let Some(name) = path.get(deepest) else {
        return Some(file);
    };
    match sources[file].aliases.get(name) {
        // The name is the file's import from outside the crate.
        Some(None) => None,
        Some(Some(from)) if hops < 8 => {
            let mut through = from.clone();
            through.extend(path[deepest + 1..].iter().cloned());
            target(sources, by_module, &through, hops + 1)
        }
        _ => Some(file),
    }
}

/// The deepest folder holding both files, and each file's unit in it:
/// its file name, or the sub-folder it sits in (`front/`).
fn units(a: &Path, b: &Path) -> (PathBuf, String, String) {
    let a_parts: Vec<_> = a.iter().collect();
    let b_parts: Vec<_> = b.iter().collect();
    let mut common = 0;
    while common + 1 < a_parts.len()
        && common + 1 < b_parts.len()
        && a_parts[common] == b_parts[common]
    {
        common += 1;
    }
    let unit = |parts: &[&std::ffi::OsStr]| {
        let name = parts[common].to_string_lossy().into_owned();
        if parts.len() > common + 1 {
            format!("{name}/")
        } else {
            name
        }
    };
    let folder: PathBuf = a_parts[..common].iter().collect();
    (folder, unit(&a_parts), unit(&b_parts))
}

#[cfg(test)]
#[path = "file_cycles_tests.rs"]
mod tests;
