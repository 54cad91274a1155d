//! The text of a traced rule, read from the node's kernel: iptables
//! syntax for iptables-nft's tables (`iptables-nft-save`, paired with
//! `nft -a list table` by position), and `nft -a list` text for rules the
//! monitor does not know.
//!
//! A whole iptables table is read at once and kept: kube-proxy's packet
//! crosses several chains of one table, and listing a table is what took
//! the time (each listing is processes, which on a busy node or a slow VM
//! took seconds and made a SYN's DNAT rule come after its story was told).
//! The IPv4 tables that exist are read when the monitor starts, so the
//! first traced packet finds its rule already listed.
//!
//! Never a wrong name: the table's handles are listed before and after
//! `iptables-save`, and a chain that changed in between (kube-proxy
//! syncing) is left out, since its lines may not be the handles' rules. A
//! kept name is used only for the chain it was listed in: a handle seen in
//! another chain means the table was made anew, and it is listed again, as
//! for a handle not listed (a rule added since).

use std::{collections::HashMap, process::Command};

use super::{
    iptables::{output, Backend},
    nft_rule::{is_iptables_table, RuleLookup},
};

/// Asks the node's kernel (through `nft` and `iptables-save`, run in the
/// calling thread's network namespace).
#[derive(Default)]
pub struct KernelRules {
    iptables: HashMap<(String, String), Listed>,
    /// (family, table, chain) → handle → nft text
    native: HashMap<(String, String, String), HashMap<u64, String>>,
    /// (family, table, chain) → its first rule, and when it was read: a
    /// dropped packet's path asks for several, and drops come in bursts.
    native_heads: HashMap<(String, String, String), (std::time::Instant, Option<String>)>,
    /// (family, table, base chain) → its hook: a chain's hook is fixed
    /// for its life, so read once.
    hooks: HashMap<(String, String, String), String>,
}

/// One iptables-nft table as last listed.
#[derive(Default)]
struct Listed {
    /// handle → (chain, iptables-save line)
    rules: HashMap<u64, (String, String)>,
    /// chain → the handle of its first rule
    first: HashMap<String, u64>,
    /// The highest handle the listing had: a handle above it is a rule
    /// added since.
    highest: u64,
    /// When it was listed (None: never, for `Default`).
    at: Option<std::time::Instant>,
}

/// A table is listed again for a handle it lacks at most this often,
/// unless the handle is newer than the listing (a chain left out for
/// changing mid-listing is retried, without a listing per trace event).
const RELIST_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

impl KernelRules {
    /// `nft -a list chain`, noting a base chain's hook on the way: a
    /// dropped packet's base chain is listed for its rules or its head
    /// too, and one listing serves both.
    fn list_chain(&mut self, family: &str, table: &str, chain: &str) -> Option<String> {
        let listing =
            output(Command::new("nft").args(["-a", "list", "chain", family, table, chain]))?;
        if let Some(hook) = hook_in(&listing) {
            let key = (family.to_string(), table.to_string(), chain.to_string());
            self.hooks.insert(key, hook);
        }
        Some(listing)
    }

    /// Reads every iptables-nft and ip6tables-nft table the node has now.
    pub fn warm(&mut self) {
        let Some(tables) = output(Command::new("nft").args(["list", "tables"])) else {
            return;
        };
        for line in tables.lines() {
            let mut words = line.split_whitespace();
            if let (Some("table"), Some(family), Some(table)) =
                (words.next(), words.next(), words.next())
            {
                if is_iptables_table(family, table) {
                    self.list_iptables_table(family, table);
                }
            }
        }
    }

    /// Lists a table again. A listing that fails is kept too, as newer
    /// than any handle, so that it is retried a second later rather than
    /// at every trace event.
    fn list_iptables_table(&mut self, family: &str, table: &str) {
        let listed = Listed {
            at: Some(std::time::Instant::now()),
            ..iptables_table(family, table).unwrap_or(Listed {
                highest: u64::MAX,
                ..Listed::default()
            })
        };
        self.iptables
            .insert((family.to_string(), table.to_string()), listed);
    }
}

