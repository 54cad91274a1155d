use super::*;

/// A crate tree in a fresh temporary folder: `(relative path, text)`.
fn tree(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let root = std::env::temp_dir().join(format!("file-cycles-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (path, text) in files {
        let file = root.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, text).unwrap();
    }
    root
}

fn cycles_of(name: &str, files: &[(&str, &str)]) -> Vec<String> {
    let root = tree(name, files);
    let found = file_cycles(&root).unwrap();
    std::fs::remove_dir_all(&root).unwrap();
    found.iter().map(|c| c.to_string()).collect()
}

#[test]
fn a_child_using_its_mod_rs_that_calls_it_is_a_cycle() {
    let found = cycles_of(
        "hub",
        &[
            ("lib.rs", "pub mod story;"),
            (
                "story/mod.rs",
                "mod verdict;\npub struct Story;\npub fn tell() { verdict::judge(); }",
            ),
            ("story/verdict.rs", "use super::Story;\npub fn judge() {}"),
        ],
    );
    assert_eq!(found, ["story: mod.rs:3 → verdict.rs:1 → mod.rs"]);
}

#[test]
fn an_index_that_only_re_exports_leads_to_the_file_that_defines() {
    let found = cycles_of(
        "index",
        &[
            ("lib.rs", "pub mod story;"),
            (
                "story/mod.rs",
                "mod journey;\nmod verdict;\npub use journey::Story;\npub use verdict::{judge, Verdict as V};",
            ),
            ("story/journey.rs", "pub struct Story;"),
            (
                "story/verdict.rs",
                "use super::Story;\nuse crate::story::Story as S;\npub struct Verdict;\npub fn judge() {}",
            ),
        ],
    );
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn globs_inline_paths_and_sub_folders_are_imports() {
    let found = cycles_of(
        "glob",
        &[
            ("lib.rs", "pub mod app;"),
            ("app/mod.rs", "mod front;\nmod wire;\npub struct Run;"),
            (
                "app/wire.rs",
                "use super::*;\npub fn send() { crate::app::front::lost(); }",
            ),
            (
                "app/front/mod.rs",
                "pub fn lost() { super::super::app::wire::send(); }",
            ),
        ],
    );
    assert_eq!(found, ["app: front/:1 → wire.rs:2 → front/"]);
}

#[test]
fn an_imported_module_and_a_path_after_for_in_are_imports() {
    let found = cycles_of(
        "alias",
        &[
            ("lib.rs", "pub mod story;"),
            ("story/mod.rs", "mod nat;\nmod verdict;"),
            (
                "story/nat.rs",
                "pub fn steps() { for _ in super::verdict::all() {} }",
            ),
            (
                "story/verdict.rs",
                "use crate::story;\npub fn all() -> Vec<()> { story::nat::steps(); vec![] }",
            ),
        ],
    );
    assert_eq!(found, ["story: nat.rs:1 → verdict.rs:2 → nat.rs"]);
}

#[test]
fn tests_extern_names_and_inline_modules_are_not() {
    let found = cycles_of(
        "tests",
        &[
            ("lib.rs", "pub mod story;"),
            (
                "story/mod.rs",
                "mod verdict;\nuse serde::Serialize;\npub fn tell() { verdict::judge(); }",
            ),
            ("story/seen.rs", "pub(in crate::story) fn seen() {}"),
            (
                "story/verdict.rs",
                "use super::Serialize;\npub fn judge() {}\nmod inner { use super::judge; }\n\
                 #[cfg(test)]\nmod tests { use crate::story::tell; }",
            ),
        ],
    );
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn tracer_cycles_are_only_in_the_folders_left_to_take_apart() {
    let cycles = file_cycles(&crate::layers::tracer_src().unwrap()).unwrap();
    for cycle in &cycles {
        eprintln!("left: {cycle}");
    }
    let problems = unlisted(&cycles, CYCLES_LEFT);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_cleaned_folder_must_leave_the_list() {
    let cycle = FileCycle {
        folder: "story".into(),
        steps: vec![("a.rs".into(), 1), ("b.rs".into(), 2)],
    };
    assert_eq!(
        unlisted(&[cycle], &["story", "doctor"]),
        ["doctor: no cycle left, so take it off CYCLES_LEFT"]
    );
    assert_eq!(unlisted(&[], &[]), Vec::<String>::new());
}
