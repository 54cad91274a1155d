//! Policy routing: the node's `ip rule` list, and the route the kernel
//! picks by it (`ip route get`'s answer, table and rule included). A CNI
//! may keep pod routes outside the main table (the AWS VPC CNI gives each
//! ENI its own table, reached by `from <pod> lookup N`).

use std::{fmt, net::IpAddr, sync::LazyLock};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::route::{table_name, Route, RouteKind, RT_TABLE_DEFAULT, RT_TABLE_LOCAL, RT_TABLE_MAIN};

/// What a matching rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// `lookup N`: the route in table N, else on to the next rule.
    Lookup(u32),
    /// `goto N`: not followed (podtrace passes over the rule).
    Goto(u32),
    /// `nop`.
    Nop,
    Blackhole,
    Unreachable,
    Prohibit,
}

/// One `ip rule`, with the selectors podtrace evaluates.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub priority: u32,
    pub ipv6: bool,
    pub from: Option<IpNet>,
    pub to: Option<IpNet>,
    pub iif: Option<String>,
    pub oif: Option<String>,
    /// (mark, mask).
    pub fwmark: Option<(u32, u32)>,
    /// `not`: the selectors' match inverted.
    pub invert: bool,
    pub action: RuleAction,
    /// `suppress_prefixlength N`: a route this short or shorter found by
    /// the rule's table is passed over (wg-quick's `suppress_prefixlength 0`).
    pub suppress_prefixlen: Option<u8>,
    /// A selector podtrace does not evaluate (`uidrange`, `ipproto`,
    /// `sport`, `dport`, `tos`, `l3mdev`, `tun_id`, `suppress_ifgroup`):
    /// such a rule is passed over, and a lookup it may have changed says so.
    pub unsupported: Option<String>,
}

/// The packet a route is picked for: what the rules select by.
#[derive(Clone, Copy, Debug)]
pub struct Flow<'a> {
    pub src: Option<IpAddr>,
    pub dst: IpAddr,
    /// The interface it arrived by; None: sent by the node itself.
    pub iif: Option<&'a str>,
    /// Its mark (`fwmark` rules select by it).
    pub mark: u32,
}

impl Flow<'_> {
    /// A packet the node sends itself, from no particular address.
    pub fn to(dst: IpAddr) -> Self {
        Flow {
            src: None,
            dst,
            iif: None,
            mark: 0,
        }
    }

    /// A pod's packet the node forwards from the pod's veth: an `iif`
    /// rule naming another device does not select it.
    pub fn forwarded_from_pod(src: IpAddr, dst: IpAddr) -> Self {
        Flow {
            src: Some(src),
            iif: Some(""),
            ..Flow::to(dst)
        }
    }
}

/// How the kernel picks a route for a flow, rule by rule.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision<'a> {
    /// The rule that decided: its table held the route, or it rejected
    /// the packet itself (`unreachable`, `prohibit`, `blackhole`).
    pub rule: Option<&'a Rule>,
    /// The route picked; None where no table held one, or a rule rejected.
    pub route: Option<&'a Route>,
    /// The rules that matched but whose table had no route (the kernel
    /// falls through to the next rule), in order.
    pub fell_through: Vec<&'a Rule>,
    /// Rules podtrace passed over that may have matched (`goto`, a
    /// selector it does not evaluate).
    pub passed_over: Vec<&'a Rule>,
}

/// The kernel's three rules of a family with no others added (IPv4's;
/// IPv6 has no `default` table rule). Built once: every route decision
/// of every hop asks for them.
pub fn default_rules(ipv6: bool) -> &'static [Rule] {
    static RULES: LazyLock<[Vec<Rule>; 2]> =
        LazyLock::new(|| [kernel_rules(false), kernel_rules(true)]);
    &RULES[usize::from(ipv6)]
}

fn kernel_rules(ipv6: bool) -> Vec<Rule> {
    [
        (0, RT_TABLE_LOCAL),
        (32766, RT_TABLE_MAIN),
        (32767, RT_TABLE_DEFAULT),
    ]
    .into_iter()
    .filter(|(priority, _)| !ipv6 || *priority != 32767)
    .map(|(priority, table)| Rule::selecting_all(priority, ipv6, RuleAction::Lookup(table)))
    .collect()
}

