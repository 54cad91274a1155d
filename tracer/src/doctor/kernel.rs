//! The kernel settings pod traffic needs on a node: forwarding, reverse
//! path filtering that does not drop tunnel traffic, bridged traffic
//! through iptables where br_netfilter is loaded, room in the conntrack
//! table, conntrack not strict enough about TCP to find live connections INVALID, and MTUs that fit inside each other (VXLAN takes 50 bytes).

use super::{flannel, node::NodeFacts, Check};
use crate::node::Link;

const FAMILY: &str = "kernel";

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    let node = facts.name.as_str();
    let mut checks = Vec::new();
    checks.push(match facts.sysctl("net/ipv4/ip_forward") {
        Some(forward) => Check::judge(
            FAMILY,
            node,
            "ip_forward",
            forward == "1",
            format!("net.ipv4.ip_forward = {forward}"),
            || "sysctl -w net.ipv4.ip_forward=1 (and in /etc/sysctl.d so that it stays)".into(),
        ),
        None => Check::not_checked(
            FAMILY,
            node,
            "ip_forward",
            "/proc/sys/net/ipv4/ip_forward could not be read",
        ),
    });
    checks.push(check_rp_filter(facts));
    if let Some(value) = facts.sysctl("net/bridge/bridge-nf-call-iptables") {
        checks.push(Check::judge(FAMILY, node, "bridge-nf-call-iptables", value == "1",
            format!("net.bridge.bridge-nf-call-iptables = {value}"),
            || "sysctl -w net.bridge.bridge-nf-call-iptables=1: kube-proxy's rules must see bridged pod traffic".into()));
    }
    checks.extend(check_conntrack(facts));
    checks.extend(check_conntrack_tcp(facts));
    checks.push(check_mtu(facts));
    checks.extend(super::policy_routing::check(facts));
    checks
}

/// Strict reverse-path filtering (1) on the underlay or a tunnel drops
/// packets that come back another way; 0 or loose (2) is what CNIs want.
fn check_rp_filter(facts: &NodeFacts) -> Check {
    const NAME: &str = "rp_filter";
    let Some(all) = facts
        .sysctl("net/ipv4/conf/all/rp_filter")
        .and_then(|v| v.parse::<u8>().ok())
    else {
        return Check::not_checked(
            FAMILY,
            &facts.name,
            NAME,
            "/proc/sys/net/ipv4/conf/all/rp_filter could not be read",
        );
    };
    let watched: Vec<&Link> = facts
        .view
        .links
        .iter()
        .filter(|l| l.is_tunnel() || is_underlay(facts, l))
        .collect();
    if watched.is_empty() {
        return Check::not_checked(FAMILY, &facts.name, NAME, "no tunnel and no underlay link found (the underlay is the link with the node's InternalIP, which needs the node list, or the one a VXLAN device sends through)");
    }
    let strict: Vec<String> = watched
        .iter()
        .filter(|l| {
            let own: u8 = facts
                .sysctl(&format!("net/ipv4/conf/{}/rp_filter", l.name))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            all.max(own) == 1
        })
        .map(|l| l.name.clone())
        .collect();
    let names: Vec<&str> = watched.iter().map(|l| l.name.as_str()).collect();
    Check::judge(
        FAMILY,
        &facts.name,
        NAME,
        strict.is_empty(),
        if strict.is_empty() {
            format!("rp_filter is off or loose on {}", names.join(", "))
        } else {
            format!(
                "strict rp_filter (1) on {}: replies that come back another way are dropped",
                strict.join(", ")
            )
        },
        || {
            format!("sysctl -w net.ipv4.conf.all.rp_filter=2 and net.ipv4.conf.<dev>.rp_filter=2 for {}", strict.join(", "))
        },
    )
}

/// The link with the node's InternalIP, else the one a VXLAN device sends
/// through (its `dev`).
fn is_underlay(facts: &NodeFacts, link: &Link) -> bool {
    match facts.me.as_ref().and_then(|m| m.ip) {
        Some(ip) => facts.view.addresses.contains(&(link.index, ip)),
        None => facts
            .view
            .links
            .iter()
            .any(|l| l.vxlan.and_then(|v| v.dev) == Some(link.index)),
    }
}

