//! The fault catalogue against the real kernel: each fault from a real
//! troubleshooting write-up, and the verdict podtrace must give for it, in
//! JSON and in human output. The healthy lab gives no drop verdict.

#[allow(dead_code)]
mod support;

use serde_json::Value;
use support::*;
use xtask::{
    faults::Fault,
    lab::{in_netns, LabGuard, Topology},
};

/// The story of one ping web-0 → db-0 (or a big DF ping), traced on both
/// nodes, as JSON and as text.
fn trace_once(lab: &LabGuard, big: bool) -> (Value, String) {
    let argv = |output| {
        let mut argv = one_packet(&lab.0, "web-0", "db-0", output);
        argv.push("--nodes-file".into());
        argv.push(lab.0.nodes_file().display().to_string());
        argv
    };
    let ping = || {
        let (web, db) = (lab.0.pod("web-0"), lab.0.pod("db-0"));
        // Forget any path MTU learnt by the run before.
        xtask::lab::ip(&web.netns, "route flush cache").expect("flush");
        let big_df: &[&str] = if big {
            &["-s", "1472", "-M", "do"]
        } else {
            &[]
        };
        // Most faults make the ping fail; the story is what matters.
        let _answered = lab.0.ping("web-0", db.ip, big_df);
    };
    if big {
        // Told live in both outputs: `--count 1` ends the trace before
        // the ICMP error's own story, so a file written with it lacks the
        // error the live story was paired with (docs/limits.md).
        let json = Trace::start(&argv("json"));
        ping();
        let json = json.finish();
        let human = Trace::start(&argv("human"));
        ping();
        let human = human.finish();
        assert!(
            json.status.success() && human.status.success(),
            "{}{}",
            json.stderr,
            human.stderr
        );
        return (
            json.stories().into_iter().next().expect("a story"),
            human.stdout,
        );
    }
    let (done, human) = told_as_json_and_text(&argv("json"), ping);
    (done.stories().into_iter().next().expect("a story"), human)
}

