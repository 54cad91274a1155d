//! Loading podtrace's eBPF object into one node (network namespace):
//! the globals that tell it where it runs, the traced pairs, the tc and
//! drop programs attached, and the ring buffer streamed out. Dropping the
//! probe detaches everything
//! it attached, and nothing another podtrace did.

use std::{
    mem::ManuallyDrop,
    net::IpAddr,
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use anyhow::{anyhow, bail, Context, Result};
use aya::{
    maps::{Array as BpfArray, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    Btf, Ebpf, EbpfLoader,
};
use podtrace_common::{
    counter,
    drops::{KernelLayout, MAX_NODES},
    filter::L4Filter,
    names, node_addr,
    packet6::FlowKey6,
    prefilter::{PairKey, TracedPairsOf},
    profile::{Histogram, StepKey},
    sighting::Sighting,
    FlowKey, TunnelKey,
};
use tokio::sync::mpsc;

use super::{
    clock::monotonic_ns, drops, features::DropHook, memlock, orphans, run_registry::Record, tc,
    uninterrupted::SignalsHeld, AttachMode,
};
use crate::node::{interfaces::Watched, netns::Namespace, tunnels::TunnelTrust};

pub(super) static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracer-ebpf"));

/// What one node's probe needs to know.
pub struct ProbeSpec<'a> {
    pub node_id: u32,
    pub netns: &'a Namespace,
    /// Inode of every traced namespace: drops there are told by their node.
    pub traced_netns: &'a [u32; MAX_NODES],
    pub layout: &'a KernelLayout,
    pub btf: &'a Btf,
    pub flows: &'a [FlowKey],
    /// The traced IPv6 pairs (`FLOWS6`).
    pub flows6: &'a [FlowKey6],
    /// Resolved for this kernel (`Features::attach_mode`): never Auto.
    pub mode: AttachMode,
    /// The kernel's kfree_skb passes a drop reason.
    pub drop_reasons: bool,
    /// Where the node's kernel treats packets as encapsulated.
    pub tunnels: &'a TunnelTrust,
    /// Bytes of the ring buffer of records.
    pub ring_bytes: u32,
    /// Profile mode: step histograms in the kernel, no records per packet.
    pub profile: bool,
    /// Profile mode: a bpffs directory where every node's probe of this
    /// run pins and finds the same STAMPS, so that the wire is a step.
    pub shared_stamps: Option<&'a std::path::Path>,
    /// `--sample N`: one packet in N reported, every hop of it (1: all).
    pub sample: u32,
    /// `--proto`/`--port` (None: every packet of the traced pairs).
    pub filter: Option<&'a L4Filter>,
}

/// How often the ring is drained when no wakeup came: records wake
/// userspace only once a quarter of the ring waits.
const RING_POLL: std::time::Duration = std::time::Duration::from_millis(10);

/// How long to wait at the end of a trace for the ring reader to hand over
/// what the kernel last wrote: its poll period, twice.
pub const RING_HANDOVER: std::time::Duration = RING_POLL.saturating_mul(2);

/// Sightings as the ring reader hands them over: every record one drain
/// found, at once (one channel wakeup per drain, not per record).
pub type Batch = Vec<Sighting>;

/// How far one ring reader has read, as a CLOCK_MONOTONIC instant (the
/// clock the kernel stamps records with): every record stamped before it
/// is in a batch already sent. Stories are finished against the slowest
/// reader's, not the wall clock: a reader or the stories' task that fell
/// behind must not cut a packet in two because its other node's records
/// were still on their way.
#[derive(Clone, Debug, Default)]
pub struct ReadThrough(Arc<AtomicU64>);

impl ReadThrough {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    fn set(&self, ns: u64) {
        self.0.store(ns, Ordering::Release);
    }
}

/// How long a record may stay reserved but not yet committed: one still
/// being written stops the reader, and every record reserved after it
/// waits behind it, so a record stamped just before a drain may come in
/// the next one. Far more than writing a record takes.
const COMMIT_SLACK_NS: u64 = 1_000_000;

/// Batches that may wait for the stories to catch up, at most. Past it the
/// ring reader waits, the ring fills, and the kernel counts what it could
/// not report: memory stays bounded (a few rings' worth) and no record is
/// lost uncounted.
pub const BATCHES_QUEUED: usize = 4;

/// The programs of one node, attached; dropping it detaches everything.
pub struct NodeProbe {
    /// Dropped inside `netns`: clsact filters are detached over netlink by
    /// ifindex, which means something only in the node's namespace.
    ebpf: ManuallyDrop<Ebpf>,
    netns: Namespace,
    mode: AttachMode,
    /// How kfree_skb was attached (tp_btf, or a raw tracepoint).
    pub drop_hook: DropHook,
    pub hooks: usize,
    /// The clsact filters this probe attached, as the run registry has them.
    filters: Vec<Record>,
}

impl Drop for NodeProbe {
    fn drop(&mut self) {
        let ebpf = &mut self.ebpf;
        let filters = std::mem::take(&mut self.filters);
        let detached = self.netns.run(|| {
            // SAFETY: dropped once, here, and never used again.
            unsafe { ManuallyDrop::drop(ebpf) };
            tc::released(&filters);
            Ok(())
        });
        if let Err(e) = detached {
            // TCX links close with the process; clsact filters stay
            // recorded, for the next start to remove.
            eprintln!("podtrace: cannot detach cleanly: {e:#}");
        }
    }
}

impl NodeProbe {
    /// Loads the programs, attaches the tc ones to `watched` inside the
    /// node's namespace, and the drop program to kfree_skb.
    pub fn attach(spec: &ProbeSpec<'_>, watched: &[Watched]) -> Result<Self> {
        // Whatever killed runs left goes first, in every mode.
        super::sweep::sweep_dead_runs()?;
        orphans::sweep_in(spec.netns);
        let _held = SignalsHeld::now();
        let mut ebpf = load_fitting_memlock(spec)?;
        flow_filter(&mut ebpf)?.replace(&[], spec.flows)?;
        flow_filter6(&mut ebpf)?.replace(&[], spec.flows6)?;
        if let Some(filter) = spec.filter {
            set_l4_filter(&mut ebpf, filter)?;
        }
        load_tunnel_trust(&mut ebpf, spec.tunnels)?;
        for name in tc::PROGRAMS {
            tc::program(&mut ebpf, name)?
                .load()
                .with_context(|| format!("the kernel refused {name}"))?;
        }
        // Only for an IPv6 pair: a kernel that refuses them may take long
        // to say so, and an IPv4 trace has no use for them.
        if !spec.flows6.is_empty() {
            if let Err(e) = tc::load_ipv6(&mut ebpf) {
                warn_ipv6_untraced(&e);
            }
        }
        let drop_hook = drops::attach(&mut ebpf, spec.btf, spec.drop_reasons)?;
        let mut probe = Self {
            ebpf: ManuallyDrop::new(ebpf),
            netns: spec.netns.clone(),
            mode: spec.mode,
            drop_hook,
            hooks: 0,
            filters: Vec::new(),
        };
        for iface in watched {
            probe.attach_interface(iface)?;
        }
        Ok(probe)
    }

    /// Attaches to both hooks of one more interface of the node.
    pub fn attach_interface(&mut self, iface: &Watched) -> Result<()> {
        let filters = self
            .netns
            .run(|| tc::attach_interface(&mut self.ebpf, iface, self.mode, &self.netns))?;
        self.filters.extend(filters);
        self.hooks += 2;
        Ok(())
    }

    /// Swaps traced pairs in the kernel filter (a pod came back with a new
    /// IP).
    pub fn replace_flows(&mut self, old: &[FlowKey], new: &[FlowKey]) -> Result<()> {
        flow_filter(&mut self.ebpf)?.replace(old, new)
    }

    /// Adds IPv6 pairs to the kernel's IPv6 filter (a connection followed
    /// to a backend learnt from conntrack).
    pub fn add_flows6(&mut self, new: &[FlowKey6]) -> Result<()> {
        flow_filter6(&mut self.ebpf)?.replace(&[], new)
    }

    /// Replaces `--proto`/`--port` (widened to a Service's target port
    /// learnt under way).
    pub fn replace_l4_filter(&mut self, filter: &L4Filter) -> Result<()> {
        set_l4_filter(&mut self.ebpf, filter)
    }

    /// Moves the ring buffer into a thread of its own that forwards every
    /// sighting. Not a task of the runtime: telling stories (a large
    /// write of JSON that the page cache may throttle) must never keep
    /// the ring from being drained, or a line-rate flow fills it.
    pub fn stream(&mut self, tx: mpsc::Sender<Batch>) -> Result<ReadThrough> {
        let map = self
            .ebpf
            .take_map(names::SIGHTINGS)
            .ok_or_else(|| anyhow!("no SIGHTINGS map"))?;
        let ring = RingBuf::try_from(map)?;
        let read_through = ReadThrough::default();
        let progress = read_through.clone();
        std::thread::Builder::new()
            .name("podtrace-ring".into())
            .spawn(move || read_ring(ring, &tx, &progress))
            .context("cannot start the ring buffer reader")?;
        Ok(read_through)
    }

    /// Profile mode's step histograms, summed over CPUs.
    pub fn steps(&self) -> Result<Vec<(StepKey, Histogram)>> {
        super::profile::read_steps(&self.ebpf)
    }

    /// Records the kernel could not report so far: (ring buffer full,
    /// header copy failed).
    pub fn losses(&self) -> Result<(u64, u64)> {
        let counters = self.counters()?;
        Ok((
            counters[counter::RINGBUF_FULL as usize],
            counters[counter::SNAPSHOT_FAILED as usize],
        ))
    }

    /// Sightings of the traced pairs that `--proto`/`--port` left out,
    /// and tunnel packets between traced addresses carrying other pairs.
    pub fn left_out(&self) -> Result<(u64, u64)> {
        let counters = self.counters()?;
        Ok((
            counters[counter::FILTERED as usize],
            counters[counter::CARRIED_OTHER_PAIR as usize],
        ))
    }

    /// Profile mode: steps not measured because the packet's stamp was
    /// taken by another packet in flight.
    pub fn stamps_evicted(&self) -> Result<u64> {
        Ok(self.counters()?[counter::STAMP_EVICTED as usize])
    }

    /// The kernel-side loss counters, summed over CPUs.
    fn counters(&self) -> Result<[u64; counter::COUNT as usize]> {
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

/// The eBPF object loaded with `spec`'s globals and its ring buffer, the
/// ring halved while the kernel refuses the maps for lack of locked
/// memory (see `memlock`).
fn load_fitting_memlock(spec: &ProbeSpec<'_>) -> Result<Ebpf> {
    let limit = memlock::raise();
    let mut ring_bytes = spec.ring_bytes;
    loop {
        match load_object(spec, ring_bytes) {
            Ok(ebpf) => {
                if let (true, Some(limit)) = (ring_bytes < spec.ring_bytes, limit) {
                    memlock::say_shrunk(spec.ring_bytes, ring_bytes, limit);
                }
                return Ok(ebpf);
            }
            Err(e) if memlock::refused_map(&e) => match limit {
                Some(_) if ring_bytes / 2 >= memlock::SMALLEST_RING => ring_bytes /= 2,
                Some(limit) => bail!("{}", memlock::too_low(limit)),
                None => return Err(e).context("cannot load the eBPF programs"),
            },
            Err(e) => return Err(e).context("cannot load the eBPF programs"),
        }
    }
}

fn load_object(spec: &ProbeSpec<'_>, ring_bytes: u32) -> Result<Ebpf, aya::EbpfError> {
    let stamps = spec.shared_stamps.map(|dir| dir.join(names::STAMPS));
    let tag_prefix = spec.tunnels.wireguard_tag_prefix();
    let mut loader = EbpfLoader::new();
    if let Some(path) = &stamps {
        loader.map_pin_path(names::STAMPS, path.as_path());
    }
    loader
        .override_global(names::NODE_ID, &spec.node_id, true)
        .override_global(names::LAYOUT, spec.layout, true)
        .override_global(names::NETNS_INUM, &spec.netns.inum, true)
        .override_global(names::TRACED_NETNS, spec.traced_netns, true)
        .override_global(names::PROFILE, &u32::from(spec.profile), true)
        .override_global(names::SAMPLE, &spec.sample, true)
        .override_global(names::FILTERING, &u32::from(spec.filter.is_some()), true)
        .override_global(names::WAKE_BYTES, &(u64::from(ring_bytes) / 4), true)
        .override_global(names::TUNNEL_PORTS, &spec.tunnels.udp_ports(), true)
        .override_global(names::WIREGUARD_TAG_PREFIX, &tag_prefix, true)
        .map_max_entries(names::SIGHTINGS, ring_bytes)
        .load(EBPF_OBJECT)
}

/// Says once that this kernel refused the IPv6 programs: IPv4 is traced
/// as ever, IPv6 packets are not seen at tc.
fn warn_ipv6_untraced(e: &anyhow::Error) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!("podtrace: IPv6 packets are not traced on this kernel: {e:#}");
    });
}

