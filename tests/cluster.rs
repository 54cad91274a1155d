//! Cluster mode end to end: `kubectl podtrace` through real kubectl's
//! plugin dispatch, run as an unprivileged user with only a kubeconfig,
//! against the API stub that plays kubelet for the lab's nodes (agents are
//! the local podtrace binary), compared with node mode on the same lab.

#[allow(dead_code)]
mod capture_checks;
#[allow(dead_code)]
mod support;

use std::{
    collections::{BTreeMap, BTreeSet},
    os::unix::fs::{chown, symlink},
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use capture_checks::{assert_read_back, assert_written, tshark};
use serde_json::Value;
use support::*;
use xtask::{
    api_stub::{ApiRequest, Kubelet, Stub, LAB_IMAGE, TOKEN},
    faults::Fault,
    lab::{kube_proxy::ProxyMode, LabGuard, Topology},
    podtrace_run,
};

const NOBODY: u32 = 65534;

/// The stub, as kubelet of both lab nodes.
fn api_for(lab: &LabGuard) -> Stub {
    // Each stub its own directory: its agents' kubeconfig names its port.
    let state = scratch().join(&lab.0.prefix);
    std::fs::create_dir_all(&state).unwrap();
    let kubelet = Kubelet::for_lab(PODTRACE.as_ref(), &lab.0, &state);
    Stub::with_kubelet(&lab.0.pod_list(), &lab.0.node_list(), kubelet)
}

fn scratch() -> PathBuf {
    scratch_dir("cluster")
}

/// `kubectl podtrace ARGS` as nobody, with only a kubeconfig of its own
/// and `kubectl-podtrace` on its PATH; started once it traces.
fn kubectl_podtrace(stub: &Stub, args: &[&str]) -> podtrace_run::Started {
    let command = kubectl_as_nobody(stub, &[&["podtrace"], args].concat());
    podtrace_run::start(command, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `kubectl ARGS` as nobody, with only a kubeconfig of its own and
/// `kubectl-podtrace` on its PATH.
fn kubectl_as_nobody(stub: &Stub, args: &[&str]) -> Command {
    let home = scratch().join(format!("home-{}", rand()));
    let bin = home.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    symlink(PODTRACE, bin.join("kubectl-podtrace")).unwrap();
    let kubeconfig = stub.kubeconfig(&home, TOKEN);
    for path in [&home, &bin, &kubeconfig] {
        chown(path, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::fs::set_permissions(
        scratch(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut command = Command::new("setpriv");
    command
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "kubectl",
        ])
        .args(args)
        .env_clear()
        .env(
            "PATH",
            format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
        )
        .env("HOME", &home)
        .env("KUBECONFIG", &kubeconfig)
        .stdout(Stdio::piped());
    command
}

/// A command that must end by itself: its exit status and stderr, or a
/// failure if it is still running after `patience` (then killed).
fn ended_within(mut command: Command, patience: Duration) -> (std::process::ExitStatus, String) {
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let stderr = podtrace_run::lines_of(child.stderr.take().unwrap());
    let until = Instant::now() + patience;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let said: Vec<String> = stderr.try_iter().collect();
            panic!("still running after {} s: {said:?}", patience.as_secs());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let said: Vec<String> = stderr.iter().collect();
    (status, said.join("\n"))
}

/// `kubectl podtrace web-0 db-0` in JSON, for `count` stories at most
/// `duration`.
fn kubectl_podtrace_json(stub: &Stub, count: &str, duration: &str) -> podtrace_run::Started {
    let pair = ["default/web-0", "default/db-0"];
    let till = ["--count", count, "--duration", duration, "-o", "json"];
    kubectl_podtrace(stub, &[&pair[..], &till[..]].concat())
}

/// A number no other call in this process got.
fn rand() -> usize {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn finish(started: podtrace_run::Started) -> Finished {
    let mut child = started.child;
    let mut stdout = String::new();
    let mut out = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        std::io::Read::read_to_string(&mut out, &mut stdout).unwrap();
        stdout
    });
    let status = child.wait().unwrap();
    let mut stderr = started.banner;
    while let Ok(line) = started
        .stderr_lines
        .recv_timeout(Duration::from_millis(200))
    {
        stderr.push_str(&line);
        stderr.push('\n');
    }
    Finished {
        status,
        stdout: reader.join().unwrap(),
        stderr,
    }
}

/// Node mode on both lab nodes: the single-process measurement.
fn node_mode(lab: &LabGuard, count: &str) -> Vec<Value> {
    let trace = Trace::start(&argv(
        &[
            "default/web-0",
            "default/db-0",
            "-o",
            "json",
            "--count",
            count,
            "--duration",
            "20s",
        ],
        lab_args(&lab.0, &[1, 2]),
    ));
    assert!(ping(&lab.0, "web-0", "db-0"));
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = trace.finish();
    assert!(done.status.success(), "{}", done.stderr);
    done.ping_stories()
}

fn shape(story: &Value) -> Vec<(Value, Value, Value)> {
    story["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["node"].clone(),
                h["iface"].clone(),
                h["direction"].clone(),
            )
        })
        .collect()
}

fn agent_pods(stub: &Stub) -> Vec<Value> {
    stub.objects("pods")
        .into_iter()
        .filter(|p| p["metadata"]["namespace"] == "podtrace")
        .collect()
}

#[test]
fn kubectl_podtrace_tells_the_cross_node_stories_node_mode_tells() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    let started = kubectl_podtrace_json(&stub, "4", "30s");
    let mut running: Vec<String> = agent_pods(&stub)
        .iter()
        .map(|p| p["spec"]["nodeName"].as_str().unwrap().to_string())
        .collect();
    // In whichever order the API stored them.
    running.sort();
    assert_eq!(running, ["node-1", "node-2"], "one agent per node involved");
    for pod in agent_pods(&stub) {
        let spec = &pod["spec"];
        // Their own account, which cannot create pods; Linux nodes only;
        // sized, so that they are neither BestEffort nor unbounded.
        assert_eq!(spec["serviceAccountName"], "podtrace-agent");
        assert_eq!(spec["nodeSelector"]["kubernetes.io/os"], "linux");
        let resources = &spec["containers"][0]["resources"];
        assert!(resources["requests"]["memory"].is_string(), "{resources}");
        assert!(resources["limits"]["memory"].is_string(), "{resources}");
        assert_eq!(spec["containers"][0]["image"], LAB_IMAGE, "the DaemonSet's");
    }
    assert!(ping(&lab.0, "web-0", "db-0"));
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = finish(started);
    assert!(done.status.success(), "{}", done.stderr);
    let cluster = done.ping_stories();
    assert_eq!(cluster.len(), 4, "{}", done.stdout);
    let summary = done
        .json()
        .into_iter()
        .find(|v| v["type"] == "summary")
        .unwrap();
    let traced: Vec<&str> = summary["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(traced, ["node-1", "node-2"]);
    // The agents are gone from the API, and nothing stays attached.
    assert!(agent_pods(&stub).is_empty(), "{:?}", agent_pods(&stub));
    for node in [1, 2] {
        assert!(tcx_programs(&lab.0.node_netns(node)).is_empty());
    }
    let single = node_mode(&lab, "4");
    for (c, n) in cluster.iter().zip(&single) {
        assert_eq!(shape(c), shape(n), "the same hops as node mode");
        assert_eq!(c["verdict"]["outcome"], n["verdict"]["outcome"]);
        assert_eq!(c["verdict"]["path"], n["verdict"]["path"]);
    }
    assert_eq!(cluster[0]["verdict"]["outcome"], "delivered");
    assert!(
        cluster[0]["hops"][4]["clock_uncertainty_us"].is_number(),
        "{}",
        cluster[0]["hops"][4]
    );
}

/// ksniff's use: `kubectl podtrace … -w FILE` writes every node's packets
/// into one pcapng where kubectl runs, which tshark reads as node mode's
/// (a frame per hop on its node's interface, the story in its comments,
/// VXLAN inside and out from the agents' header bytes), and from which
/// `podtrace read` tells the live stories again, word for word.
#[test]
fn kubectl_podtrace_writes_every_nodes_packets_into_one_pcapng() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    let dir = scratch().join(format!("write-{}", rand()));
    std::fs::create_dir_all(&dir).unwrap();
    chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    let file = dir.join("trace.pcapng");
    let path = file.display().to_string();
    let pair = ["default/web-0", "default/db-0"];
    let till = ["--count", "2", "--duration", "30s", "-o", "json"];
    let started = kubectl_podtrace(&stub, &[&pair[..], &till[..], &["-w", &path]].concat());
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = finish(started);
    assert!(done.status.success(), "{}", done.stderr);
    assert!(done.stderr.contains("podtrace: wrote"), "{}", done.stderr);
    let frames = assert_written(&done, &file);
    // Both agents' packets (and a free inside a pod, named by the pod).
    let nodes: BTreeSet<&str> = frames
        .iter()
        .filter_map(|f| f[0].split('/').next())
        .collect();
    assert!(
        nodes.is_superset(&BTreeSet::from(["node-1", "node-2"])),
        "{frames:?}"
    );
    let (web, db) = (lab.0.pod("web-0").ip, lab.0.pod("db-0").ip);
    let inner = tshark(&file, "vxlan && icmp", &["ip.src", "ip.dst"]);
    assert!(
        inner
            .iter()
            .any(|f| f.iter().any(|a| a.contains(&web.to_string()))
                && f.iter().any(|a| a.contains(&db.to_string()))),
        "{inner:?}"
    );
    assert_read_back(&done, &file);
}

/// A dual-stack pair through kubectl: `-6` reaches every agent, and the
/// pair's IPv6 ping is one story across both nodes, in VXLAN over the
/// nodes' IPv6 underlay, with no IPv4 story beside it.
#[test]
fn kubectl_podtrace_dash_6_tells_the_ipv6_stories_across_the_nodes() {
    let lab = lab(Topology::FlannelVxlan);
    lab.0.dual_stack().expect("a dual-stack lab");
    let stub = api_for(&lab);
    let pair = ["default/web-0", "default/db-0", "-6"];
    let till = ["--count", "2", "--duration", "30s", "-o", "json"];
    let started = kubectl_podtrace(&stub, &[&pair[..], &till[..]].concat());
    let ipv6 = |pod: &str| lab.0.pod(pod).ipv6.expect("a dual-stack pod");
    let (web, db) = (ipv6("web-0"), ipv6("db-0"));
    assert!(lab.0.ping6("web-0", db, &[]), "the lab's IPv6 is broken");
    assert!(ping(&lab.0, "web-0", "db-0"), "the lab's IPv4 is broken");
    let done = finish(started);
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.ipv6_echo_alone(web, db);
    let request = stories
        .iter()
        .find(|s| s["src"] == web.to_string() && s["dst"] == db.to_string())
        .unwrap_or_else(|| panic!("no IPv6 request story: {}", done.stdout));
    let ifaces: Vec<(Value, Value)> = shape(request)
        .into_iter()
        .map(|(node, iface, _)| (node, iface))
        .filter(|(_, iface)| iface == "flannel-v6.1")
        .collect();
    assert_eq!(ifaces.len(), 2, "the tunnel on both nodes: {request}");
    assert_eq!(request["verdict"]["outcome"], "delivered", "{request}");
    assert_eq!(request["verdict"]["node"], "node-2");
    assert_eq!(
        request["hops"][3]["tunnel"]["outer"]["src"],
        xtask::lab::Lab::node_ipv6(1).to_string(),
        "inner and outer paired: {request}"
    );
}

/// A dual-stack Service through kubectl: `kubectl podtrace web-0 svc/db
/// -6` follows web-0's IPv6 connection to db's IPv6 ClusterIP through
/// kube-proxy's IPv6 DNAT (ip6tables) to a backend, which the API's IPv6
/// EndpointSlice names.
#[test]
fn kubectl_podtrace_dash_6_follows_an_ipv6_cluster_ip_to_its_backend() {
    let lab = lab(Topology::FlannelVxlan);
    lab.0.dual_stack().expect("a dual-stack lab");
    lab.0
        .install_services(ProxyMode::Iptables)
        .expect("install services");
    let stub = api_for(&lab);
    stub.add_services(&lab.0.service_list());
    let db = lab.0.service("db");
    let cluster_ip = db.cluster_ipv6.expect("a dual-stack Service");
    let args = ["default/web-0", "svc/db", "-6", "--count", "2"];
    let till = ["--duration", "30s", "-o", "json"];
    let started = kubectl_podtrace(&stub, &[&args[..], &till[..]].concat());
    let answer = lab.0.tcp_request("web-0", cluster_ip, 80);
    assert_eq!(answer.as_deref(), Ok("ok"), "the lab's IPv6 Service");
    let done = finish(started);
    assert!(done.status.success(), "{}", done.stderr);
    let stories = done.stories();
    let syn = (stories.iter())
        .find(|s| s["transport"]["flags"] == 0x02)
        .unwrap_or_else(|| panic!("no SYN story: {}", done.stdout));
    let web = lab.0.pod("web-0").ipv6.expect("a dual-stack pod");
    assert_eq!(syn["src"], web.to_string(), "{syn}");
    assert_eq!(syn["verdict"]["outcome"], "delivered", "{syn}");
    let hops = syn["hops"].as_array().expect("hops");
    let dnat = (hops.iter())
        .flat_map(|h| h["nat"].as_array().into_iter().flatten())
        .find(|n| n["kind"] == "DNAT")
        .unwrap_or_else(|| panic!("no DNAT step: {syn}"));
    assert_eq!(dnat["before"], format!("[{cluster_ip}]:80"), "{dnat}");
    let named = |b: &xtask::lab::LabPod| dnat["backend"] == format!("default/{}", b.name);
    assert!(db.backends.iter().any(named), "a backend by name: {dnat}");
}

/// flanneld never ran on node-2: no subnet.env in its root, no route to
/// node-1's pods. db-0's ping finds no route there; the verdict says what
/// node-2's doctor finds, its files read by the agent from the node's root
/// its pod mounts, as node mode says it with `--host-root`.
#[test]
fn a_no_route_verdict_carries_the_doctors_findings_from_the_nodes_root_as_in_node_mode() {
    let lab = lab(Topology::FlannelVxlan);
    Fault::SubnetEnvMissing
        .apply(&lab.0)
        .expect("apply the fault");
    let to_node1 = format!("route del {}", lab.0.node_subnet(1));
    xtask::lab::ip(&lab.0.node_netns(2), &to_node1).expect("delete the route");
    let pair = [
        "default/db-0",
        "default/web-0",
        "--count",
        "1",
        "-o",
        "json",
    ];
    let stub = api_for(&lab);
    let mut args = pair.to_vec();
    args.extend(["--duration", "30s"]);
    let started = kubectl_podtrace(&stub, &args);
    let _answered = ping(&lab.0, "db-0", "web-0");
    let done = finish(started);
    assert!(done.status.success(), "{}", done.stderr);
    let cluster = done.stories().into_iter().next().expect("a story");

    // Node mode with each node's root, in --netns order.
    let mut node_args = argv(&pair, lab_args(&lab.0, &[1, 2]));
    node_args.extend(["--duration".into(), "20s".into(), "--nodes-file".into()]);
    node_args.push(lab.0.nodes_file().display().to_string());
    for n in [1, 2] {
        node_args.extend([
            "--host-root".into(),
            lab.0.host_root(n).display().to_string(),
        ]);
    }
    let trace = Trace::start(&node_args);
    let _answered = ping(&lab.0, "db-0", "web-0");
    let traced = trace.finish();
    assert!(traced.status.success(), "{}", traced.stderr);
    let node = traced.stories().into_iter().next().expect("a story");

    for (mode, story) in [("cluster", &cluster), ("node", &node)] {
        let verdict = &story["verdict"];
        assert_eq!(verdict["outcome"], "no_route", "{mode} mode: {verdict}");
        assert_eq!(verdict["check"]["node"], "node-2", "{mode} mode: {verdict}");
        let doctor = verdict["doctor"].as_array();
        let subnet_env = doctor.into_iter().flatten().find(|f| {
            f["family"] == "flannel"
                && f["check"] == "subnet.env"
                && f["evidence"]
                    .as_str()
                    .is_some_and(|e| e.contains("/run/flannel/subnet.env is missing"))
        });
        assert!(subnet_env.is_some(), "{mode} mode: {verdict}");
    }
    assert_eq!(
        cluster["verdict"]["doctor"], node["verdict"]["doctor"],
        "the same findings as node mode"
    );
}

/// The wire step of the request (node-1 eth0 egress → node-2 eth0 ingress).
fn wire_step_us(story: &Value) -> f64 {
    let hops = story["hops"].as_array().unwrap();
    let at = |node: &str, dir: &str| {
        hops.iter()
            .find(|h| h["node"] == node && h["iface"] == "eth0" && h["direction"] == dir)
            .unwrap()["t_us"]
            .as_f64()
            .unwrap()
    };
    at("node-2", "ingress") - at("node-1", "egress")
}

#[test]
fn a_skew_of_seconds_on_one_agent_keeps_stories_in_order_and_steps_right() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    let started = kubectl_podtrace(
        &stub,
        &[
            "default/web-0",
            "default/db-0",
            "--count",
            "4",
            "--duration",
            "30s",
            "-o",
            "json",
            "--clock-skew-for-testing",
            "node-2=3s",
        ],
    );
    assert!(ping(&lab.0, "web-0", "db-0"));
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = finish(started);
    assert!(done.status.success(), "{}", done.stderr);
    let cluster = done.ping_stories();
    let single = node_mode(&lab, "4");
    for (c, n) in cluster.iter().zip(&single) {
        assert_eq!(shape(c), shape(n), "hops in node mode's order");
        let times: Vec<f64> = c["hops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["t_us"].as_f64().unwrap())
            .collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    }
    // Each run's least request step: one request delayed by the
    // scheduler (a 2-core CI machine) must not stand for the wire.
    let least = |s: &[Value]| -> Option<(f64, f64)> {
        s.iter()
            .filter(|s| s["transport"]["icmp_type"] == 8)
            .map(|s| (wire_step_us(s), step_uncertainty_us(s)))
            .min_by(|a, b| a.0.total_cmp(&b.0))
    };
    let (c, uncertainty) = least(&cluster).expect("a request told");
    let (n, _) = least(&single).expect("a request told");
    // Right within what the story says of its own clocks (half the
    // asymmetry of the crossings that placed them), and 100 µs for the
    // two runs' own wire times.
    assert!(
        (c - n).abs() <= 100.0 + uncertainty,
        "cross-node step {c} µs (± {uncertainty}) with the skew, {n} µs in one process"
    );
}

/// The clock uncertainty the story gives its request's wire step.
fn step_uncertainty_us(story: &Value) -> f64 {
    let hops = story["hops"].as_array().unwrap();
    hops.iter()
        .find(|h| h["node"] == "node-2" && h["iface"] == "eth0" && h["direction"] == "ingress")
        .and_then(|h| h["clock_uncertainty_us"].as_f64())
        .unwrap_or(0.0)
}

#[test]
fn a_sigkilled_front_end_leaves_no_agent_and_nothing_attached_within_60_s() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    let started = kubectl_podtrace(&stub, &["default/web-0", "default/db-0"]);
    let agents: Vec<String> = agent_pods(&stub)
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(agents.len(), 2);
    assert!(!tcx_programs(&lab.0.node_netns(1)).is_empty());
    let mut child = started.child;
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    while !agent_pods(&stub).is_empty() || agents_running(&agents) {
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "agents still there: {:?}",
            agent_pods(&stub)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for node in [1, 2] {
        assert!(
            tcx_programs(&lab.0.node_netns(node)).is_empty(),
            "node-{node} still has programs attached"
        );
    }
    eprintln!(
        "agents gone {:.1} s after the SIGKILL",
        killed.elapsed().as_secs_f64()
    );
}

/// Any of these agent pods' `podtrace agent` processes left (this test
/// process's kubelets run them; other tests' agents run alongside).
fn agents_running(pods: &[String]) -> bool {
    !agent_pids(pods).is_empty()
}

/// The `podtrace agent` processes of these agent pods (not a child one
/// has forked a moment before it execs: `nft monitor`, its pre_exec).
fn agent_pids(pods: &[String]) -> Vec<i32> {
    let processes = std::fs::read_dir("/proc").unwrap().flatten();
    let agents: Vec<i32> = processes
        .filter(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            // The pod's command, in its container (runc runs it).
            args.len() > 2
                && args[0] == b"podtrace"
                && args[1] == b"agent"
                && pods.iter().any(|pod| args.contains(&pod.as_bytes()))
                && is_descendant(&entry.path())
        })
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect();
    let forked_by_an_agent =
        |pid: &i32| parent_of(format!("/proc/{pid}")).is_some_and(|p| agents.contains(&(p as i32)));
    agents
        .iter()
        .copied()
        .filter(|pid| !forked_by_an_agent(pid))
        .collect()
}

