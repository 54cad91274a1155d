//! The tc signal: podtrace's classifiers on both hooks of an interface.
//!
//! Attachment is by TCX link, first in line, so podtrace sees a packet
//! before any CNI program can redirect it; the kernel removes the links
//! when their fds close, even after SIGKILL. Kernels without TCX (< 6.6)
//! (or `--attach clsact`) get clsact filters instead. Several podtraces
//! may share one clsact qdisc, so each owns exactly its own filters: its
//! own handle at priority 1, recorded in the run registry
//! (`run_registry`) before attaching. They are removed on exit by priority
//! and handle, never by name; a killed run's are removed by the next
//! podtrace to start, in any mode.

use std::{
    io,
    process::{Command, Stdio},
};

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::ProgramArray,
    programs::{
        tc::{self, NlOptions, TcAttachOptions, TcHandle},
        Link, LinkOrder, SchedClassifier, TcAttachType,
    },
    Ebpf,
};
use podtrace_common::names;

use super::{
    run_registry::{self, Exclusive, Held, Record},
    AttachMode,
};
use crate::node::{
    interfaces::{Role, Watched},
    netns::Namespace,
};

/// Every tc program, loaded once per node before any attachment.
pub(super) const PROGRAMS: [&str; 5] = [
    names::TC_INGRESS,
    names::TC_EGRESS,
    names::TC_TO_POD,
    names::TC_INGRESS_L3,
    names::TC_EGRESS_L3,
];

/// Attaches the right pair of programs to both hooks of `iface` (in the
/// current thread's namespace, `netns`). Returns the clsact filters it
/// attached, recorded in the run registry; TCX links need no record.
pub(super) fn attach_interface(
    ebpf: &mut Ebpf,
    iface: &Watched,
    mode: AttachMode,
    netns: &Namespace,
) -> Result<Vec<Record>> {
    let (ingress, egress) = if iface.role == Role::PodVeth && iface.has_ethernet_header {
        // Its egress hands packets to the pod: the end of their path.
        (names::TC_INGRESS, names::TC_TO_POD)
    } else if iface.has_ethernet_header {
        (names::TC_INGRESS, names::TC_EGRESS)
    } else {
        (names::TC_INGRESS_L3, names::TC_EGRESS_L3)
    };
    let hooks = [
        (ingress, TcAttachType::Ingress),
        (egress, TcAttachType::Egress),
    ];
    let gone = || format!("cannot attach to {} (is the interface gone?)", iface.name);
    if mode != AttachMode::Clsact {
        for (name, hook) in hooks {
            program(ebpf, name)?
                .attach_with_options(
                    &iface.name,
                    hook,
                    TcAttachOptions::TcxOrder(LinkOrder::first()),
                )
                .with_context(gone)?;
        }
        return Ok(Vec::new());
    }
    let lock = run_registry::exclusive()?;
    add_clsact(&lock, iface, netns)?;
    let mut records = Vec::new();
    for (name, hook) in hooks {
        match attach_filter(program(ebpf, name)?, iface, hook, netns) {
            Ok(record) => records.push(record),
            Err(e) => {
                // The filters attached so far go with the Ebpf; the qdisc
                // may have to go now.
                for record in &records {
                    run_registry::release(record);
                }
                tidy_qdisc(&lock, netns.inum, iface.index);
                return Err(e.context(gone()));
            }
        }
    }
    Ok(records)
}

/// Loads each tc program's IPv6 twin and puts it in the table its IPv4
/// program hands IPv6 packets on through. An error leaves IPv6 untraced
/// and IPv4 as it was: the IPv4 programs leave IPv6 packets alone while
/// the table is empty.
pub(super) fn load_ipv6(ebpf: &mut Ebpf) -> Result<()> {
    let mut fds = Vec::new();
    for name in names::TC_IPV6 {
        let program = program(ebpf, name)?;
        program
            .load()
            .with_context(|| format!("the kernel refused {name}"))?;
        fds.push(program.fd()?.try_clone()?);
    }
    let table = ebpf
        .map_mut(names::IPV6_PROGRAMS)
        .ok_or_else(|| anyhow!("no {} map", names::IPV6_PROGRAMS))?;
    let mut table = ProgramArray::try_from(table)?;
    for (slot, fd) in (0u32..).zip(&fds) {
        table.set(slot, fd, 0)?;
    }
    Ok(())
}

pub(super) fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier> {
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("no program {name}"))?;
    Ok(program.try_into()?)
}

