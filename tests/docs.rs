//! The docs against the code: every flag and subcommand a user can see in
//! `--help` is in docs/usage.md, so that a flag added without its doc
//! fails here.

use clap::CommandFactory;
use podtrace::cli::Cli;

/// What `--help` shows of `command` and its subcommands, as the usage
/// doc spells them: `podtrace doctor`, `--snaplen`, ...
fn visible_names(command: &clap::Command, path: &str, names: &mut Vec<String>) {
    for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
        if let Some(long) = arg.get_long() {
            if !matches!(long, "help" | "version") {
                names.push(format!("--{long}"));
            }
        }
    }
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        let path = format!("{path} {}", sub.get_name());
        names.push(path.clone());
        visible_names(sub, &path, names);
    }
}

#[test]
fn every_flag_and_subcommand_is_in_the_usage_doc() {
    let usage = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/usage.md"))
        .expect("docs/usage.md");
    let mut names = Vec::new();
    visible_names(&Cli::command(), "podtrace", &mut names);
    names.sort();
    names.dedup();
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !mentions(&usage, name))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/usage.md does not mention {missing:?} (of {} flags and subcommands)",
        names.len()
    );
}

/// Whether `doc` names `name` as a whole word: `--port` is not in a doc
/// that only says `--ports`.
fn mentions(doc: &str, name: &str) -> bool {
    doc.match_indices(name).any(|(at, _)| {
        let next = doc[at + name.len()..].chars().next();
        !next.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
    })
}
