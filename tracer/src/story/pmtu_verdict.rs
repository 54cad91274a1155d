//! What became of the ICMP error a too-big packet's drop sent its sender
//! (JSON `verdict.pmtu`), and its words.

use serde::Serialize;

/// What became of the error the kernel sent about a packet too big.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
pub struct PmtuVerdict {
    /// The next hop's MTU, as the error says it.
    pub mtu: Option<u32>,
    /// The error's source (the node's address on the sender's side).
    pub from: String,
    #[serde(flatten)]
    pub outcome: PmtuOutcome,
}

#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum PmtuOutcome {
    /// Handed to the sender's pod: its kernel learns the path MTU.
    ReachedSender { node: String, iface: String },
    /// Dropped on its way: a PMTU black hole.
    Dropped {
        node: String,
        iface: String,
        reason: String,
        /// The rule, as the error's own story names it.
        #[serde(skip_serializing_if = "Option::is_none")]
        rule: Option<String>,
    },
    /// Seen, but neither handed to the pod nor dropped (vanished, or an
    /// untraced node): what its story says.
    Unsettled { story: String },
    /// None was seen on the traced hooks (the kernel never rate-limits
    /// these errors): the node that dropped the packet sent none, or it
    /// went by a hook podtrace does not watch.
    NotSeen,
}

impl PmtuVerdict {
    /// The verdict's words, after the drop's own: `sender` is the pod the
    /// error is for.
    pub fn words(&self, sender: &str) -> String {
        let error = match self.mtu {
            Some(mtu) => format!(
                "the kernel's ICMP \"fragmentation needed\" (MTU {mtu}) from {}",
                self.from
            ),
            None => "the kernel's ICMP \"fragmentation needed\"".to_string(),
        };
        match &self.outcome {
            PmtuOutcome::ReachedSender { node, iface } => {
                format!("{error} reached {sender} (on {node} via {iface}): its kernel learns the path MTU")
            }
            PmtuOutcome::Dropped {
                node,
                iface,
                reason,
                rule,
            } => {
                let by = rule.as_ref().map_or(String::new(), |r| format!(" by {r}"));
                // A drop before the packet had a device (OUTPUT) names none.
                let at = if iface == "-" { String::new() } else { format!(" at {iface}") };
                format!("a PMTU black hole: {error} never reached {sender}, dropped on {node}{at} ({reason}){by}; the sender keeps sending packets too big for the path")
            }
            PmtuOutcome::Unsettled { story } => {
                format!("{error} was not seen reaching {sender}: {story}")
            }
            PmtuOutcome::NotSeen => format!("no ICMP \"fragmentation needed\" about it was seen on the traced hooks, so {sender} may never learn the path MTU"),
        }
    }
}
