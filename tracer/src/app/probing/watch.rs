//! Which stories are the probes': the teller tells only those, counts the
//! pair's other traffic as skipped, and keeps the verdict of each probe
//! packet that failed, for the probe's result.

use std::collections::{HashMap, HashSet};

use crate::{
    decode::Transport,
    model::{ProbeKind, ProbeResult},
    story::{journey::Journey, Outcome, Story},
};

/// The probes' flows, as they are sent.
pub(in crate::app) struct ProbeWatch {
    kind: ProbeKind,
    /// Source ports (TCP, UDP) or echo identifiers (ICMP).
    flows: HashSet<u16>,
    /// The verdict of each probe's last packet that was not delivered, by
    /// its flow and ICMP sequence number (0 for TCP, UDP): a raw socket's
    /// echoes share one identifier.
    failed: HashMap<(u16, u16), String>,
    /// Stories of the pair that were not the probes'.
    pub skipped: u64,
}

impl ProbeWatch {
    pub fn new(kind: ProbeKind) -> Self {
        Self {
            kind,
            flows: HashSet::new(),
            failed: HashMap::new(),
            skipped: 0,
        }
    }

    /// A probe is about to be sent on `flow`.
    pub fn sending(&mut self, flow: u16) {
        self.flows.insert(flow);
    }

    /// The probe `journey`'s packet belongs to (its flow, and ICMP's
    /// sequence number): either way, and an ICMP error about a probe too.
    pub fn flow_of(&self, journey: &Journey) -> Option<(u16, u16)> {
        let transport = journey.hops.first()?.packet.packet.transport;
        let flow = match (self.kind, transport) {
            (ProbeKind::Tcp(_), Transport::Tcp { sport, dport, .. })
            | (ProbeKind::Udp(_), Transport::Udp { sport, dport }) => [sport, dport]
                .into_iter()
                .find(|p| self.flows.contains(p))
                .map(|flow| (flow, 0)),
            (
                ProbeKind::Icmp,
                Transport::Icmp {
                    id,
                    seq,
                    icmp_type: 0 | 8,
                    ..
                },
            ) => self.flows.contains(&id).then_some((id, seq)),
            // An error about a probe quotes it; whose, the probe's own
            // socket reads: take it as the probes'.
            (
                _,
                Transport::Icmp {
                    icmp_type: 3 | 11, ..
                },
            ) => self.flows.iter().next().map(|flow| (*flow, 0)),
            _ => None,
        };
        flow
    }

    /// `story` of probe `flow` (and ICMP sequence number) was told.
    pub fn told(&mut self, flow: (u16, u16), story: &Story) {
        if !matches!(story.verdict.outcome, Outcome::Delivered { .. }) {
            self.failed.insert(flow, story.verdict.summary.clone());
        }
    }

    /// Which of the stories told of `flows` (in the order told) is the
    /// last of `result`'s probe: by its flow, and for ICMP by its echo
    /// sequence too where the probes shared one identifier (a raw socket).
    pub fn last_story_of(&self, flows: &[(u16, u16)], result: &ProbeResult) -> Option<usize> {
        let of_the_probe = |exact: bool| {
            flows.iter().rposition(|&(flow, seq)| {
                flow == result.flow_id
                    && (!exact || self.kind != ProbeKind::Icmp || u32::from(seq) == result.seq)
            })
        };
        of_the_probe(true).or_else(|| of_the_probe(false))
    }

    /// `result`, with the verdict of its packet that failed beside it.
    pub fn explained(&self, mut result: ProbeResult) -> ProbeResult {
        if !result.answered {
            let seq = match self.kind {
                ProbeKind::Icmp => result.seq as u16,
                _ => 0,
            };
            let verdict = self
                .failed
                .get(&(result.flow_id, seq))
                .or_else(|| self.failed.get(&(result.flow_id, 0)));
            if let Some(verdict) = verdict {
                result.result = format!("{}: {verdict}", result.result);
            }
        }
        result
    }
}
