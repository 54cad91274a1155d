//! The nouns every layer shares, at the bottom of the tree: names, the
//! interned strings, node subnets, address translations, the output
//! format and summary, conntrack's entries and counters, netfilter rules
//! as podtrace names them, the doctor's findings, `--probe`'s traffic,
//! text helpers, bounded reads of files. Nothing here imports another
//! folder of podtrace.

pub mod bounded;
pub mod conntrack;
pub mod finding;
pub mod format;
pub mod interned;
pub mod name;
pub mod netfilter;
pub mod probe;
pub mod subnet;
pub mod summary;
pub mod text;
pub mod translation;

/// What this build cannot do off Linux (a macOS build is the cluster-mode
/// front-end: namespaces, netlink and loaded programs are Linux's).
pub fn needs_linux(what: &str) -> anyhow::Error {
    anyhow::anyhow!("{what} needs Linux")
}

pub use finding::Finding;
pub use format::{Format, MAX_SNAPLEN};
pub use name::Name;
pub use probe::{ProbeKind, ProbeResult};
pub use subnet::{NodeSubnet, NodeSubnet6, Vtep6};
pub use summary::{KernelSummary, NodeCounts, Summary, KEEP_UP};
pub use translation::{Frontend, Translation};
