//! What the running kernel can do, read once at start from its BTF, and
//! what podtrace does instead where something is missing. A missing
//! feature degrades the trace with one line that names it and the kernel
//! version that brings it; only the ring buffer (5.8) is a floor.
//!
//! Features are read from the kernel's own enums and tracepoint types, not
//! from its version number, so a distribution kernel with a backport gets
//! what it really has.

use std::fmt;

use anyhow::{bail, Result};

use super::{btf::Btf, AttachMode};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Features {
    /// `uname -r`.
    pub release: String,
    /// kfree_skb passes an `enum skb_drop_reason` (5.17).
    pub drop_reasons: bool,
    /// TCX links (6.6).
    pub tcx: bool,
}

/// How the drop program is attached to kfree_skb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropHook {
    /// A BTF-typed tracepoint (tp_btf, 5.5).
    Typed,
    /// A raw tracepoint, where tp_btf is refused.
    Raw,
}

/// A feature this kernel lacks: what podtrace does without it, and the
/// kernel version that brings it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Degraded {
    pub instead: &'static str,
    pub needs: &'static str,
}

impl fmt::Display for Degraded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.needs.is_empty() {
            write!(f, "{}", self.instead)
        } else {
            write!(f, "{} (needs {})", self.instead, self.needs)
        }
    }
}

const NO_DROP_REASONS: Degraded = Degraded {
    instead: "drop reasons not named, netfilter drops known by their location",
    needs: "5.17",
};
const NO_TCX: Degraded = Degraded {
    instead: "clsact instead of TCX",
    needs: "6.6",
};
/// tp_btf is older (5.5) than the ring buffer podtrace needs (5.8): a
/// kernel that refuses it has a reason of its own, not an age.
const NO_TP_BTF: Degraded = Degraded {
    instead: "a raw tracepoint for drops (this kernel refused tp_btf)",
    needs: "",
};

impl Features {
    pub fn probe(btf: &Btf) -> Result<Self> {
        let release = release();
        Self::from_btf(btf, release)
    }

    fn from_btf(btf: &Btf, release: String) -> Result<Self> {
        if !btf.has_enum_value("bpf_map_type", "BPF_MAP_TYPE_RINGBUF") {
            bail!("podtrace needs the BPF ring buffer (kernel 5.8 or newer); this kernel is {release}");
        }
        Ok(Self {
            drop_reasons: btf.tracepoint_args("kfree_skb").is_ok_and(|args| args >= 3),
            tcx: btf.has_enum_value("bpf_attach_type", "BPF_TCX_INGRESS"),
            release,
        })
    }

    /// The attach mode `asked` comes to on this kernel; `--attach tcx`
    /// where there is none is an error, not a silent change.
    pub fn attach_mode(&self, asked: AttachMode) -> Result<AttachMode> {
        Ok(match asked {
            AttachMode::Auto if self.tcx => AttachMode::Tcx,
            AttachMode::Auto => AttachMode::Clsact,
            AttachMode::Tcx if !self.tcx => bail!(
                "--attach tcx needs TCX links (kernel 6.6 or newer); this kernel ({}) has clsact only: use --attach clsact or auto",
                self.release
            ),
            other => other,
        })
    }

    /// What this run does without, given how it attached.
    pub fn degraded(&self, mode: AttachMode, drops: Option<DropHook>) -> Vec<Degraded> {
        let mut degraded = Vec::new();
        if !self.drop_reasons {
            degraded.push(NO_DROP_REASONS);
        }
        if mode == AttachMode::Clsact && !self.tcx {
            degraded.push(NO_TCX);
        }
        if drops == Some(DropHook::Raw) {
            degraded.push(NO_TP_BTF);
        }
        degraded
    }
}

/// The running kernel's release (`uname -r`).
fn release() -> String {
    // SAFETY: uname fills the zeroed struct it is given.
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut name) } != 0 {
        return "unknown".into();
    }
    let bytes: Vec<u8> = name
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The banner line for what a run does without, if anything.
pub fn banner(release: &str, degraded: &[Degraded]) -> Option<String> {
    if degraded.is_empty() {
        return None;
    }
    let list: Vec<String> = degraded.iter().map(ToString::to_string).collect();
    Some(format!("kernel {release}: {}", list.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(drop_reasons: bool, tcx: bool) -> Features {
        Features {
            release: "5.10.0-32-amd64".into(),
            drop_reasons,
            tcx,
        }
    }

    #[test]
    fn an_old_kernel_degrades_and_says_what_it_needs() {
        let old = kernel(false, false);
        let mode = old.attach_mode(AttachMode::Auto).unwrap();
        assert_eq!(mode, AttachMode::Clsact);
        let degraded = old.degraded(mode, Some(DropHook::Typed));
        assert_eq!(
            banner(&old.release, &degraded).unwrap(),
            "kernel 5.10.0-32-amd64: drop reasons not named, netfilter drops known by their location (needs 5.17); clsact instead of TCX (needs 6.6)"
        );
        let error = old.attach_mode(AttachMode::Tcx).unwrap_err().to_string();
        assert!(error.contains("needs TCX links (kernel 6.6"), "{error}");
    }

    #[test]
    fn a_kernel_without_the_ring_buffer_is_refused_in_one_line() {
        let btf = Btf::parse(crate::probe::btf::tests::sample()).unwrap();
        let error = Features::from_btf(&btf, "4.19.0".into())
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "podtrace needs the BPF ring buffer (kernel 5.8 or newer); this kernel is 4.19.0"
        );
    }

    #[test]
    fn a_new_kernel_degrades_nothing_unless_asked() {
        let new = kernel(true, true);
        assert_eq!(new.attach_mode(AttachMode::Auto).unwrap(), AttachMode::Tcx);
        assert!(new
            .degraded(AttachMode::Tcx, Some(DropHook::Typed))
            .is_empty());
        // clsact by choice is no degradation of the kernel's.
        assert!(new
            .degraded(AttachMode::Clsact, Some(DropHook::Typed))
            .is_empty());
        assert_eq!(
            new.degraded(AttachMode::Tcx, Some(DropHook::Raw)),
            [NO_TP_BTF]
        );
        assert_eq!(banner(&new.release, &[]), None);
    }
}
