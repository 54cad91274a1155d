//! The tc signal: podtrace's classifiers on both hooks of an interface.
//!
//! Attachment is by TCX link, first in line, so podtrace sees a packet
//! before any CNI program can redirect it; the kernel removes the links
//! when their fds close, even after SIGKILL. Kernels without TCX (< 6.6)
//! get clsact filters instead, which podtrace removes on exit and, after a
//! crash, on the next start.

use std::io;

use anyhow::{anyhow, Context, Result};
use aya::{
    programs::{
        tc::{self, NlOptions, TcAttachOptions},
        LinkOrder, SchedClassifier, TcAttachType,
    },
    util::KernelVersion,
    Ebpf,
};
use podtrace_common::names;

use crate::node::interfaces::Watched;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// TCX links where the kernel has them (≥ 6.6), clsact otherwise.
    Auto,
    Tcx,
    Clsact,
}

impl AttachMode {
    pub(super) fn resolve(self) -> Self {
        match self {
            Self::Auto
                if KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0)) =>
            {
                Self::Tcx
            }
            Self::Auto => Self::Clsact,
            other => other,
        }
    }
}

/// Every tc program, loaded once per node before any attachment.
pub(super) const PROGRAMS: [&str; 4] = [
    names::TC_INGRESS,
    names::TC_EGRESS,
    names::TC_INGRESS_L3,
    names::TC_EGRESS_L3,
];

/// Attaches the right pair of programs to both hooks of `iface` (in the
/// current thread's namespace). Returns whether podtrace added a clsact
/// qdisc for it.
pub(super) fn attach_interface(ebpf: &mut Ebpf, iface: &Watched, mode: AttachMode) -> Result<bool> {
    let (ingress, egress) = if iface.has_ethernet_header {
        (names::TC_INGRESS, names::TC_EGRESS)
    } else {
        (names::TC_INGRESS_L3, names::TC_EGRESS_L3)
    };
    let mut added_qdisc = false;
    for (name, hook) in [
        (ingress, TcAttachType::Ingress),
        (egress, TcAttachType::Egress),
    ] {
        added_qdisc |= attach_one(program(ebpf, name)?, name, &iface.name, hook, mode)?;
    }
    Ok(added_qdisc)
}

pub(super) fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier> {
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("no program {name}"))?;
    Ok(program.try_into()?)
}

fn attach_one(
    program: &mut SchedClassifier,
    name: &str,
    iface: &str,
    hook: TcAttachType,
    mode: AttachMode,
) -> Result<bool> {
    let gone = || format!("cannot attach to {iface} (is the interface gone?)");
    let mut added_qdisc = false;
    if mode == AttachMode::Clsact {
        match tc::qdisc_add_clsact(iface) {
            Ok(()) => added_qdisc = true,
            Err(tc::TcError::IoError(e)) if e.kind() == io::ErrorKind::NotFound => {
                return Err(anyhow!(e)).with_context(gone)
            }
            // Already there (another tool's, or ours from an earlier run).
            Err(_) => {}
        }
        remove_stale_filter(iface, hook, name);
        program
            .attach_with_options(
                iface,
                hook,
                TcAttachOptions::Netlink(NlOptions {
                    priority: 1,
                    ..Default::default()
                }),
            )
            .with_context(gone)?;
    } else {
        program
            .attach_with_options(iface, hook, TcAttachOptions::TcxOrder(LinkOrder::first()))
            .with_context(gone)?;
    }
    Ok(added_qdisc)
}

/// A clsact filter of ours left by a podtrace that was killed.
fn remove_stale_filter(iface: &str, hook: TcAttachType, name: &str) {
    // NotFound is the normal case; anything else will surface at attach.
    let _ = tc::qdisc_detach_program(iface, hook, name);
}
