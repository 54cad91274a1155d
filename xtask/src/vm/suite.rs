//! Which kernel tests run on which kernel of the matrix, and the
//! commands that run them.

use std::path::PathBuf;

/// What every kernel runs: (test target, exact test names). Chosen to
/// cover each kernel signal in little time under TCG: the lab's cross-node
/// VXLAN story, the fault catalogue's drops named with their rule (by
/// reason, or by location before 5.17) and no_route, a ClusterIP's DNAT
/// under kube-proxy's iptables mode, `--port` leaving packets out in the
/// kernel, a dual-stack pair over IPv6 and IPv6
/// inside the IPv4 tunnel (the IPv6 programs), an iptables drop traced
/// under the agent pod's capabilities and memlock limit with the kernel's
/// addresses hidden as distributions hide them, cleanup after kill -9 in
/// clsact mode (every kernel) and in TCX mode (`TCX_SUITE`, where the
/// kernel has it), Calico's IPIP datapath, which needs the kernels'
/// ipip.ko, Flannel's WireGuard, which needs their wireguard.ko, and
/// kube-network-policies' nfqueue, which needs their nft_queue.ko.
pub const SUITE: &[(&str, &[&str])] = &[
    (
        "lab",
        &[
            "cross_node_vxlan_traced_on_both_nodes",
            "clsact_fallback_attaches_and_cleans_up_even_after_sigkill",
        ],
    ),
    (
        "profile",
        &["calico_vxlan_cross_node_ping_is_encapsulated_with_vni_4096_on_4789"],
    ),
    (
        "faults",
        &[
            "iptables_forward_drop_names_the_rule",
            "flannel_route_missing_is_no_route_even_with_a_default_route",
        ],
    ),
    (
        "services",
        &["a_cluster_ip_is_followed_to_its_backend_on_the_other_node_and_back_iptables"],
    ),
    (
        // `--port`'s programs: the filter is a load-time constant, so
        // they are programs of their own to each verifier.
        "filters",
        &["a_port_filter_tells_only_that_ports_packets_and_counts_the_rest"],
    ),
    (
        "deployed",
        &["the_agents_capability_set_names_the_rule_and_where_the_kernel_dropped"],
    ),
    (
        "ipv6",
        &[
            "a_dual_stack_pair_is_traced_over_both_families_with_the_ipv6_tunnel_paired",
            "ipv6_inside_the_ipv4_underlays_tunnel_is_traced_with_inner_and_outer_paired",
        ],
    ),
    (
        // Ignored on this host, which has no ipip.ko: the guest runs
        // the suite with --include-ignored.
        "ipip",
        &["calico_ipip_cross_node_ping_is_delivered_with_inner_and_outer_paired"],
    ),
    (
        // Ignored on this host, whose kernel has no nft queue expression.
        "policy",
        &["kube_network_policies_queue_without_an_engine_is_told_as_such"],
    ),
    (
        "wireguard",
        &[
            "a_ping_through_flannel_wireguard_is_delivered_with_its_encrypted_leg",
            "a_packet_wireguard_frees_after_decryption_names_the_allowed_ips_to_read",
        ],
    ),
];

/// What one kernel of the matrix runs besides the suite: (series, test
/// target, exact test names). These exercise no program path, hook or
/// kernel facility that the suite does not already run on every kernel
/// (the same programs load, and their stories differ in what userspace
/// reads: another topology's routes, a rule's comments, the doctor's
/// netlink reads), so one kernel each is enough; the host runs them all,
/// and the tests that need a module the host lacks run on a kernel that
/// has it. Spread so that each kernel's suite takes about as long (the
/// VM matrix is most of CI's time).
pub const ONE_KERNEL: &[(&str, &str, &[&str])] = &[
    (
        "5.10",
        "lab",
        &["flannel_host_gw_is_routed_without_encapsulation"],
    ),
    (
        "5.10",
        "ipip",
        &["a_block_withdrawn_by_bgp_is_no_route_naming_birds_ipip_route"],
    ),
    (
        // BIRD's CrossSubnet routes over the suite's IPIP path.
        "5.10",
        "cross_subnet",
        &["ipip_cross_subnet_routes_a_node_on_the_subnet_natively_and_tunnels_across"],
    ),
    (
        // The mark drop is the iptables drop's path, through another rule.
        "5.10",
        "faults",
        &["kube_firewall_mark_drop_is_named_at_kube_firewall"],
    ),
    (
        // Calico's WireGuard is Flannel's datapath (the suite's) with
        // Calico's routing table and rule read beside it.
        "5.10",
        "wireguard_calico",
        &["a_packet_calicos_wireguard_frees_after_decryption_is_told_past_the_device"],
    ),
    (
        "6.1",
        "lab",
        &["calico_bgp_is_routed_without_encapsulation"],
    ),
    (
        "6.1",
        "ipv6",
        &["an_ipv6_cluster_ip_is_followed_through_ip6tables_dnat"],
    ),
    (
        "6.1",
        "wireguard",
        &["cluster_mode_judges_a_peer_narrowed_mid_trace_by_what_its_agent_read_since"],
    ),
    (
        "6.1",
        "wireguard_calico",
        &["a_ping_through_calico_wireguard_is_delivered_naming_table_1_and_its_rule"],
    ),
    (
        "6.12",
        "faults",
        &["calico_profile_drop_names_the_rule_with_its_comments"],
    ),
    (
        // kube-proxy's nftables mode needs 5.13 or newer.
        "6.12",
        "services",
        &["a_cluster_ip_is_followed_to_its_backend_on_the_other_node_and_back_nftables"],
    ),
    (
        "6.12",
        "wireguard",
        &[
            "the_doctor_reads_wireguard_and_names_a_device_down_and_a_subnet_no_peer_allows",
            "an_encrypted_packet_dropped_on_either_nodes_underlay_is_its_storys_drop",
        ],
    ),
    (
        // The drop after decapsulation is the suite's iptables drop, on
        // the packet tunl0 hands up.
        "6.12",
        "ipip",
        &["an_iptables_drop_after_ipip_decapsulation_names_the_rule"],
    ),
];

