//! The programs podtrace runs, read from its code: every
//! `Command::new(…)` outside test modules, with the program it names. A
//! literal names itself; a variable names the literals it is bound to
//! (`let save = if … { "ip6tables-save" } else { "iptables-save" }`,
//! `for save in ["iptables-save", …]`); a function's parameter names the
//! literal each call of that function passes (`output("ip", …)`). A site
//! none of these resolve is an error, so that a new way of naming a
//! program cannot slip past the image check.

use std::{collections::BTreeMap, path::Path};

use anyhow::{bail, Context, Result};

use crate::rust_tokens::{closing, literal, test_blocks, tokens_with_strings};

type Tokens = [(usize, String)];

/// Program → the `file:line`s that run it, for every Rust file under
/// `src`.
pub fn executed(src: &Path) -> Result<BTreeMap<String, Vec<String>>> {
    let mut files = Vec::new();
    crate::layers::rust_files(src, &mut files)?;
    files.sort();
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut unresolved = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
        // `tracer/src/…`: from the crate's parent (the workspace).
        let shown = file
            .strip_prefix(src.parent().and_then(Path::parent).unwrap_or(src))
            .unwrap_or(&file)
            .display()
            .to_string();
        for (line, programs) in spawns(&text) {
            let site = format!("{shown}:{line}");
            match programs {
                Some(programs) => {
                    for program in programs {
                        let sites = found.entry(program).or_default();
                        if !sites.contains(&site) {
                            sites.push(site.clone());
                        }
                    }
                }
                None => unresolved.push(site),
            }
        }
    }
    if !unresolved.is_empty() {
        bail!(
            "cannot tell which program runs at {} (name it with a literal, a variable bound to literals, \
             or a parameter every caller passes a literal to)",
            unresolved.join(", ")
        );
    }
    Ok(found)
}

/// Each `Command::new(…)` of `text` outside test modules: its line and
/// the programs it may run, `None` when they cannot be told.
pub fn spawns(text: &str) -> Vec<(usize, Option<Vec<String>>)> {
    let all = tokens_with_strings(text);
    let tests = test_blocks(&all);
    let toks: Vec<(usize, String)> = all
        .into_iter()
        .filter(|(line, _)| !tests.iter().any(|(from, to)| (from..=to).contains(&line)))
        .collect();
    let mut found = Vec::new();
    for i in 0..toks.len() {
        let at = |k: usize, want: &str| toks.get(i + k).is_some_and(|t| t.1 == want);
        if at(0, "Command") && at(1, "::") && at(2, "new") && at(3, "(") {
            found.push((toks[i].0, programs_of(&toks, i + 4)));
        }
    }
    found
}

/// The programs named by the argument starting at `arg` (one token, then
/// the call's `)`).
fn programs_of(toks: &Tokens, arg: usize) -> Option<Vec<String>> {
    let single = toks.get(arg + 1).is_some_and(|t| t.1 == ")");
    let token = &toks.get(arg)?.1;
    if !single {
        return None;
    }
    if let Some(program) = literal(token) {
        return Some(vec![program.to_string()]);
    }
    bound_literals(toks, arg, token).or_else(|| passed_literals(toks, arg, token))
}

/// The literals `name` is bound to by the nearest `let name =` or
/// `for name in` before `at` in the same function.
fn bound_literals(toks: &Tokens, at: usize, name: &str) -> Option<Vec<String>> {
    let mut i = at;
    while i > 0 {
        i -= 1;
        let t = toks[i].1.as_str();
        if t == "fn" {
            return None;
        }
        let binds = toks.get(i + 1).is_some_and(|n| n.1 == name);
        let binds_mut = t == "let"
            && toks.get(i + 1).is_some_and(|n| n.1 == "mut")
            && toks.get(i + 2).is_some_and(|n| n.1 == name);
        if (t == "let" || t == "for") && (binds || binds_mut) {
            let end = if t == "let" { ";" } else { "{" };
            let values = value_literals(toks, i, end);
            return (!values.is_empty()).then_some(values);
        }
    }
    None
}

/// The literals in value position from `from` to the first `end` outside
/// brackets: a branch's or an array's values, not a comparison's operand
/// (`family == "ip6"`) nor a call's argument.
fn value_literals(toks: &Tokens, from: usize, end: &str) -> Vec<String> {
    let mut depth = 0i32;
    let mut values = Vec::new();
    for i in from..toks.len() {
        let t = toks[i].1.as_str();
        match t {
            "(" | "[" => depth += 1,
            ")" | "]" => depth -= 1,
            "{" if end == "{" && depth == 0 => break,
            "{" => depth += 1,
            "}" => depth -= 1,
            _ if t == end && depth == 0 => break,
            _ => {}
        }
        let Some(value) = literal(t) else { continue };
        let before = |k: usize| i.checked_sub(k).map_or("", |j| toks[j].1.as_str());
        let compared = before(1) == "=" && matches!(before(2), "=" | "!" | "<" | ">");
        let placed = matches!(before(1), "=" | "{" | "[" | "," | ">") && !compared;
        let argument = before(1) == "," && opened_by(toks, i) == Some("(");
        if placed && !argument {
            values.push(value.to_string());
        }
    }
    values
}

