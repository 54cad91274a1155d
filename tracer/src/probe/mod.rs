//! Kernel signals, and loading and attaching the programs that catch them.
//!
//! - `tc`: the classifiers on every watched interface (one sighting per
//!   hook a traced packet crosses);
//! - `drops`: the kfree_skb tracepoint (the kernel's drop reasons);
//! - `conntrack`: ctnetlink's translated entries (DNAT, SNAT), to follow a
//!   packet across them without a list of Services; `conntrack_stats`:
//!   its counters and fill, which tell conntrack's own drops apart;
//! - `iptables`: which iptables backend a node runs, decided as
//!   kube-proxy's iptables-wrapper decides it;
//! - `netfilter`: nftables packet tracing (which rule dropped a packet),
//!   `nft_trace`: its events read into named rules;
//! - `link_watch`: interfaces that come and go during a trace;
//! - `attach_mode`: TCX links or clsact filters (`--attach`);
//! - `btf`: the running kernel's struct layout, since Rust eBPF has no CO-RE;
//! - `capabilities`: the ones podtrace runs with, and what each missing one costs;
//! - `features`: what the running kernel can do, and what podtrace does
//!   instead where it cannot;
//! - `profile`: profile mode's step histograms, read from the kernel;
//! - `clock`: the kernel's clock (CLOCK_MONOTONIC) and its offset to the
//!   wall clock, read from userspace;
//! - `load`: one node's probe, the eBPF object loaded with its globals;
//! - `run_registry`: which run owns which filter and table, alive or not;
//! - `shared_maps`: a bpffs private to the process, for maps its probes
//!   share;
//! - `uninterrupted`: stop signals held back while programs load;
//! - `kernel`: what the running kernel says about itself, read once;
//! - `memlock`: the locked-memory limit kernels before 5.11 charge maps to.

mod attach_mode;
pub mod btf;
pub mod capabilities;
pub mod clock;
pub mod conntrack;
#[cfg(target_os = "linux")]
pub mod conntrack_stats;
pub mod drops;
pub mod features;
pub mod iptables;
mod kernel;
#[cfg(target_os = "linux")]
pub mod link_watch;
#[cfg(target_os = "linux")]
mod load;
#[cfg(target_os = "linux")]
mod memlock;
pub mod netfilter;
mod nft;
pub mod nft_rule;
pub mod nft_trace;
#[cfg(target_os = "linux")]
mod orphans;
pub mod profile;
pub mod rule_path;
pub mod rule_text;
mod run_liveness;
pub mod run_registry;
#[cfg(target_os = "linux")]
pub mod shared_maps;
mod sweep;
#[cfg(target_os = "linux")]
pub mod tc;
#[cfg(target_os = "linux")]
mod try_load;
#[cfg(target_os = "linux")]
mod uninterrupted;

pub use attach_mode::AttachMode;
#[cfg(target_os = "linux")]
pub use load::{Batch, NodeProbe, ProbeSpec, ReadThrough, BATCHES_QUEUED, RING_HANDOVER};
#[cfg(target_os = "linux")]
pub use try_load::{first_line, try_load, Loaded};

pub use kernel::Kernel;