/// Drains `ring` whenever it wakes us (a quarter full) or `RING_POLL`
/// has passed, until nobody listens.
fn read_ring(mut ring: RingBuf<MapData>, tx: &mpsc::Sender<Batch>, progress: &ReadThrough) {
    let fd = ring.as_raw_fd();
    loop {
        let started = monotonic_ns();
        if !drain(&mut ring, tx) || tx.is_closed() {
            break;
        }
        progress.set(started.saturating_sub(COMMIT_SLACK_NS));
        let mut ready = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the ring owns the fd for this whole
        // loop. An error (EINTR) is only an early drain.
        unsafe { libc::poll(&mut ready, 1, RING_POLL.as_millis() as i32) };
    }
}

/// Forwards every record waiting in `ring`, as one batch; false once
/// nobody listens.
fn drain(ring: &mut RingBuf<MapData>, tx: &mpsc::Sender<Batch>) -> bool {
    let mut batch = Batch::new();
    while let Some(item) = ring.next() {
        if item.len() >= std::mem::size_of::<Sighting>() {
            // SAFETY: the kernel wrote a whole Sighting here.
            batch.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<Sighting>()) });
        }
    }
    batch.is_empty() || tx.blocking_send(batch).is_ok()
}

/// Fills the hash map `name`, a set (every value 1), with `keys`.
fn fill_set<K: aya::Pod>(ebpf: &mut Ebpf, name: &str, keys: &[K]) -> Result<()> {
    let mut set: BpfHashMap<_, K, u8> = BpfHashMap::try_from(map(ebpf, name)?)?;
    for key in keys {
        set.insert(key, 1, 0)?;
    }
    Ok(())
}

