//! The node's firewall for forwarded pod traffic (the filter table of
//! `iptables-save` inside the node's netns, of the backend the node runs,
//! and of the other one too where it holds rules: the kernel runs both
//! on every packet): the FORWARD policy and
//! whether something accepts the pod CIDRs (Docker sets DROP), DROP rules
//! that match a pod pair, kube-proxy's KUBE-FIREWALL mark drop reached by
//! pod traffic, and Calico workload chains with no profile.

use std::{collections::BTreeMap, net::Ipv4Addr};

use ipnet::Ipv4Net;

use super::{
    node::{FilterTable, NodeFacts},
    Check,
};
use crate::{model::text::shell_words, probe::iptables::Backend};

const FAMILY: &str = "firewall";

/// One `-A CHAIN …` rule, with the words after the chain.
#[derive(Clone, Debug)]
pub struct Rule {
    pub chain: String,
    pub text: String,
    words: Vec<String>,
}

impl Rule {
    fn option(&self, name: &str) -> Option<&str> {
        let at = self.words.iter().position(|w| w == name)?;
        self.words.get(at + 1).map(|s| s.as_str())
    }

    fn target(&self) -> Option<&str> {
        self.option("-j").or_else(|| self.option("-g"))
    }

    /// Whether `-s`/`-d` (if given) can match the addresses.
    fn matches(&self, src: &[Ipv4Addr], dst: &[Ipv4Addr]) -> bool {
        let hits = |opt: &str, ips: &[Ipv4Addr]| match self.option(opt) {
            None => true,
            Some(net) => parse_net(net).is_some_and(|n| ips.iter().any(|ip| n.contains(ip))),
        };
        hits("-s", src) && hits("-d", dst)
    }
}

fn parse_net(text: &str) -> Option<Ipv4Net> {
    text.parse()
        .ok()
        .or_else(|| text.parse::<Ipv4Addr>().ok().map(Ipv4Net::from))
}

/// A filter table (`iptables -S`, or `iptables-save`'s `:CHAIN POLICY`
/// lines): policies and rules by chain.
pub struct Table {
    pub policies: BTreeMap<String, String>,
    pub rules: Vec<Rule>,
}

pub fn parse(text: &str) -> Table {
    let mut table = Table {
        policies: BTreeMap::new(),
        rules: Vec::new(),
    };
    for line in text.lines() {
        let words = shell_words(line);
        match words.first().map(|w| w.as_str()) {
            Some("-P") if words.len() >= 3 => {
                table.policies.insert(words[1].clone(), words[2].clone());
            }
            // `:FORWARD DROP [0:0]`; a user chain's policy is `-`.
            Some(chain) if chain.starts_with(':') && words.len() >= 2 && words[1] != "-" => {
                table
                    .policies
                    .insert(chain[1..].to_string(), words[1].clone());
            }
            Some("-A") if words.len() >= 2 => table.rules.push(Rule {
                chain: words[1].clone(),
                text: line.to_string(),
                words: words[2..].to_vec(),
            }),
            _ => {}
        }
    }
    table
}

impl Table {
    /// The rules FORWARD reaches, in order, following jumps into user chains.
    pub fn reachable(&self, chain: &str, depth: u8) -> Vec<&Rule> {
        let mut out = Vec::new();
        for rule in self.rules.iter().filter(|r| r.chain == chain) {
            out.push(rule);
            if let Some(target) = rule.target() {
                if depth < 8 && self.rules.iter().any(|r| r.chain == target) {
                    out.extend(self.reachable(target, depth + 1));
                }
            }
        }
        out
    }
}

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    match &facts.iptables {
        Ok(tables) => tables.iter().flat_map(|t| checks_of(facts, t)).collect(),
        Err(e) => vec![Check::not_checked(
            FAMILY,
            &facts.name,
            "iptables",
            &format!("the rules could not be read: {e}"),
        )],
    }
}

/// One backend's filter table. The checks of a backend the node does not
/// run (legacy rules beside nft ones) are named after it.
fn checks_of(facts: &NodeFacts, filter: &FilterTable) -> Vec<Check> {
    let node = facts.name.as_str();
    let (name_suffix, said) = match (filter.decided, filter.backend) {
        (true, Backend::Nft) => (String::new(), String::new()),
        (true, Backend::Legacy) => (String::new(), " [iptables-legacy]".into()),
        (false, backend) => (
            format!(" ({})", backend.name()),
            format!(" [{}, beside the backend the node runs]", backend.name()),
        ),
    };
    let text = match &filter.text {
        Ok(text) => text,
        Err(e) => {
            return vec![Check::not_checked(
                FAMILY,
                node,
                &format!("iptables{name_suffix}"),
                &format!("the rules could not be read: {e}"),
            )]
        }
    };
    let table = parse(text);
    let forward = table.reachable("FORWARD", 0);
    let pods = &facts.pair;
    let program = match filter.backend {
        Backend::Nft => "iptables".to_string(),
        Backend::Legacy => filter.backend.program(false),
    };
    let mut checks = vec![check_policy(facts, &table, &forward, &program)];
    checks.push(check_drops(facts, &forward, pods, &program));
    checks.push(check_mark_drop(facts, &table, &forward, pods, &program));
    checks.extend(check_calico_profiles(facts, &table));
    for check in &mut checks {
        check.name.push_str(&name_suffix);
        check.evidence.push_str(&said);
    }
    checks
}

