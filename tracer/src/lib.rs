//! podtrace: an eBPF packet tracer for Kubernetes pod traffic.
//!
//! Every folder imports only the folders listed before it here (bottom
//! first); `cargo xtask test` checks it (xtask/src/layers.rs):
//! - [`model`]: the nouns every layer shares (names, interned strings,
//!   node subnets, translations, the output format and summary, the
//!   doctor's findings, text helpers);
//! - [`node`]: what a node looks like (links, routes, neighbours over
//!   netlink), network namespaces, tunnels, interface roles;
//! - [`probe`]: kernel programs and their loading, attaching and reading:
//!   tc sightings, drops, netfilter rule tracing, conntrack's
//!   translations, link changes, the kernel's BTF layout;
//! - [`cli`]: the arguments of every command;
//! - [`cni`]: one file per CNI backend (flannel-vxlan, flannel-host-gw,
//!   calico-bird, calico-vxlan, calico-ipip, unknown), and which
//!   interfaces to watch;
//! - [`cluster`]: the Kubernetes API, inventory files, Services and
//!   kube-proxy's rules, the endpoint arguments, cluster mode's agents;
//! - [`doctor`]: `podtrace doctor`, one file per check family;
//! - [`decode`]: a kernel record into a hop (headers, node, interface);
//! - [`story`]: journeys (pure correlation), NAT, verdicts, notes,
//!   explanations, clocks, the profile;
//! - [`output`]: one sink per format (human, JSON), pcapng;
//! - [`app`]: one run in phases (resolve, attach, stream, finish), the
//!   agent, the cluster-mode front-end and their wire.

// Off Linux (macOS: the cluster-mode front-end alone) the kernel half is
// compiled out, and the helpers only it used go unused.
#![cfg_attr(
    not(target_os = "linux"),
    allow(dead_code, unused_imports, unused_variables)
)]

/// podtrace's `eprintln!`, in every module below and in main.rs: std's
/// panics when stderr is closed under podtrace (`2>&1 | head`), which
/// stopped a trace before it detached what it attached. This one drops a
/// line nobody can read any more. (Named as std's so that every message
/// is written through it, and formatted as std's by rustfmt.)
#[macro_export]
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` likewise (a line written in pieces).
#[macro_export]
macro_rules! eprint {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

pub mod app;
pub mod cli;
pub mod cluster;
pub mod cni;
pub mod decode;
pub mod doctor;
pub mod model;
pub mod node;
pub mod output;
pub mod probe;
pub mod story;
