//! A build for another OS than Linux (macOS, for `kubectl podtrace` from a
//! laptop) is the cluster-mode front-end alone: it talks to the API,
//! starts agent pods and tells their stories. What needs this machine's
//! kernel (programs loaded, netlink, namespaces) is refused in one line.
//! Compiled everywhere so that Linux's tests check what macOS says.

use crate::cli::{Args, Cli, Command};

/// What a trace or command would need this machine's kernel for (`None`:
/// the front-end can do it anywhere). `cluster_mode`: the trace runs on
/// agents (`--cluster-mode`, or run as `kubectl podtrace`).
pub fn needs_the_kernel(cli: &Cli, cluster_mode: impl Fn(&Args) -> bool) -> Option<&'static str> {
    match &cli.command {
        Some(Command::Agent(_)) => Some("podtrace agent"),
        // --api-only examines no node: the API's checks work from here.
        Some(Command::Doctor(doctor)) if !doctor.api_only => {
            Some("podtrace doctor without --api-only")
        }
        Some(Command::Doctor(_)) => None,
        Some(Command::Profile(_)) => Some("podtrace profile"),
        Some(Command::Kernel(_)) => Some("podtrace kernel"),
        Some(Command::Read(_) | Command::Completions(_) | Command::Man(_) | Command::Schema) => {
            None
        }
        None => match &cli.trace {
            Some(trace) if !cluster_mode(trace) => Some("node mode"),
            _ => None,
        },
    }
}

/// The one line said instead, naming the way that works from here.
pub fn refusal(what: &str) -> String {
    format!(
        "podtrace: {what} needs Linux (this build is the cluster-mode front-end); \
         from this machine use kubectl podtrace (cluster mode)"
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn needs(words: &[&str], cluster_mode: bool) -> Option<&'static str> {
        let cli = Cli::try_parse_from(words).expect("the arguments parse");
        needs_the_kernel(&cli, |_| cluster_mode)
    }

    #[test]
    fn cluster_mode_and_offline_commands_need_no_kernel() {
        assert_eq!(needs(&["podtrace", "default/a", "default/b"], true), None);
        assert_eq!(needs(&["podtrace", "read", "x.pcapng"], false), None);
        assert_eq!(needs(&["podtrace", "completions", "zsh"], false), None);
        assert_eq!(needs(&["podtrace", "doctor", "--api-only"], false), None);
    }

    #[test]
    fn node_mode_and_node_commands_are_refused_by_name() {
        assert_eq!(
            needs(&["podtrace", "default/a", "default/b"], false),
            Some("node mode")
        );
        assert_eq!(
            needs(&["podtrace", "kernel"], true),
            Some("podtrace kernel")
        );
        assert_eq!(
            needs(&["podtrace", "doctor"], true),
            Some("podtrace doctor without --api-only")
        );
        let line = refusal("node mode");
        assert!(
            line.starts_with("podtrace: node mode needs Linux"),
            "{line}"
        );
        assert!(line.contains("kubectl podtrace"), "{line}");
        assert!(!line.contains('\n'), "{line}");
    }
}
