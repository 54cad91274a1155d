//! Every check family that judges a node by its gathered facts, in the
//! order the report lists them.

use super::{
    bgp, calico, calico_tunnel, cni_config, firewall, flannel, ipv6, kernel, nfqueue, node,
    plugins, wireguard, Check,
};

/// Every check a node's facts allow.
pub fn node_checks(facts: &node::NodeFacts) -> Vec<Check> {
    let mut checks = cni_config::checks(facts);
    checks.extend(plugins::checks(facts));
    checks.extend(flannel::checks(facts));
    checks.extend(calico::checks(facts));
    checks.extend(calico_tunnel::checks(facts));
    checks.extend(bgp::checks(facts));
    checks.extend(kernel::checks(facts));
    checks.extend(wireguard::checks(facts));
    checks.extend(ipv6::checks(facts));
    checks.extend(firewall::checks(facts));
    checks.extend(nfqueue::checks(facts));
    checks
}
