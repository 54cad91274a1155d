//! `podtrace doctor` on the lab: the healthy lab passes every check, and
//! every fault of the catalogue (old and new) is named on the node it
//! broke. Sandbox failures served by the API stub as kubelet's events are
//! classified, and confirmed by the node check that finds their cause.

#[allow(dead_code)]
mod support;

use std::{path::PathBuf, process::Command};

use serde_json::Value;
use support::*;
use xtask::{
    api_stub::{Stub, TOKEN},
    faults::Fault,
    lab::{cni_plugins, host_root, ip, sysctl, LabGuard, Topology},
};

/// The failing check named `name`.
fn failing_check(report: &Value, name: &str) -> Value {
    failing(report)
        .into_iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no failing check {name}: {report:#}"))
}

fn failing(report: &Value) -> Vec<&Value> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["ok"] == false)
        .collect()
}

/// The failing check of `family` whose name starts with `name` on `node`,
/// with `evidence` in its evidence; exit code 1.
fn assert_names(
    fault: Fault,
    node: &str,
    family: &str,
    name: &str,
    evidence: &str,
    extra: &[&str],
) {
    let lab = lab(fault.topology());
    fault.apply(&lab.0).expect("apply the fault");
    let (report, code) = doctor_report(&lab, extra);
    assert_eq!(code, 1, "{}: {report:#}", fault.name());
    let found = failing(&report).into_iter().find(|c| {
        c["node"] == node
            && c["family"] == family
            && c["name"].as_str().is_some_and(|n| n.starts_with(name))
    });
    let check = found.unwrap_or_else(|| {
        panic!(
            "{}: no failing {family} check {name:?} on {node}: {report:#}",
            fault.name()
        )
    });
    let text = check["evidence"].as_str().unwrap();
    assert!(text.contains(evidence), "{}: {text}", fault.name());
    assert!(
        check["fix"].as_str().is_some_and(|f| !f.is_empty()),
        "{check}"
    );
}

#[test]
fn the_healthy_labs_pass_every_check() {
    for topology in [
        Topology::FlannelVxlan,
        Topology::FlannelHostGw,
        Topology::Calico,
    ] {
        let lab = lab(topology);
        let (report, code) = doctor_report(&lab, &[]);
        assert!(
            failing(&report).is_empty(),
            "{}: {report:#}",
            topology.name()
        );
        assert_eq!(code, 0);
        let nodes: Vec<&str> = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["node"].as_str())
            .collect();
        assert!(
            nodes.contains(&"node-1") && nodes.contains(&"node-2"),
            "{nodes:?}"
        );
    }
}

/// flannel with `Backend.Port` set: flannel.1 on UDP 8475 is healthy, and
/// the check says the port it found.
#[test]
fn a_flannel_vxlan_port_of_the_clusters_choosing_passes() {
    let lab = lab(Topology::FlannelVxlan);
    xtask::lab::flannel_vxlan::move_to_port(&lab.0, 8475).expect("flannel.1 on 8475");
    let (report, code) = doctor_report(&lab, &[]);
    assert!(failing(&report).is_empty(), "{report:#}");
    assert_eq!(code, 0);
    let said = report.to_string();
    assert!(said.contains("flannel.1 is up, VNI 1, port 8475"), "{said}");
}