/// What kernels with TCX links (6.6) also run.
pub const TCX_SUITE: (&str, &[&str]) = ("lab", &["nothing_stays_attached_after_sigint_or_sigkill"]);

/// The test targets the kernel suite builds: the suite's, then those
/// only one kernel runs tests of.
pub(super) fn targets() -> Vec<&'static str> {
    let mut targets: Vec<&str> = SUITE.iter().map(|(target, _)| *target).collect();
    for (_, target, _) in ONE_KERNEL {
        if !targets.contains(target) {
            targets.push(target);
        }
    }
    targets
}

/// The commands that run the suite, one test binary at a time.
/// `kernel`: the series of the matrix, or `None` for the host, which runs
/// every kernel's share of `ONE_KERNEL`.
pub(super) fn suite_commands(
    binaries: &[(String, PathBuf)],
    kernel: Option<&str>,
    tcx: bool,
    chosen: &[String],
) -> Vec<Vec<String>> {
    binaries
        .iter()
        .filter_map(|(target, exe)| {
            let mut tests: Vec<&str> = SUITE
                .iter()
                .filter(|(t, _)| t == target)
                .flat_map(|(_, tests)| tests.iter().copied())
                .collect();
            tests.extend(
                ONE_KERNEL
                    .iter()
                    .filter(|(series, t, _)| t == target && kernel.is_none_or(|k| k == *series))
                    .flat_map(|(_, _, tests)| tests.iter().copied()),
            );
            if tcx && TCX_SUITE.0 == target {
                tests.extend(TCX_SUITE.1);
            }
            tests.retain(|test| {
                chosen.is_empty() || chosen.iter().any(|c| test.contains(c.as_str()))
            });
            if tests.is_empty() {
                return None;
            }
            let mut argv = vec![
                exe.display().to_string(),
                "--exact".into(),
                "--test-threads".into(),
                "1".into(),
            ];
            argv.extend(tests.iter().map(ToString::to_string));
            Some(argv)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::kernels::MATRIX;

    #[test]
    fn every_test_of_one_kernel_runs_on_a_kernel_of_the_matrix_in_a_binary_the_suite_builds() {
        for (series, target, _) in ONE_KERNEL {
            assert!(
                MATRIX.iter().any(|s| s.version == *series),
                "{series} is not in the matrix"
            );
            assert!(
                targets().contains(target),
                "{target} is not built for the suite"
            );
        }
        // Each target is built once, whether the suite or one kernel
        // names it (ipip, wireguard_calico).
        let targets = targets();
        for target in &targets {
            assert_eq!(
                targets.iter().filter(|t| *t == target).count(),
                1,
                "{target} is built twice"
            );
        }
        assert!(targets.contains(&"wireguard_calico"));
    }

    #[test]
    fn the_host_runs_every_kernels_share_and_a_kernel_only_its_own() {
        let binaries = vec![("lab".to_string(), PathBuf::from("/lab"))];
        let on = |kernel| suite_commands(&binaries, kernel, false, &[]).concat();
        let host_gw = "flannel_host_gw_is_routed_without_encapsulation".to_string();
        let bgp = "calico_bgp_is_routed_without_encapsulation".to_string();
        assert!(on(None).contains(&host_gw) && on(None).contains(&bgp));
        assert!(on(Some("5.10")).contains(&host_gw) && !on(Some("5.10")).contains(&bgp));
        assert!(on(Some("6.12")).contains(&"cross_node_vxlan_traced_on_both_nodes".to_string()));
    }
}
