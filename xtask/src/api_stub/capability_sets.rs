//! Which capabilities a container gets: the runtime's default set with
//! the pod's `drop` and `add` applied, and of those, the ones this host's
//! root can hand on at all.

/// The capabilities containerd (and CRI-O) give a container that drops
/// none: what `drop` removes from and `add` adds to.
const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

/// The default set, less `drop` (`ALL`: all of it), plus `add`, as
/// `CAP_…` names.
pub fn of_container(add: &[String], drop: &[String]) -> Vec<String> {
    let name = |c: &str| format!("CAP_{}", c.trim_start_matches("CAP_").to_uppercase());
    let dropped = |c: &str| drop.iter().any(|d| d == "ALL" || name(d) == name(c));
    let mut set: Vec<String> = DEFAULT_CAPABILITIES
        .iter()
        .filter(|c| !dropped(c))
        .map(|c| name(c))
        .collect();
    for c in add {
        if !set.contains(&name(c)) {
            set.push(name(c));
        }
    }
    set
}

/// Linux's capabilities in their numbering (capability.h).
const CAPABILITY_NUMBERS: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The capabilities of `asked` that this host's runtime can grant: a real
/// node's containerd runs with every one, but a lab host's root may lack
/// some (this machine's lacks CAP_SYS_RESOURCE), and runc then refuses
/// the whole container. Those it cannot grant are said, once each, and
/// left out, as podtrace would find them missing on a node that withheld
/// them.
pub fn grantable(asked: &[String]) -> Vec<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(u64::MAX);
    asked
        .iter()
        .filter(|cap| {
            let name = cap.trim_start_matches("CAP_");
            let held = CAPABILITY_NUMBERS
                .iter()
                .position(|n| *n == name)
                .is_none_or(|bit| bounding & (1 << bit) != 0);
            if !held {
                eprintln!("kubelet: this host cannot grant {cap} (its root lacks it): the container runs without it");
            }
            held
        })
        .cloned()
        .collect()
}
