//! Profile mode's kernel side, read: the per-CPU step histograms of one
//! node's probe (`tracer-ebpf/src/profile.rs` writes them), summed.

use anyhow::{anyhow, Result};
#[cfg(target_os = "linux")]
use aya::{
    maps::{MapData, PerCpuHashMap},
    Ebpf,
};
use podtrace_common::{
    names,
    profile::{Histogram, StepKey, HIST_LINEAR_US, HIST_LOG2},
};

#[cfg(target_os = "linux")]
/// Every step of the node and its histogram, all CPUs added up.
pub fn read_steps(ebpf: &Ebpf) -> Result<Vec<(StepKey, Histogram)>> {
    let map = ebpf
        .map(names::STEPS)
        .ok_or_else(|| anyhow!("no {} map", names::STEPS))?;
    let steps: PerCpuHashMap<&MapData, StepKey, Histogram> = PerCpuHashMap::try_from(map)?;
    let mut out = Vec::new();
    for entry in steps.iter() {
        let (key, per_cpu) = entry?;
        let mut sum = empty();
        for h in per_cpu.iter() {
            merge(&mut sum, h);
        }
        out.push((key, sum));
    }
    out.sort_by_key(|(k, _)| *k);
    Ok(out)
}

pub fn empty() -> Histogram {
    Histogram {
        count: 0,
        sum_ns: 0,
        max_ns: 0,
        bytes_added: 0,
        linear: [0; HIST_LINEAR_US],
        log2: [0; HIST_LOG2],
    }
}

/// Adds `h` into `sum`.
pub fn merge(sum: &mut Histogram, h: &Histogram) {
    sum.count += h.count;
    sum.sum_ns += h.sum_ns;
    sum.max_ns = sum.max_ns.max(h.max_ns);
    sum.bytes_added = sum.bytes_added.wrapping_add(h.bytes_added);
    for (s, v) in sum.linear.iter_mut().zip(&h.linear) {
        *s += v;
    }
    for (s, v) in sum.log2.iter_mut().zip(&h.log2) {
        *s += v;
    }
}
