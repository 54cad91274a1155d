//! tc sightings: loads the tc programs into one node (network namespace),
//! attaches them to its interfaces, and streams what they see.
//!
//! Attachment is by TCX link, first in line, so podtrace sees a packet
//! before any CNI program can redirect it; the kernel removes the links
//! when their fds close, even after SIGKILL. Kernels without TCX (< 6.6)
//! get clsact filters instead, which podtrace removes on exit and, after a
//! crash, on the next start.

use std::{
    io,
    mem::ManuallyDrop,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{
        tc::{self, NlOptions, TcAttachOptions},
        BtfTracePoint, LinkOrder, RawTracePoint, SchedClassifier, TcAttachType,
    },
    util::KernelVersion,
    Btf, Ebpf, EbpfLoader,
};
use podtrace_common::{counter, names, FlowKey, KernelLayout, Sighting, MAX_NODES};
use tokio::{io::unix::AsyncFd, sync::mpsc};

use crate::{interfaces::Watched, netns};

static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// TCX links where the kernel has them (≥ 6.6), clsact otherwise.
    Auto,
    Tcx,
    Clsact,
}

impl AttachMode {
    fn resolve(self) -> Self {
        match self {
            Self::Auto
                if KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0)) =>
            {
                Self::Tcx
            }
            Self::Auto => Self::Clsact,
            other => other,
        }
    }
}

/// What one node's probe needs to know.
pub struct ProbeSpec<'a> {
    pub node_id: u32,
    /// The node's namespace (None: podtrace's own).
    pub netns: Option<&'a Path>,
    /// Inode of that namespace, and of every traced one.
    pub netns_inum: u32,
    pub traced_netns: &'a [u32; MAX_NODES],
    pub layout: &'a KernelLayout,
    pub btf: &'a Btf,
    pub flows: &'a [FlowKey],
    pub mode: AttachMode,
}

/// The programs of one node, attached; dropping it detaches everything.
pub struct NodeProbe {
    /// Dropped inside `netns`: clsact filters are detached over netlink by
    /// ifindex, which means something only in the node's namespace.
    ebpf: ManuallyDrop<Ebpf>,
    /// The node's namespace (None: podtrace's own).
    netns: Option<PathBuf>,
    mode: AttachMode,
    pub hooks: usize,
    /// Interfaces where podtrace added the clsact qdisc, to remove it again.
    added_qdiscs: Vec<String>,
}

impl Drop for NodeProbe {
    fn drop(&mut self) {
        let netns = self.netns.take();
        let ebpf = &mut self.ebpf;
        let added_qdiscs = std::mem::take(&mut self.added_qdiscs);
        let detached = netns::inside(netns.as_deref(), || {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(ebpf) };
            for iface in &added_qdiscs {
                // The child starts in this thread's namespace, the node's.
                let _ = std::process::Command::new("tc")
                    .args(["qdisc", "del", "dev", iface, "clsact"])
                    .stderr(std::process::Stdio::null())
                    .status();
            }
            Ok(())
        });
        if let Err(e) = detached {
            // TCX links close with the process; clsact filters are removed
            // by the next start.
            eprintln!("podtrace: cannot detach cleanly: {e:#}");
        }
    }
}

const PROGRAMS: [&str; 4] = [
    names::TC_INGRESS,
    names::TC_EGRESS,
    names::TC_INGRESS_L3,
    names::TC_EGRESS_L3,
];

impl NodeProbe {
    /// Loads the programs, attaches the tc ones to `watched` inside the
    /// node's namespace, and the drop program to kfree_skb.
    pub fn attach(spec: &ProbeSpec<'_>, watched: &[Watched]) -> Result<Self> {
        let mut ebpf = EbpfLoader::new()
            .override_global(names::NODE_ID, &spec.node_id, true)
            .override_global(names::LAYOUT, spec.layout, true)
            .override_global(names::NETNS_INUM, &spec.netns_inum, true)
            .override_global(names::TRACED_NETNS, spec.traced_netns, true)
            .load(EBPF_OBJECT)
            .context("cannot load the eBPF programs")?;
        let mut filter: BpfHashMap<_, FlowKey, u8> = BpfHashMap::try_from(
            ebpf.map_mut(names::FLOWS)
                .ok_or_else(|| anyhow!("no FLOWS map"))?,
        )?;
        for key in spec.flows {
            filter.insert(key, 1, 0)?;
        }
        for name in PROGRAMS {
            program(&mut ebpf, name)?
                .load()
                .with_context(|| format!("the kernel refused {name}"))?;
        }
        attach_drops(&mut ebpf, spec.btf)?;
        let mut probe = Self {
            ebpf: ManuallyDrop::new(ebpf),
            netns: spec.netns.map(Path::to_path_buf),
            mode: spec.mode.resolve(),
            hooks: 0,
            added_qdiscs: Vec::new(),
        };
        for iface in watched {
            probe.attach_interface(iface)?;
        }
        Ok(probe)
    }

    /// Attaches to both hooks of one more interface of the node.
    pub fn attach_interface(&mut self, iface: &Watched) -> Result<()> {
        let netns = self.netns.clone();
        netns::inside(netns.as_deref(), || self.attach_here(iface))
    }

