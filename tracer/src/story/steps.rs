//! Profile mode's table (`podtrace profile`): the kernel's per-step
//! histograms as percentiles, encapsulation bytes and each step's share of
//! its direction's end-to-end time. Pure: tested without a kernel.

use std::collections::BTreeMap;

use podtrace_common::profile::{Histogram, HIST_LINEAR_US, HIST_LOG2};
use serde::Serialize;

/// One step of one node, from the kernel's histogram.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelStep {
    pub node: String,
    /// `node/iface:direction`, as `--profile` names hooks.
    pub from: String,
    pub to: String,
    pub packets: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// Mean skb length change: + for an encapsulation, − for a
    /// decapsulation.
    pub bytes_added: i64,
    /// Of the end-to-end time of the chain of steps this one is in.
    pub share: f64,
    /// Non-empty buckets: [from µs, to µs), packets.
    pub buckets: Vec<(f64, f64, u64)>,
}

/// Buckets of a histogram in µs: linear ones, then log2 ones.
fn buckets(h: &Histogram) -> Vec<(f64, f64, u64)> {
    let linear = (0..HIST_LINEAR_US).map(|i| (i as f64, i as f64 + 1.0, h.linear[i]));
    let log2 = (0..HIST_LOG2).map(|k| {
        let lo = (1u64 << k) as f64 / 1e3;
        (lo.max(HIST_LINEAR_US as f64), lo * 2.0, h.log2[k])
    });
    linear.chain(log2).filter(|b| b.2 > 0).collect()
}

/// The `q` quantile: the middle of the bucket it falls in, at most `max`.
fn quantile(buckets: &[(f64, f64, u64)], count: u64, q: f64, max_us: f64) -> f64 {
    let rank = ((count as f64 * q).ceil() as u64).max(1);
    let mut seen = 0;
    for (lo, hi, n) in buckets {
        seen += n;
        if seen >= rank {
            return ((lo + hi) / 2.0).min(max_us);
        }
    }
    max_us
}

/// A step of `node` (hooks already named) with its histogram.
pub fn step(node: &str, from: String, to: String, h: &Histogram) -> KernelStep {
    let b = buckets(h);
    let max_us = h.max_ns as f64 / 1e3;
    let count = h.count.max(1);
    KernelStep {
        node: node.to_string(),
        from,
        to,
        packets: h.count,
        p50_us: quantile(&b, count, 0.5, max_us),
        p90_us: quantile(&b, count, 0.9, max_us),
        p99_us: quantile(&b, count, 0.99, max_us),
        max_us,
        mean_us: h.sum_ns as f64 / count as f64 / 1e3,
        bytes_added: (h.bytes_added as i64) / count as i64,
        share: 0.0,
        buckets: b,
    }
}

/// Orders steps along their chains (each direction of the flow is one
/// chain of hooks) and sets each step's share of its chain's time.
pub fn chain(mut steps: Vec<KernelStep>) -> Vec<KernelStep> {
    // The busiest step into each hook is the one the chain follows.
    let mut into: BTreeMap<String, usize> = BTreeMap::new();
    for (i, s) in steps.iter().enumerate() {
        let busier = into
            .get(&s.to)
            .is_none_or(|&j| steps[j].packets < s.packets);
        if busier {
            into.insert(s.to.clone(), i);
        }
    }
    let root_of = |mut i: usize| {
        let mut hops = 0;
        while let Some(&j) = into.get(&steps[i].from) {
            if j == i || hops > steps.len() {
                break;
            }
            i = j;
            hops += 1;
        }
        (steps[i].from.clone(), hops)
    };
    let keys: Vec<(String, usize)> = (0..steps.len()).map(root_of).collect();
    // Only steps on a chain add to its time: not a rare shortcut past a
    // hook (a packet one hook missed).
    let mut totals: BTreeMap<String, f64> = BTreeMap::new();
    for (i, (s, (root, _))) in steps.iter().zip(&keys).enumerate() {
        let on_chain = into.get(&s.to) == Some(&i);
        *totals.entry(root.clone()).or_default() += if on_chain { s.mean_us } else { 0.0 };
    }
    for (s, (root, _)) in steps.iter_mut().zip(&keys) {
        let total = totals[root];
        s.share = if total > 0.0 {
            (s.mean_us / total).min(1.0)
        } else {
            0.0
        };
    }
    let mut ordered: Vec<(KernelStep, (String, usize))> = steps.into_iter().zip(keys).collect();
    ordered.sort_by(|a, b| a.1.cmp(&b.1));
    ordered.into_iter().map(|(s, _)| s).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(samples_us: &[f64]) -> Histogram {
        let mut h = crate::probe::profile::empty();
        for &us in samples_us {
            let ns = (us * 1e3) as u64;
            h.count += 1;
            h.sum_ns += ns;
            h.max_ns = h.max_ns.max(ns);
            h.bytes_added = h.bytes_added.wrapping_add(50);
            if (us as usize) < HIST_LINEAR_US {
                h.linear[us as usize] += 1;
            } else {
                h.log2[ns.ilog2() as usize] += 1;
            }
        }
        h
    }

    #[test]
    fn percentiles_from_buckets() {
        let samples: Vec<f64> = (0..100).map(|i| i as f64 + 0.5).collect();
        let s = step("n1", "a".into(), "b".into(), &histogram(&samples));
        assert_eq!(s.packets, 100);
        assert_eq!((s.p50_us, s.p90_us, s.p99_us), (49.5, 89.5, 98.5));
        assert_eq!(s.bytes_added, 50);
        let slow = step("n1", "a".into(), "b".into(), &histogram(&[300.0]));
        // 300 µs falls in [262.1, 524.3) µs; the max bounds the estimate.
        assert_eq!(slow.p50_us, 300.0);
    }

    #[test]
    fn shares_per_chain() {
        let h = |us: f64| histogram(&[us]);
        let steps = vec![
            step(
                "n1",
                "n1/cni0:ingress".into(),
                "n1/eth0:egress".into(),
                &h(30.0),
            ),
            step(
                "n1",
                "n1/veth:ingress".into(),
                "n1/cni0:ingress".into(),
                &h(10.0),
            ),
            step(
                "n1",
                "n1/eth0:ingress".into(),
                "n1/veth:egress".into(),
                &h(5.0),
            ),
        ];
        let steps = chain(steps);
        assert_eq!(steps[0].from, "n1/eth0:ingress");
        assert_eq!(steps[0].share, 1.0);
        assert_eq!(steps[1].from, "n1/veth:ingress");
        assert!((steps[1].share - 0.25).abs() < 1e-9);
    }
}
