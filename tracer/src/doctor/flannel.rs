//! Flannel on a node: flanneld's subnet.env (without it the flannel CNI
//! plugin fails every sandbox), cni0 with the subnet's gateway and MTU,
//! flannel.1 with the VNI and port, and for every other node the route,
//! neighbour and FDB entry flanneld writes from its annotations.

use std::{collections::BTreeMap, net::Ipv4Addr};

use ipnet::Ipv4Net;

use super::{cluster::ClusterNode, node::NodeFacts, Check};
use crate::model::bounded::{self, ReadError};
use crate::node::Link;

const FAMILY: &str = "flannel";
pub const SUBNET_ENV: &str = "run/flannel/subnet.env";

/// subnet.env is a few lines: a larger file is not flanneld's.
const SUBNET_ENV_MAX: u64 = 64 << 10;

/// `/run/flannel/subnet.env`, as KEY=value pairs.
pub fn subnet_env(facts: &NodeFacts) -> Option<BTreeMap<String, String>> {
    read_subnet_env(facts).ok()
}

/// `/run/flannel/subnet.env`, or why it cannot be read: non-blocking,
/// regular files only, and capped (a FIFO or /dev/zero there must not
/// wedge the doctor or an agent).
fn read_subnet_env(facts: &NodeFacts) -> Result<BTreeMap<String, String>, ReadError> {
    let path = facts.path(SUBNET_ENV).map_err(ReadError::Io)?;
    let text = bounded::read_regular_text(&path, SUBNET_ENV_MAX)?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

/// Whether Flannel is this node's CNI, and its backend type.
pub fn backend(facts: &NodeFacts) -> Option<String> {
    let annotated = facts
        .me
        .as_ref()
        .and_then(|m| m.annotation("flannel.alpha.coreos.com/backend-type"));
    match annotated {
        Some(kind) => Some(kind.to_string()),
        None if facts.view.link_named("flannel.1").is_some() => Some("vxlan".into()),
        None if facts.path(SUBNET_ENV).is_ok_and(|p| p.exists()) => Some("host-gw".into()),
        None => None,
    }
}

pub fn checks(facts: &NodeFacts) -> Vec<Check> {
    let Some(kind) = backend(facts) else {
        return Vec::new();
    };
    let mut checks = Vec::new();
    if facts.files {
        checks.push(check_subnet_env(facts));
    }
    checks.push(check_cni0(facts));
    if kind == "vxlan" {
        checks.push(check_vtep(facts));
    }
    for remote in facts.others.iter().filter(|r| !r.pod_cidrs.is_empty()) {
        checks.push(check_route(facts, remote, &kind));
        if kind == "vxlan" {
            checks.push(check_fdb(facts, remote));
        }
    }
    checks
}

fn check_subnet_env(facts: &NodeFacts) -> Check {
    let node = facts.name.as_str();
    let shown = NodeFacts::shown(SUBNET_ENV);
    let env = match read_subnet_env(facts) {
        Ok(env) => env,
        Err(ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return missing_subnet_env(node, &shown)
        }
        Err(e) => {
            return Check::fail(
                FAMILY,
                node,
                "subnet.env",
                format!("{shown} {e}"),
                format!(
                    "remove {shown} and restart flanneld on this node: it writes the file anew"
                ),
            )
        }
    };
    let subnet: Option<Ipv4Net> = env.get("FLANNEL_SUBNET").and_then(|s| s.parse().ok());
    let cidr = facts.pod_cidr();
    let agrees = match (subnet, cidr) {
        (Some(s), Some(c)) => s.trunc() == c,
        (Some(_), None) => true,
        _ => false,
    };
    Check::judge(
        FAMILY,
        node,
        "subnet.env",
        agrees,
        format!(
            "{shown} says FLANNEL_SUBNET={} (node podCIDR {})",
            env.get("FLANNEL_SUBNET").map_or("(none)", |s| s.as_str()),
            cidr.map_or("unknown".into(), |c| c.to_string())
        ),
        || {
            "restart flanneld on this node so that it rewrites subnet.env from the node's podCIDR"
                .into()
        },
    )
}

/// subnet.env is missing: what the flannel plugin then says.
fn missing_subnet_env(node: &str, shown: &str) -> Check {
    Check::fail(FAMILY, node, "subnet.env",
            format!("{shown} is missing: the flannel plugin fails every sandbox with \"loadFlannelSubnetEnv failed: open {shown}: no such file or directory\""),
            "flanneld has not written it: check the kube-flannel pod on this node (kubectl -n kube-flannel logs ds/kube-flannel-ds), usually the node has no podCIDR or flanneld cannot reach the API".into())
}

/// The gateway address cni0 must hold, with its subnet's length:
/// FLANNEL_SUBNET's, or the podCIDR's first address.
fn gateway(facts: &NodeFacts) -> Option<Ipv4Net> {
    let env = subnet_env(facts);
    env.and_then(|e| e.get("FLANNEL_SUBNET")?.parse().ok())
        .or_else(|| {
            let cidr = facts.pod_cidr()?;
            Ipv4Net::new(cidr.hosts().next()?, cidr.prefix_len()).ok()
        })
}

fn check_cni0(facts: &NodeFacts) -> Check {
    let node = facts.name.as_str();
    let Some(cni0) = facts.view.link_named("cni0") else {
        return Check::fail(FAMILY, node, "cni0",
            "cni0 does not exist: the pods' veths have no bridge, nothing they send is routed".into(),
            "recreate the bridge by recreating one pod on the node (the bridge plugin makes cni0), or `ip link add cni0 type bridge` with the gateway address and enslave the veths".into());
    };
    let held: Vec<Ipv4Addr> = facts
        .view
        .addresses
        .iter()
        .filter(|(index, _)| *index == cni0.index)
        .map(|(_, ip)| *ip)
        .collect();
    let flannel_mtu = subnet_env(facts).and_then(|e| e.get("FLANNEL_MTU")?.parse::<u32>().ok());
    let gateway = gateway(facts);
    if gateway.is_none() && flannel_mtu.is_none() {
        // What it holds still helps whoever reads on.
        let holds: Vec<String> = held.iter().map(ToString::to_string).collect();
        let why = format!(
            "cni0 holds {}, MTU {}, but no subnet.env and no podCIDR tell which gateway and MTU it needs",
            if holds.is_empty() { "no IPv4 address".to_string() } else { holds.join(", ") },
            cni0.mtu
        );
        return Check::not_checked(FAMILY, node, "cni0", &why);
    }
    let (ok, evidence, fix) = judge_cni0(gateway, &held, cni0.mtu, flannel_mtu);
    Check::judge(FAMILY, node, "cni0", ok, evidence, || fix)
}

/// cni0 against what Flannel expects of it: the gateway address (when a
/// podCIDR or subnet.env tells it) and FLANNEL_MTU (when subnet.env says
/// it). Whether it passes, the evidence, and the fix for what is wrong.
fn judge_cni0(
    gateway: Option<Ipv4Net>,
    held: &[Ipv4Addr],
    mtu: u32,
    flannel_mtu: Option<u32>,
) -> (bool, String, String) {
    let holds = || match held {
        [] => "no IPv4 address".to_string(),
        _ => held
            .iter()
            .map(|ip| ip.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    };
    let has_gw = gateway.is_none_or(|g| held.contains(&g.addr()));
    let addresses = match gateway {
        Some(g) if has_gw => format!("cni0 has the gateway {}", g.addr()),
        Some(g) => format!("cni0 lacks the gateway {} (it holds {})", g.addr(), holds()),
        None => format!(
            "cni0 holds {} (no podCIDR or subnet.env to tell which gateway it needs)",
            holds()
        ),
    };
    let mtu_ok = flannel_mtu.is_none_or(|m| m == mtu);
    let mtus = match flannel_mtu {
        Some(m) => format!("MTU {mtu} (FLANNEL_MTU {m})"),
        None => format!("MTU {mtu} (no FLANNEL_MTU to compare)"),
    };
    let mut fix = Vec::new();
    if let Some(g) = gateway.filter(|_| !has_gw) {
        fix.push(format!("ip addr add {g} dev cni0"));
    }
    if let Some(m) = flannel_mtu.filter(|_| !mtu_ok) {
        fix.push(format!("ip link set cni0 mtu {m}"));
    }
    (
        has_gw && mtu_ok,
        format!("{addresses}, {mtus}"),
        fix.join("; "),
    )
}

fn check_vtep(facts: &NodeFacts) -> Check {
    let node = facts.name.as_str();
    let Some(link) = facts.view.link_named("flannel.1") else {
        return Check::fail(
            FAMILY,
            node,
            "flannel.1",
            "flannel.1 does not exist: nothing encapsulates toward the other nodes".into(),
            "restart flanneld on this node: it recreates flannel.1".into(),
        );
    };
    let data = facts
        .me
        .as_ref()
        .map(|m| m.flannel_backend_data())
        .unwrap_or_default();
    let want_vni = data["VNI"].as_u64().map(|v| v as u32).or(Some(1));
    let (up, evidence) = vtep_state(facts, link);
    // The port is flannel's `Backend.Port` (8472 unless set), the same on
    // every node: any one is right here, and it is said.
    let ok = up && link.vxlan.and_then(|v| v.vni) == want_vni;
    Check::judge(FAMILY, node, "flannel.1", ok, evidence, || {
        "ip link set flannel.1 up; if the VNI is wrong, delete flannel.1 and restart flanneld"
            .into()
    })
}

/// Whether a VXLAN device is up, and `<dev> is up, VNI <n>, port <p>`.
pub fn vtep_state(facts: &NodeFacts, link: &Link) -> (bool, String) {
    let up = facts.links_up.get(&link.name).copied().unwrap_or(false);
    let vni = link.vxlan.and_then(|v| v.vni);
    let port = link.vxlan.and_then(|v| v.port);
    let said = format!(
        "{} is {}, VNI {}, port {}",
        link.name,
        if up { "up" } else { "DOWN" },
        vni.map_or("?".into(), |v| v.to_string()),
        port.map_or("?".into(), |p| p.to_string())
    );
    (up, said)
}

fn check_route(facts: &NodeFacts, remote: &ClusterNode, kind: &str) -> Check {
    let node = facts.name.as_str();
    let cidr = remote.pod_cidrs[0];
    let (gateway, dev) = match kind {
        "vxlan" => (cidr.network(), "flannel.1"),
        _ => (remote.ip.unwrap_or(Ipv4Addr::UNSPECIFIED), "eth0"),
    };
    let onlink = if kind == "vxlan" { " onlink" } else { "" };
    let expected = format!("{cidr} via {gateway} dev {dev}{onlink}");
    let found = facts
        .view
        .routes
        .iter()
        .find(|r| r.destination == cidr.into() && r.table == crate::node::RT_TABLE_MAIN);
    let want_dev = facts.view.link_named(dev).map(|l| l.index);
    let ok = found.is_some_and(|r| {
        r.gateway == Some(gateway.into()) && (kind != "vxlan" || r.oif == want_dev)
    });
    let evidence = match found {
        Some(r) if ok => format!("{} (to {})", facts.view.describe(r), remote.name),
        Some(r) => format!("the route to {}'s pods is {}, not {expected}", remote.name, facts.view.describe(r)),
        None => format!("no route to {cidr} ({}'s pods): they go by the default route, unencapsulated, or nowhere", remote.name),
    };
    Check::judge(
        FAMILY,
        node,
        &format!("route to {}", remote.name),
        ok,
        evidence,
        || format!("ip route replace {expected} (flanneld writes it: restart it if it is missing)"),
    )
}

fn check_fdb(facts: &NodeFacts, remote: &ClusterNode) -> Check {
    let node = facts.name.as_str();
    let data = remote.flannel_backend_data();
    let mac = data["VtepMAC"].as_str().unwrap_or("?").to_lowercase();
    let public = remote
        .flannel_public_ip()
        .map_or("?".into(), |ip| ip.to_string());
    let vtep = remote.pod_cidrs[0].network();
    let fdb_ok = facts.fdb.iter().any(|l| {
        l.starts_with(&mac) && l.contains("dev flannel.1") && l.contains(&format!("dst {public} "))
    });
    let index = facts.view.link_named("flannel.1").map(|l| l.index);
    let neigh_ok = facts
        .view
        .neighbours
        .iter()
        .any(|(i, ip, m)| Some(*i) == index && *ip == vtep && format_mac(m) == mac);
    Check::judge(
        FAMILY,
        node,
        &format!("VTEP of {}", remote.name),
        fdb_ok && neigh_ok,
        format!(
            "FDB {mac} dst {public}: {}; neighbour {vtep} lladdr {mac}: {}",
            if fdb_ok { "present" } else { "MISSING" },
            if neigh_ok { "present" } else { "MISSING" }
        ),
        || {
            format!("bridge fdb append {mac} dev flannel.1 dst {public}; ip neigh replace {vtep} lladdr {mac} dev flannel.1 nud permanent (flanneld writes both: restart it)")
        },
    )
}

pub fn format_mac(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn cni0_is_judged_against_the_gateway_when_known_and_described_when_not() {
        let gw: Ipv4Net = "10.244.1.1/24".parse().unwrap();
        let healthy = judge_cni0(Some(gw), &[ip("10.244.1.1")], 1450, Some(1450));
        assert_eq!(
            healthy,
            (
                true,
                "cni0 has the gateway 10.244.1.1, MTU 1450 (FLANNEL_MTU 1450)".into(),
                String::new()
            )
        );

        let (ok, evidence, fix) = judge_cni0(Some(gw), &[ip("10.244.9.1")], 1450, Some(1450));
        assert!(!ok);
        assert_eq!(
            evidence,
            "cni0 lacks the gateway 10.244.1.1 (it holds 10.244.9.1), MTU 1450 (FLANNEL_MTU 1450)"
        );
        assert_eq!(fix, "ip addr add 10.244.1.1/24 dev cni0");

        let (ok, evidence, fix) = judge_cni0(Some(gw), &[], 1500, Some(1450));
        assert!(!ok);
        assert_eq!(
            evidence,
            "cni0 lacks the gateway 10.244.1.1 (it holds no IPv4 address), MTU 1500 (FLANNEL_MTU 1450)"
        );
        assert_eq!(
            fix,
            "ip addr add 10.244.1.1/24 dev cni0; ip link set cni0 mtu 1450"
        );

        // No podCIDR, no subnet.env (the doctor without --nodes-file or
        // --host-root): nothing to judge the address by, so it is said.
        let unknown = judge_cni0(None, &[ip("10.244.1.1")], 1450, None);
        assert_eq!(
            unknown,
            (
                true,
                "cni0 holds 10.244.1.1 (no podCIDR or subnet.env to tell which gateway it needs), MTU 1450 (no FLANNEL_MTU to compare)".into(),
                String::new()
            )
        );
        let (ok, _, fix) = judge_cni0(None, &[], 1500, Some(1450));
        assert!(!ok);
        assert_eq!(fix, "ip link set cni0 mtu 1450");
    }

    /// A node root whose run/flannel/subnet.env is made by `make`.
    fn subnet_env_check(name: &str, make: impl Fn(&std::path::Path)) -> Check {
        let root =
            std::env::temp_dir().join(format!("podtrace-flannel-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("run/flannel")).unwrap();
        make(&root.join(SUBNET_ENV));
        let started = std::time::Instant::now();
        let checks = checks(&NodeFacts::of_root(&root));
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "it waited"
        );
        checks.into_iter().find(|c| c.name == "subnet.env").unwrap()
    }

    #[test]
    fn a_fifo_or_dev_zero_subnet_env_is_named_not_waited_on() {
        let fifo = subnet_env_check("fifo", |path| {
            let made = std::process::Command::new("mkfifo")
                .arg(path)
                .status()
                .unwrap();
            assert!(made.success());
        });
        assert!(fifo.failed());
        assert_eq!(
            fifo.evidence,
            "/run/flannel/subnet.env is a FIFO, not a regular file"
        );
        let zero = subnet_env_check("zero", |path| {
            crate::model::bounded::testing::mkzero(path);
        });
        assert_eq!(
            zero.evidence,
            "/run/flannel/subnet.env is a character device, not a regular file"
        );
        let huge = subnet_env_check("huge", |path| {
            std::fs::File::create(path)
                .unwrap()
                .set_len(1 << 30)
                .unwrap();
        });
        assert_eq!(
            huge.evidence,
            "/run/flannel/subnet.env is larger than 64 KiB"
        );
        let good = subnet_env_check("good", |path| {
            std::fs::write(
                path,
                "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\n",
            )
            .unwrap();
        });
        assert!(good.ok(), "{good:?}");
    }
}
