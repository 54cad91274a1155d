//! Which iptables a node runs: the one home of that decision. A container's
//! own `iptables --version` says only which backend its image links
//! (nf_tables in every recent image); the node's rules may live in the
//! other. The node is asked as kube-proxy's iptables-wrapper asks it:
//!
//! 1. kubelet (1.17 and later) makes `KUBE-IPTABLES-HINT` or
//!    `KUBE-KUBELET-CANARY` in the mangle table of the backend it uses:
//!    found in iptables-nft's, the node is nft; in iptables-legacy's, it
//!    is legacy (read with a whole `-save`: `-t mangle` would make the
//!    legacy table where it does not exist);
//! 2. otherwise the backend with more rules (`-A` lines of both families)
//!    wins, nft on a tie.
//!
//! The kernel runs both backends' rules on every packet, whichever is
//! decided: a node's legacy rules are still read where they exist (the
//! doctor's firewall checks), and a drop that nft's rule tracing cannot
//! see is said to be possibly theirs.

use std::process::Command;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::node::netns::Namespace;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Backend {
    Nft,
    Legacy,
}

impl Backend {
    /// `iptables-nft` / `iptables-legacy`: as the node's tools name it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nft => "iptables-nft",
            Self::Legacy => "iptables-legacy",
        }
    }

    /// The backend's own `iptables` (`ip6tables`) program.
    pub fn program(self, ipv6: bool) -> String {
        let family = if ipv6 { "ip6tables" } else { "iptables" };
        let suffix = match self {
            Self::Nft => "nft",
            Self::Legacy => "legacy",
        };
        format!("{family}-{suffix}")
    }

    /// Its `iptables-save` (`ip6tables-save`).
    pub fn save_program(self, ipv6: bool) -> String {
        let save = self.save_command(ipv6);
        save.get_program().to_string_lossy().into_owned()
    }

    fn save_command(self, ipv6: bool) -> Command {
        // Spelt out, so that the image check sees which programs run.
        let save = match (self, ipv6) {
            (Self::Nft, false) => "iptables-nft-save",
            (Self::Nft, true) => "ip6tables-nft-save",
            (Self::Legacy, false) => "iptables-legacy-save",
            (Self::Legacy, true) => "ip6tables-legacy-save",
        };
        Command::new(save)
    }

    /// Its whole `-save` of one family, or None where it cannot be read
    /// (not installed, or no table).
    pub fn save(self, ipv6: bool) -> Option<String> {
        output(&mut self.save_command(ipv6))
    }

    /// One table of its `-save`, never made where it does not exist: a
    /// legacy table is taken from the whole save.
    pub fn save_table(self, ipv6: bool, table: &str) -> Option<String> {
        match self {
            Self::Nft => output(self.save_command(ipv6).args(["-t", table])),
            Self::Legacy => Some(table_of(&self.save(ipv6)?, table)),
        }
    }
}

/// What the node's two iptables hold, and which one it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIptables {
    /// None: neither backend's tools run here.
    pub backend: Option<Backend>,
    /// How it was decided, for the messages.
    pub decided_by: String,
    /// `-A` lines in iptables-legacy, both families.
    pub legacy_rules: usize,
}

/// kubelet's chains in the mangle table of the backend it uses.
const KUBELET_CHAINS: [&str; 2] = [":KUBE-IPTABLES-HINT ", ":KUBE-KUBELET-CANARY "];

fn has_kubelet_chains(saved: &str) -> bool {
    saved.lines().any(|l| {
        KUBELET_CHAINS
            .iter()
            .any(|c| l.starts_with(c) || l == c.trim_end())
    })
}

fn rule_count(saved: &str) -> usize {
    saved.lines().filter(|l| l.starts_with("-A ")).count()
}