    fn attach_here(&mut self, iface: &Watched) -> Result<()> {
        let (ingress, egress) = if iface.has_ethernet_header {
            (names::TC_INGRESS, names::TC_EGRESS)
        } else {
            (names::TC_INGRESS_L3, names::TC_EGRESS_L3)
        };
        for (name, hook) in [
            (ingress, TcAttachType::Ingress),
            (egress, TcAttachType::Egress),
        ] {
            let added_qdisc = attach_one(
                program(&mut self.ebpf, name)?,
                name,
                &iface.name,
                hook,
                self.mode,
            )?;
            if added_qdisc {
                self.added_qdiscs.push(iface.name.clone());
            }
            self.hooks += 1;
        }
        Ok(())
    }

    /// Swaps traced pairs in the kernel filter (a pod came back with a new
    /// IP).
    pub fn replace_flows(&mut self, old: &[FlowKey], new: &[FlowKey]) -> Result<()> {
        let map = self
            .ebpf
            .map_mut(names::FLOWS)
            .ok_or_else(|| anyhow!("no FLOWS map"))?;
        let mut filter: BpfHashMap<_, FlowKey, u8> = BpfHashMap::try_from(map)?;
        for key in old {
            // Absent already is fine: the pair may have changed twice.
            let _ = filter.remove(key);
        }
        for key in new {
            filter.insert(key, 1, 0)?;
        }
        Ok(())
    }

    /// Moves the ring buffer into a task that forwards every sighting.
    pub fn stream(&mut self, tx: mpsc::UnboundedSender<Sighting>) -> Result<()> {
        let map = self
            .ebpf
            .take_map(names::SIGHTINGS)
            .ok_or_else(|| anyhow!("no SIGHTINGS map"))?;
        let ring = RingBuf::try_from(map)?;
        // SAFETY: the ring buffer owns its fd, and the AsyncFd owns the ring
        // buffer, so the fd stays open for as long as it is registered.
        let mut ring = unsafe { AsyncFd::register(ring) }
            .map_err(|e| anyhow!("cannot poll the ring buffer: {e}"))?;
        tokio::spawn(async move {
            loop {
                let Ok(mut guard) = ring.readable_mut().await else {
                    return;
                };
                // Clear before draining: a wakeup that lands while we drain
                // must stay pending, or the ring stalls with data in it.
                guard.clear_ready();
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    if item.len() >= std::mem::size_of::<Sighting>() {
                        // SAFETY: the kernel wrote a whole Sighting here.
                        let s =
                            unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<Sighting>()) };
                        if tx.send(s).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Ok(())
    }

    /// The kernel-side loss counters, summed over CPUs.
    pub fn counters(&self) -> Result<[u64; counter::COUNT as usize]> {
        let map = self
            .ebpf
            .map(names::COUNTERS)
            .ok_or_else(|| anyhow!("no COUNTERS map"))?;
        let array: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map)?;
        let mut out = [0; counter::COUNT as usize];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = array.get(&(i as u32), 0)?.iter().sum();
        }
        Ok(out)
    }
}

/// kfree_skb as a BTF-typed tracepoint, else as a raw one (the classic
/// tracepoint would need tracefs).
fn attach_drops(ebpf: &mut Ebpf, btf: &Btf) -> Result<()> {
    let typed: Result<()> = (|| {
        let program: &mut BtfTracePoint = ebpf
            .program_mut(names::DROPS)
            .ok_or_else(|| anyhow!("no program {}", names::DROPS))?
            .try_into()?;
        program.load("kfree_skb", btf)?;
        program.attach()?;
        Ok(())
    })();
    let Err(typed_error) = typed else {
        return Ok(());
    };
    let program: &mut RawTracePoint = ebpf
        .program_mut(names::DROPS_RAW)
        .ok_or_else(|| anyhow!("no program {}", names::DROPS_RAW))?
        .try_into()?;
    program.load()?;
    program.attach("kfree_skb").map(|_| ()).with_context(|| {
        format!("cannot attach to the kfree_skb tracepoint (as tp_btf: {typed_error:#})")
    })
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier> {
    let program = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("no program {name}"))?;
    Ok(program.try_into()?)
}

fn attach_one(
    program: &mut SchedClassifier,
    name: &str,
    iface: &str,
    hook: TcAttachType,
    mode: AttachMode,
) -> Result<bool> {
    let gone = || format!("cannot attach to {iface} (is the interface gone?)");
    let mut added_qdisc = false;
    if mode == AttachMode::Clsact {
        match tc::qdisc_add_clsact(iface) {
            Ok(()) => added_qdisc = true,
            Err(tc::TcError::IoError(e)) if e.kind() == io::ErrorKind::NotFound => {
                return Err(anyhow!(e)).with_context(gone)
            }
            // Already there (another tool's, or ours from an earlier run).
            Err(_) => {}
        }
        remove_stale_filter(iface, hook, name);
        program
            .attach_with_options(
                iface,
                hook,
                TcAttachOptions::Netlink(NlOptions {
                    priority: 1,
                    ..Default::default()
                }),
            )
            .with_context(gone)?;
    } else {
        program
            .attach_with_options(iface, hook, TcAttachOptions::TcxOrder(LinkOrder::first()))
            .with_context(gone)?;
    }
    Ok(added_qdisc)
}

/// A clsact filter of ours left by a podtrace that was killed.
fn remove_stale_filter(iface: &str, hook: TcAttachType, name: &str) {
    // NotFound is the normal case; anything else will surface at attach.
    let _ = tc::qdisc_detach_program(iface, hook, name);
}
