//! One real BIRD (Debian's bird2) per node of the Calico BGP lab, with
//! the config calico-node's confd writes, translated to BIRD 2: the
//! node's block blackholed, `protocol kernel` exporting (so its routes
//! are `proto bird`), and a full iBGP mesh in AS 64512. Its control
//! socket is where `calicoctl node status` looks on a calico-node host,
//! `/var/run/calico/bird.ctl`, which on the lab's host roots (as on
//! Debian's and Ubuntu's) is `/run/calico/bird.ctl` through the absolute
//! link `/var/run` → `/run`: the doctor must follow it inside the root.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{cmd, in_netns, run, IpipMode, Lab};

/// The AS of Calico's default node-to-node mesh.
const AS: u32 = 64512;
/// How long a healthy mesh may take to install its routes (BIRD waits
/// 2 s before it connects, and scans the kernel table every 2 s).
const CONVERGE: Duration = Duration::from_secs(30);

/// calico-node's BIRDs: `bird` for IPv4, and on a dual-stack node
/// `bird6` for IPv6 (`bird6.rs`), each with files of its own name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Daemon {
    Bird,
    Bird6,
}

impl Daemon {
    fn name(self) -> &'static str {
        match self {
            Self::Bird => "bird",
            Self::Bird6 => "bird6",
        }
    }
}

/// The daemon's files under the node's host root (`run/`, never through
/// its `var/run` link, which points at this machine's own /run from here).
pub(super) fn control_socket(lab: &Lab, node: u8, daemon: Daemon) -> PathBuf {
    (lab.host_root(node)).join(format!("run/calico/{}.ctl", daemon.name()))
}

fn pid_file(lab: &Lab, node: u8, daemon: Daemon) -> PathBuf {
    (lab.host_root(node)).join(format!("run/calico/{}.pid", daemon.name()))
}

pub(super) fn log_file(lab: &Lab, node: u8, daemon: Daemon) -> PathBuf {
    (lab.host_root(node)).join(format!("var/log/calico/{}/current", daemon.name()))
}

fn config_file(lab: &Lab, node: u8, daemon: Daemon) -> PathBuf {
    (lab.host_root(node)).join(format!("etc/calico/confd/config/{}.cfg", daemon.name()))
}

/// The address each node of `lab` announces
/// (`projectcalico.org/IPv4Address`), first node first: what confd
/// builds every node's config from.
pub fn announced(lab: &Lab) -> Vec<Ipv4Addr> {
    lab.nodes().map(Lab::node_ip).collect()
}

/// The peer's protocol name as confd writes it: `Mesh_192_0_2_12`, and
/// in bird6.cfg `Mesh_fd5a_0_2__12`.
pub fn mesh_protocol(peer: impl Into<IpAddr>) -> String {
    format!("Mesh_{}", peer.into().to_string().replace(['.', ':'], "_"))
}

/// `node`'s bird.cfg when the nodes announce `announced`. Its own
/// announced address is its router id and the source of its sessions.
pub fn config(lab: &Lab, node: u8, announced: &[Ipv4Addr]) -> String {
    let me = announced[usize::from(node - 1)];
    let peers = (announced.iter().enumerate())
        .filter(|(i, _)| *i != usize::from(node - 1))
        .map(|(i, peer)| (i as u8 + 1, IpAddr::V4(*peer)))
        .collect();
    render(&Plan {
        daemon: Daemon::Bird,
        log: log_file(lab, node, Daemon::Bird),
        router_id: me,
        me: me.into(),
        peers,
        block: lab.node_subnet(node).into(),
        pods: lab.pod_cidr.into(),
        tunnel: lab.topology.ipip_mode().map(|mode| Tunnel {
            device: "tunl0",
            // CrossSubnet: the nodes of this node's underlay subnet are
            // routed natively.
            native: (mode == IpipMode::CrossSubnet).then(|| Lab::node_underlay_subnet(node).into()),
        }),
    })
}

/// What one of calico-node's BIRDs is configured with: its family's
/// addresses (its sessions' source and its peers', by node) and blocks.
pub(super) struct Plan {
    pub daemon: Daemon,
    pub log: PathBuf,
    pub router_id: Ipv4Addr,
    pub me: IpAddr,
    pub peers: Vec<(u8, IpAddr)>,
    /// The node's IPAM block, and the pool's network.
    pub block: ipnet::IpNet,
    pub pods: ipnet::IpNet,
    /// The device remote blocks are routed over, onlink via the peer
    /// (Calico's IPIP mode: tunl0); None routes them via the peer directly.
    pub tunnel: Option<Tunnel>,
}

