//! The command line describing itself to shells and `man`: completion
//! scripts (`podtrace completions SHELL`), man pages (`podtrace man DIR`)
//! and the answers kubectl's plugin completion asks for (`podtrace
//! __complete WORD…`). All three come from the one clap definition, so
//! they cannot fall behind a new flag.

use std::{
    ffi::OsString,
    io::Write,
    path::{Path, PathBuf},
};

use clap::CommandFactory;

use super::Cli;

/// The first argument that asks for completions as kubectl's plugin
/// completion wants them (the name cobra's programs answer to).
pub const COMPLETE: &str = "__complete";

/// What an executable named `kubectl_complete-<plugin>` is for kubectl
/// (1.26 and later): it runs it with the words after the plugin's name.
pub const KUBECTL_COMPLETE_PREFIX: &str = "kubectl_complete-";

/// Whether a program named `name` runs as a kubectl plugin: kubectl runs
/// `kubectl-<plugin>` (krew links it so) for any plugin name, and krew's
/// index already has a `podtrace` that is not this one (README, "Not
/// gma1k/podtrace").
pub fn is_kubectl_plugin_name(name: &str) -> bool {
    name.starts_with("kubectl-")
}

/// `podtrace completions SHELL`: the script that makes SHELL complete
/// podtrace's subcommands, flags and their values.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn Write) {
    clap_complete::generate(shell, &mut Cli::command(), "podtrace", out);
}

/// `podtrace man DIR`: podtrace.1 and a page per subcommand
/// (podtrace-doctor.1, …) in DIR; the pages DIR then holds.
pub fn man_pages(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    clap_mangen::generate_to(Cli::command(), dir)?;
    let mut pages = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("podtrace") && name.ends_with(".1") {
            pages.push(path);
        }
    }
    pages.sort();
    Ok(pages)
}

/// The completions of the last of `words` (the words typed after the
/// command's name, the last one possibly empty), in cobra's format as
/// kubectl passes them on: a candidate a line (`value\thelp`), then
/// `:4` (cobra's "no file completion": podtrace's candidates are all
/// it takes where it has any).
pub fn complete_words(words: &[OsString]) -> String {
    let mut args = vec![OsString::from("podtrace")];
    args.extend(words.iter().cloned());
    if args.len() == 1 {
        args.push(OsString::new());
    }
    let index = args.len() - 1;
    let mut command = Cli::command();
    // Paths (--kubeconfig, --write, …) complete from where the shell is.
    let here = std::env::current_dir().ok();
    let candidates = clap_complete::engine::complete(&mut command, args, index, here.as_deref())
        .unwrap_or_default();
    let mut answer = String::new();
    for candidate in candidates.iter().filter(|c| !c.is_hide_set()) {
        answer.push_str(&candidate.get_value().to_string_lossy());
        if let Some(help) = candidate.get_help() {
            let help = help.to_string();
            let first_line = help.lines().next().unwrap_or("");
            answer.push('\t');
            answer.push_str(first_line);
        }
        answer.push('\n');
    }
    answer.push_str(":4\n");
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_kubectl_plugin_name_is_one_and_its_completer_is_not() {
        assert!(is_kubectl_plugin_name("kubectl-podtrace"));
        assert!(is_kubectl_plugin_name("kubectl-podpath"));
        assert!(!is_kubectl_plugin_name("podtrace"));
        assert!(!is_kubectl_plugin_name("kubectl_complete-podpath"));
    }

    #[test]
    fn kubectl_gets_flags_values_and_subcommands_in_cobras_format() {
        let words = |w: &[&str]| -> Vec<OsString> { w.iter().map(OsString::from).collect() };
        let flags = complete_words(&words(&["web-0", "db-0", "--cou"]));
        assert!(flags.starts_with("--count\t"), "{flags}");
        assert!(flags.ends_with("\n:4\n"), "{flags}");
        let values = complete_words(&words(&["doctor", "-o", ""]));
        assert_eq!(values, "human\njson\n:4\n");
        let first = complete_words(&[]);
        assert!(first.lines().any(|l| l.starts_with("doctor\t")), "{first}");
        assert!(!first.contains("\nagent"), "hidden: {first}");
    }
}
