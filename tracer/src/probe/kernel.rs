//! What the running kernel says about itself (its layout, features, drop
//! reasons and symbols), read once per run.

use anyhow::{Context as _, Result};
use podtrace_common::drops::KernelLayout;

use crate::model::KernelSummary;

use super::{
    btf::Btf,
    capabilities::Capabilities,
    drops,
    drops::{ReasonNames, Symbols},
    features,
    features::Features,
    AttachMode,
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
        // First: the symbols are read while everything else is.
        let symbols = Symbols::from_kallsyms();
        let btf = Btf::from_sys_fs()?;
        let features = Features::probe(&btf)?;
        Ok(Self {
            layout: drops::kernel_layout(&btf)?,
            reasons: ReasonNames::from_btf(&btf, features.drop_reasons),
            features,
            symbols,
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
        let without_privileges = Capabilities::of_this_process().degraded(self.symbols.missing());
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

    #[cfg(target_os = "linux")]
    /// The kernel's BTF as aya loads BTF-typed programs with it; only
    /// needed while attaching (it is large: drop it after).
    pub fn typed_btf() -> Result<aya::Btf> {
        aya::Btf::from_sys_fs().context("aya cannot read the kernel's BTF")
    }
}
