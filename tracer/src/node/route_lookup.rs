//! The route the kernel picks for a packet on this node: its `ip rule`
//! list walked in priority order, each rule's table looked up, as `ip
//! route get` answers.

use std::net::IpAddr;

use super::{
    route::{Route, RT_TABLE_MAIN},
    rules::{default_rules, Decision, Flow, Rule, RuleAction},
    NodeView,
};

impl NodeView {
    /// The node's rules of `dst`'s family by priority; the kernel's
    /// defaults where none were read. Borrowed, not cloned: every hop of
    /// every story asks.
    fn rules_for(&self, ipv6: bool) -> Vec<&Rule> {
        let mut rules: Vec<&Rule> = (self.rules.iter()).filter(|r| r.ipv6 == ipv6).collect();
        if rules.is_empty() {
            rules.extend(default_rules(ipv6));
        }
        rules.sort_by_key(|r| r.priority);
        rules
    }

    /// The longest-prefix route for `dst` in one table.
    pub fn route_in_table(&self, table: u32, dst: IpAddr) -> Option<&Route> {
        self.routes
            .iter()
            .filter(|r| r.table == table && r.destination.contains(&dst))
            .max_by_key(|r| r.destination.prefix_len())
    }

    /// The route the kernel picks for `flow`, as fib_rules_lookup does:
    /// rules by priority; a matching rule's action, or its table's
    /// longest prefix; a table without one falls through to the next
    /// rule, a reject route in it (`unreachable`, `prohibit`,
    /// `blackhole`) ends the lookup.
    pub fn decide(&self, flow: &Flow) -> Decision<'_> {
        let mut decision = Decision::default();
        for rule in self.rules_for(flow.dst.is_ipv6()) {
            if !rule.selects(flow) {
                continue;
            }
            if rule.unsupported.is_some() {
                decision.passed_over.push(rule);
                continue;
            }
            let table = match rule.action {
                RuleAction::Lookup(table) => table,
                RuleAction::Nop => continue,
                RuleAction::Goto(_) => {
                    decision.passed_over.push(rule);
                    continue;
                }
                RuleAction::Blackhole | RuleAction::Unreachable | RuleAction::Prohibit => {
                    decision.rule = Some(rule);
                    return decision;
                }
            };
            match self.route_in_table(table, flow.dst) {
                Some(route) if !rule.suppresses(route) => {
                    decision.route = Some(route);
                    decision.rule = Some(rule);
                    return decision;
                }
                _ => decision.fell_through.push(rule),
            }
        }
        decision
    }
}

impl NodeView {
    /// The links that routes via a gateway leave by in the tables the
    /// node's own rules look up (not local, main or default): uplinks
    /// policy routing sends traffic out of, as the AWS VPC CNI sends a
    /// secondary ENI's pods' packets out of that ENI.
    pub fn policy_uplinks(&self) -> Vec<u32> {
        let tables: Vec<u32> = (self.rules.iter())
            .filter(|r| !r.is_default())
            .filter_map(|r| match r.action {
                RuleAction::Lookup(table) if table != RT_TABLE_MAIN => Some(table),
                _ => None,
            })
            .collect();
        let mut links: Vec<u32> = (self.routes.iter())
            .filter(|r| tables.contains(&r.table) && r.gateway.is_some())
            .filter_map(|r| r.oif)
            .collect();
        links.sort_unstable();
        links.dedup();
        links
    }
}