/// Fills the maps that say where a packet's inner header may be read.
fn load_tunnel_trust(ebpf: &mut Ebpf, trust: &TunnelTrust) -> Result<()> {
    fill_set::<u32>(ebpf, names::TUNNEL_HOOKS, &trust.hooks)?;
    fill_set::<TunnelKey>(ebpf, names::TUNNELS, &trust.tunnels)?;
    fill_set::<u32>(ebpf, names::WIREGUARD_DEVICES, &trust.wireguard_devices)?;
    let v4 = |ip: &IpAddr| match ip {
        IpAddr::V4(v4) => Some(v4.octets()),
        IpAddr::V6(_) => None,
    };
    let v6 = |ip: &IpAddr| match ip {
        IpAddr::V6(v6) => Some(v6.octets()),
        IpAddr::V4(_) => None,
    };
    load_node_addrs(ebpf, names::NODE_ADDRS, trust, v4, node_addr::ANY)?;
    load_node_addrs(ebpf, names::NODE_ADDRS6, trust, v6, node_addr::ANY6)
}

/// One family's node addresses (`NODE_ADDRS` or `NODE_ADDRS6`): the
/// node's own, its peers', or, where no peer of the family is known,
/// `any`.
fn load_node_addrs<K: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &str,
    trust: &TunnelTrust,
    key: impl Fn(&IpAddr) -> Option<K>,
    any: K,
) -> Result<()> {
    let mut addrs: BpfHashMap<_, K, u8> = BpfHashMap::try_from(map(ebpf, name)?)?;
    for ip in trust.local.iter().filter_map(&key) {
        addrs.insert(ip, node_addr::LOCAL, 0)?;
    }
    let mut peers = trust.peers.iter().filter_map(&key).peekable();
    if peers.peek().is_none() {
        addrs.insert(any, node_addr::PEER, 0)?;
    }
    for ip in peers {
        addrs.insert(ip, node_addr::PEER, 0)?;
    }
    Ok(())
}

