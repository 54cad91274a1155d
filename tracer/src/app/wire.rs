//! What an agent tells its front-end, one JSON object per line on its
//! stdout, which the front-end reads back through the API (`pods/log`).
//!
//! Every record carries a sequence number: a gap is a transport loss. The
//! pod log also holds the agent's stderr (kubelets merge the streams), so
//! a line that is not a record is a message, relayed as it is.

use std::{collections::HashMap, net::IpAddr};

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};

use crate::model::conntrack;
use crate::{
    cni,
    decode::hop::Hop,
    model::netfilter::NetfilterRule,
    model::{Finding, KernelSummary, ProbeResult, Summary},
    node::{wireguard::WireGuard, NodeFacts, NodeView},
};

/// One line of an agent's output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub seq: u64,
    #[serde(flatten)]
    pub record: Record,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// First: the node as the agent found it, and its clock.
    Start(Box<Start>),
    /// A sighting, placed on its interface (kernel time of the agent's node).
    Hop(Box<Hop>),
    /// The netfilter rule that dropped a traced packet.
    Rule {
        src: IpAddr,
        dst: IpAddr,
        ip_id: u16,
        rule: NetfilterRule,
        at_ns: u64,
    },
    /// A translated connection of the traced pair, from the node's
    /// conntrack, and until when (kernel time) its translated addresses
    /// were not traced (0: always were).
    Conntrack {
        entry: conntrack::Entry,
        untraced_until_ns: u64,
    },
    /// Records lost between two kernel times: by the kernel (ring buffer
    /// full, header copy failed) or by the agent (its output queue full).
    Loss {
        from_ns: u64,
        to_ns: u64,
        kernel: u64,
        agent: u64,
    },
    /// Hooks attached now (an interface came or went).
    Hooks { hooks: usize },
    /// How far the agent has read its ring buffer (kernel time): every
    /// sighting stamped before `at_ns` was sent before this record. The
    /// front-end finishes no journey past the slowest agent's.
    ReadThrough { at_ns: u64 },
    /// `--probe`, from the source's node: a probe goes out on this flow
    /// (source port, or echo identifier).
    ProbeSending { flow: u16 },
    /// `--probe`: one probe's result, and its flow.
    Probe { flow: u16, result: Box<ProbeResult> },
    /// The node's WireGuard state read again: the first read, then when a
    /// story would be judged otherwise by it than by the last one sent, at
    /// least every 10 s, and why it is not read once reads failed 10 s.
    Wireguard(Box<WireGuard>),
    /// Last: the agent's own counts.
    Summary(Box<Summary>),
    /// A record a newer agent sends that this front-end does not know:
    /// numbered like the others, so it is no transport loss, and skipped.
    #[serde(other)]
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Start {
    pub node: String,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC at start, in ns: the node's kernel
    /// times on the wall clock (plus any skew injected for testing).
    pub realtime_offset_ns: i64,
    /// "eth0, cni0, flannel.1, 1 pod veth".
    pub watched: String,
    pub hooks: usize,
    pub facts: WireFacts,
    /// It sends `ReadThrough` records. Older agents do not: nothing
    /// waits for theirs.
    #[serde(default)]
    pub reports_read_through: bool,
    /// The doctor's failing checks on the node (its files read from the
    /// host's root the agent's pod mounts), for the verdicts that have no
    /// packet to blame, as node mode joins them. Older agents send none.
    #[serde(default)]
    pub doctor: Vec<Finding>,
    /// The node's kernel, and what podtrace does without there. Older
    /// agents send none.
    #[serde(default)]
    pub kernel: Option<KernelSummary>,
    /// Why a netfilter drop on the node may have no traced rule (its
    /// iptables-legacy rules), where rule tracing cannot see them all.
    #[serde(default)]
    pub rules_unseen: Option<String>,
}

/// [`NodeFacts`] as they travel (the CNI by its name).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireFacts {
    pub view: NodeView,
    pub forwarding: bool,
    pub cni: String,
    pub local_pod_subnets: Vec<IpNet>,
    pub pod_interfaces: Vec<(IpAddr, String)>,
    pub inferred_pod_cidr: Option<(Ipv4Net, String)>,
}

impl From<&NodeFacts> for WireFacts {
    fn from(f: &NodeFacts) -> Self {
        Self {
            view: f.view.clone(),
            forwarding: f.forwarding,
            cni: f.cni.to_string(),
            local_pod_subnets: f.local_pod_subnets.clone(),
            pod_interfaces: f.pod_interfaces.clone(),
            inferred_pod_cidr: f.inferred_pod_cidr.clone(),
        }
    }
}

impl From<WireFacts> for NodeFacts {
    fn from(f: WireFacts) -> Self {
        Self {
            view: f.view,
            forwarding: f.forwarding,
            cni: cni::by_name(&f.cni).map_or("unknown", |b| b.name()),
            local_pod_subnets: f.local_pod_subnets,
            pod_interfaces: f.pod_interfaces,
            inferred_pod_cidr: f.inferred_pod_cidr,
        }
    }
}

/// Numbers records as they are written.
#[derive(Default)]
pub struct Numbering {
    next: u64,
}

impl Numbering {
    /// The record as one line of JSON, without the newline.
    pub fn line(&mut self, record: Record) -> String {
        let line = Line {
            seq: self.next,
            record,
        };
        self.next += 1;
        serde_json::to_string(&line).unwrap_or_default()
    }
}

