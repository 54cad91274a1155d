//! The pods' network made by the real CNI plugins (Debian's
//! `containernetworking-plugins`), called as a container runtime calls
//! them: CNI_COMMAND, the sandbox's netns, CNI_PATH, and the network
//! config on stdin. A Flannel pod gets what the flannel plugin delegates
//! (`bridge` with `host-local`), then the conflist's `portmap`; every pod
//! gets `loopback` for lo. Each plugin runs inside the node's namespace
//! and finds its helpers in the node's host root (`opt/cni/bin`), and
//! host-local keeps its reservations under the host root's
//! `var/lib/cni/networks`, so a node's plugin directory and IPAM state
//! are real, and a plugin missing from the node fails the pod as it
//! would fail a sandbox.

use std::{
    fs,
    io::Write,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{anyhow, bail, Context, Result};
use ipnet::Ipv4Net;
use serde_json::{json, Value};

use super::{cmd, host_root, in_netns, Lab, LabPod};

/// Where Debian installs the reference plugins.
pub const SYSTEM_DIR: &str = "/usr/lib/cni";

/// The reference plugins a node's `opt/cni/bin` holds for real (the
/// CNI's own plugin, flannel or calico, is not packaged: a stub stands in).
pub const REAL: &[&str] = &["bridge", "host-local", "loopback", "portmap"];

/// The network name in Flannel's conflist, which the delegate keeps.
const NETWORK: &str = "cbr0";
const CNI_VERSION: &str = "0.3.1";

/// Copies the reference plugins into a node's plugin directory (a few MB
/// each), files of the node's own. Not symlinks: an absolute link is the
/// node's `/usr/lib/cni`, resolved inside its root, which the lab's host
/// roots do not have. Not hard links: a fault that changed one would
/// change the system's.
pub fn install(bin: &Path) -> Result<()> {
    for plugin in REAL {
        let system = Path::new(SYSTEM_DIR).join(plugin);
        if !system.exists() {
            bail!(
                "{} is missing: the lab's pods are made by Debian's CNI plugins (cargo xtask setup installs containernetworking-plugins)",
                system.display()
            );
        }
        let file = bin.join(plugin);
        let _ = fs::remove_file(&file);
        fs::copy(&system, &file)
            .with_context(|| format!("cannot copy {} to {}", system.display(), file.display()))?;
    }
    Ok(())
}

/// The node's plugin directory, the runtime's CNI_PATH.
pub fn bin_dir(lab: &Lab, node: u8) -> PathBuf {
    lab.host_root(node).join(host_root::PLUGIN_DIR)
}

/// Where host-local keeps the node's reservations (one directory per
/// network, one file per address, named by the address).
pub fn ipam_dir(lab: &Lab, node: u8) -> PathBuf {
    lab.host_root(node).join("var/lib/cni/networks")
}

/// flanneld's file on a node, which the flannel plugin reads at each ADD.
pub fn subnet_env(lab: &Lab, node: u8) -> PathBuf {
    lab.host_root(node).join("run/flannel/subnet.env")
}

/// What the flannel plugin hands to `bridge` on a node, read from the
/// node's subnet.env as the plugin reads it (failing in its words).
pub fn flannel_delegate(lab: &Lab, node: u8) -> Result<Value> {
    let path = subnet_env(lab, node);
    let env = fs::read_to_string(&path).map_err(|e| {
        let why = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
            _ => e.to_string(),
        };
        anyhow!(
            "loadFlannelSubnetEnv failed: open {}: {why}",
            path.display()
        )
    })?;
    delegate_from_subnet_env(&env, &ipam_dir(lab, node))
}