/// The parent process of `/proc/<pid>`.
fn parent_of(dir: impl AsRef<std::path::Path>) -> Option<u32> {
    let stat = std::fs::read_to_string(dir.as_ref().join("stat")).unwrap_or_default();
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// node-2's agent is SIGKILLed mid-trace. Its loss is said at once, the
/// packets that went on to node-2 after it are incomplete (never
/// vanished), what it sent before is counted, and the exit code says the
/// trace was not whole.
#[test]
fn a_killed_agent_is_said_and_the_packets_sent_to_its_node_are_incomplete() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    let started = kubectl_podtrace_json(&stub, "4", "40s");
    assert!(ping(&lab.0, "web-0", "db-0"));
    let on_node_2: Vec<String> = agent_pods(&stub)
        .iter()
        .filter(|p| p["spec"]["nodeName"] == "node-2")
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let pids = agent_pids(&on_node_2);
    assert_eq!(pids.len(), 1, "node-2's agent process: {pids:?}");
    // Past the hold, so that the first ping's stories are whole.
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: a process this test's kubelet started.
    unsafe { libc::kill(pids[0], libc::SIGKILL) };
    let killed = Instant::now();
    let said = loop {
        match started.stderr_lines.recv_timeout(Duration::from_secs(1)) {
            Ok(line) if line.contains("node-2's agent was lost") => break true,
            _ if killed.elapsed() > Duration::from_secs(15) => break false,
            _ => {}
        }
    };
    assert!(said, "the loss was not said within 15 s");
    assert!(
        ping(&lab.0, "web-0", "db-0"),
        "the datapath does not need the agent"
    );
    let done = finish(started);
    assert!(
        !done.status.success(),
        "a lost agent must fail the run: {}",
        done.stderr
    );
    let stories = done.stories();
    assert_eq!(stories.len(), 4, "{}", done.stdout);
    // Before the kill, both ways delivered; after it, the reply too (node-1
    // sees it to web-0), but the request's way on node-2 went unseen.
    let (incomplete, delivered): (Vec<&Value>, Vec<&Value>) = stories
        .iter()
        .partition(|s| s["verdict"]["outcome"] == "incomplete");
    assert_eq!(
        (incomplete.len(), delivered.len()),
        (1, 3),
        "{}",
        done.stdout
    );
    assert!(delivered
        .iter()
        .all(|s| s["verdict"]["outcome"] == "delivered"));
    let request = incomplete[0];
    assert_eq!(request["transport"]["icmp_type"], 8, "{request}");
    let cause = request["verdict"]["cause"].as_str().unwrap();
    assert!(cause.contains("node-2's agent was lost"), "{cause}");
    let summary = done
        .json()
        .into_iter()
        .find(|v| v["type"] == "summary")
        .unwrap();
    let node_2 = &summary["nodes"][1];
    assert_eq!(node_2["node"], "node-2");
    assert!(node_2["sightings"].as_u64().unwrap() >= 4, "{node_2}");
    assert!(node_2["lost"].is_string(), "{node_2}");
}