impl Rule {
    /// A rule with no selector (it matches every packet of its family)
    /// that does `action`: the kernel's own rules, and where a dumped rule
    /// starts before its attributes are read.
    pub fn selecting_all(priority: u32, ipv6: bool, action: RuleAction) -> Self {
        Rule {
            priority,
            ipv6,
            from: None,
            to: None,
            iif: None,
            oif: None,
            fwmark: None,
            invert: false,
            action,
            suppress_prefixlen: None,
            unsupported: None,
        }
    }

    /// Whether the rule selects the flow, as fib_rule_match does (a
    /// rule's oif selects only packets sent to a given device, which
    /// a forwarded or unbound packet is not).
    pub(super) fn selects(&self, flow: &Flow) -> bool {
        let within = |net: &Option<IpNet>, ip: Option<IpAddr>| match (net, ip) {
            (None, _) => true,
            (Some(net), Some(ip)) => net.contains(&ip),
            (Some(net), None) => net.prefix_len() == 0,
        };
        // The node's own packets arrive by `lo`, as `iif lo` means.
        let iif = flow.iif.unwrap_or("lo");
        let matched = within(&self.from, flow.src)
            && within(&self.to, Some(flow.dst))
            && self.iif.as_deref().is_none_or(|name| name == iif)
            && self.oif.is_none()
            && (self.fwmark).is_none_or(|(mark, mask)| (mark ^ flow.mark) & mask == 0);
        matched != self.invert
    }

    /// Whether the route a table gave is passed over by
    /// `suppress_prefixlength`.
    pub(super) fn suppresses(&self, route: &Route) -> bool {
        self.suppress_prefixlen
            .is_some_and(|len| route.destination.prefix_len() <= len)
    }

    /// Whether it is one of the kernel's own three rules (`from all
    /// lookup local/main/default`), which need no mention.
    pub fn is_default(&self) -> bool {
        default_rules(self.ipv6).contains(self)
    }
}

/// As `ip rule` prints it: `1536: from 10.245.1.0/24 lookup 100`.
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.priority)?;
        if self.invert {
            f.write_str(" not")?;
        }
        match self.from {
            Some(net) => write!(f, " from {}", Prefix(net))?,
            None => f.write_str(" from all")?,
        }
        if let Some(net) = self.to {
            write!(f, " to {}", Prefix(net))?;
        }
        if let Some((mark, mask)) = self.fwmark {
            write!(f, " fwmark {mark:#x}")?;
            if mask != u32::MAX {
                write!(f, "/{mask:#x}")?;
            }
        }
        if let Some(iif) = &self.iif {
            write!(f, " iif {iif}")?;
        }
        if let Some(oif) = &self.oif {
            write!(f, " oif {oif}")?;
        }
        if let Some(what) = &self.unsupported {
            write!(f, " {what}")?;
        }
        match self.action {
            RuleAction::Lookup(table) => write!(f, " lookup {}", table_name(table))?,
            RuleAction::Goto(priority) => write!(f, " goto {priority}")?,
            RuleAction::Nop => f.write_str(" nop")?,
            RuleAction::Blackhole => f.write_str(" blackhole")?,
            RuleAction::Unreachable => f.write_str(" unreachable")?,
            RuleAction::Prohibit => f.write_str(" prohibit")?,
        }
        if let Some(len) = self.suppress_prefixlen {
            write!(f, " suppress_prefixlength {len}")?;
        }
        Ok(())
    }
}

/// A rule's prefix as `ip rule` prints it: a single address bare.
struct Prefix(IpNet);

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            net if net.prefix_len() == net.max_prefix_len() => write!(f, "{}", net.addr()),
            net => write!(f, "{net}"),
        }
    }
}

