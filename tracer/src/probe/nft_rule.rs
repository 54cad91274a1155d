//! One rule event of nft's packet trace, how its table is named, and
//! what the trace's reader asks the node about rules the trace does not
//! spell out.

/// What the parser asks the node about rules it cannot name from the
/// trace alone (real: [`KernelRules`]; tests: canned answers).
pub trait RuleLookup {
    /// The iptables-save line of an iptables-nft rule, by its handle.
    fn iptables_rule(
        &mut self,
        family: &str,
        table: &str,
        chain: &str,
        handle: u64,
    ) -> Option<String>;
    /// A native rule's text as `nft -a list chain` prints it, for a rule
    /// the monitor does not know (added after it started).
    fn nft_rule(&mut self, family: &str, table: &str, chain: &str, handle: u64) -> Option<String>;
    /// The first rule of a chain (as [`Self::iptables_rule`] or
    /// [`Self::nft_rule`] name it): where Calico writes which policy a
    /// chain is, whether the packet matched it or not.
    fn chain_head(&mut self, family: &str, table: &str, chain: &str) -> Option<String>;
    /// The netfilter hook of a native table's base chain (`forward`),
    /// from its `type filter hook forward priority …` line: such a
    /// chain's name is its table's choice (`filter-FORWARD`), not a hook.
    fn chain_hook(&mut self, family: &str, table: &str, chain: &str) -> Option<String>;
    /// The comment of a verdict map's element (`key`: `a . b . c` as nft
    /// prints it).
    fn element_comment(
        &mut self,
        family: &str,
        table: &str,
        map: &str,
        key: &str,
    ) -> Option<String>;
}

/// iptables-nft's tables: what it creates, and what iptables-save shows.
const IPTABLES_TABLES: [&str; 5] = ["filter", "nat", "mangle", "raw", "security"];

/// A rule event of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RuleEvent {
    pub(super) family: String,
    pub(super) table: String,
    pub(super) chain: String,
    /// As nft prints it, without the handle.
    pub(super) text: String,
    pub(super) handle: u64,
    /// `accept`, `drop`, `jump X`, `goto X`, `continue`, `return`.
    pub(super) verdict: String,
}

/// `nat` for iptables' tables (as iptables names them), `ip kube-proxy`
/// for native ones (as `nft list table` does).
pub(super) fn table_name(family: &str, table: &str) -> String {
    if is_iptables_table(family, table) {
        table.to_string()
    } else {
        format!("{family} {table}")
    }
}

pub(super) fn is_iptables_table(family: &str, table: &str) -> bool {
    matches!(family, "ip" | "ip6") && IPTABLES_TABLES.contains(&table)
}
