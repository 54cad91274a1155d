//! The size limits of the code: no file over [`MAX_FILE_LINES`] lines
//! (its tests aside) and no function over [`MAX_FN_LINES`] lines, in
//! tracer, tracer-ebpf and xtask. Past them, a file or a function
//! usually does more than one thing, and a newcomer reads it as a wall.
//!
//! The check reads the code as tokens (`rust_tokens`: comments and
//! strings left out): a `#[cfg(test)] mod … { … }` block (`pub` or not)
//! is a test, and a function runs from its `fn` line to its closing
//! brace.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::rust_tokens::{closing, is_ident, test_blocks, tokens};

pub const MAX_FILE_LINES: usize = 500;
pub const MAX_FN_LINES: usize = 80;

/// The folders held to the limits, from the workspace root.
pub const CHECKED: &[&str] = &["tracer", "tracer-ebpf", "xtask"];

/// One file or function past its limit.
#[derive(Debug, PartialEq, Eq)]
pub struct Oversized {
    pub file: PathBuf,
    /// The function's name and first line; `None` for the whole file.
    pub function: Option<(String, usize)>,
    pub lines: usize,
}

impl std::fmt::Display for Oversized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.function {
            Some((name, line)) => write!(
                f,
                "{}:{line}: fn {name} is {} lines (at most {MAX_FN_LINES})",
                self.file.display(),
                self.lines
            ),
            None => write!(
                f,
                "{}: {} lines outside tests (at most {MAX_FILE_LINES})",
                self.file.display(),
                self.lines
            ),
        }
    }
}

/// Fails, listing each one, when a file or function is past its limit.
pub fn check() -> Result<()> {
    let oversized = oversized_in_workspace()?;
    if oversized.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = oversized.iter().map(|o| o.to_string()).collect();
    bail!(
        "{} file(s) or function(s) too long (xtask/src/sizes.rs has the limits):\n{}",
        oversized.len(),
        list.join("\n")
    )
}

/// Every file and function past its limit under [`CHECKED`].
pub fn oversized_in_workspace() -> Result<Vec<Oversized>> {
    let root = crate::workspace_root()?;
    let mut files = Vec::new();
    for folder in CHECKED {
        rust_files(&root.join(folder), &mut files)?;
    }
    files.sort();
    let mut oversized = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
        let shown = file.strip_prefix(&root).unwrap_or(&file).to_path_buf();
        oversized.extend(oversized_in(&shown, &text));
    }
    Ok(oversized)
}

/// Rust files below `dir`, build output left out.
fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, into)?;
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
    Ok(())
}

/// The file (outside its test modules) and the functions (outside them
/// too) of `text` that are past their limits.
pub fn oversized_in(file: &Path, text: &str) -> Vec<Oversized> {
    let tokens = tokens(text);
    let total = text.lines().count();
    let tests = test_blocks(&tokens);
    let test_lines: usize = tests.iter().map(|(from, to)| to - from + 1).sum();
    let mut found = Vec::new();
    let lines = total.saturating_sub(test_lines);
    if lines > MAX_FILE_LINES {
        found.push(Oversized {
            file: file.to_path_buf(),
            function: None,
            lines,
        });
    }
    let in_tests = |line: usize| tests.iter().any(|(from, to)| (*from..=*to).contains(&line));
    for (name, from, to) in functions(&tokens) {
        let lines = to - from + 1;
        if lines > MAX_FN_LINES && !in_tests(from) {
            found.push(Oversized {
                file: file.to_path_buf(),
                function: Some((name, from)),
                lines,
            });
        }
    }
    found
}

/// Each function with a body: its name, its `fn` line and the line of
/// its closing brace. A `fn(…)` pointer type names no function; a
/// declaration without a body (`;` first) has no length.
fn functions(tokens: &[(usize, String)]) -> Vec<(String, usize, usize)> {
    let mut found = Vec::new();
    for (i, (line, t)) in tokens.iter().enumerate() {
        if t != "fn" {
            continue;
        }
        let Some(name) = tokens.get(i + 1).filter(|n| is_ident(&n.1)) else {
            continue;
        };
        let Some(open) = tokens[i..]
            .iter()
            .position(|t| t.1 == "{" || t.1 == ";")
            .map(|p| i + p)
            .filter(|p| tokens[*p].1 == "{")
        else {
            continue;
        };
        if let Some(end) = closing(tokens, open) {
            found.push((name.1.clone(), *line, tokens[end].0));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long_fn(name: &str, body_lines: usize) -> String {
        format!("fn {name}() {{\n{}}}\n", "    x();\n".repeat(body_lines))
    }

    #[test]
    fn a_function_is_measured_from_fn_to_its_brace() {
        let text = format!("/* fn no() {{ }} */\n{}", long_fn("long", 79));
        let found = oversized_in(Path::new("a.rs"), &text);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].function, Some(("long".to_string(), 2)));
        assert_eq!(found[0].lines, 81);
        assert!(oversized_in(Path::new("a.rs"), &long_fn("short", 78)).is_empty());
    }

    #[test]
    fn test_modules_count_for_neither_limit() {
        let tests = format!(
            "#[cfg(test)]\npub(crate) mod tests {{\n{}}}\n",
            long_fn("t", 600)
        );
        let text = format!("fn f(g: fn(u32) -> u32) -> u32 {{ g(1) }}\n{tests}");
        assert!(oversized_in(Path::new("a.rs"), &text).is_empty());
        let text = format!("{}{tests}", "const A: u8 = 0;\n".repeat(501));
        assert_eq!(
            oversized_in(Path::new("a.rs"), &text),
            [Oversized {
                file: "a.rs".into(),
                function: None,
                lines: 501
            }]
        );
    }

    #[test]
    fn the_workspace_is_within_the_limits() {
        let oversized = oversized_in_workspace().unwrap();
        for o in &oversized {
            eprintln!("{o}");
        }
        assert!(oversized.is_empty(), "{} too long", oversized.len());
    }
}