impl RuleLookup for KernelRules {
    fn iptables_rule(
        &mut self,
        family: &str,
        table: &str,
        chain: &str,
        handle: u64,
    ) -> Option<String> {
        let key = (family.to_string(), table.to_string());
        let named = |listed: &Listed| {
            let (listed_chain, line) = listed.rules.get(&handle)?;
            (listed_chain == chain).then(|| line.clone())
        };
        if let Some(listed) = self.iptables.get(&key) {
            if let Some(line) = named(listed) {
                return Some(line);
            }
            // Not listed, or listed in another chain (the table made anew):
            // listed again if the handle is newer than the listing, or the
            // listing a second old.
            let recent = listed.at.is_some_and(|at| at.elapsed() < RELIST_AFTER);
            if handle <= listed.highest && recent {
                return None;
            }
        }
        self.list_iptables_table(family, table);
        named(self.iptables.get(&key)?)
    }

    fn nft_rule(&mut self, family: &str, table: &str, chain: &str, handle: u64) -> Option<String> {
        let key = (family.to_string(), table.to_string(), chain.to_string());
        if let Some(text) = self.native.get(&key).and_then(|c| c.get(&handle)) {
            return Some(text.clone());
        }
        let listing = self.list_chain(family, table, chain)?;
        let listed: HashMap<u64, String> = rule_lines(&listing).into_iter().collect();
        let text = listed.get(&handle).cloned();
        self.native.insert(key, listed);
        text
    }

    fn chain_head(&mut self, family: &str, table: &str, chain: &str) -> Option<String> {
        if is_iptables_table(family, table) {
            let key = (family.to_string(), table.to_string());
            if !self.iptables.contains_key(&key) {
                self.list_iptables_table(family, table);
            }
            let listed = self.iptables.get(&key)?;
            let handle = listed.first.get(chain)?;
            return listed.rules.get(handle).map(|(_, line)| line.clone());
        }
        let key = (family.to_string(), table.to_string(), chain.to_string());
        if let Some((at, head)) = self.native_heads.get(&key) {
            if at.elapsed() < RELIST_AFTER {
                return head.clone();
            }
        }
        let head = self
            .list_chain(family, table, chain)
            .and_then(|listing| rule_lines(&listing).into_iter().next())
            .map(|(handle, text)| format!("{text} # handle {handle}"));
        self.native_heads
            .insert(key, (std::time::Instant::now(), head.clone()));
        head
    }

    fn chain_hook(&mut self, family: &str, table: &str, chain: &str) -> Option<String> {
        let key = (family.to_string(), table.to_string(), chain.to_string());
        if let Some(hook) = self.hooks.get(&key) {
            return Some(hook.clone());
        }
        // A listing that failed is tried again at the next drop.
        self.list_chain(family, table, chain)?;
        self.hooks.get(&key).cloned()
    }

    fn element_comment(
        &mut self,
        family: &str,
        table: &str,
        map: &str,
        key: &str,
    ) -> Option<String> {
        let listing = output(Command::new("nft").args(["list", "map", family, table, map]))?;
        element_comment_in(&listing, key)
    }
}

/// The hook a chain's listing declares (`type filter hook forward
/// priority filter; policy accept;` → `forward`).
fn hook_in(listing: &str) -> Option<String> {
    // Only the declaration: a table's or chain's comment, printed
    // before it, may say "hook" too.
    let declaration = listing
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("type "))?;
    let mut words = declaration.split_whitespace();
    words.find(|w| *w == "hook")?;
    words
        .next()
        .map(|hook| hook.trim_end_matches(';').to_string())
}

/// Every rule of an iptables-nft table, by handle, with its chain and
/// iptables-save line: the handles listed before and after the save, and
/// only chains the same in both kept.
fn iptables_table(family: &str, table: &str) -> Option<Listed> {
    // iptables-nft's own save: a plain `iptables-save` may be the
    // legacy one, whose lines are not these handles' rules.
    let list = || output(Command::new("nft").args(["-a", "list", "table", family, table]));
    let before = list()?;
    let saved = Backend::Nft.save_table(family == "ip6", table)?;
    let after = list()?;
    Some(pair_by_position(&saved, &before, &after))
}