/// A process of this test: this process is among its ancestors (its
/// kubelet's `runc run` is the container's parent).
fn is_descendant(proc_dir: &std::path::Path) -> bool {
    let mut at = proc_dir.to_path_buf();
    while let Some(ppid) = parent_of(&at) {
        if ppid == std::process::id() {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        at = std::path::PathBuf::from(format!("/proc/{ppid}"));
    }
    false
}

/// `cargo xtask bench`: sightings per second through agent → API log →
/// front-end, and the losses on the way, under a ping flood.
#[test]
#[ignore = "benchmark: run with cargo xtask bench"]
fn bench_agent_to_front_end() {
    const PINGS: u32 = 2000;
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    let started = kubectl_podtrace(
        &stub,
        &[
            "default/web-0",
            "default/db-0",
            "--duration",
            "25s",
            "-o",
            "json",
        ],
    );
    let db = lab.0.pod("db-0");
    let flood = Instant::now();
    let _ = xtask::lab::in_netns(&lab.0.pod("web-0").netns, "ping")
        .args(["-f", "-q", "-c", &PINGS.to_string(), &db.ip.to_string()])
        .stdout(std::process::Stdio::null())
        .status();
    let flooded = flood.elapsed();
    let done = finish(started);
    let summary = done
        .json()
        .into_iter()
        .find(|v| v["type"] == "summary")
        .expect("a summary");
    let sightings = summary["sightings"].as_u64().unwrap_or(0);
    println!(
        "cluster path: {PINGS} flood pings in {:.2} s; {} stories from {sightings} sightings through the agents' logs: {:.0} sightings/s while flooding",
        flooded.as_secs_f64(),
        summary["stories"],
        sightings as f64 / flooded.as_secs_f64()
    );
    for node in summary["nodes"].as_array().into_iter().flatten() {
        println!(
            "  {}: {} sightings; lost {} in the kernel, {} in the agent, {} on the way",
            node["node"],
            node["sightings"],
            node["lost_kernel"],
            node["lost_agent"],
            node["lost_transport"]
        );
    }
}

/// The API is lost mid-trace (the agents run on). The front-end says it
/// lost them, names the agent pods it could not delete and when they stop
/// by themselves, and fails; the agents stop within their lease's
/// staleness, detaching everything.
#[test]
fn an_api_lost_mid_trace_is_said_and_the_agents_stop_by_themselves() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    let started = kubectl_podtrace_json(&stub, "100", "90s");
    let agents: Vec<String> = agent_pods(&stub)
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(agents.len(), 2);
    assert!(ping(&lab.0, "web-0", "db-0"));
    std::thread::sleep(Duration::from_secs(1));
    stub.go_dark();
    let dark = Instant::now();
    let done = finish(started);
    eprintln!(
        "{}the front-end ended {:.1} s after the API was lost",
        done.stderr,
        dark.elapsed().as_secs_f64()
    );
    assert!(!done.status.success(), "{}", done.stderr);
    for said in [
        "node-1's agent was lost",
        "node-2's agent was lost",
        "cannot delete agent pod podtrace/",
        "kubectl delete -n podtrace lease/podtrace-",
    ] {
        assert!(
            done.stderr.contains(said),
            "not said: {said}\n{}",
            done.stderr
        );
    }
    assert_eq!(done.stories().len(), 2, "the ping before: {}", done.stdout);
    while agents_running(&agents) {
        assert!(
            dark.elapsed() < Duration::from_secs(60),
            "agents still running 60 s after the API was lost"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for node in [1, 2] {
        assert!(
            tcx_programs(&lab.0.node_netns(node)).is_empty(),
            "node-{node} still has programs attached"
        );
    }
}

/// `kubectl podtrace … --probe tcp:8080`: the source's agent sends it from
/// web-0's namespace once every agent traces; the SYN's and the SYN-ACK's
/// stories are told, then the probe's result, and the run ends by itself.
#[test]
fn kubectl_podtrace_probe_is_sent_by_the_sources_agent_and_answered() {
    let lab = lab(Topology::FlannelVxlan);
    lab.0
        .install_services(ProxyMode::Iptables)
        .expect("listeners");
    let stub = api_for(&lab);
    let started = kubectl_podtrace(
        &stub,
        &[
            "default/web-0",
            "default/db-0",
            "--probe",
            "tcp:8080",
            "-o",
            "json",
        ],
    );
    let done = finish(started);
    assert!(done.status.success(), "{}", done.stderr);
    let probes = done.probes();
    assert_eq!(probes.len(), 1, "{}", done.stdout);
    let result = probes[0]["result"].as_str().unwrap();
    assert!(result.starts_with("connected in"), "{result}");
    let stories = done.stories();
    assert!(stories.len() >= 2, "{}", done.stdout);
    for story in &stories[..2] {
        assert_eq!(story["verdict"]["outcome"], "delivered", "{story}");
    }
    assert_eq!(stories[0]["transport"]["flags"], 0x02, "the SYN first");
}

/// A namespace that enforces baseline (here the cluster's default, the
/// namespace created without a label) refuses agent pods: said in one
/// line, as PodSecurity with the API's words and the `kubectl label` that
/// fixes it, not as missing RBAC. Run as said, real kubectl's label lets
/// the trace run.
#[test]
fn a_pod_security_refusal_is_told_with_the_label_that_fixes_it() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    stub.set_pod_security_default("baseline");
    stub.add_namespace("podtrace", None);
    let pair = ["podtrace", "default/web-0", "default/db-0", "--count", "1"];
    let (status, stderr) = ended_within(kubectl_as_nobody(&stub, &pair), Duration::from_secs(60));
    assert!(!status.success());
    let fix = "kubectl label namespace podtrace pod-security.kubernetes.io/enforce=privileged --overwrite";
    let told: Vec<&str> = stderr.lines().filter(|l| l.contains(fix)).collect();
    assert_eq!(told.len(), 1, "{stderr}");
    assert!(
        told[0].contains("violates PodSecurity \"baseline:latest\": non-default capabilities (container \"agent\" must not include \"NET_ADMIN\""),
        "{stderr}"
    );
    assert!(!stderr.contains("RBAC"), "{stderr}");
    assert!(agent_pods(&stub).is_empty());
    let fix_args: Vec<&str> = fix.split(' ').skip(1).collect();
    let (labelled, said) =
        ended_within(kubectl_as_nobody(&stub, &fix_args), Duration::from_secs(30));
    assert!(labelled.success(), "{said}");
    let started = kubectl_podtrace_json(&stub, "1", "20s");
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = finish(started);
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(done.ping_stories()[0]["verdict"]["outcome"], "delivered");
}

/// An image the nodes cannot pull (named by the persisted setting,
/// PODTRACE_IMAGE) is told with the image and the kubelet's reason and
/// message as soon as the kubelet says them, long before the agents'
/// 120 s of patience; nothing is left behind.
#[test]
fn an_image_pull_failure_is_told_with_the_image_and_the_kubelets_message() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    let image = "registry.example/podtrace:missing";
    let mut command = kubectl_as_nobody(&stub, &["podtrace", "default/web-0", "default/db-0"]);
    command.env("PODTRACE_IMAGE", image);
    let (status, stderr) = ended_within(command, Duration::from_secs(60));
    assert!(!status.success());
    let told: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(&format!("cannot pull its image {image}: ")))
        .collect();
    assert_eq!(told.len(), 1, "{stderr}");
    assert!(
        told[0].contains(&format!("ErrImagePull: rpc error: code = NotFound desc = failed to pull and unpack image \"{image}\""))
            || told[0].contains(&format!("ImagePullBackOff: Back-off pulling image \"{image}\"")),
        "{stderr}"
    );
    assert!(agent_pods(&stub).is_empty(), "{:?}", agent_pods(&stub));
    assert!(stub.objects("leases").is_empty());
}

