//! kube-network-policies' nftables table on node-2, as its controller
//! renders it (pkg/dataplane/controller.go, syncNFTablesRules): table
//! `inet kube-network-policies`; sets `podips-v4`/`podips-v6` holding
//! the pods some NetworkPolicy selects (here db-0, selected by
//! `default/backend-deny-ingress`); base chains `postrouting` (filter,
//! srcnat - 5), `input` (101, after IPVS) and `prerouting` (dstnat + 5,
//! its DNS race workaround, on by default). The chains accept what needs
//! no decision (DNS, IPv6 neighbour discovery, root's sockets,
//! connections the engine labelled 100) and queue the rest to nfqueue 98
//! (install.yaml's `--nfqueue-id`).
//!
//! Run with `--fail-open=false` its queue rules carry no `bypass` flag,
//! and here no engine reads the queue, as when its pod is not running:
//! the kernel drops every packet the rules queue, web-0's to db-0 first.

use anyhow::{Context, Result};

use crate::lab::{feed, LabPod};

/// The table for `db`, with the queue rules `--fail-open=false` writes.
pub(super) fn fail_closed(node2: &str, db: &LabPod) -> Result<()> {
    let queue = "queue to 98";
    let to_engine = |family: &str, set: &str| {
        format!("    {family} saddr @{set} {queue}\n    {family} daddr @{set} {queue}\n")
    };
    let (v4, v6) = (to_engine("ip", "podips-v4"), to_engine("ip6", "podips-v6"));
    let script = format!(
        r#"table inet kube-network-policies {{
  set podips-v4 {{
    type ipv4_addr
    elements = {{ {db} }}
  }}
  set podips-v6 {{
    type ipv6_addr
  }}
  chain postrouting {{
    type filter hook postrouting priority srcnat - 5; policy accept;
    udp dport 53 accept
    meta nfproto ipv6 icmpv6 type nd-router-solicit accept
    meta nfproto ipv6 icmpv6 type nd-router-advert accept
    meta nfproto ipv6 icmpv6 type nd-neighbor-solicit accept
    meta nfproto ipv6 icmpv6 type nd-neighbor-advert accept
    meta nfproto ipv6 icmpv6 type nd-redirect accept
    meta skuid 0 counter accept
    ct label 100 ct state established,related counter accept
{v4}{v6}    ct label set 100
  }}
  chain input {{
    type filter hook input priority 101; policy accept;
    iifname "lo" accept
    ip saddr @podips-v4 ct state new {queue}
    ip6 saddr @podips-v6 ct state new {queue}
  }}
  chain prerouting {{
    type filter hook prerouting priority dstnat + 5; policy accept;
    meta l4proto != udp accept
    udp dport != 53 accept
{v4}{v6}  }}
}}
"#,
        db = db.ip
    );
    feed(node2, "nft", &["-f", "-"], &script).context(
        "kube-network-policies' table did not load: its queue rules need nft's queue expression (CONFIG_NFT_QUEUE), which this kernel may lack",
    )
}