/// Pairs each chain's `-A <chain> …` lines with its handles in
/// `nft -a list table`: both list a chain's rules in order, so the n-th
/// handle is the n-th line. A chain whose handles differ between the
/// listings `before` and `after` the save, or whose count differs from
/// its lines, changed while it was read: it is left out rather than
/// misnamed (a rule replaced in place gets a new handle, so equal handles
/// are equal rules).
fn pair_by_position(saved: &str, before: &str, after: &str) -> Listed {
    let mut lines: HashMap<&str, Vec<&str>> = HashMap::new();
    for line in saved.lines() {
        if let Some(chain) = line.strip_prefix("-A ").and_then(|r| r.split(' ').next()) {
            lines.entry(chain).or_default().push(line);
        }
    }
    let unchanged = handles_by_chain(after);
    let mut listed = Listed::default();
    for (chain, handles) in handles_by_chain(before) {
        listed.highest = handles.iter().copied().fold(listed.highest, u64::max);
        if unchanged.get(&chain) != Some(&handles) {
            continue;
        }
        let Some(chain_lines) = lines.get(chain.as_str()) else {
            continue;
        };
        if chain_lines.len() != handles.len() {
            continue;
        }
        if let Some(first) = handles.first() {
            listed.first.insert(chain.clone(), *first);
        }
        for (handle, line) in handles.into_iter().zip(chain_lines.iter()) {
            listed
                .rules
                .insert(handle, (chain.clone(), line.to_string()));
        }
    }
    listed
}

/// chain → its rule handles in order, from `nft -a list table`.
fn handles_by_chain(listing: &str) -> HashMap<String, Vec<u64>> {
    let mut chains: HashMap<String, Vec<u64>> = HashMap::new();
    let mut current: Option<String> = None;
    for line in listing.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("chain ") {
            let name = rest.split_whitespace().next().unwrap_or_default();
            current = Some(name.trim_matches('"').to_string());
            continue;
        }
        let (Some(chain), Some((h, _))) = (current.as_ref(), rule_line(line)) else {
            continue;
        };
        chains.entry(chain.clone()).or_default().push(h);
    }
    chains
}

/// (handle, text) of each rule in an `nft -a list chain` listing, in order.
pub(super) fn rule_lines(listing: &str) -> Vec<(u64, String)> {
    listing
        .lines()
        .map(str::trim)
        .filter_map(rule_line)
        .collect()
}

fn rule_line(line: &str) -> Option<(u64, String)> {
    if line.starts_with("chain ") || line.starts_with("table ") {
        return None;
    }
    let (text, handle) = line.rsplit_once(" # handle ")?;
    Some((handle.trim().parse().ok()?, without_counts(text.trim())))
}

/// A rule's text without its counter's live figures (`counter packets 3
/// bytes 252` → `counter`): they are not the rule, and the same rule would
/// read differently from one packet to the next.
pub(super) fn without_counts(text: &str) -> String {
    const FIGURES: &str = "counter packets ";
    let mut kept = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(FIGURES) {
        kept.push_str(&rest[..at + "counter".len()]);
        let after = &rest[at + FIGURES.len()..];
        rest =
            counted_figures_end(after).map_or(&rest[at + "counter".len()..], |end| &after[end..]);
    }
    kept.push_str(rest);
    kept
}

/// Where `<n> bytes <m>` ends in `text`, if it starts with that.
fn counted_figures_end(text: &str) -> Option<usize> {
    let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let packets = digits(text);
    let bytes_at = packets + " bytes ".len();
    if packets == 0 || !text[packets..].starts_with(" bytes ") {
        return None;
    }
    let bytes = digits(&text[bytes_at..]);
    (bytes > 0).then_some(bytes_at + bytes)
}