/// podtrace's arguments for the JSON story of one packet `src` → `dst`
/// on both nodes.
fn one_story(lab: &LabGuard, src: &str, dst: &str, extra: &[&str]) -> Vec<String> {
    let first = [src, dst, "--count", "1", "--duration", "20s", "-o", "json"];
    let mut args = argv(&first, lab_args(&lab.0, &[1, 2]));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn faulty(fault: Fault) -> LabGuard {
    let lab = lab(fault.topology());
    fault.apply(&lab.0).expect("apply the fault");
    lab
}

fn assert_dropped(story: &Value, node: &str, reason: &str) {
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{verdict}");
    assert_eq!(verdict["node"], node, "{verdict}");
    assert_eq!(verdict["reason"], reason, "{verdict}");
}

#[test]
fn iptables_forward_drop_names_the_rule() {
    let lab = faulty(Fault::IptablesForwardDrop);
    let (story, human) = trace_once(&lab, false);
    assert_dropped(&story, "node-1", "NETFILTER_DROP");
    let rule = &story["verdict"]["netfilter"];
    assert_eq!(rule["table"], "filter");
    assert_eq!(rule["chain"], "FORWARD");
    assert_eq!(rule["hook"], "FORWARD");
    let expected = format!("-A FORWARD -s {}/32 -j DROP", lab.0.pod("web-0").ip);
    assert_eq!(rule["rule"], expected.as_str());
    assert!(
        human.contains(&format!(
            "by table filter chain FORWARD (hook FORWARD): {expected}"
        )),
        "{human}"
    );
}

/// Rule tracing marks a pair on the output hook only where the node sends
/// it itself (its own address is the source): a rule that drops what the
/// node sends is still named, and without rule tracing the hook is told
/// from the packet's source. That the node's route would pick another
/// source is said at start.
#[test]
fn a_drop_of_what_the_node_sends_itself_names_the_output_rule() {
    let lab = lab(Topology::FlannelVxlan);
    let node_ip = xtask::lab::Lab::node_ip(2);
    let web = lab.0.pod("web-0");
    let rule = format!("-A OUTPUT -d {}/32 -p icmp -j DROP", web.ip);
    let node = lab.0.node_netns(2);
    let added = in_netns(&node, "iptables")
        .args(rule.split(' ').collect::<Vec<_>>())
        .status()
        .expect("iptables");
    assert!(added.success(), "cannot add {rule}");
    let story_of_one_ping = |extra: &[&str]| {
        let trace = Trace::start(&one_story(&lab, &node_ip.to_string(), "web-0", extra));
        // From the node's own address (its route to the pod would pick
        // flannel.1's).
        let _refused = in_netns(&node, "ping")
            .args(["-c", "1", "-W", "1", "-I", &node_ip.to_string()])
            .arg(web.ip.to_string())
            .output();
        let done = trace.finish();
        let story = done.stories().into_iter().next().expect("a story");
        (story, done.stderr)
    };
    let (story, stderr) = story_of_one_ping(&[]);
    // Unbound, node-2 would have sent from flannel.1's address: said.
    let note = format!(
        "note: node-2 sends to {} from {} by default",
        web.ip,
        lab.0.node_subnet(2).network()
    );
    assert!(stderr.contains(&note), "{stderr}");
    assert_dropped(&story, "node-2", "NETFILTER_DROP");
    let named = &story["verdict"]["netfilter"];
    assert_eq!(named["chain"], "OUTPUT", "{story}");
    assert_eq!(named["rule"], rule.as_str(), "{story}");
    let (story, _) = story_of_one_ping(&["--no-ruleset-changes"]);
    assert_dropped(&story, "node-2", "NETFILTER_DROP");
    assert_eq!(
        story["verdict"]["netfilter_hook"], "OUTPUT or POSTROUTING",
        "{story}"
    );
}

#[test]
fn without_ruleset_changes_the_drop_names_the_hook_but_not_the_rule() {
    let lab = faulty(Fault::IptablesForwardDrop);
    let trace = Trace::start(&one_story(&lab, "web-0", "db-0", &["--no-ruleset-changes"]));
    let _answered = lab.0.ping("web-0", lab.0.pod("db-0").ip, &[]);
    let done = trace.finish();
    let story = &done.stories()[0];
    assert_dropped(story, "node-1", "NETFILTER_DROP");
    assert!(story["verdict"]["netfilter"].is_null());
    assert_eq!(story["verdict"]["netfilter_hook"], "FORWARD");
    let summary = story["verdict"]["summary"].as_str().unwrap();
    assert!(
        summary.ends_with("dropped by netfilter at hook FORWARD; the rule is not named: rule tracing is off (--no-ruleset-changes)"),
        "{summary}"
    );
}

/// The doctor's finding of the story's verdict whose check is `check`.
fn finding<'a>(story: &'a Value, check: &str) -> &'a Value {
    let findings = story["verdict"]["doctor"].as_array();
    let found = findings.and_then(|f| f.iter().find(|f| f["check"] == check));
    found.unwrap_or_else(|| panic!("no finding {check:?}: {story}"))
}

/// An iptables-legacy DROP beside the node's nft rules: rule tracing
/// cannot see it, and the verdict says so (never the rate limit), with
/// the doctor's candidate rule from iptables-legacy-save.
#[test]
fn a_legacy_drop_beside_nft_rules_is_said_and_its_rule_is_the_candidate() {
    let lab = faulty(Fault::LegacyForwardDrop);
    let (story, human) = trace_once(&lab, false);
    assert_dropped(&story, "node-1", "NETFILTER_DROP");
    assert!(story["verdict"]["netfilter"].is_null(), "{story}");
    let summary = story["verdict"]["summary"].as_str().unwrap();
    assert!(
        summary.ends_with("the rule is not named: no nft rule was traced dropping it, and this node also has 1 iptables-legacy rule(s), which rule tracing cannot see; the doctor's firewall findings name the legacy DROP rules that match the pair, if any"),
        "{summary}"
    );
    assert!(!summary.contains("packets/s"), "{summary}");
    let rule = format!("-A FORWARD -s {}/32 -j DROP", lab.0.pod("web-0").ip);
    let candidate = finding(&story, "DROP rules (iptables-legacy)");
    assert!(
        candidate["evidence"].as_str().unwrap().starts_with(&rule),
        "{candidate}"
    );
    assert!(human.contains("iptables-legacy"), "{human}");
}