/// Flannel's conflist delegate (hairpin, default gateway) completed from
/// subnet.env: the node's subnet for host-local (its network, as the
/// plugin parses FLANNEL_SUBNET), the cluster CIDR as a route, the MTU,
/// and masquerade by the bridge only when flanneld does not masquerade.
fn delegate_from_subnet_env(env: &str, ipam_dir: &Path) -> Result<Value> {
    let field = |key: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .with_context(|| format!("subnet.env has no {key}"))
    };
    let network: Ipv4Net = field("FLANNEL_NETWORK")?.parse()?;
    let subnet: Ipv4Net = field("FLANNEL_SUBNET")?.parse()?;
    let mtu: u16 = field("FLANNEL_MTU")?.parse()?;
    let flanneld_masquerades = field("FLANNEL_IPMASQ")? == "true";
    Ok(json!({
        "cniVersion": CNI_VERSION,
        "name": NETWORK,
        "type": "bridge",
        "hairpinMode": true,
        "isDefaultGateway": true,
        "isGateway": true,
        "ipMasq": !flanneld_masquerades,
        "mtu": mtu,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": subnet.trunc().to_string()}]],
            "routes": [{"dst": network.to_string()}],
            // A runtime's host-local writes /var/lib/cni/networks; the
            // lab's node keeps its own, under its host root.
            "dataDir": ipam_dir,
        },
    }))
}

/// What the bridge plugin made for a pod: its address, and the host end
/// of its veth as the plugin named it.
#[derive(Debug, PartialEq, Eq)]
pub struct Attached {
    pub address: Ipv4Net,
    pub host_iface: String,
}

/// Reads a bridge ADD result (CNI 0.3.1): the pod's IPv4 address, and the
/// interface outside the sandbox that is not the bridge.
pub fn attached(result: &Value) -> Result<Attached> {
    let address = result["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|ip| ip["address"].as_str()?.parse::<Ipv4Net>().ok())
        .with_context(|| format!("the bridge plugin gave no IPv4 address: {result}"))?;
    let host_iface = result["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["sandbox"].as_str().unwrap_or_default().is_empty())
        .filter_map(|i| i["name"].as_str())
        .find(|name| *name != "cni0")
        .with_context(|| format!("the bridge plugin named no host veth: {result}"))?
        .to_string();
    Ok(Attached {
        address,
        host_iface,
    })
}

/// One plugin call for a pod's sandbox, made as a runtime makes it:
/// in the node's namespace, with the node's plugin directory as CNI_PATH.
struct Call<'a> {
    lab: &'a Lab,
    pod: &'a LabPod,
    command: &'static str,
    /// eth0 for the pod network, lo for loopback.
    ifname: &'static str,
    /// Extra CNI_ARGS (host-local reads `IP=` as the address asked for).
    args: Option<String>,
}

impl Call<'_> {
    /// The sandbox's id: the pod's namespace name, so that a reservation
    /// file under `var/lib/cni/networks` says whose it is.
    fn container_id(&self) -> &str {
        &self.pod.netns
    }

    /// kubelet's CNI_ARGS, and the caller's.
    fn cni_args(&self) -> String {
        let mut args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
            self.pod.name,
            self.container_id()
        );
        if let Some(extra) = &self.args {
            args.push(';');
            args.push_str(extra);
        }
        args
    }

    /// A plugin looked up in CNI_PATH, failing in libcni's words (which
    /// a delegating plugin's invoke package shares).
    fn find(&self, plugin: &str) -> Result<PathBuf> {
        let bin = bin_dir(self.lab, self.pod.node);
        let program = bin.join(plugin);
        if !program.exists() {
            bail!(
                "failed to find plugin {plugin:?} in path [{}]",
                bin.display()
            );
        }
        Ok(program)
    }

    /// As libcni runs one plugin of a network: a plugin not found is said
    /// as is, a plugin's failure as `plugin type="…" failed (add): …`.
    fn as_runtime(&self, config: &Value) -> Result<Value> {
        let plugin = config["type"].as_str().context("a plugin type")?;
        let program = self.find(plugin)?;
        self.exec(&program, config)
            .map_err(|e| self.failed(plugin, e))
    }

    /// As the flannel plugin runs its delegate: an ADD's failure, the
    /// lookup's too, as `failed to delegate add: …` (a DEL's as is),
    /// which the runtime reports as flannel's failure.
    fn as_flannel(&self, delegate: &Value) -> Result<Value> {
        let plugin = delegate["type"].as_str().context("a delegate type")?;
        self.find(plugin)
            .and_then(|program| self.exec(&program, delegate))
            .map_err(|e| match self.command {
                "ADD" => anyhow!("failed to delegate add: {e:#}"),
                _ => e,
            })
            .map_err(|e| self.failed("flannel", e))
    }

    /// libcni's wrapping of a plugin's error.
    fn failed(&self, plugin: &str, error: anyhow::Error) -> anyhow::Error {
        let verb = if self.command == "ADD" {
            "add"
        } else {
            "delete"
        };
        anyhow!("plugin type={plugin:?} failed ({verb}): {error:#}")
    }

    /// Runs `program` in the pod's node namespace with `config` on stdin:
    /// its result (none for DEL), or its error in its own words.
    fn exec(&self, program: &Path, config: &Value) -> Result<Value> {
        let bin = bin_dir(self.lab, self.pod.node);
        let mut child = in_netns(
            &self.lab.node_netns(self.pod.node),
            &program.to_string_lossy(),
        )
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", self.command)
        .env("CNI_CONTAINERID", self.container_id())
        .env("CNI_NETNS", format!("/run/netns/{}", self.pod.netns))
        .env("CNI_IFNAME", self.ifname)
        .env("CNI_ARGS", self.cni_args())
        .env("CNI_PATH", &bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", program.display()))?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(config.to_string().as_bytes())?;
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "{}",
                plugin_error(&stdout, &String::from_utf8_lossy(&out.stderr))
            );
        }
        if self.command == "DEL" || stdout.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&stdout)
            .with_context(|| format!("{} answered {stdout}", program.display()))
    }
}