/// The comment of element `key` in an `nft list map` listing.
fn element_comment_in(listing: &str, key: &str) -> Option<String> {
    let (_, after) = listing.split_once(&format!("{key} comment \""))?;
    after.split('"').next().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rules_text_leaves_out_its_counters_live_figures() {
        assert_eq!(
            without_counts("ip daddr 10.1.2.3 counter packets 12 bytes 9040 reject with tcp reset"),
            "ip daddr 10.1.2.3 counter reject with tcp reset"
        );
        assert_eq!(without_counts("counter packets 0 bytes 0"), "counter");
        assert_eq!(
            without_counts("counter drop comment \"counter packets x\""),
            "counter drop comment \"counter packets x\""
        );
    }

    #[test]
    fn a_base_chains_hook_is_read_from_its_declaration() {
        let listing = "table ip calico {\n\tchain filter-FORWARD {\n\t\ttype filter hook forward priority filter; policy accept;\n\t\tcounter packets 3 bytes 252 jump filter-cali-FORWARD\n\t}\n}\n";
        assert_eq!(hook_in(listing).as_deref(), Some("forward"));
        // A comment before the declaration is not it.
        let commented = "table ip t {\n\tcomment \"we hook into forward\"\n\tchain c {\n\t\ttype filter hook input priority 0; policy accept;\n\t}\n}\n";
        assert_eq!(hook_in(commented).as_deref(), Some("input"));
        // A regular chain has none.
        assert_eq!(
            hook_in("table ip calico {\n\tchain cali-fw {\n\t}\n}\n"),
            None
        );
    }

    #[test]
    fn listings_give_handles_in_order_and_element_comments() {
        let chain = "table ip nat {\n\tchain PREROUTING { # handle 3\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tmeta l4proto tcp counter dnat to 10.1.2.3:80 # handle 4\n\t\tcounter jump KUBE-SERVICES # handle 9\n\t}\n}\n";
        assert_eq!(
            rule_lines(chain),
            [
                (4, "meta l4proto tcp counter dnat to 10.1.2.3:80".into()),
                (9, "counter jump KUBE-SERVICES".into())
            ]
        );
        let map = "\t\telements = { 10.96.171.9 . tcp . 80 comment \"default/empty:http\" : goto reject-chain }";
        assert_eq!(
            element_comment_in(map, "10.96.171.9 . tcp . 80").as_deref(),
            Some("default/empty:http")
        );
    }

    #[test]
    fn a_whole_table_pairs_each_chains_rules_by_position() {
        let saved = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SEP-A - [0:0]\n-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n-A KUBE-SEP-A -s 10.244.1.2/32 -j KUBE-MARK-MASQ\n-A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.244.1.2:80\n-A KUBE-STALE -j RETURN\nCOMMIT\n";
        let listing = "table ip nat { # handle 5\n\tchain PREROUTING { # handle 1\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tcounter packets 0 bytes 0 jump KUBE-SERVICES # handle 7\n\t}\n\tchain KUBE-SEP-A { # handle 2\n\t\tip saddr 10.244.1.2 counter jump KUBE-MARK-MASQ # handle 11\n\t\tmeta l4proto tcp counter dnat to 10.244.1.2:80 # handle 12\n\t}\n\tchain KUBE-STALE { # handle 3\n\t\tcounter return # handle 20\n\t\tcounter return # handle 21\n\t}\n}\n";
        let paired = pair_by_position(saved, listing, listing).rules;
        assert_eq!(
            paired[&12].1,
            "-A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.244.1.2:80"
        );
        assert_eq!(paired[&12].0, "KUBE-SEP-A");
        assert_eq!(
            paired[&7].1,
            "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
        );
        // Changed between the two listings: not named rather than misnamed.
        assert!(!paired.contains_key(&20) && !paired.contains_key(&21));
        // A chain rewritten during the save (same count, new handles): left
        // out too, though its count still fits.
        let rewritten = listing.replace("# handle 11", "# handle 31");
        let paired = pair_by_position(saved, listing, &rewritten).rules;
        assert!(!paired.contains_key(&11) && !paired.contains_key(&12));
        assert!(paired.contains_key(&7));
    }
}