fn check_conntrack(facts: &NodeFacts) -> Option<Check> {
    let count: u64 = facts
        .sysctl("net/netfilter/nf_conntrack_count")?
        .parse()
        .ok()?;
    let max: u64 = facts
        .conntrack_max_override
        .or_else(|| facts.sysctl("net/netfilter/nf_conntrack_max")?.parse().ok())?;
    let full = max > 0 && count * 10 >= max * 9;
    Some(Check::judge(
        FAMILY,
        &facts.name,
        "conntrack table",
        !full,
        format!(
            "{count} of nf_conntrack_max {max} entries in use{}",
            if full {
                ": new connections are dropped (\"nf_conntrack: table full, dropping packet\")"
            } else {
                ""
            }
        ),
        || {
            "raise net.netfilter.nf_conntrack_max (kube-proxy's conntrack.maxPerCore), or find what opens so many connections (conntrack -L | sort)".into()
        },
    ))
}

/// Conntrack strict about TCP: with nf_conntrack_tcp_loose=0 a connection
/// whose entry expired (idle past nf_conntrack_tcp_timeout_established)
/// or was flushed is INVALID at its next segment, which kube-proxy's
/// `--ctstate INVALID -j DROP` drops. Said only when strict and not
/// liberal (nf_conntrack_tcp_be_liberal lets such segments through).
fn check_conntrack_tcp(facts: &NodeFacts) -> Option<Check> {
    let loose = facts.sysctl("net/netfilter/nf_conntrack_tcp_loose")?;
    let liberal = facts.sysctl("net/netfilter/nf_conntrack_tcp_be_liberal");
    if loose != "0" || liberal == Some("1") {
        return None;
    }
    let timeout = facts
        .sysctl("net/netfilter/nf_conntrack_tcp_timeout_established")
        .map_or(String::new(), |t| {
            format!(", nf_conntrack_tcp_timeout_established = {t}s")
        });
    Some(Check::fail(
        FAMILY,
        &facts.name,
        "conntrack TCP tracking",
        format!("nf_conntrack_tcp_loose = 0{timeout}: a connection whose entry expired or was flushed is INVALID at its next segment (kube-proxy's --ctstate INVALID rule drops it)"),
        "sysctl -w net.netfilter.nf_conntrack_tcp_loose=1, or nf_conntrack_tcp_be_liberal=1 (kube-proxy's conntrack.tcpBeLiberal)".into(),
    ))
}

/// Pod veths, cni0 and the tunnel all at the pod MTU; the tunnel at most
/// the underlay's less 50 bytes for VXLAN.
fn check_mtu(facts: &NodeFacts) -> Check {
    let view = &facts.view;
    let underlay = view.links.iter().find(|l| is_underlay(facts, l));
    let tunnel = view.links.iter().find(|l| l.kind == "vxlan");
    let expected = flannel::subnet_env(facts)
        .and_then(|e| e.get("FLANNEL_MTU")?.parse::<u32>().ok())
        .or_else(|| tunnel.map(|t| t.mtu))
        .or_else(|| underlay.map(|u| u.mtu));
    let mut wrong = Vec::new();
    if let (Some(t), Some(u)) = (tunnel, underlay) {
        if t.mtu + 50 > u.mtu {
            wrong.push(format!(
                "{} MTU {} does not fit the underlay {} MTU {} less 50 B of VXLAN",
                t.name, t.mtu, u.name, u.mtu
            ));
        }
    }
    let cni0 = view.link_named("cni0");
    let pod_links = view.links.iter().filter(|l| {
        (l.kind == "veth" && l.controller.is_some() && l.controller == cni0.map(|c| c.index))
            || l.name.starts_with("cali")
    });
    for link in cni0.into_iter().chain(pod_links) {
        if expected.is_some_and(|m| link.mtu > m) {
            wrong.push(format!(
                "{} MTU {} is above the pod MTU {}",
                describe(facts, link),
                link.mtu,
                expected.unwrap_or(0)
            ));
        }
    }
    if wrong.is_empty() && (expected.is_none() || underlay.is_none()) {
        return Check::not_checked(FAMILY, &facts.name, "MTU", &format!(
            "{} (the underlay is the link with the node's InternalIP, or the one a VXLAN device sends through)",
            match (expected, underlay) {
                (None, None) => "no pod MTU and no underlay link found",
                (None, Some(_)) => "no pod MTU found (no FLANNEL_MTU, no tunnel)",
                _ => "no underlay link found",
            }
        ));
    }
    let evidence = if wrong.is_empty() {
        format!(
            "pod MTU {}, tunnel {}, underlay {}",
            expected.map_or("?".into(), |m| m.to_string()),
            tunnel.map_or("none".into(), |t| t.mtu.to_string()),
            underlay.map_or("?".into(), |u| u.mtu.to_string())
        )
    } else {
        wrong.join("; ")
    };
    Check::judge(
        FAMILY,
        &facts.name,
        "MTU",
        wrong.is_empty(),
        evidence,
        || {
            format!("set every pod veth, cni0 and the tunnel to the pod MTU {} (FLANNEL_MTU; underlay less 50 for VXLAN); pods get it at sandbox creation, so recreate the pods", expected.unwrap_or(1450))
        },
    )
}

