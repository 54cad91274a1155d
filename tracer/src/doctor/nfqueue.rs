//! Rules that hand packets to a userspace program by nfqueue
//! (kube-network-policies' engine decides there), and whether a program
//! reads each queue: `nft list ruleset` and
//! /proc/net/netfilter/nfnetlink_queue inside the node's netns. A queue
//! with no reader and no bypass is a black hole: the kernel drops every
//! packet its rule queues, which is what a policy engine's pod not
//! running looks like from the node.

use super::{node::NodeFacts, Check};

const FAMILY: &str = "firewall";
const NAME: &str = "nfqueue readers";

/// One check where the node has queue rules: failed for a queue without
/// bypass that nothing reads, or whose reader lost packets.
pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    let Some(queues) = &facts.nfqueue else {
        return Vec::new();
    };
    if queues.rules.is_empty() {
        return Vec::new();
    }
    let bound = queues.bound.as_deref().unwrap_or_default();
    let reader = |number: u16| bound.iter().find(|b| b.number == number);
    let mut black_holes = Vec::new();
    let mut open = Vec::new();
    let mut losses = Vec::new();
    let mut read = Vec::new();
    for rule in &queues.rules {
        let place = format!(
            "`{}` (table {}, chain {})",
            rule.rule, rule.table, rule.chain
        );
        let unread: Vec<u16> = rule
            .statement
            .queues()
            .filter(|n| reader(*n).is_none())
            .collect();
        let numbers = |ns: &[u16]| ns.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
        match (unread.is_empty(), rule.statement.bypass) {
            (false, false) => black_holes.push(format!("{place} queues to {} without bypass, and no program reads it: the kernel drops every packet the rule queues", numbers(&unread))),
            (false, true) => open.push(format!("{place} queues to {}, which no program reads: its bypass lets the packets through unchecked", numbers(&unread))),
            (true, _) => {
                for queue in rule.statement.queues().filter_map(reader) {
                    let lost = queue.queue_dropped + queue.user_dropped;
                    if lost > 0 && !rule.statement.bypass {
                        losses.push(format!("queue {} is read (netlink port {}), but the kernel dropped {} packets it had no room for and {} its reader could not take", queue.number, queue.portid, queue.queue_dropped, queue.user_dropped));
                    } else {
                        read.push(format!("queue {} is read (netlink port {})", queue.number, queue.portid));
                    }
                }
            }
        }
    }
    let node = &facts.name;
    if !black_holes.is_empty() || !losses.is_empty() {
        let evidence = [black_holes, losses].concat().join("; ");
        let fix = "start the program that reads the queue (kube-network-policies: its DaemonSet's pod on this node), or let the rule fail open (`bypass`; kube-network-policies' --fail-open)".to_string();
        return vec![Check::fail(FAMILY, node, NAME, evidence, fix)];
    }
    let mut said = read;
    said.sort();
    said.dedup();
    said.extend(open);
    vec![Check::pass(FAMILY, node, NAME, said.join("; "))]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::nfqueue_state::{parse_bound, parse_ruleset, Queues};

    /// kube-network-policies' table as `nft -a list ruleset` prints it
    /// with `--fail-open=false` (sets shortened).
    const RULESET: &str = "table inet kube-network-policies { # handle 12
	set podips-v4 { # handle 1
		type ipv4_addr
		elements = { 10.244.2.2 }
	}
	chain postrouting { # handle 3
		type filter hook postrouting priority srcnat - 5; policy accept;
		ct mark 0x64 accept # handle 9
		ip saddr @podips-v4 queue to 98 # handle 10
		ip daddr @podips-v4 queue to 98 # handle 11
	}
}
";

    fn facts(ruleset: &str, bound: Option<&str>) -> NodeFacts {
        let mut facts = NodeFacts::of_root(std::path::Path::new("/nonexistent"));
        facts.name = "node-2".into();
        facts.nfqueue = Some(Queues {
            rules: parse_ruleset(ruleset),
            bound: bound.map(parse_bound),
        });
        facts
    }

    #[test]
    fn an_unread_queue_without_bypass_is_a_black_hole_named_by_its_rule() {
        let rules = parse_ruleset(RULESET);
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0].table, "inet kube-network-policies");
        assert_eq!(rules[0].chain, "postrouting");
        assert_eq!(rules[0].rule, "ip saddr @podips-v4 queue to 98");
        // nfnetlink_queue loaded, nothing bound; and not loaded at all.
        for bound in [Some(""), None] {
            let said = checks(&facts(RULESET, bound));
            assert_eq!(said.len(), 1);
            assert!(said[0].failed());
            assert!(
                said[0].evidence.starts_with("`ip saddr @podips-v4 queue to 98` (table inet kube-network-policies, chain postrouting) queues to 98 without bypass, and no program reads it"),
                "{}",
                said[0].evidence
            );
        }
    }

    #[test]
    fn a_read_queue_passes_and_its_losses_fail() {
        let read = "   98  12345     0 2 65531     0     0      412  1\n";
        let said = checks(&facts(RULESET, Some(read)));
        assert!(said[0].ok(), "{:?}", said[0]);
        assert_eq!(said[0].evidence, "queue 98 is read (netlink port 12345)");
        let overflowing = "   98  12345  1024 2 65531    17     3      412  1\n";
        let said = checks(&facts(RULESET, Some(overflowing)));
        assert!(said[0].failed());
        assert!(said[0]
            .evidence
            .contains("dropped 17 packets it had no room for and 3 its reader could not take"));
    }

    #[test]
    fn an_unread_queue_with_bypass_fails_open_and_no_queue_rule_means_no_check() {
        let open = RULESET.replace("queue to 98", "queue flags bypass to 98");
        let said = checks(&facts(&open, Some("")));
        assert!(said[0].ok());
        assert!(said[0]
            .evidence
            .contains("lets the packets through unchecked"));
        assert!(checks(&facts("table ip filter {\n}\n", None)).is_empty());
    }
}