/// The cluster's pod CIDR: subnet.env's FLANNEL_NETWORK, else the nodes'.
fn cluster_cidrs(facts: &NodeFacts) -> Vec<Ipv4Net> {
    let flannel =
        super::flannel::subnet_env(facts).and_then(|e| e.get("FLANNEL_NETWORK")?.parse().ok());
    match flannel {
        Some(net) => vec![net],
        None => facts
            .me
            .iter()
            .chain(&facts.others)
            .flat_map(|n| n.pod_cidrs.clone())
            .collect(),
    }
}

fn check_policy(facts: &NodeFacts, table: &Table, forward: &[&Rule], program: &str) -> Check {
    let policy = table
        .policies
        .get("FORWARD")
        .map_or("ACCEPT", |p| p.as_str());
    let cidrs = cluster_cidrs(facts);
    let accepts = forward.iter().find(|r| {
        r.target() == Some("ACCEPT")
            && ["-s", "-d"].iter().any(|o| {
                r.option(o)
                    .and_then(parse_net)
                    .is_some_and(|n| cidrs.iter().any(|c| n.contains(c) || c.contains(&n)))
            })
    });
    let shown: Vec<String> = cidrs.iter().map(|c| c.to_string()).collect();
    let ok = policy != "DROP" || accepts.is_some();
    let evidence = match accepts {
        _ if policy != "DROP" => format!("FORWARD policy {policy}"),
        Some(rule) => format!("FORWARD policy DROP, and {} accepts the pods", rule.text),
        None => format!("FORWARD policy DROP and no rule accepts the pod CIDR {}: forwarded pod traffic is dropped (Docker sets this policy)", shown.join(", ")),
    };
    Check::judge(FAMILY, &facts.name, "FORWARD policy", ok, evidence, || {
        let cidr = shown
            .first()
            .cloned()
            .unwrap_or_else(|| "<pod CIDR>".into());
        format!("{program} -A FORWARD -s {cidr} -j ACCEPT; {program} -A FORWARD -d {cidr} -j ACCEPT (what flanneld's FLANNEL-FWD chain does)")
    })
}

/// A DROP or REJECT that a pod pair's packets can hit, not behind a mark
/// or conntrack state, nor a Calico workload chain (judged below).
fn check_drops(facts: &NodeFacts, forward: &[&Rule], pods: &[Ipv4Addr], program: &str) -> Check {
    let hit = forward.iter().find(|r| {
        matches!(r.target(), Some("DROP" | "REJECT"))
            && !r.text.contains("--mark")
            && !r.text.contains("--ctstate")
            && !r.text.contains("--state")
            && !r.chain.starts_with("cali-")
            && (r.option("-s").is_some() || r.option("-d").is_some())
            && r.matches(pods, pods)
    });
    let evidence = match hit {
        Some(rule) => what_it_does(rule, &named(facts, rule)),
        None => "no DROP or REJECT rule reached from FORWARD matches a pod address".into(),
    };
    Check::judge(
        FAMILY,
        &facts.name,
        "DROP rules",
        hit.is_none(),
        evidence,
        || {
            let rule = hit
                .map(|r| r.text.replacen("-A ", "-D ", 1))
                .unwrap_or_default();
            format!("remove it if it is not wanted: {program} {rule}")
        },
    )
}

/// What a DROP or REJECT rule does to the pods it names. A REJECT drops
/// too, but the node answers the sender: say so, or the user hunts a
/// silent drop where the client saw a refusal.
fn what_it_does(rule: &Rule, pods: &str) -> String {
    if rule.target() != Some("REJECT") {
        return format!("{} drops pod traffic{pods}", rule.text);
    }
    // A reset takes the rejected packet's destination as its source; an
    // ICMP error is the node's own, from its address.
    let answer = match rule.option("--reject-with") {
        Some(reset) if reset.contains("tcp-reset") => {
            "with a TCP reset in the destination's name".to_string()
        }
        with => format!(
            "with an ICMP {} from its own address",
            with.unwrap_or("icmp-port-unreachable")
        ),
    };
    format!(
        "{} rejects pod traffic{pods}: the node drops it and answers {answer}",
        rule.text
    )
}

/// The pods a rule's -s/-d name.
fn named(facts: &NodeFacts, rule: &Rule) -> String {
    let names: Vec<String> = ["-s", "-d"]
        .iter()
        .filter_map(|o| rule.option(o).and_then(parse_net))
        .flat_map(|n| {
            facts
                .pods
                .iter()
                .filter(move |p| p.ip.is_some_and(|ip| n.contains(&ip)))
                .map(|p| p.qualified())
        })
        .collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(" ({})", names.join(", "))
    }
}