/// No --image, no PODTRACE_IMAGE and no podtrace DaemonSet: one line that
/// says how to get an image, before anything is created.
#[test]
fn without_an_image_it_says_how_to_get_one() {
    let lab = lab(Topology::FlannelVxlan);
    // An API without the lab's kubelet: no DaemonSet names an image.
    let stub = Stub::start(&lab.0.pod_list(), &lab.0.node_list());
    let pair = ["podtrace", "default/web-0", "default/db-0"];
    let (status, stderr) = ended_within(kubectl_as_nobody(&stub, &pair), Duration::from_secs(60));
    assert!(!status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no agent image: "), "{stderr}");
    assert!(stderr.contains("cargo xtask image"), "{stderr}");
    assert!(
        stderr.contains("--image REF, or set PODTRACE_IMAGE=REF"),
        "{stderr}"
    );
    assert!(stub.objects("leases").is_empty());
}

/// An agent OOM-killed mid-trace (its kubelet records the kill, then the
/// kernel's OOM killer's SIGKILL ends it) is said as such, with its
/// memory limit, not as a log that broke off.
#[test]
fn an_oom_killed_agent_is_told_as_such() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    let started = kubectl_podtrace_json(&stub, "4", "8s");
    let pod = agent_pods(&stub)
        .into_iter()
        .find(|p| p["spec"]["nodeName"] == "node-2")
        .expect("node-2's agent");
    let name = pod["metadata"]["name"].as_str().unwrap().to_string();
    let pids = agent_pids(std::slice::from_ref(&name));
    assert_eq!(pids.len(), 1, "node-2's agent process: {pids:?}");
    let oom = serde_json::json!({"containerStatuses": [{"name": "agent", "image": LAB_IMAGE, "imageID": "",
        "ready": false, "restartCount": 0,
        "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]});
    stub.merge_pod_status("podtrace", &name, &oom);
    // SAFETY: a process this test's kubelet started.
    unsafe { libc::kill(pids[0], libc::SIGKILL) };
    let done = finish(started);
    assert!(!done.status.success());
    let told = format!(
        "agent pod {name} was OOM-killed (exit code 137): the agent used more than its memory limit 256Mi"
    );
    let line = done
        .stderr
        .lines()
        .find(|l| l.contains("node-2's agent was lost"));
    assert!(
        line.is_some_and(|l| l.ends_with(&told) || l.contains(&format!("{told};"))),
        "{}",
        done.stderr
    );
}

/// Each client of the API in `requests`, by its User-Agent (podtrace
/// names an agent by its node), with its requests and bytes received.
fn load_by_client(requests: &[ApiRequest]) -> BTreeMap<String, (usize, u64)> {
    let mut by_client: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for request in requests {
        let agent = (request.user_agent.as_deref()).map(|ua| ua.split(" agent/").nth(1));
        let client = match agent {
            Some(Some(node)) => format!("agent {node}"),
            Some(None) => "front-end".to_string(),
            None => "(no user agent)".to_string(),
        };
        let entry = by_client.entry(client).or_default();
        entry.0 += 1;
        entry.1 += request.bytes;
    }
    by_client
}

/// On a cluster of 10,000 pods and 2,000 Services, `kubectl podtrace` of
/// two pods asks the API for what it traces: the front-end and each
/// agent list nothing cluster-wide without a selector, and each gets a
/// few KB in all (a selector that still matched much of the cluster would
/// show there), not the tens of MB a list of the cluster's pods is. The
/// requests and bytes of each are printed.
#[test]
fn a_pod_to_pod_trace_on_a_crowded_cluster_asks_for_what_it_traces() {
    let lab = lab(Topology::FlannelVxlan);
    let stub = api_for(&lab);
    stub.add_crowd(10_000, 2_000);
    stub.clear_requests();
    let started = kubectl_podtrace_json(&stub, "2", "30s");
    assert!(ping(&lab.0, "web-0", "db-0"));
    let done = finish(started);
    assert!(done.status.success(), "{}", done.stderr);
    assert_eq!(done.ping_stories().len(), 2, "{}", done.stdout);
    let requests = stub.requests();
    let cluster_wide: Vec<&ApiRequest> = (requests.iter())
        .filter(|r| r.verb == "list" && r.namespace.is_none())
        .filter(|r| r.field_selector.is_none() && r.label_selector.is_none())
        .collect();
    assert!(cluster_wide.is_empty(), "{cluster_wide:#?}");
    let by_client = load_by_client(&requests);
    eprintln!("API load of a pod→pod trace among 10,000 pods and 2,000 Services:");
    for (client, (count, bytes)) in &by_client {
        eprintln!("  {client}: {count} requests, {bytes} bytes");
    }
    let clients: Vec<&str> = by_client.keys().map(String::as_str).collect();
    assert_eq!(clients, ["agent node-1", "agent node-2", "front-end"]);
    // A list of the crowd's pods alone is some 40 MB; what a pair needs,
    // a few KB per object asked for.
    for (client, (_, bytes)) in &by_client {
        assert!(*bytes < 1 << 20, "{client} received {bytes} bytes");
    }
    // Each connects once, and passes that one handle down (resolution,
    // the doctor, the lease, the probes' gate, removal): a connection
    // starts with one /version request.
    let versions = load_by_client(
        &(requests.iter())
            .filter(|r| r.path == "/version")
            .cloned()
            .collect::<Vec<_>>(),
    );
    assert_eq!(versions.len(), by_client.len(), "{versions:?}");
    for (client, (connections, _)) in &versions {
        assert_eq!(*connections, 1, "{client} connected {connections} times");
    }
}

/// A ClusterIP given by address, on an API server older than the
/// Services' `spec.clusterIP` field selector (before 1.30): the Services
/// are looked through a page at a time, and the trace follows kube-proxy's
/// DNAT to a backend named by its EndpointSlice.
#[test]
fn a_cluster_ip_is_found_on_an_api_server_without_the_cluster_ip_selector() {
    let lab = lab(Topology::FlannelVxlan);
    lab.0
        .install_services(ProxyMode::Iptables)
        .expect("install services");
    let stub = api_for(&lab);
    stub.add_services(&lab.0.service_list());
    stub.add_crowd(0, 1_200);
    stub.refuse_field_selector("services", "spec.clusterIP");
    let db = lab.0.service("db");
    let front = format!("{}:80", db.cluster_ip);
    let args = ["default/web-0", &front, "--count", "2", "--duration", "30s"];
    let started = kubectl_podtrace(&stub, &[&args[..], &["-o", "json"]].concat());
    let answer = lab.0.tcp_request("web-0", db.cluster_ip, 80);
    assert_eq!(answer.as_deref(), Ok("ok"), "the lab's Service");
    let done = finish(started);
    assert!(done.status.success(), "{}", done.stderr);
    let syn = (done.stories().into_iter())
        .find(|s| s["transport"]["flags"] == 0x02)
        .unwrap_or_else(|| panic!("no SYN story: {}", done.stdout));
    let dnat = (syn["hops"].as_array().into_iter().flatten())
        .flat_map(|h| h["nat"].as_array().into_iter().flatten())
        .find(|n| n["kind"] == "DNAT")
        .cloned()
        .unwrap_or_else(|| panic!("no DNAT step: {syn}"));
    assert_eq!(dnat["before"], front, "{dnat}");
    let named = |b: &xtask::lab::LabPod| dnat["backend"] == format!("default/{}", b.name);
    assert!(db.backends.iter().any(named), "a backend by name: {dnat}");
    // Looked through page by page: 1,200 Services and more, 500 a page.
    let pages = (stub.requests().into_iter())
        .filter(|r| r.resource == "services" && r.verb == "list" && r.field_selector.is_none())
        .filter(|r| r.limit == Some(500))
        .count();
    assert!(pages >= 3, "{pages} pages");
}