/// How Calico's IPIP mode routes the pool's blocks.
pub(super) struct Tunnel {
    pub device: &'static str,
    /// The pool's ipipMode CrossSubnet: peers on this subnet (the node's
    /// own underlay one) are routed natively, the rest through `device`.
    pub native: Option<ipnet::IpNet>,
}

/// The config confd writes for `plan` (bird.cfg, bird6.cfg), in BIRD 2's
/// syntax: a peer with a higher address is passive (it dials us), as in
/// confd.
pub(super) fn render(plan: &Plan) -> String {
    let me = plan.me;
    let mut text = common(plan);
    let family = if me.is_ipv6() { "v6" } else { "v4" };
    for (node, peer) in &plan.peers {
        // confd compares the addresses as strings.
        let passive = if peer.to_string() > me.to_string() {
            "\n  passive on; # Mesh is unidirectional, peer will connect to us."
        } else {
            ""
        };
        text.push_str(&format!(
            "\n# For peer /host/{}/ip_addr_{family}\nprotocol bgp {} from bgp_template {{\n  neighbor {peer} as {AS};{passive}\n}}\n",
            Lab::node_name(*node),
            mesh_protocol(*peer),
        ));
    }
    text
}

/// What BIRD writes into the kernel's table: never device routes (BIRD 1,
/// Calico's, does not export them; bird2 would add a second route to
/// the underlay), and in IPIP mode the pool's routes through the tunnel.
fn kernel_filter(plan: &Plan) -> String {
    // Calico's BIRD sets krt_tunnel for the pool's routes; BIRD 2 says
    // the same with the route's device, onlink, and the peer as gateway.
    let tunnel = match &plan.tunnel {
        Some(Tunnel { device, native }) => {
            let native = native.map_or(String::new(), |subnet| {
                format!("    if ( from ~ {subnet} ) then accept;\n")
            });
            format!(
                "  if ( source = RTS_BGP && net ~ {} ) then {{\n{native}    ifname = \"{device}\";\n    onlink = true;\n    gw = from;\n  }}\n",
                plan.pods
            )
        }
        None => String::new(),
    };
    format!(
        "# BIRD 1 (Calico's) never exports device routes to the kernel; bird2\n# would add a second route to the underlay.\nfilter calico_kernel_programming {{\n  if ( source = RTS_DEVICE ) then reject;\n{tunnel}  accept;\n}}\n"
    )
}

/// Everything of the config but the mesh's peers.
fn common(plan: &Plan) -> String {
    let Plan {
        daemon,
        router_id,
        me,
        block,
        pods,
        ..
    } = plan;
    let channel = if me.is_ipv6() { "ipv6" } else { "ipv4" };
    let log = plan.log.display();
    let kernel_filter = kernel_filter(plan);
    let daemon = daemon.name();
    format!(
        r#"# Calico's confd {daemon}.cfg, in BIRD 2's syntax.
router id {router_id};

# To a file, as calico-node's runit logs it: not to the terminal of
# whoever started the lab.
log "{log}" all;

{kernel_filter}
# The node's block goes to its peers, never its pods' host routes within it.
filter calico_export_to_bgp_peers {{
  if ( net = {block} ) then accept;
  if ( net ~ {block} ) then reject;
  if ( net ~ {pods} ) then accept;
  reject;
}}

protocol device {{
  scan time 2;
}}

protocol direct {{
  interface -"cali*", -"kube-ipvs*", "*";
  {channel};
}}

protocol kernel {{
  learn;
  persist;
  scan time 2;
  graceful restart;
  merge paths on;
  {channel} {{
    import all;
    export filter calico_kernel_programming;
  }};
}}

# The node's IPAM block: its pods get host routes from it, the rest dropped.
protocol static {{
  {channel};
  route {block} blackhole;
}}

template bgp bgp_template {{
  description "Connection to BGP peer";
  local as {AS};
  multihop;
  {channel} {{
    gateway recursive;
    import all;
    export filter calico_export_to_bgp_peers;
  }};
  source address {me};
  graceful restart;
  connect delay time 2;
  connect retry time 5;
  error wait time 5,30;
}}
"#
    )
}