impl Decision<'_> {
    /// The reject the lookup ended with: a reject route, or a rule's own
    /// action. None where a route was found, or none at all.
    pub fn rejected(&self) -> Option<RouteKind> {
        if let Some(route) = self.route {
            return matches!(
                route.kind,
                RouteKind::Blackhole | RouteKind::Unreachable | RouteKind::Prohibit
            )
            .then_some(route.kind);
        }
        match self.rule.as_ref()?.action {
            RuleAction::Blackhole => Some(RouteKind::Blackhole),
            RuleAction::Unreachable => Some(RouteKind::Unreachable),
            RuleAction::Prohibit => Some(RouteKind::Prohibit),
            _ => None,
        }
    }

    /// Which rule took the lookup where it was not the kernel's own:
    /// ` (rule 1536: from 10.245.1.0/24 lookup 100)`; the rules whose
    /// tables had no route, and those podtrace passed over, are named
    /// after it. The table itself is the route's to name (`ip route`
    /// prints `table 100`).
    pub fn policy(&self) -> String {
        let custom = |rules: &[&Rule]| {
            (rules.iter())
                .filter(|r| !r.is_default())
                .map(|r| format!("rule {r}"))
                .collect::<Vec<_>>()
        };
        let lacking = custom(&self.fell_through);
        let mut said = match &self.rule {
            Some(rule) if !rule.is_default() || !lacking.is_empty() => format!(" (rule {rule})"),
            _ => String::new(),
        };
        if !lacking.is_empty() {
            said.push_str(&format!(
                "; no route in the table of {}",
                lacking.join(", ")
            ));
        }
        let skipped = custom(&self.passed_over);
        if !skipped.is_empty() {
            said.push_str(&format!(
                "; not followed: {} (podtrace does not evaluate it)",
                skipped.join(", ")
            ));
        }
        said
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::node::{fixtures::route, NodeView};

    /// An EKS node as the AWS VPC CNI leaves it: the kernel's three rules,
    /// `to <pod> lookup main` at 512, `from <pod subnet> lookup 100` at
    /// 1536; table 100's default route via the VPC router over eth1.
    pub(crate) fn eks_node(table_100: Route) -> NodeView {
        let rule = |priority, from: Option<&str>, to: Option<&str>, table| Rule {
            from: from.map(|n| n.parse().unwrap()),
            to: to.map(|n| n.parse().unwrap()),
            priority,
            action: RuleAction::Lookup(table),
            ..default_rules(false)[0].clone()
        };
        let mut rules = default_rules(false).to_vec();
        rules.push(rule(512, None, Some("10.245.1.5/32"), RT_TABLE_MAIN));
        rules.push(rule(1536, Some("10.245.1.0/24"), None, 100));
        NodeView {
            rules,
            routes: vec![
                Route {
                    gateway: Some("192.0.2.1".parse().unwrap()),
                    ..route("0.0.0.0/0", 2)
                },
                route("10.245.1.5/32", 7),
                Route {
                    table: RT_TABLE_LOCAL,
                    kind: RouteKind::Local,
                    ..route("192.0.2.11/32", 2)
                },
                table_100,
            ],
            ..Default::default()
        }
    }

    pub(crate) fn via_eth1() -> Route {
        Route {
            gateway: Some("192.0.2.22".parse().unwrap()),
            table: 100,
            ..route("0.0.0.0/0", 3)
        }
    }

    fn from_pod(dst: &str) -> Flow<'static> {
        Flow {
            src: Some("10.245.1.5".parse().unwrap()),
            dst: dst.parse().unwrap(),
            iif: Some("eni1a2b3c4d5e6"),
            mark: 0,
        }
    }

    #[test]
    fn a_pods_packet_is_routed_by_its_subnets_table_and_says_so() {
        let node = eks_node(via_eth1());
        let decision = node.decide(&from_pod("10.245.2.7"));
        assert_eq!(decision.route, Some(&via_eth1()));
        assert_eq!(decision.rule.as_ref().unwrap().priority, 1536);
        assert_eq!(
            decision.policy(),
            " (rule 1536: from 10.245.1.0/24 lookup 100)"
        );
        // The node's own packet, and a reply to the pod, use main.
        let own = node.decide(&Flow::to("10.245.2.7".parse().unwrap()));
        assert_eq!(own.route.unwrap().oif, Some(2));
        assert_eq!(own.policy(), "");
        let to_pod = node.decide(&from_pod("10.245.1.5"));
        assert_eq!(to_pod.route.unwrap().oif, Some(7));
        let to_pod_rule = to_pod.rule.unwrap();
        assert_eq!(to_pod_rule.priority, 512);
        assert_eq!(
            to_pod_rule.to_string(),
            "512: from all to 10.245.1.5 lookup main"
        );
        // The local table comes first.
        let local = node.decide(&from_pod("192.0.2.11"));
        assert_eq!(local.route.unwrap().kind, RouteKind::Local);
        // eth1, where table 100 leads, is an uplink to watch.
        assert_eq!(node.policy_uplinks(), vec![3]);
    }

    #[test]
    fn an_unreachable_route_in_the_table_ends_the_lookup_and_an_empty_table_falls_through() {
        let unreachable = Route {
            kind: RouteKind::Unreachable,
            oif: None,
            table: 100,
            ..route("10.245.2.0/24", 0)
        };
        let node = eks_node(unreachable.clone());
        let decision = node.decide(&from_pod("10.245.2.7"));
        assert_eq!(decision.route, Some(&unreachable));
        assert_eq!(decision.rejected(), Some(RouteKind::Unreachable));
        assert!(decision.policy().starts_with(" (rule 1536: "));
        // Table 100 holds nothing for this one: main's default takes it.
        let fell = node.decide(&from_pod("10.9.0.1"));
        assert_eq!(fell.route.unwrap().table, RT_TABLE_MAIN);
        assert_eq!(fell.rule.as_ref().unwrap().priority, 32766);
        assert_eq!(
            fell.policy(),
            " (rule 32766: from all lookup main); no route in the table of rule 1536: from 10.245.1.0/24 lookup 100"
        );
        assert_eq!(fell.rejected(), None);
    }

    #[test]
    fn reject_rules_marks_inversion_and_unevaluated_selectors() {
        let mut node = eks_node(via_eth1());
        let base = default_rules(false)[0].clone();
        node.rules.push(Rule {
            priority: 100,
            to: Some("10.99.0.0/16".parse().unwrap()),
            action: RuleAction::Prohibit,
            ..base.clone()
        });
        // A marked packet's rule does not select an unmarked one.
        node.rules.push(Rule {
            priority: 200,
            fwmark: Some((0x80, 0x80)),
            action: RuleAction::Blackhole,
            ..base.clone()
        });
        node.rules.push(Rule {
            priority: 300,
            unsupported: Some("uidrange 1000-1000".into()),
            action: RuleAction::Unreachable,
            ..base.clone()
        });
        let prohibited = node.decide(&from_pod("10.99.1.1"));
        assert_eq!(prohibited.rejected(), Some(RouteKind::Prohibit));
        assert_eq!(prohibited.route, None);
        let passed = node.decide(&from_pod("10.245.2.7"));
        assert_eq!(passed.route, Some(&via_eth1()));
        assert!(passed
            .policy()
            .ends_with("; not followed: rule 300: from all uidrange 1000-1000 unreachable (podtrace does not evaluate it)"));
        // `not from 10.245.1.0/24 lookup main`: the pod's packet is not selected.
        let not = Rule {
            priority: 10,
            invert: true,
            from: Some("10.245.1.0/24".parse().unwrap()),
            ..base
        };
        assert!(!not.selects(&from_pod("10.245.2.7")));
        assert!(not.selects(&Flow::to("10.245.2.7".parse().unwrap())));
        assert_eq!(not.to_string(), "10: not from 10.245.1.0/24 lookup local");
    }

    #[test]
    fn without_rules_read_the_kernels_defaults_apply() {
        let mut node = eks_node(via_eth1());
        node.rules.clear();
        let decision = node.decide(&from_pod("10.245.2.7"));
        assert_eq!(decision.route.unwrap().table, RT_TABLE_MAIN);
        assert_eq!(decision.policy(), "");
    }
}
