//! IPv6 on a dual-stack node, where it differs from IPv4: its own
//! forwarding switch, IPv6 turned off on a pod-facing device, router
//! advertisements the kernel stops taking once forwarding is on, and
//! Flannel's second VXLAN device, flannel-v6.1.
//!
//! Only a node that carries pod IPv6 is checked: flanneld wrote an IPv6
//! subnet, or an IPv6 tunnel device exists. A single-stack node gets no
//! IPv6 check at all, rather than a list of failures it does not have.

use super::{flannel, node::NodeFacts, Check};

const FAMILY: &str = "ipv6";

/// The IPv6 VXLAN devices of Flannel (`EnableIPv6`) and Calico (IPv6
/// pools in VXLAN mode).
const TUNNELS: [&str; 2] = ["flannel-v6.1", "vxlan-v6.calico"];

/// Devices pod IPv6 crosses on the node, where they exist.
const POD_FACING: [&str; 3] = ["cni0", "flannel-v6.1", "vxlan-v6.calico"];

/// A default route as `ip -6 route show default` prints it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefaultRoute6 {
    /// The line itself, for the evidence.
    pub line: String,
    pub dev: String,
    /// `proto ra`: learnt from a router advertisement.
    pub from_ra: bool,
}

impl DefaultRoute6 {
    /// The default routes of an `ip -6 route show default` listing.
    pub fn parse(listing: &str) -> Vec<Self> {
        listing
            .lines()
            .filter(|l| l.starts_with("default"))
            .filter_map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                let after = |key: &str| words.windows(2).find(|w| w[0] == key).map(|w| w[1]);
                Some(Self {
                    line: line.trim().to_string(),
                    dev: after("dev")?.to_string(),
                    from_ra: after("proto") == Some("ra"),
                })
            })
            .collect()
    }
}

/// The sysctls these checks read, for the node's links named `links`.
pub fn sysctl_keys<'a>(links: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut keys = vec![
        "net/ipv6/conf/all/forwarding".to_string(),
        "net/ipv6/conf/all/disable_ipv6".to_string(),
    ];
    for link in links {
        keys.push(format!("net/ipv6/conf/{link}/disable_ipv6"));
        keys.push(format!("net/ipv6/conf/{link}/accept_ra"));
    }
    keys
}

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    let Some(why) = dual_stack(facts) else {
        return Vec::new();
    };
    let node = facts.name.as_str();
    if facts.sysctl("net/ipv6/conf/all/disable_ipv6").is_none() {
        return vec![Check::fail(
            FAMILY,
            node,
            "ipv6",
            format!("{why}, but this kernel has no IPv6 (no /proc/sys/net/ipv6: booted with ipv6.disable=1?)"),
            "remove ipv6.disable=1 from the kernel command line and reboot, or run the cluster single-stack".into(),
        )];
    }
    let mut checks = vec![check_forwarding(facts, &why)];
    checks.extend(check_disabled(facts));
    checks.extend(check_accept_ra(facts));
    checks.extend(check_flannel_v6(facts));
    checks
}

/// Why the node carries pod IPv6, or None.
fn dual_stack(facts: &NodeFacts) -> Option<String> {
    let env = flannel::subnet_env(facts).unwrap_or_default();
    if let Some(subnet) = env.get("FLANNEL_IPV6_SUBNET") {
        return Some(format!("flanneld gave this node the IPv6 subnet {subnet}"));
    }
    TUNNELS
        .iter()
        .find(|t| facts.view.link_named(t).is_some())
        .map(|t| format!("{t} exists"))
}

fn check_forwarding(facts: &NodeFacts, why: &str) -> Check {
    let node = facts.name.as_str();
    match facts.sysctl("net/ipv6/conf/all/forwarding") {
        Some(value) => Check::judge(
            FAMILY,
            node,
            "ipv6 forwarding",
            value == "1",
            format!("net.ipv6.conf.all.forwarding = {value} ({why})"),
            || {
                "sysctl -w net.ipv6.conf.all.forwarding=1 (and in /etc/sysctl.d so that it stays): IPv4's ip_forward does not forward IPv6".into()
            },
        ),
        None => Check::not_checked(
            FAMILY,
            node,
            "ipv6 forwarding",
            "net.ipv6.conf.all.forwarding could not be read",
        ),
    }
}

