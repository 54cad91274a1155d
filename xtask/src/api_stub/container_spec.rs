//! A Pod spec read as a node's runtime reads it, into an OCI runtime
//! config for runc: what the kubelet honours (command and args, env,
//! capabilities added and dropped, hostNetwork, hostPID, hostPath mounts
//! with readOnly, readOnlyRootFilesystem, allowPrivilegeEscalation,
//! runAsUser, memory and CPU limits, seccomp), and a refusal naming the
//! field for anything it cannot honour, as a kubelet fails such a pod
//! rather than run it otherwise than asked.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::capability_sets;

/// systemd's default RLIMIT_MEMLOCK (8 MiB), which containerd and CRI-O
/// started by systemd pass on to every container.
pub const MEMLOCK: u64 = 8 << 20;

/// Pod spec fields the kubelet has nothing to do for here: the
/// scheduler's, the API's defaults, and those honoured elsewhere
/// (nodeName picks the kubelet, terminationGracePeriodSeconds is the
/// kubelet's stop, activeDeadlineSeconds its deadline).
const POD_FIELDS: [&str; 18] = [
    "nodeName",
    "hostNetwork",
    "hostPID",
    "restartPolicy",
    "containers",
    "volumes",
    "serviceAccountName",
    "serviceAccount",
    "automountServiceAccountToken",
    "terminationGracePeriodSeconds",
    "activeDeadlineSeconds",
    "tolerations",
    "nodeSelector",
    "affinity",
    "priorityClassName",
    "schedulerName",
    "dnsPolicy",
    "enableServiceLinks",
];

const CONTAINER_FIELDS: [&str; 12] = [
    "name",
    "image",
    "command",
    "args",
    "env",
    "securityContext",
    "volumeMounts",
    "resources",
    "imagePullPolicy",
    "workingDir",
    "terminationMessagePath",
    "terminationMessagePolicy",
];

/// One bind mount: from the node, to the container.
#[derive(Debug, PartialEq, Eq)]
pub struct Bind {
    pub source: PathBuf,
    pub destination: String,
    pub read_only: bool,
    /// `DirectoryOrCreate`: the kubelet makes the node's directory.
    pub create: bool,
}

/// What the container runs, and how.
#[derive(Debug)]
pub struct ContainerSpec {
    pub image: String,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub capabilities: Vec<String>,
    pub binds: Vec<Bind>,
    pub host_network: bool,
    pub host_pid: bool,
    pub seccomp: bool,
    pub read_only_root: bool,
    pub no_new_privileges: bool,
    pub user: (u32, u32),
    pub cwd: String,
    pub memory_limit: Option<u64>,
    pub cpu_millis: Option<u64>,
}

