//! podtrace as the agent pod runs it, not as full root: the capability set
//! the agent's pod spec asks for (cluster/agent_pod.rs), with the memlock
//! limit a container runtime gives (systemd's 8 MiB). Each capability is
//! also taken away in turn: podtrace refuses in one line naming it and
//! what it is for, or traces and says what it does without.
//!
//! In the VM suite (PODTRACE_GUEST), the kernel also hides its addresses
//! as Debian and Ubuntu do (kernel.kptr_restrict=1,
//! kernel.perf_event_paranoid=3); on the host, sysctls are left alone.

#[allow(dead_code)]
mod support;

use std::process::Command;

use serde_json::Value;
use support::*;
use xtask::{faults::Fault, lab::LabGuard};

/// The agent pod's capabilities, as setpriv names them: the same as
/// `cluster::agent_pod::CAPABILITIES` (`the_agents_set_is_the_one_tested`).
const AGENT_CAPABILITIES: [&str; 6] = [
    "net_admin",
    "sys_admin",
    "sys_ptrace",
    "net_raw",
    "syslog",
    "sys_resource",
];

/// systemd's default LimitMEMLOCK, which containerd's pods inherit.
const RUNTIME_MEMLOCK: &str = "8388608";

/// The capabilities this test process may hand on (the machine's root may
/// lack some, as this one lacks CAP_SYS_RESOURCE).
fn bounding_set() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .expect("CapBnd");
    u64::from_str_radix(hex.trim(), 16).unwrap()
}

fn number(capability: &str) -> u32 {
    match capability {
        "net_admin" => 12,
        "net_raw" => 13,
        "sys_ptrace" => 19,
        "sys_admin" => 21,
        "sys_resource" => 24,
        "syslog" => 34,
        other => panic!("{other}"),
    }
}

/// podtrace's command line under `capabilities` and the runtime's memlock.
fn as_the_agent(capabilities: &[&str], args: &[String]) -> Command {
    let held = bounding_set();
    let set: Vec<String> = capabilities
        .iter()
        .filter(|c| held & (1 << number(c)) != 0)
        .map(|c| format!("+{c}"))
        .collect();
    let mut command = Command::new("prlimit");
    command
        .arg(format!("--memlock={RUNTIME_MEMLOCK}:{RUNTIME_MEMLOCK}"))
        .args(["setpriv", "--inh-caps=-all"])
        .arg(format!("--bounding-set=-all,{}", set.join(",")))
        .arg(PODTRACE)
        .args(args);
    command
}

/// In a VM, the kernel hides its addresses as distributions set it to.
fn distribution_sysctls() {
    if std::env::var_os("PODTRACE_GUEST").is_none() {
        return;
    }
    for (name, value) in [
        ("kernel/kptr_restrict", "1"),
        ("kernel/perf_event_paranoid", "3"),
    ] {
        std::fs::write(format!("/proc/sys/{name}"), value).expect(name);
    }
}

fn drop_lab() -> LabGuard {
    let lab = lab(Fault::IptablesForwardDrop.topology());
    Fault::IptablesForwardDrop
        .apply(&lab.0)
        .expect("apply the fault");
    lab
}

fn trace_args(lab: &LabGuard) -> Vec<String> {
    argv(
        &[
            "web-0",
            "db-0",
            "--count",
            "1",
            "--duration",
            "20s",
            "-o",
            "json",
        ],
        lab_args(&lab.0, &[1, 2]),
    )
}

/// One ping web-0 → db-0 traced under `capabilities`.
fn traced_as_the_agent(lab: &LabGuard, capabilities: &[&str]) -> Finished {
    let trace = Trace::start_command(as_the_agent(capabilities, &trace_args(lab)));
    let _ = lab.0.ping("web-0", lab.0.pod("db-0").ip, &[]);
    trace.finish()
}

fn assert_rule_named(story: &Value, lab: &LabGuard) {
    let verdict = &story["verdict"];
    assert_eq!(verdict["outcome"], "dropped", "{verdict}");
    let expected = format!("-A FORWARD -s {}/32 -j DROP", lab.0.pod("web-0").ip);
    assert_eq!(verdict["netfilter"]["rule"], expected.as_str(), "{verdict}");
}

#[test]
fn the_agents_capability_set_names_the_rule_and_where_the_kernel_dropped() {
    distribution_sysctls();
    let lab = drop_lab();
    let done = traced_as_the_agent(&lab, &AGENT_CAPABILITIES);
    assert!(done.status.success(), "{}", done.stderr);
    let story = done.stories().into_iter().next().expect("a story");
    assert_rule_named(&story, &lab);
    // CAP_SYSLOG shows the kernel's addresses: the location is named.
    let location = story["verdict"]["location"].as_str().unwrap_or_default();
    assert!(
        !location.starts_with("0x") && location.contains("+0x"),
        "{}",
        story["verdict"]
    );
}

#[test]
fn each_capability_taken_away_is_named_or_its_loss_said() {
    let lab = drop_lab();
    let held = bounding_set();
    for missing in AGENT_CAPABILITIES {
        if held & (1 << number(missing)) == 0 {
            eprintln!(
                "CAP_{} is not this machine's to take away: not tried",
                missing.to_uppercase()
            );
            continue;
        }
        let fewer: Vec<&str> = AGENT_CAPABILITIES
            .iter()
            .copied()
            .filter(|c| *c != missing)
            .collect();
        let name = format!("CAP_{}", missing.to_uppercase());
        match missing {
            // Required: refused in one line, nothing attached.
            "net_admin" | "sys_admin" => {
                let out = as_the_agent(&fewer, &trace_args(&lab))
                    .output()
                    .expect("run podtrace");
                let stderr = String::from_utf8_lossy(&out.stderr);
                assert!(!out.status.success(), "{name}: {stderr}");
                assert_eq!(stderr.lines().count(), 1, "{name}: {stderr}");
                assert!(stderr.contains(&format!("needs {name} to ")), "{stderr}");
                for node in [1, 2] {
                    assert!(tcx_programs(&lab.0.node_netns(node)).is_empty(), "{name}");
                }
            }
            // The rest: the drop is still told with its rule; what is
            // lost, if anything on this kernel, is said.
            _ => {
                let done = traced_as_the_agent(&lab, &fewer);
                assert!(done.status.success(), "{name}: {}", done.stderr);
                let story = done.stories().into_iter().next().expect("a story");
                assert_rule_named(&story, &lab);
                let location = story["verdict"]["location"].as_str().unwrap_or_default();
                if location.starts_with("0x") {
                    assert!(
                        done.stderr.contains("without CAP_SYSLOG"),
                        "{name}: a raw location is explained: {}",
                        done.stderr
                    );
                }
                if missing == "sys_ptrace" {
                    assert!(
                        done.stderr.contains("without CAP_SYS_PTRACE"),
                        "{}",
                        done.stderr
                    );
                }
                assert!(
                    !done.stderr.contains("map error"),
                    "{name}: {}",
                    done.stderr
                );
            }
        }
    }
}

#[test]
fn the_agents_set_is_the_one_tested() {
    let tested: Vec<String> = AGENT_CAPABILITIES
        .iter()
        .map(|c| c.to_uppercase())
        .collect();
    assert_eq!(tested, podtrace::cluster::agent_pod::CAPABILITIES);
}