/// `disable_ipv6` on a device pod IPv6 crosses drops it there (and
/// removes the device's IPv6 addresses).
fn check_disabled(facts: &NodeFacts) -> Vec<Check> {
    let node = facts.name.as_str();
    POD_FACING
        .iter()
        .filter_map(|dev| {
            let value = facts.sysctl(&format!("net/ipv6/conf/{dev}/disable_ipv6"))?;
            Some(Check::judge(
                FAMILY,
                node,
                &format!("{dev} disable_ipv6"),
                value == "0",
                format!("net.ipv6.conf.{dev}.disable_ipv6 = {value}"),
                || format!("sysctl -w net.ipv6.conf.{dev}.disable_ipv6=0, then restart the CNI's daemon so that it puts {dev}'s IPv6 addresses back"),
            ))
        })
        .collect()
}

/// With forwarding on, the kernel takes router advertisements only where
/// `accept_ra` is 2: a default route learnt from one is not renewed, and
/// the node loses IPv6 beyond its link when the route's lifetime ends.
fn check_accept_ra(facts: &NodeFacts) -> Vec<Check> {
    let node = facts.name.as_str();
    if facts.sysctl("net/ipv6/conf/all/forwarding") != Some("1") {
        return Vec::new();
    }
    facts
        .ipv6_defaults
        .iter()
        .filter(|route| route.from_ra)
        .map(|route| {
            let dev = &route.dev;
            let value = facts
                .sysctl(&format!("net/ipv6/conf/{dev}/accept_ra"))
                .unwrap_or("?");
            Check::judge(
                FAMILY,
                node,
                &format!("{dev} accept_ra"),
                value == "2",
                format!("`{}` came from a router advertisement; with forwarding on, net.ipv6.conf.{dev}.accept_ra = {value}{}", route.line,
                    if value == "2" { "" } else { " ignores the next ones, so the route expires unrenewed" }),
                || format!("sysctl -w net.ipv6.conf.{dev}.accept_ra=2 (and in /etc/sysctl.d)"),
            )
        })
        .collect()
}

/// Flannel in VXLAN mode with an IPv6 subnet needs flannel-v6.1.
fn check_flannel_v6(facts: &NodeFacts) -> Option<Check> {
    const DEV: &str = "flannel-v6.1";
    let env = flannel::subnet_env(facts)?;
    env.get("FLANNEL_IPV6_SUBNET")?;
    if flannel::backend(facts).as_deref() != Some("vxlan") {
        return None;
    }
    let node = facts.name.as_str();
    let Some(link) = facts.view.link_named(DEV) else {
        return Some(Check::fail(
            FAMILY,
            node,
            DEV,
            format!("{DEV} does not exist: nothing encapsulates IPv6 toward the other nodes"),
            "restart flanneld on this node (with EnableIPv6 in net-conf.json): it recreates flannel-v6.1".into(),
        ));
    };
    let (up, evidence) = flannel::vtep_state(facts, link);
    Some(Check::judge(FAMILY, node, DEV, up, evidence, || {
        format!("ip link set {DEV} up")
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_routes_say_their_device_and_whether_an_ra_gave_them() {
        let listing = "default via fe80::1 dev eth0 proto ra metric 1024 expires 1797sec hoplimit 64 pref medium\ndefault via fd5a::1 dev eth1 metric 1024 pref medium\n";
        let routes = DefaultRoute6::parse(listing);
        assert_eq!(routes.len(), 2);
        assert_eq!((routes[0].dev.as_str(), routes[0].from_ra), ("eth0", true));
        assert_eq!((routes[1].dev.as_str(), routes[1].from_ra), ("eth1", false));
    }

    #[test]
    fn a_single_stack_node_gets_no_ipv6_check() {
        let facts = NodeFacts::of_root(std::path::Path::new("/nonexistent"));
        assert!(checks(&facts).is_empty());
    }
}