/// Writes `node`'s config and starts its BIRD in the node's namespace.
pub fn start(lab: &Lab, node: u8, announced: &[Ipv4Addr]) -> Result<()> {
    start_daemon(lab, node, Daemon::Bird, &config(lab, node, announced))
}

/// Writes `daemon`'s `config` on `node` and starts it in the node's
/// namespace.
pub(super) fn start_daemon(lab: &Lab, node: u8, daemon: Daemon, config: &str) -> Result<()> {
    let path = config_file(lab, node, daemon);
    fs::create_dir_all(path.parent().context("a config dir")?)?;
    let socket = control_socket(lab, node, daemon);
    fs::create_dir_all(socket.parent().context("a run dir")?)?;
    fs::create_dir_all(log_file(lab, node, daemon).parent().context("a log dir")?)?;
    fs::write(&path, config)?;
    // bird forks into the background once its config is read.
    run(in_netns(&lab.node_netns(node), "bird")
        .arg("-c")
        .arg(&path)
        .arg("-s")
        .arg(socket)
        .arg("-P")
        .arg(pid_file(lab, node, daemon)))
    .with_context(|| format!("cannot start {} on {}", daemon.name(), Lab::node_name(node)))
}

/// Rewrites every node's config for `announced` and has each running
/// BIRD read it again (`birdc configure`), as confd does on a change.
pub fn reconfigure(lab: &Lab, announced: &[Ipv4Addr]) -> Result<()> {
    for node in lab.nodes() {
        fs::write(
            config_file(lab, node, Daemon::Bird),
            config(lab, node, announced),
        )?;
        let socket = control_socket(lab, node, Daemon::Bird);
        let out = std::process::Command::new("birdc")
            .arg("-s")
            .arg(&socket)
            .arg("configure")
            .output()
            .context("cannot run birdc")?;
        let said = String::from_utf8_lossy(&out.stdout);
        if !said.contains("Reconfigured") && !said.contains("Reconfiguration in progress") {
            bail!(
                "bird on {} did not take its new config: {}",
                Lab::node_name(node),
                said.trim()
            );
        }
    }
    Ok(())
}

/// Waits until `node`'s BIRD says `text` of its protocols (`birdc show
/// protocols all`): a session's error comes after its first attempt.
pub fn wait_said(lab: &Lab, node: u8, text: &str) -> Result<()> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let out = std::process::Command::new("birdc")
            .arg("-s")
            .arg(control_socket(lab, node, Daemon::Bird))
            .args(["show", "protocols", "all"])
            .output()
            .context("cannot run birdc")?;
        let said = String::from_utf8_lossy(&out.stdout);
        if said.contains(text) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "bird on {} never said {text:?} in {} s: {}",
                Lab::node_name(node),
                CONVERGE.as_secs(),
                said.trim()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The pid in `daemon`'s pidfile, when that process is still a bird.
fn running_pid(lab: &Lab, node: u8, daemon: Daemon) -> Option<i32> {
    let pid: i32 = fs::read_to_string(pid_file(lab, node, daemon))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // A pid reused by another program since is not ours to end.
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    (comm.trim() == "bird").then_some(pid)
}

/// Stops `node`'s BIRD (SIGTERM: it closes its sessions with a
/// notification, so its peers withdraw its routes at once) and waits for
/// it to exit. Its kernel routes stay (`persist`), as on a real node.
pub fn stop(lab: &Lab, node: u8) -> Result<()> {
    stop_daemon(lab, node, Daemon::Bird)
}

/// [`stop`] of either daemon.
pub(super) fn stop_daemon(lab: &Lab, node: u8, daemon: Daemon) -> Result<()> {
    let Some(pid) = running_pid(lab, node, daemon) else {
        return Ok(());
    };
    cmd::sh(&["kill", "-TERM", &pid.to_string()])?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() {
        if Instant::now() > deadline {
            let _ = cmd::sh(&["kill", "-KILL", &pid.to_string()]);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = fs::remove_file(pid_file(lab, node, daemon));
    Ok(())
}

/// Stops every node's BIRDs (bird6 too), whatever the lab's topology
/// (`lab down` knows only the prefix).
pub fn stop_all(lab: &Lab) {
    for (node, daemon) in lab
        .nodes()
        .flat_map(|n| [(n, Daemon::Bird), (n, Daemon::Bird6)])
    {
        if let Err(e) = stop_daemon(lab, node, daemon) {
            eprintln!(
                "lab {}: cannot stop {} on node-{node}: {e:#}",
                lab.prefix,
                daemon.name()
            );
        }
    }
}

/// Whether `ns` has a `proto bird` route to `block` (of either family).
fn has_bird_route(ns: &str, block: ipnet::IpNet) -> bool {
    // `ip route` lists IPv4 unless told the family.
    let family = match block {
        ipnet::IpNet::V4(_) => "-4",
        ipnet::IpNet::V6(_) => "-6",
    };
    std::process::Command::new("ip")
        .args(["-n", ns, family, "route", "show", "exact"])
        .arg(block.to_string())
        .args(["proto", "bird"])
        .output()
        .is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).trim().is_empty())
}