/// A link with the pod behind it, when a pod's veth.
fn describe(facts: &NodeFacts, link: &Link) -> String {
    let pod = facts
        .view
        .routes
        .iter()
        .find(|r| r.oif == Some(link.index) && r.destination.prefix_len() == 32)
        .and_then(|r| match r.destination.network() {
            std::net::IpAddr::V4(ip) => facts.pod_named(ip),
            std::net::IpAddr::V6(_) => None,
        });
    match pod {
        Some(pod) => format!("{} ({pod})", link.name),
        None => link.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::doctor::Status;

    /// A node with the sysctls read and, when given, a VXLAN device
    /// sending through eth0 (the underlay by that).
    fn node(tunnel: bool) -> NodeFacts {
        let mut facts = NodeFacts::of_root(Path::new("/nonexistent"));
        for (key, value) in [
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv4/conf/all/rp_filter", "0"),
        ] {
            facts.sysctls.insert(key.into(), value.into());
        }
        if tunnel {
            let link = |index, name: &str, kind: &str, mtu| Link {
                index,
                name: name.into(),
                kind: kind.into(),
                controller: None,
                has_ethernet_header: true,
                mtu,
                peer_in_other_netns: false,
                peer_netns_id: None,
                peer_index: None,
                vxlan: (kind == "vxlan").then(|| crate::node::VxlanDevice {
                    dev: Some(2),
                    ..Default::default()
                }),
            };
            facts.view.links = vec![
                link(2, "eth0", "", 1500),
                link(3, "flannel.1", "vxlan", 1450),
            ];
        }
        facts
    }

    fn named<'a>(checks: &'a [Check], name: &str) -> &'a Check {
        checks.iter().find(|c| c.name == name).expect(name)
    }

    #[test]
    fn rp_filter_and_mtu_with_no_link_to_judge_are_not_checked() {
        let checks = checks(&node(false));
        for name in ["rp_filter", "MTU"] {
            let check = named(&checks, name);
            assert_eq!(check.status, Status::NotChecked, "{check:?}");
            assert!(check.evidence.starts_with("not checked: no "), "{check:?}");
        }
        assert!(named(&checks, "ip_forward").ok());
    }

    #[test]
    fn rp_filter_and_mtu_with_their_links_are_judged() {
        let checks = checks(&node(true));
        let rp = named(&checks, "rp_filter");
        assert!(rp.ok(), "{rp:?}");
        assert_eq!(rp.evidence, "rp_filter is off or loose on eth0, flannel.1");
        let mtu = named(&checks, "MTU");
        assert_eq!(mtu.evidence, "pod MTU 1450, tunnel 1450, underlay 1500");
    }

    #[test]
    fn unread_sysctls_are_not_checked() {
        let checks = checks(&NodeFacts::of_root(Path::new("/nonexistent")));
        for name in ["ip_forward", "rp_filter"] {
            assert_eq!(named(&checks, name).status, Status::NotChecked);
        }
    }
}