/// One `*table` section of an `iptables-save` (empty where it has none).
pub fn table_of(saved: &str, table: &str) -> String {
    let header = format!("*{table}");
    let mut inside = false;
    let mut out = String::new();
    for line in saved.lines() {
        if line == header {
            inside = true;
        }
        if inside {
            out.push_str(line);
            out.push('\n');
            if line == "COMMIT" {
                break;
            }
        }
    }
    out
}

impl NodeIptables {
    /// Asks the node of the calling thread's network namespace.
    pub fn detect() -> Self {
        let both = |backend: Backend, table: Option<&str>| -> Option<String> {
            let saves: Vec<String> = [false, true]
                .into_iter()
                .filter_map(|ipv6| match table {
                    Some(table) => backend.save_table(ipv6, table),
                    None => backend.save(ipv6),
                })
                .collect();
            (!saves.is_empty()).then(|| saves.concat())
        };
        let nft_mangle = both(Backend::Nft, Some("mangle"));
        let legacy = both(Backend::Legacy, None);
        decide(nft_mangle.as_deref(), legacy.as_deref(), || {
            both(Backend::Nft, None)
        })
    }

    /// Why a netfilter drop's rule is not named on this node, when rule
    /// tracing cannot see it: None where it can (an nft node whose legacy
    /// tables are empty).
    pub fn why_untraceable(&self) -> Option<String> {
        match self.backend {
            None => Some("iptables is not installed here, so rule tracing cannot run".into()),
            Some(Backend::Legacy) => Some(format!(
                "this node runs iptables-legacy ({}), whose rules nft's rule tracing cannot see; the doctor's firewall findings name the legacy DROP rules that match the pair, if any",
                self.decided_by
            )),
            Some(Backend::Nft) => None,
        }
    }

    /// Where the node runs iptables-nft but also has legacy rules, which
    /// rule tracing cannot see: what an unnamed drop's verdict says.
    pub fn legacy_beside_nft(&self) -> Option<String> {
        (self.backend == Some(Backend::Nft) && self.legacy_rules > 0).then(|| {
            format!(
                "no nft rule was traced dropping it, and this node also has {} iptables-legacy rule(s), which rule tracing cannot see; the doctor's firewall findings name the legacy DROP rules that match the pair, if any",
                self.legacy_rules
            )
        })
    }
}

/// What rule tracing can see on the traced nodes, each asked in its own
/// namespace (not through this process's `iptables`, which may be a
/// container's).
#[derive(Clone, Debug)]
pub struct RuleSight {
    /// Why no rule is named on any node (tracing off, or no node's rules
    /// visible to it); None: rule tracing runs.
    pub off: Option<&'static str>,
    /// Each node's reason, in order, why a drop there may have no traced
    /// rule (its legacy rules); None where that is not so.
    pub unseen: Vec<Option<String>>,
}

impl RuleSight {
    pub fn of(namespaces: &[Namespace], tracing_off: bool) -> Result<Self> {
        if tracing_off {
            return Ok(Self {
                off: Some("rule tracing is off (--no-ruleset-changes)"),
                unseen: vec![None; namespaces.len()],
            });
        }
        let nodes: Vec<NodeIptables> = namespaces
            .iter()
            .map(|ns| ns.run(|| Ok(NodeIptables::detect())))
            .collect::<Result<_>>()?;
        let untraceable = nodes.iter().all(|n| n.why_untraceable().is_some());
        Ok(Self {
            off: untraceable.then_some("rule tracing cannot see the traced nodes' rules"),
            unseen: (nodes.iter())
                .map(|n| n.why_untraceable().or_else(|| n.legacy_beside_nft()))
                .collect(),
        })
    }
}

