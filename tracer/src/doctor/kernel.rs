//! The kernel settings pod traffic needs on a node: forwarding, reverse
//! path filtering that does not drop tunnel traffic, bridged traffic
//! through iptables where br_netfilter is loaded, room in the conntrack
//! table, conntrack not strict enough about TCP to find live connections
//! INVALID, and MTUs that fit inside each other (VXLAN takes 50 bytes,
//! IPIP 20, WireGuard 60).

use super::{flannel, node::NodeFacts, Check};
use crate::node::{Link, NodeView};

const FAMILY: &str = "kernel";

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    let node = facts.name.as_str();
    let mut checks = Vec::new();
    checks.push(check_forwarding(facts));
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
    checks.extend(super::next_hops::check(facts));
    checks
}

/// ip_forward, and each link's own forwarding: ip_forward=1 turns every
/// link's on, but one turned off since (`conf.<dev>.forwarding=0`, by
/// hand or by a tool) still stops what arrives on it while ip_forward
/// shows 1.
fn check_forwarding(facts: &NodeFacts) -> Check {
    const NAME: &str = "ip_forward";
    let node = facts.name.as_str();
    let Some(forward) = facts.sysctl("net/ipv4/ip_forward") else {
        return Check::not_checked(
            FAMILY,
            node,
            NAME,
            "/proc/sys/net/ipv4/ip_forward could not be read",
        );
    };
    if forward != "1" {
        return Check::judge(
            FAMILY,
            node,
            NAME,
            false,
            format!("net.ipv4.ip_forward = {forward}"),
            || "sysctl -w net.ipv4.ip_forward=1 (and in /etc/sysctl.d so that it stays)".into(),
        );
    }
    // The links pod traffic is routed from: a bridge (not its ports: the
    // kernel routes by the bridge's setting), a tunnel, the underlay, a
    // routed pod's veth (Calico's). A NIC pods never use may be off on
    // purpose.
    let carries_pods = |l: &&Link| {
        l.up && l.controller.is_none()
            && (l.kind == "bridge"
                || l.is_tunnel()
                || l.peer_in_other_netns
                || is_underlay(facts, l))
    };
    let off: Vec<&str> = facts
        .view
        .links
        .iter()
        .filter(carries_pods)
        .filter(|l| facts.sysctl(&format!("net/ipv4/conf/{}/forwarding", l.name)) == Some("0"))
        .map(|l| l.name.as_str())
        .collect();
    let sysctls = |value: &str| {
        off.iter()
            .map(|dev| format!("net.ipv4.conf.{dev}.forwarding{value}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let evidence = if off.is_empty() {
        "net.ipv4.ip_forward = 1".to_string()
    } else {
        format!(
            "net.ipv4.ip_forward = 1, but forwarding is off on {} ({}): what arrives there is not routed",
            off.join(", "),
            sysctls(" = 0")
        )
    };
    Check::judge(FAMILY, node, NAME, off.is_empty(), evidence, || {
        format!("sysctl -w {}", sysctls("=1"))
    })
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
        // A tunnel that is down (tunl0 where no CNI uses it) carries nothing.
        .filter(|l| (l.is_tunnel() && l.up) || is_underlay(facts, l))
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

/// Bytes a tunnel device's encapsulation adds to what it sends, and its
/// name: an outer IPv4 header (20), plus UDP, VXLAN or Geneve and the inner
/// Ethernet header (30), or WireGuard's UDP, header and tag (40); 20 more
/// over an IPv6 underlay (a VXLAN device's local address tells it, a
/// WireGuard device's peers' endpoints).
fn overhead(view: &NodeView, link: &Link) -> Option<(u32, &'static str)> {
    let (bytes, name) = match link.kind.as_str() {
        "vxlan" => (50, "VXLAN"),
        "geneve" => (50, "Geneve"),
        "ipip" => (20, "IPIP"),
        "wireguard" => {
            let device = view.wireguard.device(&link.name);
            return Some((device.and_then(|d| d.overhead()).unwrap_or(60), "WireGuard"));
        }
        _ => return None,
    };
    let over_ipv6 = link
        .vxlan
        .and_then(|v| v.local)
        .is_some_and(|ip| ip.is_ipv6());
    Some((bytes + if over_ipv6 { 20 } else { 0 }, name))
}

/// Pod veths, cni0 and the tunnels all at the pod MTU; each tunnel that
/// is up at most the underlay's less its encapsulation's overhead.
fn check_mtu(facts: &NodeFacts) -> Check {
    let view = &facts.view;
    let underlay = view.links.iter().find(|l| is_underlay(facts, l));
    let carries = |l: &Link| view.routes.iter().any(|r| r.oif == Some(l.index));
    // Each tunnel that is up, with the bytes its encapsulation adds.
    let mut tunnels: Vec<(&Link, (u32, &str))> = (view.links.iter())
        .filter(|l| l.up)
        .filter_map(|l| Some((l, overhead(view, l)?)))
        .collect();
    // The one pods' cross-node traffic takes first: a route leaves by it.
    tunnels.sort_by_key(|(l, _)| !carries(l));
    let tunnel = tunnels.first().map(|(l, _)| *l);
    let expected = flannel::subnet_env(facts)
        .and_then(|e| e.get("FLANNEL_MTU")?.parse::<u32>().ok())
        .or_else(|| tunnel.map(|t| t.mtu))
        .or_else(|| underlay.map(|u| u.mtu));
    let mut wrong = Vec::new();
    for (t, (bytes, name), u) in tunnels.iter().filter_map(|&(t, o)| Some((t, o, underlay?))) {
        if t.mtu + bytes > u.mtu {
            wrong.push(format!(
                "{} MTU {} does not fit the underlay {} MTU {} less {bytes} B of {name}",
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
    let (bytes, name) = tunnels.first().map_or((50, "VXLAN"), |&(_, o)| o);
    Check::judge(
        FAMILY,
        &facts.name,
        "MTU",
        wrong.is_empty(),
        evidence,
        || {
            let pod_mtu = (underlay.map(|u| u.mtu - bytes).or(expected)).unwrap_or(1500 - bytes);
            format!("set every pod veth, cni0 and the tunnel to the pod MTU {pod_mtu} (FLANNEL_MTU, or Calico's veth_mtu: the underlay less {bytes} for {name}); pods get it at sandbox creation, so recreate the pods")
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
                up: true,
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
    fn one_links_forwarding_off_fails_ip_forward_though_ip_forward_is_1() {
        let mut facts = node(true);
        assert!(named(&checks(&facts), "ip_forward").ok());
        facts
            .sysctls
            .insert("net/ipv4/conf/flannel.1/forwarding".into(), "0".into());
        facts
            .sysctls
            .insert("net/ipv4/conf/eth0/forwarding".into(), "1".into());
        // A NIC pods never use, off on purpose, is not judged.
        facts.view.links.push(Link {
            name: "mgmt0".into(),
            index: 9,
            ..facts.view.links[0].clone()
        });
        facts
            .sysctls
            .insert("net/ipv4/conf/mgmt0/forwarding".into(), "0".into());
        let checks = checks(&facts);
        let check = named(&checks, "ip_forward");
        assert!(!check.ok(), "{check:?}");
        assert_eq!(
            check.evidence,
            "net.ipv4.ip_forward = 1, but forwarding is off on flannel.1 (net.ipv4.conf.flannel.1.forwarding = 0): what arrives there is not routed"
        );
        assert_eq!(
            check.fix.as_deref(),
            Some("sysctl -w net.ipv4.conf.flannel.1.forwarding=1")
        );
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
    fn an_ipip_tunnel_leaves_20_bytes_and_a_tunnel_that_is_down_is_not_judged() {
        let mut facts = node(true);
        let ipip = |mtu, up| Link {
            mtu,
            up,
            ..crate::node::fixtures::link(4, "tunl0", "ipip")
        };
        // Calico in IPIP mode: the underlay is the link with the InternalIP.
        facts.me = Some(crate::doctor::cluster::ClusterNode {
            ip: Some("192.0.2.11".parse().unwrap()),
            ..Default::default()
        });
        facts.view.addresses = vec![(2, "192.0.2.11".parse().unwrap())];
        facts.view.links = vec![facts.view.links[0].clone(), ipip(1480, true)];
        facts.view.routes = vec![crate::node::fixtures::route("10.248.2.0/24", 4)];
        let mtu = named(&checks(&facts), "MTU").clone();
        assert!(mtu.ok(), "{mtu:?}");
        assert_eq!(mtu.evidence, "pod MTU 1480, tunnel 1480, underlay 1500");
        facts.view.links[1] = ipip(1500, true);
        let mtu = named(&checks(&facts), "MTU").clone();
        assert!(!mtu.ok(), "{mtu:?}");
        assert_eq!(
            mtu.evidence,
            "tunl0 MTU 1500 does not fit the underlay eth0 MTU 1500 less 20 B of IPIP"
        );
        assert!(mtu.fix.unwrap().contains("pod MTU 1480"));
        // Flannel's node with the ipip module loaded: tunl0 is down.
        let mut flannel = node(true);
        flannel.view.links.push(ipip(1500, false));
        let checks = checks(&flannel);
        assert!(named(&checks, "MTU").ok());
        assert_eq!(
            named(&checks, "rp_filter").evidence,
            "rp_filter is off or loose on eth0, flannel.1"
        );
    }

    #[test]
    fn a_wireguard_device_leaves_60_bytes_over_ipv4_and_80_over_ipv6() {
        use crate::node::wireguard::{WgDevice, WgPeer};
        let mut facts = node(true);
        facts.me = Some(crate::doctor::cluster::ClusterNode {
            ip: Some("192.0.2.11".parse().unwrap()),
            ..Default::default()
        });
        facts.view.addresses = vec![(2, "192.0.2.11".parse().unwrap())];
        let wg = Link {
            mtu: 1440,
            ..crate::node::fixtures::link(4, "flannel-wg", "wireguard")
        };
        facts.view.links = vec![facts.view.links[0].clone(), wg];
        facts.view.routes = vec![crate::node::fixtures::route("10.244.0.0/16", 4)];
        let with_endpoint = |endpoint: &str| WgDevice {
            name: "flannel-wg".into(),
            peers: vec![WgPeer {
                endpoint: Some(endpoint.parse().unwrap()),
                ..Default::default()
            }],
            ..Default::default()
        };
        facts.view.wireguard.devices = vec![with_endpoint("192.0.2.12:51820")];
        let mtu = named(&checks(&facts), "MTU").clone();
        assert!(mtu.ok(), "{mtu:?}");
        facts.view.wireguard.devices = vec![with_endpoint("[2001:db8::12]:51820")];
        let mtu = named(&checks(&facts), "MTU").clone();
        assert_eq!(
            mtu.evidence,
            "flannel-wg MTU 1440 does not fit the underlay eth0 MTU 1500 less 80 B of WireGuard"
        );
    }

    #[test]
    fn unread_sysctls_are_not_checked() {
        let checks = checks(&NodeFacts::of_root(Path::new("/nonexistent")));
        for name in ["ip_forward", "rp_filter"] {
            assert_eq!(named(&checks, name).status, Status::NotChecked);
        }
    }
}