/// A node whose kubelet made its KUBE-IPTABLES-HINT chain in legacy's
/// mangle table runs iptables-legacy, as kube-proxy's iptables-wrapper
/// decides it: its drop says why rule tracing cannot name it, and the
/// doctor names the legacy rule under the plain check.
#[test]
fn an_iptables_legacy_node_is_told_as_one() {
    let lab = faulty(Fault::LegacyForwardDrop);
    lab.0
        .run_iptables_legacy(1)
        .expect("node-1 on iptables-legacy");
    let (story, _) = trace_once(&lab, false);
    assert_dropped(&story, "node-1", "NETFILTER_DROP");
    let summary = story["verdict"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("the rule is not named: this node runs iptables-legacy (kubelet's KUBE-IPTABLES-HINT chain is in iptables-legacy's mangle table), whose rules nft's rule tracing cannot see"),
        "{summary}"
    );
    let candidate = finding(&story, "DROP rules");
    let rule = format!("-A FORWARD -s {}/32 -j DROP", lab.0.pod("web-0").ip);
    let evidence = candidate["evidence"].as_str().unwrap();
    assert!(
        evidence.starts_with(&rule) && evidence.ends_with("[iptables-legacy]"),
        "{evidence}"
    );
    assert!(
        candidate["fix"]
            .as_str()
            .unwrap()
            .contains(&format!("iptables-legacy {}", rule.replacen("-A", "-D", 1))),
        "{candidate}"
    );
}

#[test]
fn calico_profile_drop_names_the_rule_with_its_comments() {
    let lab = faulty(Fault::CalicoProfileDrop);
    let (story, human) = trace_once(&lab, false);
    assert_dropped(&story, "node-2", "NETFILTER_DROP");
    let rule = &story["verdict"]["netfilter"];
    let chain = format!("cali-tw-{}", lab.0.pod("db-0").host_iface);
    assert_eq!(rule["chain"], chain.as_str());
    assert_eq!(rule["hook"], "FORWARD");
    let expected = format!(
        r#"-A {chain} -m comment --comment "cali:s4tXYq2MQ2b8zM1b" -m comment --comment "Drop if no profiles matched" -j DROP"#
    );
    assert_eq!(rule["rule"], expected.as_str());
    assert!(human.contains("Drop if no profiles matched"), "{human}");
}

#[test]
fn kube_firewall_mark_drop_is_named_at_kube_firewall() {
    let lab = faulty(Fault::KubeFirewallMarkDrop);
    let (story, human) = trace_once(&lab, false);
    assert_dropped(&story, "node-1", "NETFILTER_DROP");
    let rule = &story["verdict"]["netfilter"];
    assert_eq!(rule["chain"], "KUBE-FIREWALL");
    assert_eq!(
        rule["rule"],
        r#"-A KUBE-FIREWALL -m comment --comment "kubernetes firewall for dropping marked packets" -m mark --mark 0x8000/0x8000 -j DROP"#
    );
    assert!(
        human.contains("chain KUBE-FIREWALL (hook FORWARD)"),
        "{human}"
    );
}

/// What the packet did after the missing route: dropped on the node
/// with this reason, or left it by another route.
enum Then<'a> {
    Dropped(&'a str),
    LeftNode,
}

fn assert_no_route(story: &Value, human: &str, lab: &LabGuard, then: Then) {
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "no_route", "{verdict}");
    let subnet = lab.0.node_subnet(2);
    let expected = format!(
        "{subnet} via {gateway} dev flannel.1 onlink (route -n: {} {gateway} {} UG flannel.1) (pod subnet of node-2)",
        subnet.network(),
        subnet.netmask(),
        gateway = subnet.network(),
    );
    assert_eq!(verdict["check"]["node"], "node-1");
    assert_eq!(verdict["check"]["expected"], expected.as_str());
    match then {
        Then::Dropped(reason) => assert_eq!(
            verdict["then"]["reason"],
            told_reason(reason).as_str(),
            "{verdict}"
        ),
        Then::LeftNode => assert_eq!(verdict["then"]["outcome"], "left_node", "{verdict}"),
    }
    assert!(
        human.contains(&format!(
            "verdict: no route on node-1 to {}",
            lab.0.pod("db-0").ip
        )),
        "{human}"
    );
    assert!(human.contains(&expected), "{human}");
}