/// The pod's one container, or the field that cannot be honoured.
/// `node_root` is where the node's `/` is (hostPath paths below it are
/// the node's own files).
pub fn from_pod(pod: &Value, node_root: &Path) -> Result<ContainerSpec, String> {
    let spec = &pod["spec"];
    unknown_fields(spec, &POD_FIELDS, "spec")?;
    if spec["restartPolicy"].as_str().is_some_and(|p| p != "Never") {
        return Err("spec.restartPolicy: the lab's kubelet runs a container once (Never)".into());
    }
    let containers = spec["containers"].as_array().map_or(&[][..], Vec::as_slice);
    let [container] = containers else {
        return Err(format!(
            "spec.containers: {} containers; the lab's kubelet runs one",
            containers.len()
        ));
    };
    unknown_fields(container, &CONTAINER_FIELDS, "spec.containers[0]")?;
    let security = &container["securityContext"];
    unknown_fields(
        security,
        &[
            "capabilities",
            "privileged",
            "allowPrivilegeEscalation",
            "readOnlyRootFilesystem",
            "runAsUser",
            "runAsGroup",
            "seccompProfile",
        ],
        "securityContext",
    )?;
    if security["privileged"] == true {
        return Err(
            "securityContext.privileged: the lab's kubelet runs no privileged container".into(),
        );
    }
    let image = container["image"]
        .as_str()
        .ok_or("spec.containers[0].image is missing")?
        .to_string();
    let argv: Vec<String> = strings(&container["command"])
        .into_iter()
        .chain(strings(&container["args"]))
        .collect();
    if argv.is_empty() {
        return Err("spec.containers[0].command: the lab's kubelet needs a command (the image's entrypoint is not read)".into());
    }
    let uid = |key: &str| security[key].as_u64().map(|id| id as u32).unwrap_or(0);
    Ok(ContainerSpec {
        image,
        argv,
        env: env(&container["env"])?,
        capabilities: capability_sets::of_container(
            &strings(&security["capabilities"]["add"]),
            &strings(&security["capabilities"]["drop"]),
        ),
        binds: binds(spec, container, node_root)?,
        host_network: spec["hostNetwork"] == true,
        host_pid: spec["hostPID"] == true,
        seccomp: seccomp(&security["seccompProfile"])?,
        read_only_root: security["readOnlyRootFilesystem"] == true,
        no_new_privileges: security["allowPrivilegeEscalation"] == false,
        user: (uid("runAsUser"), uid("runAsGroup")),
        cwd: container["workingDir"].as_str().unwrap_or("/").to_string(),
        memory_limit: container["resources"]["limits"]["memory"]
            .as_str()
            .map(quantity)
            .transpose()?,
        cpu_millis: container["resources"]["limits"]["cpu"]
            .as_str()
            .map(millicpu)
            .transpose()?,
    })
}

fn unknown_fields(object: &Value, known: &[&str], at: &str) -> Result<(), String> {
    let unknown: Vec<&String> = object
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k)
        .filter(|k| !known.contains(&k.as_str()))
        .collect();
    match unknown.first() {
        None => Ok(()),
        Some(field) => Err(format!("{at}.{field}: the lab's kubelet cannot honour it")),
    }
}

fn strings(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(String::from))
        .collect()
}

fn env(list: &Value) -> Result<Vec<String>, String> {
    let mut env = vec![format!("PATH={}", crate::image::PATH)];
    for var in list.as_array().into_iter().flatten() {
        let (Some(name), Some(value)) = (var["name"].as_str(), var["value"].as_str()) else {
            return Err(format!(
                "env {}: only literal values (no valueFrom) in the lab",
                var["name"]
            ));
        };
        env.push(format!("{name}={value}"));
    }
    Ok(env)
}

/// RuntimeDefault (also what an absent profile gets: a kubelet with
/// `--seccomp-default`, as this one plays it) or Unconfined; a Localhost
/// profile is a file on a node the lab does not have.
fn seccomp(profile: &Value) -> Result<bool, String> {
    match profile["type"].as_str() {
        None | Some("RuntimeDefault") => Ok(true),
        Some("Unconfined") => Ok(false),
        Some(other) => Err(format!(
            "seccompProfile {other}: the lab's kubelet has RuntimeDefault and Unconfined only"
        )),
    }
}

/// Each volumeMount of a hostPath volume. The node's `/` is its root
/// directory; other paths are the machine's, which every lab node shares
/// (its kernel's /sys, its /run/podtrace).
fn binds(spec: &Value, container: &Value, node_root: &Path) -> Result<Vec<Bind>, String> {
    let volumes = spec["volumes"].as_array().map_or(&[][..], Vec::as_slice);
    let mut binds = Vec::new();
    for mount in container["volumeMounts"].as_array().into_iter().flatten() {
        unknown_fields(mount, &["name", "mountPath", "readOnly"], "volumeMounts")?;
        let volume = volumes
            .iter()
            .find(|v| v["name"] == mount["name"])
            .ok_or(format!("volumeMount {}: no such volume", mount["name"]))?;
        unknown_fields(volume, &["name", "hostPath"], "volumes")?;
        let host = &volume["hostPath"];
        let path = host["path"].as_str().ok_or(format!(
            "volume {}: only hostPath volumes in the lab",
            volume["name"]
        ))?;
        let kind = host["type"].as_str().unwrap_or("");
        if !["", "Directory", "DirectoryOrCreate"].contains(&kind) {
            return Err(format!(
                "volume {}: hostPath type {kind}: the lab's kubelet has directories only",
                volume["name"]
            ));
        }
        let source = if path == "/" {
            node_root.to_path_buf()
        } else {
            PathBuf::from(path)
        };
        binds.push(Bind {
            source,
            destination: mount["mountPath"]
                .as_str()
                .ok_or("volumeMount without mountPath")?
                .to_string(),
            read_only: mount["readOnly"] == true,
            create: kind == "DirectoryOrCreate",
        });
    }
    Ok(binds)
}