/// What the front-end reads from one agent's log.
#[derive(Debug, PartialEq)]
pub enum Read {
    Record(Record),
    /// Not a record: a message the agent wrote to stderr.
    Message(String),
}

/// Reads one agent's lines and counts the gaps in their numbering.
#[derive(Default)]
pub struct Reader {
    expected: u64,
    pub lost: u64,
}

impl Reader {
    pub fn read(&mut self, text: &str) -> Read {
        match serde_json::from_str::<Line>(text) {
            Ok(line) => {
                self.lost += line.seq.saturating_sub(self.expected);
                self.expected = line.seq + 1;
                Read::Record(line.record)
            }
            Err(_) => Read::Message(text.to_string()),
        }
    }
}

/// Agents' counts by node, for the summary.
pub type PerNode = HashMap<String, Summary>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_in_the_numbering_are_transport_losses() {
        let mut out = Numbering::default();
        let lines: Vec<String> = (0..4)
            .map(|n| out.line(Record::Hooks { hooks: n }))
            .collect();
        let mut reader = Reader::default();
        assert_eq!(
            reader.read(&lines[0]),
            Read::Record(Record::Hooks { hooks: 0 })
        );
        reader.read(&lines[3]);
        assert_eq!(reader.lost, 2);
        assert_eq!(
            reader.read("podtrace: node-1: hello"),
            Read::Message("podtrace: node-1: hello".into())
        );
    }

    #[test]
    fn an_older_agents_start_without_findings_still_parses() {
        let mut start = Start {
            node: "node-2".into(),
            realtime_offset_ns: 7,
            watched: "eth0".into(),
            hooks: 2,
            facts: WireFacts::from(&NodeFacts::default()),
            reports_read_through: true,
            doctor: vec![Finding {
                family: "flannel".into(),
                check: "subnet.env".into(),
                evidence: "/run/flannel/subnet.env is missing".into(),
                fix: Some("check flanneld".into()),
            }],
            kernel: Some(KernelSummary {
                release: "5.10.0-32-amd64".into(),
                degraded: vec!["clsact instead of TCX (needs 6.6)".into()],
            }),
            rules_unseen: None,
        };
        let line = Numbering::default().line(Record::Start(Box::new(start.clone())));
        let mut reader = Reader::default();
        assert_eq!(
            reader.read(&line),
            Read::Record(Record::Start(Box::new(start.clone())))
        );
        // As an agent before the field wrote it.
        let mut old: serde_json::Value = serde_json::from_str(&line).unwrap();
        old.as_object_mut().unwrap().remove("doctor");
        old.as_object_mut().unwrap().remove("kernel");
        start.doctor.clear();
        start.kernel = None;
        assert_eq!(
            Reader::default().read(&old.to_string()),
            Read::Record(Record::Start(Box::new(start)))
        );
    }

    #[test]
    fn an_icmp_errors_quoted_header_reaches_the_front_end() {
        use crate::{
            decode::{
                hop::{tests::hop, Direction},
                quote::tests::{error, icmp_frame, udp},
            },
            node::interfaces::Role,
        };
        let datagram = udp([10, 0, 1, 2], [10, 0, 2, 2], 40000, 5354);
        let frame = icmp_frame([10, 0, 2, 2], [10, 0, 1, 2], &error(3, 3, &datagram));
        let sent = hop(
            1,
            "node-1",
            "vethA",
            Role::PodVeth,
            Direction::Egress,
            &frame,
        );
        assert!(sent.packet.quoted.is_some());
        let line = Numbering::default().line(Record::Hop(Box::new(sent.clone())));
        let Read::Record(Record::Hop(read)) = Reader::default().read(&line) else {
            panic!("not a hop: {line}");
        };
        assert_eq!(read.packet, sent.packet);
    }

    /// `--write` in cluster mode: the header bytes an agent kept reach the
    /// front-end as they were; without `--write` a hop carries none.
    #[test]
    fn a_hops_header_bytes_travel_only_when_kept() {
        use crate::{
            decode::hop::{tests::hop, Direction, Snapshot},
            node::interfaces::Role,
        };
        let frame = crate::decode::tests::icmp_echo([10, 0, 1, 2], [10, 0, 2, 2], 8, 7);
        let mut sent = hop(
            1,
            "node-1",
            "eth0",
            Role::Underlay,
            Direction::Egress,
            &frame,
        );
        sent.snapshot = Snapshot::default();
        let bare = Numbering::default().line(Record::Hop(Box::new(sent.clone())));
        assert!(!bare.contains("snapshot"), "{bare}");
        sent.snapshot = Snapshot {
            bytes: frame.clone(),
            has_l2: true,
        };
        let line = Numbering::default().line(Record::Hop(Box::new(sent.clone())));
        let Read::Record(Record::Hop(read)) = Reader::default().read(&line) else {
            panic!("not a hop: {line}");
        };
        assert_eq!(*read, sent);
        assert!(
            line.len() < bare.len() + frame.len() * 2,
            "base64, not numbers: {line}"
        );
    }

    #[test]
    fn a_record_of_a_newer_agent_is_skipped_and_not_lost() {
        let mut reader = Reader::default();
        let newer = r#"{"seq":0,"type":"from_the_future","at_ns":7}"#;
        assert_eq!(reader.read(newer), Read::Record(Record::Unknown));
        reader.read(r#"{"seq":1,"type":"hooks","hooks":3}"#);
        assert_eq!(reader.lost, 0);
    }
}
