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

/// How to name a device's IPv6 sysctl to `sysctl -w`: the dotted form,
/// or the slash form for a device whose name has a dot (`flannel-v6.1`,
/// `eth0.100`), which the dotted form would split.
fn sysctl_name(dev: &str, key: &str) -> String {
    if dev.contains('.') {
        format!("net/ipv6/conf/{dev}/{key}")
    } else {
        format!("net.ipv6.conf.{dev}.{key}")
    }
}

/// The sysctls these checks read, for the node's links named `links`.
pub fn sysctl_keys<'a>(links: impl Iterator<Item = &'a str>) -> Vec<String> {
    let mut keys = vec![
        "net/ipv6/conf/all/forwarding".to_string(),
        "net/ipv6/conf/all/disable_ipv6".to_string(),
    ];
    for link in links {
        for key in ["disable_ipv6", "accept_ra", "forwarding"] {
            keys.push(format!("net/ipv6/conf/{link}/{key}"));
        }
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
            let name = sysctl_name(dev, "disable_ipv6");
            Some(Check::judge(
                FAMILY,
                node,
                &format!("{dev} disable_ipv6"),
                value == "0",
                format!("{name} = {value}"),
                || format!("sysctl -w {name}=0, then restart the CNI's daemon so that it puts {dev}'s IPv6 addresses back"),
            ))
        })
        .collect()
}

/// With forwarding on on a device, the kernel takes router advertisements
/// there only where `accept_ra` is 2: a default route it learnt from one
/// is not renewed, and the node loses IPv6 beyond its link when the
/// route's lifetime ends. `accept_ra` 0 with such a route is a network
/// daemon (systemd-networkd, NetworkManager) taking them in userspace,
/// which forwarding does not stop.
fn check_accept_ra(facts: &NodeFacts) -> Vec<Check> {
    let node = facts.name.as_str();
    facts
        .ipv6_defaults
        .iter()
        .filter(|route| route.from_ra)
        .filter_map(|route| {
            let dev = &route.dev;
            let forwarding = facts.sysctl(&format!("net/ipv6/conf/{dev}/forwarding"))?;
            let accept_ra = facts.sysctl(&format!("net/ipv6/conf/{dev}/accept_ra"))?;
            if forwarding != "1" {
                return None;
            }
            let name = sysctl_name(dev, "accept_ra");
            let (ok, meaning) = match accept_ra {
                "1" => (false, "ignores the next ones, so the route expires unrenewed"),
                "0" => (true, "leaves them to a network daemon, which renews it"),
                _ => (true, "takes them all the same"),
            };
            Some(Check::judge(
                FAMILY,
                node,
                &format!("{dev} accept_ra"),
                ok,
                format!(
                    "`{}` came from a router advertisement; with forwarding on, {name} = {accept_ra} {meaning}",
                    route.line
                ),
                || format!("sysctl -w {name}=2 (and in /etc/sysctl.d)"),
            ))
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
    use crate::doctor::ipv6_routes::DefaultRoute6;

    #[test]
    fn default_routes_say_their_device_and_whether_an_ra_gave_them() {
        let listing = "default via fe80::1 dev eth0 proto ra metric 1024 expires 1797sec hoplimit 64 pref medium\ndefault via fd5a::1 dev eth1 metric 1024 pref medium\ndefault proto ra metric 1024 pref medium\n\tnexthop via fe80::2 dev eth2 weight 1\n\tnexthop via fe80::3 dev eth3 weight 1\n";
        let routes = DefaultRoute6::parse(listing);
        let seen: Vec<(&str, bool)> = routes.iter().map(|r| (r.dev.as_str(), r.from_ra)).collect();
        assert_eq!(
            seen,
            [
                ("eth0", true),
                ("eth1", false),
                ("eth2", true),
                ("eth3", true)
            ]
        );
        assert_eq!(
            sysctl_name("flannel-v6.1", "disable_ipv6"),
            "net/ipv6/conf/flannel-v6.1/disable_ipv6"
        );
        assert_eq!(
            sysctl_name("cni0", "disable_ipv6"),
            "net.ipv6.conf.cni0.disable_ipv6"
        );
    }

    #[test]
    fn a_single_stack_node_gets_no_ipv6_check() {
        let facts = NodeFacts::of_root(std::path::Path::new("/nonexistent"));
        assert!(checks(&facts).is_empty());
    }
}