#[test]
fn flannel_route_missing_is_no_route_even_with_a_default_route() {
    let lab = faulty(Fault::FlannelRouteMissing);
    let (story, human) = trace_once(&lab, false);
    // The packet left by the default route, unencapsulated. The underlay
    // gateway (which does not forward) drops it, in a namespace that is
    // neither a traced node's nor a traced pod's: on a real network a
    // router that podtrace cannot see, so the story ends where it left.
    assert_no_route(&story, &human, &lab, Then::LeftNode);
    assert_eq!(
        story["verdict"]["check"]["used"],
        "default via 192.0.2.1 dev eth0 (route -n: 0.0.0.0 192.0.2.1 0.0.0.0 UG eth0)"
    );
}

#[test]
fn flannel_route_missing_without_default_route_is_no_route() {
    let lab = faulty(Fault::FlannelRouteMissingNoDefault);
    let (story, human) = trace_once(&lab, false);
    assert_no_route(&story, &human, &lab, Then::Dropped("IP_INNOROUTES"));
    assert_eq!(story["verdict"]["check"]["used"], "no route at all");
}

#[test]
fn cni0_deleted_says_the_bridge_is_missing() {
    let lab = faulty(Fault::Cni0Deleted);
    let (story, human) = trace_once(&lab, false);
    let veth = lab.0.pod("web-0").host_iface;
    assert_dropped(&story, "node-1", "OTHERHOST");
    assert_eq!(story["verdict"]["iface"], veth.as_str());
    let hint = story["verdict"]["hint"].as_str().expect("a hint");
    assert!(
        hint.starts_with(&format!(
            "{veth} is not attached to any bridge (there is no cni0 on this node)"
        )),
        "{hint}"
    );
    assert!(human.contains("there is no cni0 on this node"), "{human}");
}

#[test]
fn flannel_fdb_missing_is_what_vxlan_said() {
    let lab = faulty(Fault::FlannelFdbMissing);
    let (story, human) = trace_once(&lab, false);
    assert_dropped(&story, "node-1", "NO_TX_TARGET");
    assert_eq!(story["verdict"]["iface"], "flannel.1");
    assert!(story["verdict"]["location"]
        .as_str()
        .unwrap()
        .starts_with("vxlan_xmit+"));
    assert!(
        human.contains("flannel.1 has no forwarding entry (FDB)"),
        "{human}"
    );
}

#[test]
fn ip_forward_off_is_reported_as_such() {
    let lab = faulty(Fault::IpForwardOff);
    let (story, human) = trace_once(&lab, false);
    assert_dropped(&story, "node-1", "IP_INADDRERRORS");
    // The kernel's own route lookup at the pod's veth says so.
    assert_eq!(story["hops"][0]["route"]["result"], "forwarding_disabled");
    assert!(
        human.contains(
            "IP forwarding is off on node-1 (net.ipv4.ip_forward = 0, and the kernel's route lookup said forwarding_disabled)"
        ),
        "{human}"
    );
    assert!(story["verdict"]["hint"]
        .as_str()
        .unwrap()
        .starts_with("IP forwarding is off on node-1"));
}

#[test]
fn forwarding_off_on_the_bridge_alone_names_its_sysctl_not_ip_forward() {
    let lab = faulty(Fault::BridgeForwardingOff);
    let (story, human) = trace_once(&lab, false);
    assert_dropped(&story, "node-1", "IP_INADDRERRORS");
    let hint = story["verdict"]["hint"].as_str().unwrap_or_default();
    assert!(
        hint.starts_with("IP forwarding is off for cni0 on node-1: the kernel's route lookup at cni0 ingress said forwarding_disabled"),
        "{hint}"
    );
    assert!(
        hint.contains("fix: sysctl -w net.ipv4.conf.cni0.forwarding=1"),
        "{hint}"
    );
    assert!(!human.contains("IP forwarding is off on node-1"), "{human}");
    // The doctor's check, beside the verdict, says the same from sysctls.
    let findings = story["verdict"]["doctor"].as_array();
    assert!(
        findings.is_some_and(|f| f.iter().any(|f| f["check"] == "ip_forward"
            && f["evidence"]
                .as_str()
                .is_some_and(|e| e.contains("net.ipv4.conf.cni0.forwarding = 0")))),
        "{story}"
    );
}

