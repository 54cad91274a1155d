//! The datapath profile (`--profile`): latency of every hop-to-hop step
//! over all stories, so an encapsulation path can be measured on the real
//! datapath (veth → cni0 → flannel.1 → eth0, wire, and back).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{decode::hop::Direction, story::Story};

/// One step between two consecutive hooks of a journey.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
pub struct Step {
    pub from: String,
    pub to: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct StepLatency {
    #[serde(flatten)]
    pub step: Step,
    pub count: usize,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

#[derive(Default)]
pub struct Profile {
    samples: BTreeMap<Step, Vec<f64>>,
}

fn hook(node: &str, iface: &str, direction: Direction) -> String {
    format!("{node}/{iface}:{}", direction.label())
}

impl Profile {
    pub fn add(&mut self, story: &Story) {
        for pair in story.hops.windows(2) {
            let step = Step {
                from: hook(&pair[0].node, &pair[0].iface, pair[0].direction),
                to: hook(&pair[1].node, &pair[1].iface, pair[1].direction),
            };
            self.samples
                .entry(step)
                .or_default()
                .push(pair[1].t_us - pair[0].t_us);
        }
    }

    /// Per step, most frequent first.
    pub fn latencies(&self) -> Vec<StepLatency> {
        let mut out: Vec<StepLatency> = self
            .samples
            .iter()
            .map(|(step, samples)| {
                let mut sorted = samples.clone();
                sorted.sort_by(f64::total_cmp);
                let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
                StepLatency {
                    step: step.clone(),
                    count: sorted.len(),
                    p50_us: at(0.5),
                    p90_us: at(0.9),
                    p99_us: at(0.99),
                    max_us: sorted[sorted.len() - 1],
                }
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.step.cmp(&b.step)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{node::interfaces::Role, story::HopLine};

    fn line(t_us: f64, iface: &str, direction: Direction) -> HopLine {
        HopLine {
            t_us,
            clock_uncertainty_us: None,
            node: "n1".into(),
            iface: iface.into(),
            role: Role::PodVeth,
            direction,
            skb_len: 98,
            ttl: 64,
            mark: 0,
            tunnel: None,
            route: None,
            note: String::new(),
            nat: Vec::new(),
        }
    }

    #[test]
    fn percentiles_per_step() {
        let mut profile = Profile::default();
        let template = crate::story::tests::sample_story();
        for i in 0..100 {
            let mut story = template.clone();
            story.hops = vec![
                line(0.0, "veth", Direction::Ingress),
                line(f64::from(i + 1), "cni0", Direction::Ingress),
            ];
            profile.add(&story);
        }
        let steps = profile.latencies();
        assert_eq!(steps.len(), 1);
        let s = &steps[0];
        assert_eq!(
            (s.step.from.as_str(), s.step.to.as_str()),
            ("n1/veth:ingress", "n1/cni0:ingress")
        );
        assert_eq!(s.count, 100);
        assert_eq!(
            (s.p50_us, s.p90_us, s.p99_us, s.max_us),
            (51.0, 90.0, 99.0, 100.0)
        );
    }
}
