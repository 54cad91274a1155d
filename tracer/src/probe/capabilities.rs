//! The capabilities podtrace runs with (a pod's `securityContext`, not
//! full root), checked before anything is attached: one that the trace
//! cannot do without is refused in one line naming it and what it is for;
//! one that only takes something away is said at start, with what is lost.
//!
//! CAP_SYS_ADMIN is required (entering the nodes' and pods' network
//! namespaces, the process's own bpffs), and it also grants what CAP_BPF
//! and CAP_PERFMON would (loading the programs, reading kernel memory in
//! them), so those two are never asked for on their own.

use super::drops::NoSymbols;
use anyhow::{bail, Result};

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYSLOG: u32 = 34;

/// A capability the trace cannot do without, and what for.
const REQUIRED: [(u32, &str, &str); 2] = [
    (
        CAP_SYS_ADMIN,
        "CAP_SYS_ADMIN",
        "to enter the nodes' and pods' network namespaces and load its eBPF programs",
    ),
    (
        CAP_NET_ADMIN,
        "CAP_NET_ADMIN",
        "to attach to tc hooks and add its nft tracing table",
    ),
];

/// The effective capabilities of this process.
#[derive(Clone, Copy, Debug)]
pub struct Capabilities(u64);

impl Capabilities {
    pub fn of_this_process() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        Self::from_status(&status)
    }

    /// From `/proc/PID/status`'s `CapEff:` line (all, if it has none:
    /// a kernel that does not say cannot be second-guessed).
    pub fn from_status(status: &str) -> Self {
        let effective = status
            .lines()
            .find_map(|line| line.strip_prefix("CapEff:"))
            .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok());
        Self(effective.unwrap_or(u64::MAX))
    }

    pub fn has(self, capability: u32) -> bool {
        self.0 & (1 << capability) != 0
    }

    /// The one-line refusal when a capability the trace needs is missing.
    pub fn require(self) -> Result<()> {
        for (capability, name, what_for) in REQUIRED {
            if !self.has(capability) {
                bail!("podtrace needs {name} {what_for}: add it to the pod's securityContext capabilities (or run as full root)");
            }
        }
        Ok(())
    }

    /// What is lost for lack of a capability that is not required, or
    /// of a kernel symbol table, for the start banner. `no_symbols`: why
    /// drop locations cannot be named (the kernel hides addresses unless
    /// CAP_SYSLOG, depending on kernel.kptr_restrict and
    /// kernel.perf_event_paranoid; or the file could not be read at all,
    /// which no sysctl explains).
    pub fn degraded(self, no_symbols: Option<NoSymbols>) -> Vec<String> {
        let mut lost = Vec::new();
        match no_symbols {
            Some(NoSymbols::Hidden) => lost.push(format!(
                "drop locations as raw addresses: /proc/kallsyms shows none to this process (kernel.kptr_restrict={}, kernel.perf_event_paranoid={}){}",
                sysctl("kernel/kptr_restrict"),
                sysctl("kernel/perf_event_paranoid"),
                if self.has(CAP_SYSLOG) { "" } else { " without CAP_SYSLOG" }
            )),
            Some(NoSymbols::Unreadable(why)) => {
                lost.push(format!("drop locations as raw addresses: {why}"))
            }
            None => {}
        }
        if !self.has(CAP_SYS_PTRACE) {
            lost.push("without CAP_SYS_PTRACE, the namespaces of processes run as other users (a pod's pause container) cannot be opened: a pod found only through its namespace may be missed".into());
        }
        lost
    }
}

fn sysctl(name: &str) -> String {
    std::fs::read_to_string(format!("/proc/sys/{name}"))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_required_capability_is_named_with_what_it_is_for() {
        // The agent's set without CAP_NET_ADMIN: SYS_ADMIN, SYS_PTRACE,
        // NET_RAW, SYSLOG.
        let caps = Capabilities::from_status("Name:\tpodtrace\nCapEff:\t0000000400282000\n");
        assert!(caps.has(CAP_SYS_ADMIN) && !caps.has(CAP_NET_ADMIN));
        let refusal = format!("{:#}", caps.require().unwrap_err());
        assert!(
            refusal.contains("CAP_NET_ADMIN to attach to tc hooks"),
            "{refusal}"
        );
        assert_eq!(refusal.lines().count(), 1);
        let full = Capabilities::from_status("CapEff:\t000001ffffffffff\n");
        assert!(full.require().is_ok());
        assert!(full.degraded(None).is_empty());
    }

    #[test]
    fn hidden_kernel_addresses_say_which_capability_shows_them() {
        let without_syslog = Capabilities::from_status("CapEff:\t0000000000283000\n");
        let lost = without_syslog.degraded(Some(NoSymbols::Hidden));
        assert!(lost[0].contains("without CAP_SYSLOG"), "{lost:?}");
        assert!(lost[0].contains("kernel.kptr_restrict="), "{lost:?}");
    }

    #[test]
    fn an_unreadable_kallsyms_says_why_and_blames_no_sysctl() {
        let lost = Capabilities::from_status("CapEff:\t000001ffffffffff\n").degraded(Some(
            NoSymbols::Unreadable("cannot read /proc/kallsyms: Permission denied".into()),
        ));
        assert_eq!(
            lost,
            ["drop locations as raw addresses: cannot read /proc/kallsyms: Permission denied"]
        );
    }
}