/// A dual-stack flannel node gets IPv6's own checks: they pass on the node
/// as flanneld leaves it, and each fault IPv4 does not have is named with
/// its fix: IPv6 forwarding off, IPv6 disabled on cni0, flannel-v6.1
/// missing, and a router-advertised default route the kernel stops
/// renewing once forwarding is on. A single-stack node has none of them.
#[test]
fn a_dual_stack_flannel_node_gets_ipv6s_own_checks() {
    let lab = lab(Topology::FlannelVxlan);
    let (report, _) = doctor_report(&lab, &[]);
    assert!(
        !report.to_string().contains("ipv6"),
        "a single-stack node got IPv6 checks: {report:#}"
    );
    xtask::lab::flannel_vxlan::dual_stack(&lab.0).expect("dual-stack flannel");
    let (report, code) = doctor_report(&lab, &[]);
    assert!(failing(&report).is_empty(), "{report:#}");
    assert_eq!(code, 0);
    assert_eq!(
        check_on(&report, "node-1", "ipv6 forwarding")["evidence"],
        "net.ipv6.conf.all.forwarding = 1 (flanneld gave this node the IPv6 subnet fd00:10:244:1::1/64)"
    );
    assert_eq!(
        check_on(&report, "node-2", "flannel-v6.1")["evidence"],
        "flannel-v6.1 is up, VNI 1, port 8472"
    );
    let (node1, node2) = (lab.0.node_netns(1), lab.0.node_netns(2));
    sysctl(&node1, "net.ipv6.conf.all.forwarding", "0").unwrap();
    sysctl(&node1, "net.ipv6.conf.cni0.disable_ipv6", "1").unwrap();
    ip(&node2, "link del flannel-v6.1").unwrap();
    ip(
        &node2,
        "-6 route add default via fd5a:0:2::1 dev eth0 proto ra",
    )
    .unwrap();
    let (report, code) = doctor_report(&lab, &[]);
    assert_eq!(code, 1, "{report:#}");
    let failed: Vec<(String, String)> = failing(&report)
        .iter()
        .map(|c| {
            (
                c["node"].as_str().unwrap().into(),
                c["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    for (node, name) in [
        ("node-1", "ipv6 forwarding"),
        ("node-1", "cni0 disable_ipv6"),
        ("node-2", "flannel-v6.1"),
        ("node-2", "eth0 accept_ra"),
    ] {
        assert!(
            failed.contains(&(node.into(), name.into())),
            "{node} {name} not failed: {report:#}"
        );
    }
    assert_eq!(failed.len(), 4, "{report:#}");
    let ra = check_on(&report, "node-2", "eth0 accept_ra");
    assert_eq!(
        ra["fix"],
        "sysctl -w net.ipv6.conf.eth0.accept_ra=2 (and in /etc/sysctl.d)"
    );
    assert!(
        ra["evidence"]
            .as_str()
            .unwrap()
            .contains("came from a router advertisement; with forwarding on, net.ipv6.conf.eth0.accept_ra = 1 ignores the next ones"),
        "{ra}"
    );
    // accept_ra 0: a network daemon (systemd-networkd, NetworkManager)
    // takes the advertisements and renews the route itself.
    sysctl(&node2, "net.ipv6.conf.eth0.accept_ra", "0").unwrap();
    let (report, _) = doctor_report(&lab, &[]);
    let ra = check_on(&report, "node-2", "eth0 accept_ra");
    assert_eq!(ra["ok"], true, "{ra}");
    assert!(
        ra["evidence"]
            .as_str()
            .unwrap()
            .ends_with("accept_ra = 0 leaves them to a network daemon, which renews it"),
        "{ra}"
    );
}

/// cni0's check names the gateway when the node's podCIDR or subnet.env
/// tells it, and otherwise says what cni0 holds and why it cannot judge
/// it (`podtrace doctor` with neither --nodes-file nor --host-root).
#[test]
fn the_cni0_check_names_the_gateway_or_says_why_it_cannot() {
    let lab = lab(Topology::FlannelVxlan);
    let gateway = lab.0.subnet_host(1, 1);
    let cni0 = |(report, code): (Value, i32)| -> String {
        assert_eq!(code, 0, "{report:#}");
        let check = report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["node"] == "node-1" && c["name"] == "cni0")
            .unwrap_or_else(|| panic!("no cni0 check on node-1: {report:#}"));
        check["evidence"].as_str().expect("evidence").to_string()
    };
    assert_eq!(
        cni0(doctor_report(&lab, &[])),
        format!("cni0 has the gateway {gateway}, MTU 1450 (FLANNEL_MTU 1450)")
    );
    let bare: Vec<String> = [
        "doctor",
        "-o",
        "json",
        "--pods-file",
        &lab.0.pods_file().display().to_string(),
        "--netns",
        &lab.0.node_netns(1),
    ]
    .map(String::from)
    .into();
    // Nothing to judge it by: not checked (never ✓), with what it holds.
    assert_eq!(
        cni0(run_doctor(&bare)),
        format!(
            "not checked: cni0 holds {gateway}, MTU 1450, but no subnet.env and no podCIDR \
             tell which gateway and MTU it needs"
        )
    );
}

#[test]
fn every_fault_of_the_catalogue_has_a_doctor_test() {
    // The tests below, by fault: adding a fault without one fails here.
    let tested = [
        "iptables-forward-drop",
        "legacy-forward-drop",
        "calico-profile-drop",
        "kube-firewall-mark-drop",
        "flannel-route-missing",
        "flannel-route-missing-no-default",
        "cni0-deleted",
        "flannel-fdb-missing",
        "ip-forward-off",
        "bridge-forwarding-off",
        "mtu-too-big",
        "pmtu-black-hole",
        "next-hop-no-arp",
        "stale-cni-conflist",
        "cni-plugin-missing",
        "cni-bin-masked",
        "subnet-env-missing",
        "calico-wrong-peer-ip",
        "calico-bird-stopped",
        "forward-policy-drop",
        "conntrack-full",
        "mtu-mismatch",
        // A NetworkPolicy that drops is the cluster's intent, not a node
        // fault: the doctor has no policy check (yet); tests/policy.rs
        // asserts the verdict names the policy.
        "calico-policy-deny",
        "calico-nft-policy-deny",
        "kube-router-policy-deny",
        // kube-network-policies' queue, fail-closed with no engine: the
        // doctor's "nfqueue readers" check names it, asserted where the
        // kernel has nft's queue (tests/policy.rs, in the VM matrix).
        "kube-network-policies-fail-closed",
        "conntrack-invalid",
    ];
    // A port range is no fault until it runs out: the trace tells it, in
    // tests/conntrack.rs.
    let told_by_the_trace = ["snat-exhausted"];
    for fault in Fault::all() {
        assert!(
            tested.contains(&fault.name()) || told_by_the_trace.contains(&fault.name()),
            "no doctor test for {}",
            fault.name()
        );
    }
}

/// One test per fault: `podtrace doctor` names it on its node.
macro_rules! names_the_fault {
    ($($test:ident: $fault:ident on $node:literal, $family:literal $check:literal says $evidence:expr $(, with $($extra:expr),+)?;)*) => {$(
        #[test]
        fn $test() {
            let extra: &[&str] = &[$($($extra),+)?];
            assert_names(Fault::$fault, $node, $family, $check, $evidence, extra);
        }
    )*};
}

names_the_fault! {
    iptables_forward_drop: IptablesForwardDrop on "node-1", "firewall" "DROP rules" says "-A FORWARD -s";
    // Beside the node's iptables-nft rules: named after its backend, never
    // `✓ no DROP rule`.
    legacy_forward_drop: LegacyForwardDrop on "node-1", "firewall" "DROP rules (iptables-legacy)"
        says "drops pod traffic (default/web-0) [iptables-legacy, beside the backend the node runs]";
    calico_profile_drop: CalicoProfileDrop on "node-2", "firewall" "Calico policy of cali" says "Drop if no profiles matched";
    kube_firewall_mark_drop: KubeFirewallMarkDrop on "node-1", "firewall" "KUBE-FIREWALL" says "KUBE-MARK-DROP";
    flannel_route_missing: FlannelRouteMissing on "node-1", "flannel" "route to node-2" says "no route to";
    flannel_route_missing_no_default: FlannelRouteMissingNoDefault on "node-1", "flannel" "route to node-2" says "no route to";
    cni0_deleted: Cni0Deleted on "node-1", "flannel" "cni0" says "cni0 does not exist";
    flannel_fdb_missing: FlannelFdbMissing on "node-1", "flannel" "VTEP of node-2" says "dst 192.0.2.12: MISSING";
    ip_forward_off: IpForwardOff on "node-1", "kernel" "ip_forward" says "= 0";
    bridge_forwarding_off: BridgeForwardingOff on "node-1", "kernel" "ip_forward"
        says "net.ipv4.ip_forward = 1, but forwarding is off on cni0 (net.ipv4.conf.cni0.forwarding = 0)";
    mtu_too_big: MtuTooBig on "node-1", "kernel" "MTU" says "MTU 1500 is above the pod MTU 1450";
    // The black hole's cause on the node: the pod MTU above the path's
    // (the rule that eats the ICMP error is the trace's to name).
    pmtu_black_hole: PmtuBlackHole on "node-1", "kernel" "MTU" says "MTU 1500 is above the pod MTU 1450";
    next_hop_no_arp: NextHopNoArp on "node-1", "flannel" "route to node-2" says xtask::faults::GONE_GATEWAY;
    stale_cni_conflist: StaleCniConflist on "node-2", "cni-config" "config the runtime uses"
        says "10-calico.conflist (calico) comes first and shadows /etc/cni/net.d/10-flannel.conflist";
    cni_plugin_missing: CniPluginMissing on "node-2", "plugins" "plugin flannel" says "/opt/cni/bin has no flannel binary";
    cni_bin_masked: CniBinMasked on "node-2", "plugins" "plugin directory" says "/opt/cni/bin is empty";
    subnet_env_missing: SubnetEnvMissing on "node-2", "flannel" "subnet.env" says "/run/flannel/subnet.env is missing";
    calico_wrong_peer_ip: CalicoWrongPeerIp on "node-1", "calico" "peer address"
        says "says 192.0.2.99/24, an address this node does not have";
    calico_bird_stopped: CalicoBirdStopped on "node-1", "bgp" "BGP sessions"
        says "fell back to /proc/net/tcp";
    forward_policy_drop: ForwardPolicyDrop on "node-1", "firewall" "FORWARD policy"
        says "FORWARD policy DROP and no rule accepts the pod CIDR";
    // nf_conntrack_max is read-only outside the initial netns: the table's
    // size is set for the check instead; the entries are real.
    conntrack_full: ConntrackFull on "node-1", "kernel" "conntrack table"
        says "of nf_conntrack_max 1 entries in use", with "--conntrack-max-for-testing", "1";
    conntrack_invalid: ConntrackInvalid on "node-1", "kernel" "conntrack TCP tracking"
        says "nf_conntrack_tcp_loose = 0, nf_conntrack_tcp_timeout_established = 1s";
    mtu_mismatch: MtuMismatch on "node-1", "kernel" "MTU"
        says "flannel.1 MTU 1450 does not fit the underlay eth0 MTU 1400 less 50 B of VXLAN";
}

fn scratch() -> PathBuf {
    scratch_dir("doctor")
}

/// A lab with `fault`, and a stub in which db-0 (node-2) has no IP and
/// kubelet's event says `message`; the stub's kubeconfig.
fn failing_sandbox(broken: Broken, message: &str) -> (LabGuard, Stub, String) {
    let lab = lab(broken.topology());
    let stub = Stub::start(&lab.0.pod_list(), &lab.0.node_list());
    let message = match broken.apply(&lab, &stub) {
        Some(said) => {
            assert!(said.contains(message), "{said}");
            said
        }
        None => message.to_string(),
    };
    stub.fail_sandbox("default", "db-0", &message);
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let kubeconfig = stub
        .kubeconfig(&scratch().join(n.to_string()), TOKEN)
        .display()
        .to_string();
    (lab, stub, kubeconfig)
}

/// What breaks a sandbox: a fault of the catalogue, Calico's CNI
/// kubeconfig on node-2 holding a token the API rejects (expired), or a
/// real plugin removed from node-2's plugin directory.
enum Broken {
    Fault(Fault),
    ExpiredCalicoToken,
    PluginRemoved(&'static str),
}

impl Broken {
    fn topology(&self) -> Topology {
        match self {
            Self::Fault(fault) => fault.topology(),
            Self::ExpiredCalicoToken => Topology::Calico,
            Self::PluginRemoved(_) => Topology::FlannelVxlan,
        }
    }

    /// Breaks the lab; where its plugins run for real, what the runtime
    /// now says when it makes a sandbox on node-2.
    fn apply(&self, lab: &LabGuard, stub: &Stub) -> Option<String> {
        match self {
            Self::Fault(fault) => fault.apply(&lab.0).expect("apply the fault"),
            Self::ExpiredCalicoToken => {
                let path = lab.0.host_root(2).join("etc/cni/net.d/calico-kubeconfig");
                stub.kubeconfig_at(&path, "an-expired-token");
            }
            Self::PluginRemoved(plugin) => {
                let new_sandbox = || cni_plugins::new_sandbox_error(&lab.0, 2).expect("a sandbox");
                assert_eq!(new_sandbox(), None, "a healthy node makes sandboxes");
                std::fs::remove_file(cni_plugins::bin_dir(&lab.0, 2).join(plugin)).unwrap();
                return Some(new_sandbox().expect("the sandbox fails"));
            }
        }
        None
    }
}

/// A sandbox failure on node-2 (db-0 Pending, no IP, kubelet's event),
/// through the stub: the doctor's verdict on db-0, and kubectl's view.
fn sandbox_failure(broken: Broken, message: &str) -> (Value, String) {
    let (lab, _stub, kubeconfig) = failing_sandbox(broken, message);
    let mut argv: Vec<String> = ["doctor", "db-0", "-o", "json", "--kubeconfig", &kubeconfig]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.extend(doctor_node_args(&lab));
    let (report, code) = run_doctor(&argv);
    assert_eq!(code, 1, "{report:#}");
    let check = failing_check(&report, "pod default/db-0");
    assert_eq!(check["node"], "node-2");
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .args(["--kubeconfig", &kubeconfig])
            .args(args)
            .output()
            .expect("kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let events = kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=db-0",
    ]);
    assert!(
        events.contains("FailedCreatePodSandBox") && events.contains(message),
        "{events}"
    );
    let node = kubectl(&["describe", "node", "node-2"]);
    assert!(node.contains("NetworkUnavailable"), "{node}");
    let described = kubectl(&["describe", "pod", "db-0"]);
    assert!(described.contains("FailedCreatePodSandBox"), "{described}");
    (check, described)
}

/// Events the API refuses to list (RBAC without them) cost the pod's
/// sandbox event, not the doctor's other checks: the pod is still
/// checked, with its node's evidence, and says why its events are
/// missing.
#[test]
fn a_pod_whose_events_cannot_be_read_is_still_checked_and_says_why() {
    let (lab, stub, kubeconfig) = failing_sandbox(
        Broken::Fault(Fault::SubnetEnvMissing),
        "loadFlannelSubnetEnv failed",
    );
    stub.forbid("list", "events");
    let mut argv = argv(
        &["doctor", "db-0", "-o", "json", "--kubeconfig", &kubeconfig],
        Vec::new(),
    );
    argv.extend(doctor_node_args(&lab));
    let (report, code) = run_doctor(&argv);
    assert_eq!(code, 1, "{report:#}");
    let check = failing_check(&report, "pod default/db-0");
    let evidence = check["evidence"].as_str().unwrap();
    assert!(evidence.contains("subnet.env"), "{evidence}");
    assert!(
        evidence.contains("its events could not be read")
            && evidence.contains("events is forbidden"),
        "{evidence}"
    );
}

#[test]
fn a_missing_subnet_env_sandbox_failure_is_confirmed_on_the_node() {
    let (check, _) = sandbox_failure(Broken::Fault(Fault::SubnetEnvMissing), "plugin type=\"flannel\" failed (add): loadFlannelSubnetEnv failed: open /run/flannel/subnet.env: no such file or directory");
    let evidence = check["evidence"].as_str().unwrap();
    assert!(
        evidence.contains("flannel's subnet.env is missing"),
        "{evidence}"
    );
    assert!(
        evidence.contains("on node-2, /run/flannel/subnet.env is missing"),
        "{evidence}"
    );
}

#[test]
fn a_plugin_not_found_sandbox_failure_is_confirmed_on_the_node() {
    let (check, _) = sandbox_failure(
        Broken::Fault(Fault::CniPluginMissing),
        "failed to find plugin \"flannel\" in path [/opt/cni/bin]",
    );
    let evidence = check["evidence"].as_str().unwrap();
    assert!(
        evidence.contains("CNI plugin flannel not found"),
        "{evidence}"
    );
    assert!(
        evidence.contains("on node-2, /opt/cni/bin has no flannel binary"),
        "{evidence}"
    );
}

/// The lab's pods are made by the real CNI plugins: with host-local
/// removed from node-2, a new sandbox there fails with the bridge
/// plugin's own error, carried as the runtime carries it; the doctor
/// classifies kubelet's event and confirms it on the node.
#[test]
fn a_real_plugins_error_for_a_removed_plugin_is_confirmed_on_the_node() {
    let (check, _) = sandbox_failure(
        Broken::PluginRemoved("host-local"),
        "plugin type=\"flannel\" failed (add): failed to delegate add: failed to find plugin \"host-local\" in path [/run/podtrace-lab/",
    );
    let evidence = check["evidence"].as_str().unwrap();
    assert!(
        evidence.contains("CNI plugin host-local not found"),
        "{evidence}"
    );
    assert!(
        evidence.contains("on node-2, /opt/cni/bin has no host-local binary"),
        "{evidence}"
    );
}

#[test]
fn an_unauthorized_cni_sandbox_failure_is_confirmed_on_the_node() {
    let (check, _) = sandbox_failure(Broken::ExpiredCalicoToken, "plugin type=\"calico\" failed (add): error getting ClusterInformation: connection is unauthorized: Unauthorized");
    let evidence = check["evidence"].as_str().unwrap();
    assert!(
        evidence.contains("credentials are rejected (Unauthorized)"),
        "{evidence}"
    );
    assert!(
        evidence.contains("on node-2, /etc/cni/net.d/calico-kubeconfig's token is rejected: the API at https://127.0.0.1:"),
        "{evidence}"
    );
    assert!(evidence.contains("answers 401"), "{evidence}");
    assert!(
        check["fix"].as_str().unwrap().contains("calico-kubeconfig"),
        "{check}"
    );
}

const PLUGIN_NOT_FOUND: &str = "failed to find plugin \"flannel\" in path [/opt/cni/bin]";

#[test]
fn a_trace_to_a_pod_without_an_ip_ends_with_the_doctors_finding() {
    let (lab, _stub, kubeconfig) =
        failing_sandbox(Broken::Fault(Fault::CniPluginMissing), PLUGIN_NOT_FOUND);
    let argv = argv(
        &["default/web-0", "default/db-0", "--kubeconfig", &kubeconfig],
        ["--count", "1", "--duration", "5s"]
            .map(String::from)
            .into_iter()
            .chain(doctor_node_args(&lab))
            .collect(),
    );
    let argv: Vec<&str> = argv.iter().map(|s| s.as_str()).collect();
    let done = run_podtrace(&argv);
    assert!(!done.status.success());
    assert_eq!(done.stderr.lines().count(), 1, "{}", done.stderr);
    let expected = r#"default/db-0 has no IP: its sandbox fails with "failed to find plugin \"flannel\" in path [/opt/cni/bin]" (CNI plugin flannel not found); on node-2, /opt/cni/bin has no flannel binary"#;
    assert!(done.stderr.contains(expected), "{}", done.stderr);
    assert!(tcx_programs(&lab.0.node_netns(1)).is_empty());
}

/// A trace of one packet from web-0 to db-0 on both nodes (with their
/// host roots), with the node list or without.
fn web_to_db(lab: &LabGuard, node_list: bool) -> Vec<String> {
    let files = [lab.0.pods_file(), lab.0.nodes_file()].map(|f| f.display().to_string());
    let mut argv = argv(
        &[
            "web-0",
            "db-0",
            "--count",
            "1",
            "--duration",
            "20s",
            "-o",
            "json",
            "--pods-file",
        ],
        vec![files[0].clone()],
    );
    if node_list {
        argv.extend(["--nodes-file".to_string(), files[1].clone()]);
    }
    argv.extend(doctor_node_args(lab));
    argv
}

#[test]
fn a_dropped_verdict_carries_the_doctors_finding() {
    let lab = lab(Topology::FlannelVxlan);
    Fault::IpForwardOff.apply(&lab.0).expect("apply the fault");
    let trace = Trace::start(&web_to_db(&lab, true));
    let _answered = lab.0.ping("web-0", lab.0.pod("db-0").ip, &[]);
    let done = trace.finish();
    let story = done.stories().into_iter().next().expect("a story");
    assert_eq!(story["verdict"]["outcome"], "dropped", "{story}");
    let doctor = story["verdict"]["doctor"]
        .as_array()
        .expect("a doctor field");
    assert!(
        doctor
            .iter()
            .any(|f| f["check"] == "ip_forward" && f["evidence"] == "net.ipv4.ip_forward = 0"),
        "{doctor:?}"
    );
}

#[test]
fn the_api_alone_names_network_unavailable_and_overlapping_pod_cidrs() {
    let lab = lab(Topology::FlannelVxlan);
    let mut nodes = lab.0.node_list();
    nodes["items"][1]["status"]["conditions"][0] = serde_json::json!({
        "type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated",
        "message": "Node created without a route"});
    let first = nodes["items"][0]["spec"]["podCIDR"].clone();
    nodes["items"][1]["spec"]["podCIDR"] = first.clone();
    nodes["items"][1]["spec"]["podCIDRs"] = serde_json::json!([first]);
    let dir = scratch().join("api-only");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("nodes.json");
    std::fs::write(&file, nodes.to_string()).unwrap();
    let (report, code) = run_doctor(&argv(
        &["doctor", "--api-only", "-o", "json", "--nodes-file"],
        vec![file.display().to_string()],
    ));
    assert_eq!(code, 1);
    let failed = failing(&report);
    assert!(
        failed.iter().any(|c| c["node"] == "node-2"
            && c["name"] == "NetworkUnavailable"
            && c["evidence"].as_str().unwrap().contains("NoRouteCreated")),
        "{report:#}"
    );
    assert!(
        failed.iter().any(|c| c["name"] == "podCIDR"
            && c["evidence"]
                .as_str()
                .unwrap()
                .contains("overlaps node-2's")),
        "{report:#}"
    );
}

/// Bad input to the doctor: one line naming it, exit 2, no report (an
/// unknown pod used to give a clean report of nothing, exit 0).
#[test]
fn the_doctor_refuses_an_unknown_pod_a_malformed_one_and_a_missing_host_root() {
    let lab = lab(Topology::FlannelVxlan);
    let pods = lab.0.pods_file().display().to_string();
    let node1 = lab.0.node_netns(1);
    let cases: [(Vec<&str>, &str); 3] = [
        (
            vec![
                "doctor",
                "default/nope-9",
                "--pods-file",
                &pods,
                "--netns",
                &node1,
            ],
            "pod default/nope-9 not found in the pods file",
        ),
        (
            vec!["doctor", "nope/x/y", "--pods-file", &pods, "--api-only"],
            "\"nope/x/y\" is not a pod",
        ),
        (
            vec![
                "doctor",
                "--netns",
                &node1,
                "--host-root",
                "/nonexistent-root",
            ],
            "--host-root /nonexistent-root: no such directory",
        ),
    ];
    for (argv, expected) in cases {
        let out = Command::new(PODTRACE)
            .args(&argv)
            .output()
            .expect("podtrace");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{argv:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{argv:?}: no report");
        assert_eq!(stderr.lines().count(), 1, "{argv:?}: one line: {stderr}");
        assert!(stderr.contains(expected), "{argv:?}: {stderr}");
    }
}

/// `podtrace doctor` on both nodes with their host roots, and without a
/// node list.
fn doctor_without_node_list(lab: &LabGuard) -> (Value, i32) {
    let mut argv: Vec<String> = ["doctor", "-o", "json", "--pods-file"]
        .map(String::from)
        .into();
    argv.push(lab.0.pods_file().display().to_string());
    argv.extend(doctor_node_args(lab));
    run_doctor(&argv)
}

/// The Calico lab, with real BIRD, and `fault`.
fn calico_with(fault: Fault) -> LabGuard {
    let lab = lab(Topology::Calico);
    fault.apply(&lab.0).expect("apply the fault");
    lab
}

/// Healthy: every session Established, by BIRD's word (the node named
/// by the pods' hostIP when there is no node list).
#[test]
fn bgp_sessions_are_read_from_bird_on_the_healthy_calico_lab() {
    let lab = lab(Topology::Calico);
    for (report, _) in [doctor_report(&lab, &[]), doctor_without_node_list(&lab)] {
        let on_1 = check_on(&report, "node-1", "BGP session Mesh_192_0_2_12");
        assert_eq!(on_1["ok"], true, "{on_1}");
        assert_eq!(
            on_1["evidence"],
            "BGP session Mesh_192_0_2_12 with 192.0.2.12 (node-2) is Established (BIRD, /var/run/calico/bird.ctl)"
        );
        let on_2 = check_on(&report, "node-2", "BGP session Mesh_192_0_2_11");
        assert_eq!(on_2["ok"], true, "{on_2}");
        assert!(
            !report.to_string().contains("listens on TCP 179"),
            "{report:#}"
        );
    }
}

/// The seed: node-1 announces 192.0.2.99. BIRD says it: node-2 peers with
/// 192.0.2.99 and waits; node-1's session cannot bind its source.
#[test]
fn a_wrong_peer_ip_is_named_from_birds_own_sessions() {
    let lab = calico_with(Fault::CalicoWrongPeerIp);
    let (listed, code) = doctor_report(&lab, &[]);
    assert_eq!(code, 1, "{listed:#}");
    let peer = failing_check(&listed, "BGP session Mesh_192_0_2_99");
    assert_eq!(peer["node"], "node-2", "{peer}");
    let evidence = peer["evidence"].as_str().unwrap();
    assert!(
        evidence.starts_with("BGP session Mesh_192_0_2_99 with 192.0.2.99 is Passive (BIRD, /var/run/calico/bird.ctl); 192.0.2.99 is what node-1 announces (projectcalico.org/IPv4Address), an address it does not have (its InternalIP is 192.0.2.11)"),
        "{evidence}"
    );
    let own = failing_check(&listed, "BGP session Mesh_192_0_2_12");
    assert_eq!(own["node"], "node-1", "{own}");
    assert!(
        own["evidence"].as_str().unwrap().starts_with(
            "BGP session Mesh_192_0_2_12 with 192.0.2.12 (node-2) is Active: Socket: "
        ),
        "{own}"
    );
    let router_id = failing_check(&listed, "BGP router id");
    assert!(
        router_id["evidence"].as_str().unwrap().starts_with(
            "BIRD's router id 192.0.2.99 is none of this node's addresses (192.0.2.11"
        ),
        "{router_id}"
    );
    // Without the API's view: the examined nodes' own addresses.
    let (bare, code) = doctor_without_node_list(&lab);
    assert_eq!(code, 1, "{bare:#}");
    let peer = failing_check(&bare, "BGP session Mesh_192_0_2_99");
    assert!(
        peer["evidence"].as_str().unwrap().contains(
            "is Passive (BIRD, /var/run/calico/bird.ctl); 192.0.2.99 is no node's address (the nodes' here: node-1 192.0.2.11"
        ),
        "{peer}"
    );
}

/// node-1's BIRD stopped: its socket is gone, so the doctor falls back to
/// /proc/net/tcp and says so; node-2's BIRD says the peer refuses.
#[test]
fn a_stopped_bird_is_named_and_the_fallback_said() {
    let lab = calico_with(Fault::CalicoBirdStopped);
    for (report, code) in [doctor_report(&lab, &[]), doctor_without_node_list(&lab)] {
        assert_eq!(code, 1, "{report:#}");
        let down = failing_check(&report, "BGP sessions");
        assert_eq!(down["node"], "node-1", "{down}");
        let evidence = down["evidence"].as_str().unwrap();
        assert!(
            // A BIRD that exits removes its socket.
            evidence.starts_with("no BIRD control socket under the host root (/var/run/calico/bird.ctl, /var/run/bird/bird.ctl, /run/bird/bird.ctl); ")
                && evidence.contains("; fell back to /proc/net/tcp: no ESTABLISHED connection on TCP 179 to 192.0.2.12 (node-2); nothing listens on TCP 179: BIRD is not running"),
            "{evidence}"
        );
        let peer = failing_check(&report, "BGP session Mesh_192_0_2_11");
        assert!(
            peer["evidence"]
                .as_str()
                .unwrap()
                .starts_with("BGP session Mesh_192_0_2_11 with 192.0.2.11 (node-1) is Active"),
            "{peer}"
        );
    }
}

/// The trace of web-0 → db-0 on the wrong-peer lab: no route on node-1 to
/// db-0's block, and the verdict names BGP, with and without a node list.
#[test]
fn a_no_route_verdict_names_the_bgp_session() {
    let lab = calico_with(Fault::CalicoWrongPeerIp);
    for listed in [true, false] {
        let trace = Trace::start(&web_to_db(&lab, listed));
        let _unanswered = lab.0.ping("web-0", lab.0.pod("db-0").ip, &[]);
        let done = trace.finish();
        let story = done.stories().into_iter().next().expect("a story");
        let verdict = &story["verdict"];
        assert_eq!(verdict["outcome"], "no_route", "{verdict}");
        let summary = verdict["summary"].as_str().unwrap();
        assert!(
            summary.starts_with("no route on node-1 to ")
                && summary.contains(
                    "; BGP session Mesh_192_0_2_12 with 192.0.2.12 (node-2) is Active: Socket: "
                ),
            "listed {listed}: {summary}"
        );
    }
}

/// A node root shaped as a distribution lays it out, beside the lab's:
/// `files` written as given (the runtime's config), Flannel's conflist in
/// `conf` and its plugins in `bins[0]` (all but `missing`), `links` made
/// (absolute, as the node names them), /var/run a link to /run, and
/// node-1's subnet.env.
fn shaped_root(
    lab: &LabGuard,
    shape: &str,
    files: &[(&str, &str)],
    (conf, bins): (&str, &[&str]),
    links: &[(&str, &str)],
    missing: &str,
) -> PathBuf {
    let root = scratch().join(shape);
    let _ = std::fs::remove_dir_all(&root);
    let under = |path: &str| root.join(path.trim_start_matches('/'));
    for (path, text) in files {
        std::fs::create_dir_all(under(path).parent().unwrap()).unwrap();
        std::fs::write(under(path), text).unwrap();
    }
    std::fs::create_dir_all(under(conf)).unwrap();
    std::fs::write(
        under(conf).join("10-flannel.conflist"),
        host_root::FLANNEL_CONFLIST,
    )
    .unwrap();
    for bin in bins {
        std::fs::create_dir_all(under(bin)).unwrap();
    }
    for plugin in host_root::FLANNEL_PLUGINS.iter().filter(|p| **p != missing) {
        host_root::plugin_stub(&under(bins[0]), plugin).unwrap();
    }
    for (link, target) in links.iter().chain(&[("/var/run", "/run")]) {
        std::fs::create_dir_all(under(link).parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(target, under(link)).unwrap();
    }
    std::fs::create_dir_all(under("/run/flannel")).unwrap();
    let env = lab.0.host_root(1).join("run/flannel/subnet.env");
    std::fs::copy(env, under("/run/flannel/subnet.env")).unwrap();
    root
}

/// `podtrace doctor` on node-1 with `root` as its host root.
fn doctor_on_node1(lab: &LabGuard, root: &std::path::Path) -> Value {
    let mut argv: Vec<String> = ["doctor", "-o", "json", "--pods-file"]
        .map(String::from)
        .into();
    argv.push(lab.0.pods_file().display().to_string());
    argv.extend([
        "--nodes-file".into(),
        lab.0.nodes_file().display().to_string(),
    ]);
    argv.extend(["--netns".into(), lab.0.node_netns(1)]);
    argv.extend(["--host-root".into(), root.display().to_string()]);
    run_doctor(&argv).0
}

/// The check named `name` on node-1 passes, with `evidence` in its words.
fn passes(report: &Value, name: &str, evidence: &str) {
    let check = check_on(report, "node-1", name);
    assert_eq!(check["ok"], true, "{check}");
    let said = check["evidence"].as_str().unwrap();
    assert!(said.contains(evidence), "{said}");
}

/// k3s keeps CNI under /var/lib/rancher, named by the config of its own
/// containerd, its plugins behind the absolute link data/current.
#[test]
fn a_k3s_node_is_read_where_its_containerd_keeps_cni() {
    let lab = lab(Topology::FlannelVxlan);
    let config = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml";
    let conf = "/var/lib/rancher/k3s/agent/etc/cni/net.d";
    let root = shaped_root(
        &lab,
        "k3s",
        &[(config, &format!("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/var/lib/rancher/k3s/data/current/bin\"\n  conf_dir = \"{conf}\"\n"))],
        (conf, &["/var/lib/rancher/k3s/data/9f2c41/bin"]),
        &[("/var/lib/rancher/k3s/data/current", "/var/lib/rancher/k3s/data/9f2c41")],
        "",
    );
    let report = doctor_on_node1(&lab, &root);
    passes(&report, "config the runtime uses", &format!("the runtime uses {conf}/10-flannel.conflist (plugins: flannel, portmap) (from {config})"));
    passes(
        &report,
        "plugin flannel",
        "/var/lib/rancher/k3s/data/current/bin/flannel is executable",
    );
}

/// GKE's containerd runs plugins from /home/kubernetes/bin: a plugin
/// missing there is named there, in kubelet's words.
#[test]
fn a_gke_node_is_read_in_home_kubernetes_bin() {
    let lab = lab(Topology::FlannelVxlan);
    let config = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/home/kubernetes/bin\"\n  conf_dir = \"/etc/cni/net.d\"\n";
    let root = shaped_root(
        &lab,
        "gke",
        &[("/etc/containerd/config.toml", config)],
        ("/etc/cni/net.d", &["/home/kubernetes/bin"]),
        &[],
        "flannel",
    );
    let report = doctor_on_node1(&lab, &root);
    passes(
        &report,
        "plugin bridge",
        "/home/kubernetes/bin/bridge is executable",
    );
    let missing = check_on(&report, "node-1", "plugin flannel");
    assert_eq!(missing["ok"], false, "{missing}");
    let said = missing["evidence"].as_str().unwrap();
    assert!(said.contains("/home/kubernetes/bin has no flannel binary (from /etc/containerd/config.toml): kubelet says failed to find plugin \"flannel\" in path [/home/kubernetes/bin]"), "{said}");
}

/// containerd 2.x lists its plugin directories (`bin_dirs`): a plugin is
/// found in any of them, in order.
#[test]
fn a_containerd_2_node_searches_every_bin_dir() {
    let lab = lab(Topology::FlannelVxlan);
    let config = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\n  bin_dirs = ['/opt/cni/bin', '/usr/libexec/cni']\n  conf_dir = '/etc/cni/net.d'\n";
    let root = shaped_root(
        &lab,
        "containerd2",
        &[("/etc/containerd/config.toml", config)],
        ("/etc/cni/net.d", &["/usr/libexec/cni", "/opt/cni/bin"]),
        &[],
        "",
    );
    let report = doctor_on_node1(&lab, &root);
    passes(
        &report,
        "plugin flannel",
        "/usr/libexec/cni/flannel is executable",
    );
}