fn set_l4_filter(ebpf: &mut Ebpf, filter: &L4Filter) -> Result<()> {
    let mut array: BpfArray<_, L4Filter> = BpfArray::try_from(map(ebpf, names::L4_FILTER)?)?;
    array.set(0, filter, 0)?;
    Ok(())
}

fn map<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::maps::Map> {
    ebpf.map_mut(name).ok_or_else(|| anyhow!("no {name} map"))
}

/// The kernel's filter of traced pairs of one family (both eBPF programs
/// read it), and its pre-filter.
struct FlowFilter<'a, K: aya::Pod>
where
    TracedPairsOf<K>: aya::Pod,
{
    flows: BpfHashMap<&'a mut MapData, K, u8>,
    prefilter: BpfArray<&'a mut MapData, TracedPairsOf<K>>,
}

/// The IPv4 flow filter (`FLOWS`, `TRACED_PAIRS`).
fn flow_filter(ebpf: &mut Ebpf) -> Result<FlowFilter<'_, FlowKey>> {
    flow_filter_of(ebpf, names::FLOWS, names::TRACED_PAIRS)
}

/// The IPv6 flow filter (`FLOWS6`, `TRACED_PAIRS6`).
fn flow_filter6(ebpf: &mut Ebpf) -> Result<FlowFilter<'_, FlowKey6>> {
    flow_filter_of(ebpf, names::FLOWS6, names::TRACED_PAIRS6)
}

