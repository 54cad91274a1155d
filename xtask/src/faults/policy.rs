//! NetworkPolicy enforcers' rules on node-2 for db-0, selected for
//! ingress by `default/backend-deny-ingress` (a policy without rules):
//! written as each renderer writes them, with their chain names (hashes
//! as the renderers compute them) and comments, so that web-0 → db-0 is
//! dropped the way it is on a real node.
//!
//! - Felix, iptables mode (felix/rules/endpoints.go, policy.go): the
//!   workload's `cali-tw-<veth>` runs tier `default`, jumps to the
//!   policy's chain (`cali-pi-` + the first 19 characters of the
//!   base64url SHA-256 of `knp/default/backend-deny-ingress`), whose only
//!   rule is its comment, and drops at the tier's end.
//! - Felix, nftables mode: the same in its `ip calico` table, chains
//!   prefixed by their layer (`filter-`), the policy chain unhashed (nft
//!   names are long enough), hash and comments in one nft comment.
//! - kube-router v2.x (pkg/controllers/netpol): `KUBE-ROUTER-FORWARD`
//!   sends traffic to db-0 to its `KUBE-POD-FW-` chain, which runs the
//!   policy's `KUBE-NWPLCY-` chain (hashes: base32 SHA-256 of namespace,
//!   name and a sync version), then logs and rejects what no policy
//!   marked. Its common chain accepts ICMP echo requests, as kube-router's
//!   does: a ping passes, a TCP connection does not.

use anyhow::Result;

use super::iptables;
use crate::lab::{feed, LabPod};

/// The policy chain Felix (iptables mode) names for
/// `knp/default/backend-deny-ingress`.
const FELIX_POLICY_CHAIN: &str = "cali-pi-_3SjGCfk6HPOX91Gip1T";
const FELIX_POLICY_COMMENT: &str = "KubernetesNetworkPolicy default/backend-deny-ingress ingress";
const END_OF_TIER: &str = "End of tier default. Drop if no policies passed packet";