#[test]
fn mtu_too_big_is_dropped_with_the_mtu_named() {
    let lab = faulty(Fault::MtuTooBig);
    let (story, human) = trace_once(&lab, true);
    assert_dropped(&story, "node-1", "PKT_TOO_BIG");
    let hint = story["verdict"]["hint"].as_str().unwrap();
    assert!(
        hint.ends_with("leaves by flannel.1 with MTU 1450"),
        "{hint}"
    );
    assert!(
        human.contains("the packet is 1500 B with DF set"),
        "{human}"
    );
    // The kernel's "fragmentation needed" reached the sender.
    let pmtu = &story["verdict"]["pmtu"];
    assert_eq!(pmtu["error"], "reached_sender", "{pmtu}");
    assert_eq!(pmtu["mtu"], 1450, "{pmtu}");
    assert_eq!(pmtu["node"], "node-1", "{pmtu}");
    assert!(human.contains("(MTU 1450)"), "{human}");
    assert!(human.contains("reached 10."), "{human}");
}

/// web-0 pings db-0 with `ping_args` (its path MTU forgotten first)
/// while `--count` stories are traced in JSON: the run, and whether the
/// ping was answered.
fn big_pings(lab: &LabGuard, count: &str, ping_args: &[&str]) -> (Finished, bool) {
    let mut argv = argv(
        &[
            "web-0",
            "db-0",
            "--count",
            count,
            "--duration",
            "20s",
            "-o",
            "json",
        ],
        lab_args(&lab.0, &[1, 2]),
    );
    argv.extend([
        "--nodes-file".into(),
        lab.0.nodes_file().display().to_string(),
    ]);
    let trace = Trace::start(&argv);
    let (web, db) = (lab.0.pod("web-0"), lab.0.pod("db-0"));
    xtask::lab::ip(&web.netns, "route flush cache").expect("flush");
    let answered = lab.0.ping("web-0", db.ip, ping_args);
    (trace.finish(), answered)
}

/// After the error reached it, the sender lowered its size: ping's
/// default PMTU discovery (`want`) sends the first echo whole with DF,
/// and once the error told it the path MTU fragments the next at the
/// source, each piece within 1450 B. The summary says so.
#[test]
fn a_sender_told_the_path_mtu_lowers_its_next_packet() {
    let lab = faulty(Fault::MtuTooBig);
    let (done, _answered) = big_pings(&lab, "8", &["-s", "1472", "-c", "2", "-i", "0.5"]);
    let after = done.summary()["pmtu_after"].clone();
    let first = &after[0];
    assert_eq!(first["size"], 1500, "{after}");
    assert_eq!(first["mtu"], 1450, "{after}");
    assert_eq!(first["error_reached_sender"], true, "{after}");
    assert_eq!(first["sender"], "lowered", "{after}");
    let next_size = first["next_size"].as_u64().unwrap_or(u64::MAX);
    assert!(next_size <= 1450, "{after}");
    assert!(
        first["next_story"].as_u64() > first["story"].as_u64(),
        "{after}"
    );
}

