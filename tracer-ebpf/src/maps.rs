//! Maps and globals shared by every podtrace program.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuArray, RingBuf},
};
use podtrace_common::{counter, FlowKey};

use crate::kernel::{contains, global, with_per_cpu};

/// Both directions of every traced pair, with room to spare.
const MAX_FLOWS: u32 = 1024;

/// 4 MiB: a burst of some 20,000 sightings before userspace must drain.
const SIGHTINGS_BYTES: u32 = 1 << 22;

/// Traced (src, dst) pairs; filled by userspace.
#[map(name = "FLOWS")]
pub static FLOWS: HashMap<FlowKey, u8> = HashMap::with_max_entries(MAX_FLOWS, 0);

#[map(name = "SIGHTINGS")]
pub static SIGHTINGS: RingBuf = RingBuf::with_byte_size(SIGHTINGS_BYTES, 0);

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Which traced node (network namespace) this instance serves; userspace
/// sets it at load time, one program instance per namespace.
#[unsafe(no_mangle)]
pub static NODE_ID: u32 = 0;

#[inline(always)]
pub fn node_id() -> u32 {
    global(&NODE_ID)
}

#[inline(always)]
pub fn is_traced(key: &FlowKey) -> bool {
    contains(&FLOWS, key)
}

#[inline(always)]
pub fn bump(index: u32) {
    with_per_cpu(&COUNTERS, index, |count| *count += 1);
}