/// Felix's iptables-mode chains for `db` (iptables-nft, as Felix on a
/// node whose iptables is nft).
pub(super) fn calico_iptables(node2: &str, db: &LabPod) -> Result<()> {
    let tw = format!("cali-tw-{}", db.host_iface);
    let pi = FELIX_POLICY_CHAIN;
    for chain in ["cali-FORWARD", "cali-to-wl-dispatch", tw.as_str(), pi] {
        iptables(node2, &format!("-N {chain}"))?;
    }
    for rule in [
        r#"-A FORWARD -m comment --comment "cali:wUHhoiAYhphO9Mso" -j cali-FORWARD"#.to_string(),
        r#"-A cali-FORWARD -m comment --comment "cali:vjrMJCRpqwy5oRoX" -j MARK --set-xmark 0x0/0xe0000"#.to_string(),
        r#"-A cali-FORWARD -o cali+ -m comment --comment "cali:8ZoYfO5HKXWbB3pk" -j cali-to-wl-dispatch"#.to_string(),
        format!(r#"-A cali-to-wl-dispatch -o {} -m comment --comment "cali:lSj8x5fXYVtbL3Kq" -g {tw}"#, db.host_iface),
        format!(r#"-A {tw} -m comment --comment "cali:aYw0rH3d9SM6PFFq" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"#),
        format!(r#"-A {tw} -m comment --comment "cali:xW4aD_iaOJylQrzh" -m conntrack --ctstate INVALID -j DROP"#),
        format!(r#"-A {tw} -m comment --comment "cali:2eEWKPJdmEBKINUF" -j MARK --set-xmark 0x0/0x10000"#),
        format!(r#"-A {tw} -m comment --comment "cali:wcHQ6Nl1vEgMO3zh" -m comment --comment "Start of tier default" -j MARK --set-xmark 0x0/0x20000"#),
        format!(r#"-A {tw} -m comment --comment "cali:Gz8T5Oshy9sdhsQ9" -m mark --mark 0x0/0x20000 -j {pi}"#),
        format!(r#"-A {tw} -m comment --comment "cali:ftd5B3rgTHzdqs-S" -m mark --mark 0x10000/0x10000 -m comment --comment "Return if policy accepted" -j RETURN"#),
        format!(r#"-A {tw} -m comment --comment "cali:9RJKa0VgLHeVw5Ar" -m mark --mark 0x0/0x20000 -m comment --comment "{END_OF_TIER}" -j DROP"#),
        format!(r#"-A {pi} -m comment --comment "cali:R3Bg4XQlcMCzJfMa" -m comment --comment "{FELIX_POLICY_COMMENT}""#),
    ] {
        iptables(node2, &rule)?;
    }
    Ok(())
}

/// Felix's nftables-mode table for `db`.
pub(super) fn calico_nftables(node2: &str, db: &LabPod) -> Result<()> {
    let iface = &db.host_iface;
    let tw = format!("filter-cali-tw-{iface}");
    let pi = "filter-cali-pi-knp/default/backend-deny-ingress";
    let script = format!(
        r#"table ip calico {{
  chain filter-cali-FORWARD {{
    counter meta mark set mark & 0xfff1ffff comment "cali:vjrMJCRpqwy5oRoX;"
    oifname "cali*" counter jump filter-cali-to-wl-dispatch comment "cali:8ZoYfO5HKXWbB3pk;"
  }}
  chain filter-cali-to-wl-dispatch {{
    oifname vmap @filter-cali-to-wl-dispatch comment "cali:lSj8x5fXYVtbL3Kq;"
  }}
  chain {tw} {{
    ct state related,established counter accept comment "cali:aYw0rH3d9SM6PFFq;"
    ct state invalid counter drop comment "cali:xW4aD_iaOJylQrzh;"
    counter meta mark set mark & 0xfffeffff comment "cali:2eEWKPJdmEBKINUF;"
    counter meta mark set mark & 0xfffdffff comment "cali:wcHQ6Nl1vEgMO3zh; Start of tier default"
    meta mark & 0x20000 == 0 counter jump {pi} comment "cali:Gz8T5Oshy9sdhsQ9;"
    meta mark & 0x10000 == 0x10000 counter return comment "cali:ftd5B3rgTHzdqs-S; Return if policy accepted"
    meta mark & 0x20000 == 0 counter drop comment "cali:9RJKa0VgLHeVw5Ar; {END_OF_TIER}"
  }}
  chain {pi} {{
    continue comment "cali:R3Bg4XQlcMCzJfMa; {FELIX_POLICY_COMMENT}"
  }}
  map filter-cali-to-wl-dispatch {{
    type ifname : verdict
    elements = {{ "{iface}" : goto {tw} }}
  }}
  chain filter-FORWARD {{
    type filter hook forward priority filter; policy accept;
    counter jump filter-cali-FORWARD comment "cali:wUHhoiAYhphO9Mso;"
  }}
}}
"#
    );
    feed(node2, "nft", &["-f", "-"], &script)
}

/// kube-router's chains for `db` (its pod chain and the policy's hashed
/// with sync version 1764979200000000000).
pub(super) fn kube_router(node2: &str, db: &LabPod) -> Result<()> {
    let pod_fw = "KUBE-POD-FW-K4J53BEWIFDUK44P";
    let policy = "KUBE-NWPLCY-OVTRZAMGLOZSOSLQ";
    let (ip, pod) = (db.ip, "POD name:db-0 namespace: default");
    for chain in [
        "KUBE-ROUTER-FORWARD",
        "KUBE-NWPLCY-COMMON",
        "KUBE-NWPLCY-DEFAULT",
        pod_fw,
        policy,
    ] {
        iptables(node2, &format!("-N {chain}"))?;
    }
    for rule in [
        r#"-A FORWARD -m comment --comment "kube-router netpol - TEMCG2JMHZYE7H7T" -j KUBE-ROUTER-FORWARD"#.to_string(),
        format!(r#"-A KUBE-ROUTER-FORWARD -d {ip}/32 -m comment --comment "rule to jump traffic destined to {pod} to chain {pod_fw}" -j {pod_fw}"#),
        r#"-A KUBE-NWPLCY-COMMON -m comment --comment "rule to drop invalid state for pod" -m conntrack --ctstate INVALID -j DROP"#.to_string(),
        r#"-A KUBE-NWPLCY-COMMON -m comment --comment "rule for stateful firewall for pod" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"#.to_string(),
        r#"-A KUBE-NWPLCY-COMMON -p icmp -m comment --comment "allow icmp echo requests" -m icmp --icmp-type 8 -j ACCEPT"#.to_string(),
        r#"-A KUBE-NWPLCY-DEFAULT -m comment --comment "rule to mark traffic matching a network policy" -j MARK --set-xmark 0x10000/0x10000"#.to_string(),
        format!(r#"-A {pod_fw} -m comment --comment "common bi-directional traffic policy rules" -j KUBE-NWPLCY-COMMON"#),
        format!(r#"-A {pod_fw} -d {ip}/32 -m comment --comment "rule to permit the traffic traffic to pods when source is the pod's local node" -m addrtype --src-type LOCAL -j ACCEPT"#),
        format!(r#"-A {pod_fw} -s {ip}/32 -m comment --comment "run through default egress network policy chain" -j KUBE-NWPLCY-DEFAULT"#),
        format!(r#"-A {pod_fw} -d {ip}/32 -m comment --comment "run through nw policy backend-deny-ingress" -j {policy}"#),
        format!(r#"-A {pod_fw} -m comment --comment "rule to log dropped traffic {pod}" -m mark ! --mark 0x10000/0x10000 -j NFLOG --nflog-group 100 -m limit --limit 10/min --limit-burst 10"#),
        format!(r#"-A {pod_fw} -m comment --comment "rule to REJECT traffic destined for {pod}" -m mark ! --mark 0x10000/0x10000 -j REJECT"#),
        format!(r#"-A {pod_fw} -j MARK --set-xmark 0x0/0x10000"#),
    ] {
        iptables(node2, &rule)?;
    }
    Ok(())
}
