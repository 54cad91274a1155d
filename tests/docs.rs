//! The docs against the code: every flag and subcommand a user can see in
//! `--help` is in docs/usage.md, and every JSON field in its JSON
//! reference, so that a flag or a field added without its doc fails here;
//! docs/schema.json is what `podtrace schema` prints.

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

/// docs/schema.json, committed for tools that read podtrace's JSON lines,
/// is the schema the structs give.
#[test]
fn the_committed_json_schema_is_the_one_the_structs_give() {
    let committed =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/schema.json"))
            .expect("docs/schema.json");
    assert!(
        committed == podtrace::output::schema::text(),
        "docs/schema.json is not what the structs give: regenerate it with \
         `cargo run --release -- schema > docs/schema.json` (and bump \
         output::schema::VERSION if a field was removed or renamed)"
    );
}

/// Every property the schema defines, anywhere in it.
fn schema_properties(value: &serde_json::Value, names: &mut std::collections::BTreeSet<String>) {
    match value {
        serde_json::Value::Object(object) => {
            if let Some(serde_json::Value::Object(properties)) = object.get("properties") {
                names.extend(properties.keys().cloned());
            }
            object.values().for_each(|v| schema_properties(v, names));
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| schema_properties(v, names)),
        _ => {}
    }
}

#[test]
fn every_json_field_is_in_the_usage_doc() {
    let usage = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/usage.md"))
        .expect("docs/usage.md");
    let schema = serde_json::to_value(podtrace::output::schema::schema()).unwrap();
    let mut names = std::collections::BTreeSet::new();
    schema_properties(&schema, &mut names);
    let missing: Vec<&String> = names
        .iter()
        .filter(|name| !usage.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/usage.md's JSON reference does not name {missing:?} as `field` (of {} fields)",
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

/// The crates whose every source file docs/how-it-works.md names.
const SOURCE_ROOTS: [&str; 3] = ["tracer/src", "tracer-ebpf/src", "tracer-ebpf/common/src"];

#[test]
fn every_source_file_is_in_how_it_works() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let doc = std::fs::read_to_string(format!("{root}/docs/how-it-works.md"))
        .expect("docs/how-it-works.md");
    let named = files_the_table_names(&doc);
    let mut on_disk = std::collections::BTreeSet::new();
    for source_root in SOURCE_ROOTS {
        rust_files(std::path::Path::new(root), source_root, &mut on_disk);
    }
    let unnamed: Vec<&String> = on_disk.difference(&named).collect();
    let gone: Vec<&String> = named.difference(&on_disk).collect();
    assert!(
        unnamed.is_empty() && gone.is_empty(),
        "docs/how-it-works.md's table lacks {unnamed:?} and names {gone:?}, which do not exist \
         (of {} source files)",
        on_disk.len()
    );
}

/// Every `.rs` file under `dir` (relative to `root`), as `dir/.../name.rs`.
fn rust_files(root: &std::path::Path, dir: &str, files: &mut std::collections::BTreeSet<String>) {
    for entry in std::fs::read_dir(root.join(dir)).expect(dir) {
        let entry = entry.expect(dir);
        let name = entry.file_name().into_string().expect("a UTF-8 file name");
        let path = format!("{dir}/{name}");
        if entry.file_type().expect(&path).is_dir() {
            rust_files(root, &path, files);
        } else if name.ends_with(".rs") {
            files.insert(path);
        }
    }
}

/// The files the table names, as paths from the repository's root. The
/// rule: a table row's second column is one folder (`tracer/src/probe/`);
/// its third names that folder's files in backticks, relative to it
/// (`tc.rs`); a subfolder is named in backticks with its trailing slash
/// and its files follow it in parentheses (`front/` (`arrivals.rs`: …)).
/// So `mod.rs` or `profile.rs` in several folders is never ambiguous: its
/// row says which.
fn files_the_table_names(doc: &str) -> std::collections::BTreeSet<String> {
    let mut files = std::collections::BTreeSet::new();
    for row in doc.lines().filter(|line| line.starts_with("| ")) {
        let columns: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(folder), Some(what)) = (columns.get(2), columns.get(3)) else {
            continue;
        };
        let Some(folder) = folder.strip_prefix('`').and_then(|f| f.strip_suffix("/`")) else {
            continue; // the header row and its rule
        };
        // Each open parenthesis gets the folder its names are relative
        // to: a subfolder named just before it, else the enclosing one.
        let mut folders = vec![folder.to_string()];
        let mut subfolder: Option<String> = None;
        let mut rest: &str = what;
        while let Some(c) = rest.chars().next() {
            let here = folders.last().expect("the row's folder").clone();
            if c == '`' {
                let end = rest[1..].find('`').expect("a closed backtick") + 1;
                let name = &rest[1..end];
                subfolder = None;
                if name.ends_with('/') {
                    subfolder = Some(format!("{here}/{}", name.trim_end_matches('/')));
                } else if name.ends_with(".rs") {
                    files.insert(format!("{here}/{name}"));
                }
                rest = &rest[end + 1..];
                continue;
            }
            match c {
                '(' => folders.push(subfolder.take().unwrap_or(here)),
                ')' if folders.len() > 1 => {
                    folders.pop();
                }
                c if !c.is_whitespace() => subfolder = None,
                _ => {}
            }
            rest = &rest[c.len_utf8()..];
        }
    }
    files
}

/// The "Event families" table of docs/how-it-works.md: each family's
/// kernel file and ABI file carry its name, and its user files exist, one
/// of them named for it too, so that a rename on one side cannot leave
/// the others behind.
#[test]
fn every_event_family_has_one_name_on_each_side() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let doc = std::fs::read_to_string(format!("{root}/docs/how-it-works.md"))
        .expect("docs/how-it-works.md");
    let rows: Vec<Vec<&str>> = doc
        .lines()
        .skip_while(|line| !line.starts_with("| family | kernel | common | user |"))
        .skip(2)
        .take_while(|line| line.starts_with("| "))
        .map(|row| row.split('|').map(str::trim).collect())
        .collect();
    assert!(
        !rows.is_empty(),
        "docs/how-it-works.md has no event families table"
    );
    let exists = |path: String| {
        assert!(
            std::path::Path::new(root).join(&path).is_file(),
            "docs/how-it-works.md's event families name {path}, which does not exist"
        );
    };
    for columns in rows {
        let [_, family, kernel, common, user, ..] = columns[..] else {
            panic!("an event family's row has not four columns: {columns:?}");
        };
        let family = family.trim_matches('`');
        let named = format!("`{family}.rs`");
        assert_eq!(kernel, named, "the {family} family's kernel file");
        assert_eq!(common, named, "the {family} family's ABI file");
        exists(format!("tracer-ebpf/src/{family}.rs"));
        exists(format!("tracer-ebpf/common/src/{family}.rs"));
        let user: Vec<&str> = user.split(", ").map(|f| f.trim_matches('`')).collect();
        for file in &user {
            exists(format!("tracer/src/{file}"));
        }
        assert!(
            user.iter().any(|f| f.ends_with(&format!("/{family}.rs"))),
            "no user file of the {family} family is named {family}.rs: {user:?}"
        );
    }
}