/// `256Mi`, `1G`, `1048576` in bytes.
fn quantity(text: &str) -> Result<u64, String> {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    let (number, scale) = units
        .iter()
        .find_map(|(u, s)| text.strip_suffix(u).map(|n| (n, *s)))
        .unwrap_or((text, 1));
    number
        .parse::<u64>()
        .map(|n| n * scale)
        .map_err(|_| format!("resources: cannot read the quantity {text:?}"))
}

/// `500m`, `2` in thousandths of a CPU.
fn millicpu(text: &str) -> Result<u64, String> {
    match text.strip_suffix('m') {
        Some(millis) => millis
            .parse()
            .map_err(|_| format!("resources: cannot read cpu {text:?}")),
        None => text
            .parse::<f64>()
            .map(|cpus| (cpus * 1000.0) as u64)
            .map_err(|_| format!("resources: cannot read cpu {text:?}")),
    }
}

/// Syscalls containerd's default profile refuses whatever the
/// capabilities (keyrings, kexec, modules, the clock, swap, reboot, raw
/// I/O ports, userfaultfd, handles). The profile itself is an allow-list
/// of some 370 syscalls, widened per capability; with the agent's
/// capabilities (SYS_ADMIN, BPF, PERFMON, SYS_PTRACE) it allows bpf,
/// perf_event_open, setns, mount and ptrace, so the difference that
/// matters is what it refuses to everyone, which this deny-list is.
const SECCOMP_DENIED: [&str; 24] = [
    "acct",
    "add_key",
    "keyctl",
    "request_key",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "userfaultfd",
    "open_by_handle_at",
    "nfsservctl",
    "vhangup",
    "lookup_dcookie",
    "create_module",
];

fn seccomp_profile() -> Value {
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [{"names": SECCOMP_DENIED, "action": "SCMP_ACT_ERRNO", "errnoRet": libc::EPERM}],
    })
}