/// A PMTU black hole: node-1's firewall drops the "fragmentation needed"
/// it sends web-0. The error is traced through the rules from the first
/// packet too big on (a sender retransmits what a black hole ate), so
/// the second ping's story names the rule that ate its error.
#[test]
fn a_pmtu_black_hole_names_the_rule_that_ate_the_icmp_error() {
    let lab = faulty(Fault::PmtuBlackHole);
    let big_df = ["-s", "1472", "-M", "do", "-c", "2"];
    let (done, answered) = big_pings(&lab, "4", &big_df);
    assert!(!answered);
    assert!(done.status.success(), "{}", done.stderr);
    let too_big: Vec<Value> = (done.stories().into_iter())
        .filter(|s| s["verdict"]["reason"] == "PKT_TOO_BIG")
        .collect();
    assert_eq!(too_big.len(), 2, "{}", done.stdout);
    for story in &too_big {
        let pmtu = &story["verdict"]["pmtu"];
        assert_eq!(pmtu["error"], "dropped", "{pmtu}");
        assert_eq!(pmtu["node"], "node-1", "{pmtu}");
        assert_eq!(pmtu["mtu"], 1450, "{pmtu}");
        let summary = story["verdict"]["summary"].as_str().unwrap();
        assert!(summary.contains("a PMTU black hole"), "{summary}");
    }
    let rule = too_big[1]["verdict"]["pmtu"]["rule"].as_str().unwrap_or("");
    assert!(
        rule.contains("-A OUTPUT -p icmp -m icmp --icmp-type 3/4 -j DROP"),
        "{}",
        too_big[1]["verdict"]
    );
    // Never told the path MTU, web-0 sent the second echo as big.
    let after = done.summary()["pmtu_after"].clone();
    assert_eq!(after[0]["error_reached_sender"], false, "{after}");
    assert_eq!(after[0]["sender"], "kept_too_big", "{after}");
    assert_eq!(after[0]["next_size"], 1500, "{after}");
}

#[test]
fn the_healthy_lab_has_no_drop_verdict() {
    for topology in [Topology::FlannelVxlan, Topology::Calico] {
        let lab = lab(topology);
        let (story, _) = trace_once(&lab, false);
        assert_eq!(story["verdict"]["outcome"], "delivered", "{story}");
        assert!(story["hops"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["direction"] != "drop"));
    }
}

#[test]
fn the_nft_table_is_gone_after_sigint_sigterm_and_sigkill() {
    let lab = lab(Topology::FlannelVxlan);
    let tables = || {
        let out = xtask::lab::in_netns(&lab.0.node_netns(1), "nft")
            .args(["list", "tables"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("podtrace_"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGKILL] {
        let trace = Trace::start(&lab_args_with(&lab, &["web-0", "db-0"]));
        // One table, named by the run's random id (never by PID).
        let ours = tables();
        assert_eq!(ours.len(), 1, "{ours:?}");
        assert!(ours[0].starts_with("table inet podtrace_r"), "{ours:?}");
        trace.signal(signal);
        trace.finish();
        if signal == libc::SIGKILL {
            // A killed podtrace cannot remove its table; the next start
            // sweeps it. (Any podtrace's start may: the other tests' runs
            // share /run/podtrace, so it may already be gone here.)
            let next = Trace::start(&lab_args_with(&lab, &["web-0", "db-0"]));
            let now = tables();
            assert_eq!(now.len(), 1, "only the new run's table: {now:?}");
            assert_ne!(now, ours, "the killed run's table went");
            next.signal(libc::SIGINT);
            next.finish();
        }
        assert!(tables().is_empty(), "after signal {signal}: {:?}", tables());
    }
    let no_changes = Trace::start(&lab_args_with(
        &lab,
        &["web-0", "db-0", "--no-ruleset-changes"],
    ));
    assert!(tables().is_empty(), "--no-ruleset-changes adds no table");
    no_changes.signal(libc::SIGINT);
    no_changes.finish();
}

fn lab_args_with(lab: &LabGuard, first: &[&str]) -> Vec<String> {
    argv(first, lab_args(&lab.0, &[1, 2]))
}

/// `--fail`, for a script: a story told dropped is exit status 3.
#[test]
fn with_fail_a_dropped_story_is_exit_status_3() {
    let lab = faulty(Fault::IptablesForwardDrop);
    let trace = Trace::start(&one_story(&lab, "web-0", "db-0", &["--fail"]));
    let _answered = lab.0.ping("web-0", lab.0.pod("db-0").ip, &[]);
    let done = trace.finish();
    let stories = done.stories();
    assert_eq!(
        stories[0]["verdict"]["outcome"], "dropped",
        "{}",
        done.stdout
    );
    assert_eq!(done.status.code(), Some(3), "{}", done.stderr);
}