/// Waits until each node's routes to the other nodes' blocks are as
/// `expected(node, remote)` says (present or gone): BIRD learns and
/// withdraws them over BGP, in its own time.
pub fn wait_routes(lab: &Lab, expected: impl Fn(u8, u8) -> bool) -> Result<()> {
    wait_blocks(lab, Daemon::Bird, |n| lab.node_subnet(n).into(), expected)
}

/// [`wait_routes`] of `daemon`, whose blocks are `block(node)`.
pub(super) fn wait_blocks(
    lab: &Lab,
    daemon: Daemon,
    block: impl Fn(u8) -> ipnet::IpNet,
    expected: impl Fn(u8, u8) -> bool,
) -> Result<()> {
    let deadline = Instant::now() + CONVERGE;
    loop {
        let wrong: Vec<String> = lab
            .nodes()
            .flat_map(|node| lab.remotes(node).map(move |remote| (node, remote)))
            .filter(|(node, remote)| {
                has_bird_route(&lab.node_netns(*node), block(*remote)) != expected(*node, *remote)
            })
            .map(|(node, remote)| {
                let state = if expected(node, remote) {
                    "no"
                } else {
                    "still a"
                };
                format!(
                    "{} has {state} route to {} ({}'s block)",
                    Lab::node_name(node),
                    block(remote),
                    Lab::node_name(remote)
                )
            })
            .collect();
        if wrong.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} did not converge in {} s: {} (birdc -s {} show protocols all)",
                daemon.name(),
                CONVERGE.as_secs(),
                wrong.join("; "),
                control_socket(lab, 1, daemon).display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::Topology;

    #[test]
    fn the_config_has_calicos_shape() {
        let lab = Lab::new("t", Topology::Calico, None).unwrap();
        let node1 = config(&lab, 1, &announced(&lab));
        for line in [
            "router id 192.0.2.11;",
            "route 10.245.1.0/24 blackhole;",
            "local as 64512;",
            "source address 192.0.2.11;",
            "protocol bgp Mesh_192_0_2_12 from bgp_template {\n  neighbor 192.0.2.12 as 64512;\n  passive on;",
        ] {
            assert!(node1.contains(line), "{line}\n{node1}");
        }
        let node2 = config(&lab, 2, &announced(&lab));
        assert!(node2.contains("protocol bgp Mesh_192_0_2_11 from bgp_template {\n  neighbor 192.0.2.11 as 64512;\n}"), "{node2}");
        assert!(!node1.contains("tunl0"), "{node1}");
        let ipip = Lab::new("t", Topology::CalicoIpip, None).unwrap();
        let node1 = config(&ipip, 1, &announced(&ipip));
        let tunnel = "  if ( source = RTS_BGP && net ~ 10.248.0.0/16 ) then {\n    ifname = \"tunl0\";\n    onlink = true;\n    gw = from;\n  }\n  accept;";
        assert!(node1.contains(tunnel), "{node1}");
        // CrossSubnet: node-3 (another rack) through tunl0, the rack's own
        // nodes natively.
        let cross = Lab::new("t", Topology::CalicoIpipCrossSubnet, None).unwrap();
        let node1 = config(&cross, 1, &announced(&cross));
        let native = "  if ( source = RTS_BGP && net ~ 10.248.0.0/16 ) then {\n    if ( from ~ 192.0.2.0/24 ) then accept;\n    ifname = \"tunl0\";";
        assert!(node1.contains(native), "{node1}");
        assert!(
            node1.contains("neighbor 198.51.100.13 as 64512;"),
            "{node1}"
        );
        let wrong = config(&lab, 2, &["192.0.2.99".parse().unwrap(), Lab::node_ip(2)]);
        assert!(
            wrong.contains("neighbor 192.0.2.99 as 64512;\n  passive on;"),
            "{wrong}"
        );
    }
}