/// runc's config.json for `container`, its root filesystem at `rootfs`;
/// with hostNetwork, the node's network namespace at `node_netns`.
/// `extra` binds are the lab's own (not the pod's).
pub fn runc_config(
    container: &ContainerSpec,
    rootfs: &Path,
    node_netns: &Path,
    extra: &[Bind],
) -> Value {
    let caps = &capability_sets::grantable(&container.capabilities);
    let mut namespaces = vec![json!({"type": "mount"}), json!({"type": "ipc"})];
    if container.host_network {
        namespaces.push(json!({"type": "network", "path": node_netns}));
    } else {
        namespaces.push(json!({"type": "network"}));
        namespaces.push(json!({"type": "uts"}));
    }
    if !container.host_pid {
        namespaces.push(json!({"type": "pid"}));
    }
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc"}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]}),
    ];
    for bind in container.binds.iter().chain(extra) {
        let mut options = vec!["rbind", "rprivate"];
        if bind.read_only {
            options.push("ro");
        }
        mounts.push(json!({"destination": bind.destination, "type": "bind", "source": bind.source, "options": options}));
    }
    let mut resources = json!({});
    if let Some(limit) = container.memory_limit {
        resources["memory"] = json!({"limit": limit});
    }
    if let Some(millis) = container.cpu_millis {
        resources["cpu"] = json!({"quota": millis * 100, "period": 100_000});
    }
    let mut linux = json!({
        "namespaces": namespaces,
        "resources": resources,
        "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"],
        "readonlyPaths": ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
    });
    if container.seccomp {
        linux["seccomp"] = seccomp_profile();
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": container.user.0, "gid": container.user.1},
            "args": container.argv,
            "env": container.env,
            "cwd": container.cwd,
            // As containerd: the set is bounding, effective and permitted;
            // inheritable and ambient stay empty (CVE-2022-24769), so a
            // non-root process gets none.
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_MEMLOCK", "hard": MEMLOCK, "soft": MEMLOCK}],
            "noNewPrivileges": container.no_new_privileges,
        },
        "root": {"path": rootfs, "readonly": container.read_only_root},
        "mounts": mounts,
        "linux": linux,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent_like() -> Value {
        json!({"spec": {
            "nodeName": "node-1", "hostNetwork": true, "hostPID": true, "restartPolicy": "Never",
            "containers": [{"name": "agent", "image": "img", "command": ["podtrace"], "args": ["agent"],
                "securityContext": {"capabilities": {"add": ["BPF", "NET_ADMIN"], "drop": ["ALL"]}},
                "volumeMounts": [{"name": "host", "mountPath": "/host", "readOnly": true},
                                 {"name": "runs", "mountPath": "/run/podtrace"}]}],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}},
                        {"name": "runs", "hostPath": {"path": "/run/podtrace", "type": "DirectoryOrCreate"}}]
        }})
    }

    #[test]
    fn the_pod_spec_is_run_as_written() {
        let spec = from_pod(&agent_like(), Path::new("/lab/node-1/root")).unwrap();
        assert_eq!(spec.argv, ["podtrace", "agent"]);
        assert_eq!(spec.capabilities, ["CAP_BPF", "CAP_NET_ADMIN"]);
        assert_eq!(spec.binds[0].source, Path::new("/lab/node-1/root"));
        assert!(spec.binds[0].read_only && !spec.binds[1].read_only && spec.binds[1].create);
        assert!(spec.host_network && spec.host_pid && spec.seccomp);
        let config = runc_config(&spec, Path::new("/r"), Path::new("/run/netns/n1"), &[]);
        let types: Vec<&Value> = config["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| &n["type"])
            .collect();
        assert_eq!(types, ["mount", "ipc", "network"]);
        assert_eq!(config["linux"]["namespaces"][2]["path"], "/run/netns/n1");
        assert_eq!(config["process"]["rlimits"][0]["hard"], MEMLOCK);
        let mut kept = agent_like();
        kept["spec"]["containers"][0]["securityContext"]["capabilities"] =
            json!({"drop": ["NET_RAW", "MKNOD"]});
        let caps = from_pod(&kept, Path::new("/")).unwrap().capabilities;
        assert!(
            caps.contains(&"CAP_CHOWN".to_string())
                && !caps.contains(&"CAP_NET_RAW".to_string())
                && caps.len() == 12
        );
    }

    #[test]
    fn a_field_the_lab_cannot_honour_fails_the_pod_by_name() {
        let cases = [
            ("/spec/hostIPC", json!(true), "spec.hostIPC"),
            (
                "/spec/containers/0/securityContext/privileged",
                json!(true),
                "privileged",
            ),
            (
                "/spec/containers/0/securityContext/seccompProfile",
                json!({"type": "Localhost"}),
                "Localhost",
            ),
            ("/spec/volumes/0/hostPath/type", json!("Socket"), "Socket"),
            (
                "/spec/containers/0/lifecycle",
                json!({}),
                "spec.containers[0].lifecycle",
            ),
        ];
        for (pointer, value, named) in cases {
            let mut pod = agent_like();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            pod.pointer_mut(parent).unwrap()[key] = value;
            let err = from_pod(&pod, Path::new("/")).unwrap_err();
            assert!(err.contains(named), "{pointer}: {err}");
        }
    }
}