/// The wrapper's decision from `nft_mangle` (iptables-nft's mangle tables),
/// `legacy` (iptables-legacy's whole saves), and `nft_all` (iptables-nft's
/// whole saves, read only when the counts decide). None: not installed.
fn decide(
    nft_mangle: Option<&str>,
    legacy: Option<&str>,
    nft_all: impl FnOnce() -> Option<String>,
) -> NodeIptables {
    let legacy_rules = legacy.map_or(0, rule_count);
    let decided = |backend: Backend, decided_by: String| NodeIptables {
        backend: Some(backend),
        decided_by,
        legacy_rules,
    };
    if nft_mangle.is_some_and(has_kubelet_chains) {
        return decided(
            Backend::Nft,
            "kubelet's KUBE-IPTABLES-HINT chain is in iptables-nft's mangle table".into(),
        );
    }
    if legacy.is_some_and(has_kubelet_chains) {
        return decided(
            Backend::Legacy,
            "kubelet's KUBE-IPTABLES-HINT chain is in iptables-legacy's mangle table".into(),
        );
    }
    let nft = nft_all();
    if nft.is_none() && legacy.is_none() && nft_mangle.is_none() {
        return NodeIptables {
            backend: None,
            decided_by: "neither iptables-nft-save nor iptables-legacy-save runs here".into(),
            legacy_rules,
        };
    }
    let nft_rules = nft.as_deref().map_or(0, rule_count);
    let backend = if legacy_rules > nft_rules {
        Backend::Legacy
    } else {
        Backend::Nft
    };
    decided(
        backend,
        format!("iptables-legacy holds {legacy_rules} rule(s), iptables-nft {nft_rules}"),
    )
}

/// A command's stdout, when it succeeds.
pub(crate) fn output(command: &mut Command) -> Option<String> {
    let out = command.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HINT: &str = "*mangle\n:PREROUTING ACCEPT [0:0]\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n";
    const EMPTY_MANGLE: &str = "*mangle\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n";
    const LEGACY_DROP: &str =
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n-A FORWARD -s 10.244.1.2/32 -j DROP\nCOMMIT\n";

    #[test]
    fn kubelets_hint_decides_first_then_the_rule_counts() {
        let nft = || Some("-A KUBE-SERVICES -j RETURN\n".repeat(20));
        // kubelet's chain in nft's mangle wins over any legacy count.
        let hinted = decide(Some(HINT), Some(&LEGACY_DROP.repeat(30)), || unreachable!());
        assert_eq!(hinted.backend, Some(Backend::Nft));
        assert_eq!(hinted.legacy_rules, 30);
        assert!(hinted
            .legacy_beside_nft()
            .is_some_and(|w| w.contains("30 iptables-legacy rule(s)")));
        // In legacy's tables: legacy, though nft has more rules.
        let legacy = format!("{LEGACY_DROP}{HINT}");
        let hinted = decide(Some(EMPTY_MANGLE), Some(&legacy), nft);
        assert_eq!(hinted.backend, Some(Backend::Legacy));
        let why = hinted.why_untraceable().unwrap();
        assert!(
            why.contains("iptables-legacy") && !why.contains("packets/s"),
            "{why}"
        );
        // No hint: the counts; one stray legacy rule does not make a
        // legacy node, and nft wins a tie.
        let counted = decide(Some(EMPTY_MANGLE), Some(LEGACY_DROP), nft);
        assert_eq!(counted.backend, Some(Backend::Nft));
        assert_eq!(
            counted.decided_by,
            "iptables-legacy holds 1 rule(s), iptables-nft 20"
        );
        assert_eq!(decide(None, Some(""), || None).backend, Some(Backend::Nft));
        let legacy_node = decide(None, Some(&LEGACY_DROP.repeat(3)), || Some(String::new()));
        assert_eq!(legacy_node.backend, Some(Backend::Legacy));
        assert_eq!(decide(None, None, || None).backend, None);
    }

    #[test]
    fn one_table_is_cut_from_a_whole_save() {
        let saved = format!("{HINT}{LEGACY_DROP}");
        assert_eq!(table_of(&saved, "filter"), LEGACY_DROP);
        assert_eq!(table_of(&saved, "nat"), "");
        assert_eq!(Backend::Legacy.save_program(true), "ip6tables-legacy-save");
        assert_eq!(Backend::Nft.program(false), "iptables-nft");
    }
}
