//! Kernel signals, and loading and attaching the programs that catch them.
//!
//! - `tc`: the classifiers on every watched interface (one sighting per
//!   hook a traced packet crosses);
//! - `drops`: the kfree_skb tracepoint (the kernel's drop reasons);
//! - `conntrack`: ctnetlink's translated entries (DNAT, SNAT), to follow a
//!   packet across them without a list of Services;
//! - `iptables`: which iptables backend a node runs, decided as
//!   kube-proxy's iptables-wrapper decides it;
//! - `netfilter`: nftables packet tracing (which rule dropped a packet),
//!   `nft_trace`: its events read into named rules;
//! - `link_watch`: interfaces that come and go during a trace;
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
//! - `memlock`: the locked-memory limit kernels before 5.11 charge maps to.

pub mod btf;
pub mod capabilities;
pub mod clock;
pub mod conntrack;
pub mod drops;
pub mod features;
pub mod iptables;
pub mod link_watch;
mod load;
mod memlock;
pub mod netfilter;
pub mod nft_trace;
mod orphans;
pub mod profile;
pub mod rule_text;
mod run_liveness;
pub mod run_registry;
pub mod shared_maps;
pub mod tc;
mod try_load;
mod uninterrupted;

use anyhow::{Context as _, Result};
use podtrace_common::KernelLayout;

use crate::model::KernelSummary;

pub use load::{Batch, NodeProbe, ProbeSpec, ReadThrough, BATCHES_QUEUED, RING_HANDOVER};
pub use tc::AttachMode;
pub use try_load::{first_line, try_load, Loaded};

use self::{
    btf::Btf,
    capabilities::Capabilities,
    drops::{ReasonNames, Symbols},
    features::Features,
};

/// What the running kernel says about itself, read once.
pub struct Kernel {
    pub layout: KernelLayout,
    pub features: Features,
    pub reasons: ReasonNames,
    pub symbols: Symbols,
}

impl Kernel {
    pub fn read() -> Result<Self> {
        let btf = Btf::from_sys_fs()?;
        let features = Features::probe(&btf)?;
        Ok(Self {
            layout: drops::kernel_layout(&btf)?,
            reasons: ReasonNames::from_btf(&btf, features.drop_reasons),
            features,
            symbols: Symbols::from_kallsyms()?,
        })
    }

    /// Says on stderr what this kernel cannot do for the trace, and keeps
    /// it for the summary.
    pub fn say_degraded(
        &self,
        mode: AttachMode,
        drops: Option<features::DropHook>,
    ) -> KernelSummary {
        let degraded = self.features.degraded(mode, drops);
        if let Some(line) = features::banner(&self.features.release, &degraded) {
            eprintln!("podtrace: {line}");
        }
        let without_privileges = Capabilities::of_this_process().degraded(self.symbols.is_empty());
        for lost in &without_privileges {
            eprintln!("podtrace: {lost}");
        }
        KernelSummary {
            release: self.features.release.clone(),
            degraded: degraded
                .iter()
                .map(ToString::to_string)
                .chain(without_privileges)
                .collect(),
        }
    }

    /// The kernel's BTF as aya loads BTF-typed programs with it; only
    /// needed while attaching (it is large: drop it after).
    pub fn typed_btf() -> Result<aya::Btf> {
        aya::Btf::from_sys_fs().context("aya cannot read the kernel's BTF")
    }
}