/// The bracket that opens the innermost group holding token `at`.
fn opened_by(toks: &Tokens, at: usize) -> Option<&str> {
    let mut depth = 0;
    for i in (0..at).rev() {
        match toks[i].1.as_str() {
            ")" | "]" | "}" => depth += 1,
            open @ ("(" | "[" | "{") if depth == 0 => return Some(open),
            "(" | "[" | "{" => depth -= 1,
            _ => {}
        }
    }
    None
}

/// When `name` is a parameter of the function holding `at`: the literal
/// each call of that function (in the same file) passes for it; `None`
/// when a call passes something else, or nothing calls it.
fn passed_literals(toks: &Tokens, at: usize, name: &str) -> Option<Vec<String>> {
    let fn_at = (0..at).rev().find(|&i| toks[i].1 == "fn")?;
    let function = toks.get(fn_at + 1)?.1.clone();
    let open = fn_at + 2 + toks[fn_at + 2..].iter().position(|t| t.1 == "(")?;
    let position = arguments(toks, open)
        .iter()
        .position(|arg| arg.first().is_some_and(|t| t == name))?;
    let mut values = Vec::new();
    for i in 1..toks.len() {
        let call = toks[i].1 == function
            && toks.get(i + 1).is_some_and(|t| t.1 == "(")
            && !matches!(toks[i - 1].1.as_str(), "fn" | ".");
        if !call {
            continue;
        }
        match arguments(toks, i + 1).get(position).map(Vec::as_slice) {
            Some([only]) => values.push(literal(only)?.to_string()),
            _ => return None,
        }
    }
    (!values.is_empty()).then_some(values)
}

/// The comma-separated arguments (or parameters) of the `(` at `open`,
/// each as its tokens.
fn arguments(toks: &Tokens, open: usize) -> Vec<Vec<String>> {
    let close = closing(toks, open).unwrap_or(toks.len());
    let mut args = vec![Vec::new()];
    let mut depth = 0;
    for (_, t) in &toks[open + 1..close] {
        match t.as_str() {
            "(" | "[" | "{" | "<" => depth += 1,
            ")" | "]" | "}" | ">" => depth -= 1,
            "," if depth == 0 => {
                args.push(Vec::new());
                continue;
            }
            _ => {}
        }
        args.last_mut().expect("one at least").push(t.clone());
    }
    args.retain(|a| !a.is_empty());
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn programs(text: &str) -> Vec<Option<Vec<String>>> {
        spawns(text).into_iter().map(|(_, p)| p).collect()
    }

    fn named(list: &[&str]) -> Option<Vec<String>> {
        Some(list.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn literals_bindings_and_parameters_name_their_programs() {
        let text = r#"
            fn a() { Command::new("nft").args(["list", "tables"]); }
            fn b(family: &str) {
                let save = if family == "ip6" { "ip6tables-save" } else { "iptables-save" };
                Command::new(save).arg("-t");
            }
            fn c() { for tool in ["ip", "bridge"] { Command::new(tool).output(); } }
            fn output(program: &str, args: &[&str]) { std::process::Command::new(program).args(args); }
            fn d() { output("tc", &["qdisc"]); let x = output("ip", &["link"]); }
            #[cfg(test)]
            mod tests { fn t() { Command::new("mkfifo"); } }
        "#;
        assert_eq!(
            programs(text),
            [
                named(&["nft"]),
                named(&["ip6tables-save", "iptables-save"]),
                named(&["ip", "bridge"]),
                named(&["tc", "ip"]),
            ]
        );
    }

    #[test]
    fn a_program_the_code_does_not_spell_out_is_not_guessed() {
        let text = r#"
            fn a(name: &str) { Command::new(format!("{name}-save")); }
            fn b() { let p = lookup("nft"); Command::new(p); }
            fn run(program: &str) { Command::new(program); }
            fn c(dynamic: &str) { run("ip"); run(dynamic); }
        "#;
        assert_eq!(programs(text), [None, None, None]);
    }

    #[test]
    fn an_unresolved_site_fails_with_its_place() {
        let dir = std::env::temp_dir().join(format!("podtrace-programs-{}", std::process::id()));
        let src = dir.join("tracer/src");
        std::fs::create_dir_all(src.join("probe")).unwrap();
        std::fs::write(src.join("probe/tc.rs"), "fn a(){ Command::new(\"tc\"); }\n").unwrap();
        std::fs::write(
            src.join("lib.rs"),
            "fn b(p: String){\n Command::new(p); }\n",
        )
        .unwrap();
        let err = executed(&src).unwrap_err().to_string();
        assert!(err.contains("tracer/src/lib.rs:2"), "{err}");
        std::fs::write(src.join("lib.rs"), "").unwrap();
        let found = executed(&src).unwrap();
        assert_eq!(found["tc"], ["tracer/src/probe/tc.rs:1"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