/// kube-proxy's pair: KUBE-MARK-DROP sets 0x8000, KUBE-FIREWALL drops it.
fn check_mark_drop(
    facts: &NodeFacts,
    table: &Table,
    forward: &[&Rule],
    pods: &[Ipv4Addr],
    program: &str,
) -> Check {
    let firewall = table.rules.iter().find(|r| {
        r.chain == "KUBE-FIREWALL" && r.target() == Some("DROP") && r.text.contains("0x8000")
    });
    let marking = forward
        .iter()
        .find(|r| r.target() == Some("KUBE-MARK-DROP") && r.matches(pods, pods));
    let reached = forward.iter().any(|r| r.target() == Some("KUBE-FIREWALL"));
    let bad = firewall.is_some() && reached && marking.is_some();
    let evidence = match (firewall, marking) {
        (Some(fw), Some(mark)) if bad => format!(
            "{} marks pod traffic 0x8000{}, and {} drops it",
            mark.text,
            named(facts, mark),
            fw.text
        ),
        (Some(fw), _) => format!(
            "{} only drops what KUBE-MARK-DROP marks, and no pod traffic is marked",
            fw.text
        ),
        _ => "no KUBE-FIREWALL mark drop".into(),
    };
    Check::judge(FAMILY, &facts.name, "KUBE-FIREWALL", !bad, evidence, || {
        let rule = marking
            .map(|r| r.text.replacen("-A ", "-D ", 1))
            .unwrap_or_default();
        format!("find who jumps pod traffic to KUBE-MARK-DROP (a Service with no endpoints, a loadBalancerSourceRanges) or remove it: {program} {rule}")
    })
}

/// Calico's to-workload chains that end in "Drop if no profiles matched"
/// with no profile jump before it: every packet to that pod is dropped.
fn check_calico_profiles(facts: &NodeFacts, table: &Table) -> Vec<Check> {
    let mut chains: Vec<&str> = table
        .rules
        .iter()
        .filter(|r| r.chain.starts_with("cali-tw-") || r.chain.starts_with("cali-fw-"))
        .map(|r| r.chain.as_str())
        .collect();
    chains.dedup();
    chains.into_iter().filter_map(|chain| {
        let rules: Vec<&Rule> = table.rules.iter().filter(|r| r.chain == chain).collect();
        let drop = rules.iter().find(|r| r.text.contains("Drop if no profiles matched"))?;
        let profiled = rules.iter().any(|r| r.target().is_some_and(|t| t.starts_with("cali-pro-") || t.starts_with("cali-pi-")));
        let iface = chain.splitn(3, '-').nth(2).unwrap_or(chain);
        Some(Check::judge(FAMILY, &facts.name, &format!("Calico policy of {iface}"), profiled,
            if profiled { format!("{chain} applies a profile before dropping") }
            else { format!("{chain} has no profile or policy before {}: every packet to the pod behind {iface} is dropped", drop.text) },
            || "the pod's namespace profile (kns.<namespace>) is missing: check the namespace and calico-kube-controllers; or a NetworkPolicy selects the pod and allows nothing".into()))
    }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_reached_from_forward_follow_jumps_and_keep_comments() {
        let table = parse(
            "-P INPUT ACCEPT\n-P FORWARD DROP\n-N FLANNEL-FWD\n-A FORWARD -j FLANNEL-FWD\n\
             -A FLANNEL-FWD -s 10.244.0.0/16 -m comment --comment \"flanneld forward\" -j ACCEPT\n\
             -A FORWARD -s 10.244.1.2/32 -j DROP\n",
        );
        assert_eq!(table.policies["FORWARD"], "DROP");
        let reached = table.reachable("FORWARD", 0);
        assert_eq!(reached.len(), 3);
        assert_eq!(reached[1].target(), Some("ACCEPT"));
        assert_eq!(reached[1].option("--comment"), Some("flanneld forward"));
        let pod: Ipv4Addr = "10.244.1.2".parse().unwrap();
        let other: Ipv4Addr = "10.244.2.2".parse().unwrap();
        assert!(reached[2].matches(&[pod], &[other]));
        assert!(!reached[2].matches(&[other], &[pod]));
    }

    #[test]
    fn a_reject_is_told_as_a_refusal_the_node_answers() {
        let table = parse(
            "-P FORWARD ACCEPT\n-A FORWARD -d 10.244.2.2/32 -p tcp -j REJECT --reject-with tcp-reset\n\
             -A FORWARD -s 10.244.1.2/32 -j DROP\n",
        );
        let reached = table.reachable("FORWARD", 0);
        let reject = what_it_does(reached[0], " (default/db-0)");
        assert!(
            reject.ends_with("rejects pod traffic (default/db-0): the node drops it and answers with a TCP reset in the destination's name"),
            "{reject}"
        );
        assert!(what_it_does(reached[1], "").ends_with("-j DROP drops pod traffic"));
    }
}