fn flow_filter_of<'a, K: aya::Pod>(
    ebpf: &'a mut Ebpf,
    flows_name: &str,
    prefilter_name: &str,
) -> Result<FlowFilter<'a, K>>
where
    TracedPairsOf<K>: aya::Pod,
{
    let [flows, prefilter] = ebpf.maps_disjoint_mut([flows_name, prefilter_name]);
    let flows = flows.ok_or_else(|| anyhow!("no {flows_name} map"))?;
    let prefilter = prefilter.ok_or_else(|| anyhow!("no {prefilter_name} map"))?;
    Ok(FlowFilter {
        flows: BpfHashMap::try_from(flows)?,
        prefilter: BpfArray::try_from(prefilter)?,
    })
}

impl<K: aya::Pod + PairKey> FlowFilter<'_, K>
where
    TracedPairsOf<K>: aya::Pod,
{
    /// Traces `new` instead of `old`, while the programs run: the
    /// pre-filter widened to both with FLOWS deciding, FLOWS changed, then
    /// the pre-filter settled on what FLOWS holds (`TracedPairs`).
    fn replace(&mut self, old: &[K], new: &[K]) -> Result<()> {
        let current = self.pairs()?;
        let before = self.prefilter.get(&0, 0)?;
        self.prefilter
            .set(0, before.widened(current.iter().chain(new)), 0)?;
        for key in old {
            // Absent already is fine: the pair may have changed twice.
            let _ = self.flows.remove(key);
        }
        for key in new {
            self.flows.insert(key, 1, 0)?;
        }
        for step in TracedPairsOf::settled(&self.pairs()?) {
            self.prefilter.set(0, step, 0)?;
        }
        Ok(())
    }

    fn pairs(&self) -> Result<Vec<K>> {
        Ok(self.flows.keys().collect::<Result<_, _>>()?)
    }
}