/// A failed plugin's words: its JSON error's `msg` (and `details`), else
/// whatever it printed.
fn plugin_error(stdout: &str, stderr: &str) -> String {
    match serde_json::from_str::<Value>(stdout) {
        Ok(error) if error["msg"].is_string() => {
            let msg = error["msg"].as_str().unwrap_or_default();
            match error["details"].as_str().filter(|d| !d.is_empty()) {
                Some(details) => format!("{msg}: {details}"),
                None => msg.to_string(),
            }
        }
        _ => format!("{} {}", stdout.trim(), stderr.trim())
            .trim()
            .to_string(),
    }
}

/// The conflist's second plugin; `prev`: the result before it (ADD).
fn portmap(prev: Option<&Value>) -> Value {
    let mut config = json!({
        "cniVersion": CNI_VERSION,
        "name": NETWORK,
        "type": "portmap",
        "capabilities": {"portMappings": true},
    });
    if let Some(prev) = prev {
        config["prevResult"] = prev.clone();
    }
    config
}

/// Where the flannel plugin keeps the delegate config it rendered for a
/// sandbox, to hand the same one to its DEL.
fn saved_delegate(lab: &Lab, pod: &LabPod) -> PathBuf {
    lab.host_root(pod.node)
        .join("var/lib/cni/flannel")
        .join(&pod.netns)
}

/// A Flannel pod's network, in the order a runtime sets it up: lo, then
/// the conflist's chain (flannel, which renders and saves its bridge
/// delegate and runs it; then portmap with the result before it).
/// `address`: the one to ask host-local for, else the next free one.
/// Returns what the bridge made.
pub fn add_flannel_pod(lab: &Lab, pod: &LabPod, address: Option<Ipv4Addr>) -> Result<Attached> {
    loopback(lab, pod)?;
    let call = Call {
        lab,
        pod,
        command: "ADD",
        ifname: "eth0",
        args: address.map(|a| format!("IP={a}")),
    };
    // The runtime finds flannel first; the lab does flannel's part.
    call.find("flannel")?;
    let delegate = flannel_delegate(lab, pod.node).map_err(|e| call.failed("flannel", e))?;
    let saved = saved_delegate(lab, pod);
    fs::create_dir_all(saved.parent().context("a directory")?)?;
    fs::write(&saved, delegate.to_string())?;
    let result = call.as_flannel(&delegate)?;
    call.as_runtime(&portmap(Some(&result)))?;
    attached(&result)
}

/// The conflist's chain torn down in reverse, as a runtime removes a
/// sandbox: portmap, then flannel's saved delegate (bridge releases the
/// host-local address and deletes the pod's veth if its namespace is
/// still there). No saved delegate: nothing of the pod's is left.
pub fn del_flannel_pod(lab: &Lab, pod: &LabPod) -> Result<()> {
    let call = Call {
        lab,
        pod,
        command: "DEL",
        ifname: "eth0",
        args: None,
    };
    call.as_runtime(&portmap(None))?;
    call.find("flannel")?;
    let saved = saved_delegate(lab, pod);
    let Ok(delegate) = fs::read_to_string(&saved) else {
        return Ok(());
    };
    call.as_flannel(&serde_json::from_str(&delegate)?)?;
    fs::remove_file(saved)?;
    Ok(())
}