/// Adds the clsact qdisc unless there is one, marked as podtrace's first.
fn add_clsact(lock: &Exclusive, iface: &Watched, netns: &Namespace) -> Result<()> {
    let marked_now = run_registry::mark_qdisc(lock, netns, iface.index)?;
    match tc::qdisc_add_clsact(&iface.name) {
        Ok(()) => Ok(()),
        Err(tc::TcError::IoError(e)) if e.kind() == io::ErrorKind::NotFound => {
            run_registry::unmark_qdisc(lock, netns.inum, iface.index);
            Err(anyhow!(e)).with_context(|| {
                format!("cannot attach to {} (is the interface gone?)", iface.name)
            })
        }
        // Already there: another tool's (then not ours to remove), or
        // another podtrace's (then marked already).
        Err(_) => {
            if marked_now {
                run_registry::unmark_qdisc(lock, netns.inum, iface.index);
            }
            Ok(())
        }
    }
}

/// One clsact filter, first in line, under this run's own handle;
/// recorded before it exists.
fn attach_filter(
    program: &mut SchedClassifier,
    iface: &Watched,
    hook: TcAttachType,
    netns: &Namespace,
) -> Result<Record> {
    let handle = run_registry::filter_handle()?;
    let record = Record::at(
        netns,
        Held::Filter {
            ifindex: iface.index,
            ifname: iface.name.to_string(),
            ingress: hook == TcAttachType::Ingress,
            priority: PRIORITY,
            handle,
        },
    );
    run_registry::claim(record.clone())?;
    let attached = program.attach_with_options(
        &iface.name,
        hook,
        TcAttachOptions::Netlink(NlOptions {
            priority: PRIORITY,
            handle: TcHandle::from(handle),
            ..Default::default()
        }),
    );
    if let Err(e) = attached {
        run_registry::release(&record);
        return Err(e.into());
    }
    Ok(record)
}

/// Priority of podtrace's clsact filters: before any CNI's.
pub(super) const PRIORITY: u16 = 1;

/// Forgets filters the Ebpf has detached (it detaches by priority and
/// handle: exactly this run's), and removes qdiscs left empty.
pub(super) fn released(records: &[Record]) {
    if records.is_empty() {
        return;
    }
    let lock = run_registry::exclusive();
    for record in records {
        run_registry::release(record);
    }
    if let Ok(lock) = lock {
        let mut tidied = Vec::new();
        for record in records {
            if let Held::Filter { ifindex, .. } = record.held {
                if !tidied.contains(&ifindex) {
                    tidied.push(ifindex);
                    tidy_qdisc(&lock, record.netns_inum, ifindex);
                }
            }
        }
    }
}

/// A dead run's filter (in the current thread's namespace): removed by its
/// priority and handle, never by name.
pub(super) fn remove_filter(lock: &Exclusive, record: &Record) -> Result<()> {
    let Held::Filter {
        ifindex,
        ingress,
        priority,
        handle,
        ..
    } = record.held
    else {
        return Ok(());
    };
    let Some(ifname) = ifname(ifindex) else {
        // The interface is gone, and its filters with it.
        run_registry::unmark_qdisc(lock, record.netns_inum, ifindex);
        return Ok(());
    };
    let hook = if ingress {
        TcAttachType::Ingress
    } else {
        TcAttachType::Egress
    };
    // RTM_DELTFILTER by priority and handle.
    let link =
        tc::SchedClassifierLink::attached(&ifname, hook, priority, TcHandle::from(handle), None)?;
    link.detach().context("cannot remove the filter")?;
    tidy_qdisc(lock, record.netns_inum, ifindex);
    Ok(())
}

/// Removes a clsact qdisc podtrace added once no filter at all is left on
/// it (in the current thread's namespace).
fn tidy_qdisc(lock: &Exclusive, netns_inum: u32, ifindex: u32) {
    if !run_registry::qdisc_marked(lock, netns_inum, ifindex) {
        return;
    }
    let Some(ifname) = ifname(ifindex) else {
        run_registry::unmark_qdisc(lock, netns_inum, ifindex);
        return;
    };
    let empty = |hook: &str| {
        Command::new("tc")
            .args(["filter", "show", "dev", &ifname, hook])
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|out| out.status.success() && out.stdout.is_empty())
    };
    if empty("ingress") && empty("egress") {
        let _ = Command::new("tc")
            .args(["qdisc", "del", "dev", &ifname, "clsact"])
            .stderr(Stdio::null())
            .status();
        run_registry::unmark_qdisc(lock, netns_inum, ifindex);
    }
}

/// The name of an interface of the current thread's namespace.
fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: the buffer holds IF_NAMESIZE bytes, as if_indextoname wants.
    let name = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr().cast()) };
    if name.is_null() {
        return None;
    }
    let len = buf.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&buf[..len]).into_owned())
}