/// The pod's lo, up, by the loopback plugin (as every runtime does first).
pub fn loopback(lab: &Lab, pod: &LabPod) -> Result<()> {
    let call = Call {
        lab,
        pod,
        command: "ADD",
        ifname: "lo",
        args: None,
    };
    call.as_runtime(
        &json!({"cniVersion": CNI_VERSION, "name": "cni-loopback", "type": "loopback"}),
    )?;
    Ok(())
}

/// What a runtime says when it makes a new Flannel sandbox on `node` now
/// (a throwaway pod, removed again): `None` when it could, else its
/// error, as kubelet's FailedCreatePodSandBox event carries it.
pub fn new_sandbox_error(lab: &Lab, node: u8) -> Result<Option<String>> {
    let pod = LabPod {
        name: "sandbox-check".into(),
        netns: format!("{}-sandbox-check{node}", lab.prefix),
        ip: lab.subnet_host(node, 254),
        ipv6: None,
        node,
        host_iface: String::new(),
    };
    cmd::netns_add(&pod.netns)?;
    let added = add_flannel_pod(lab, &pod, None);
    // A runtime tears a failed sandbox down too.
    let _ = del_flannel_pod(lab, &pod);
    cmd::sh(&["ip", "netns", "del", &pod.netns])?;
    Ok(added.err().map(|e| format!("{e:#}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bridge ADD result as the Debian plugin prints it (CNI 0.3.1).
    const RESULT: &str = r#"{"cniVersion":"0.3.1","interfaces":[{"name":"cni0","mac":"5a:15:39:42:c7:85"},{"name":"veth1f2e3d4c","mac":"be:54:5c:38:c3:71"},{"name":"eth0","mac":"b6:d9:25:cc:29:aa","sandbox":"/run/netns/lab-web-0"}],"ips":[{"version":"4","interface":2,"address":"10.244.1.2/24","gateway":"10.244.1.1"}],"routes":[{"dst":"10.244.0.0/16"},{"dst":"0.0.0.0/0","gw":"10.244.1.1"}],"dns":{}}"#;

    #[test]
    fn a_bridge_result_gives_the_address_and_the_host_veth() {
        let made = attached(&serde_json::from_str(RESULT).unwrap()).unwrap();
        assert_eq!(made.address, "10.244.1.2/24".parse().unwrap());
        assert_eq!(made.host_iface, "veth1f2e3d4c");
        assert!(attached(&json!({"ips": []})).is_err());
    }

    #[test]
    fn a_plugins_error_is_its_message_and_details() {
        let missing =
            r#"{"code":999,"msg":"failed to find plugin \"host-local\" in path [/opt/cni/bin]"}"#;
        assert_eq!(
            plugin_error(missing, ""),
            r#"failed to find plugin "host-local" in path [/opt/cni/bin]"#
        );
        let detailed = r#"{"code":11,"msg":"no IP addresses available","details":"in range set 10.244.1.1-10.244.1.254"}"#;
        assert_eq!(
            plugin_error(detailed, ""),
            "no IP addresses available: in range set 10.244.1.1-10.244.1.254"
        );
        assert_eq!(plugin_error("", "panic: boom"), "panic: boom");
    }

    #[test]
    fn the_delegate_is_flannels_from_subnet_env() {
        let env = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.2.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
        let delegate =
            delegate_from_subnet_env(env, Path::new("/root/var/lib/cni/networks")).unwrap();
        assert_eq!(delegate["type"], "bridge");
        assert_eq!(delegate["mtu"], 1450);
        assert_eq!(delegate["ipMasq"], false);
        assert_eq!(delegate["ipam"]["ranges"][0][0]["subnet"], "10.244.2.0/24");
        assert_eq!(delegate["ipam"]["routes"][0]["dst"], "10.244.0.0/16");
        assert_eq!(delegate["ipam"]["dataDir"], "/root/var/lib/cni/networks");
        assert!(delegate_from_subnet_env("FLANNEL_MTU=1450\n", Path::new("/x")).is_err());
    }
}
