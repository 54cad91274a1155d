//! Where a packet's journey ended (JSON `verdict.outcome` and its
//! fields) and how it travelled: the nouns the verdict and its
//! explanations share.

use std::net::IpAddr;

use serde::Serialize;

use super::explain::RouteCheck;
use crate::decode::hop::Direction;

/// How the packet travelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PathStep {
    Bridged,
    Routed,
    Encapsulated,
    Decapsulated,
}

/// Where the packet's journey ended, as far as the traced nodes can see.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Sent out of the destination pod's host-side veth.
    Delivered { node: String, iface: String },
    /// Left the traced nodes through the underlay, toward an untraced node.
    LeftNode {
        node: String,
        iface: String,
        toward: IpAddr,
    },
    /// The node had no route for the destination's pods: the route it
    /// needed, the one it used, and what became of the packet.
    NoRoute {
        check: RouteCheck,
        then: Box<Outcome>,
    },
    /// Freed by the kernel with a drop reason, and seen nowhere after.
    Dropped {
        node: String,
        iface: String,
        reason: String,
        location: String,
    },
    /// Seen at a hook, and never at the next one expected.
    Vanished {
        node: String,
        iface: String,
        direction: Direction,
    },
    /// Translated (DNAT, SNAT) by a conntrack entry podtrace learnt only
    /// after the packet had passed: its hops after the translation, under
    /// addresses not traced yet, were not seen.
    TranslatedOutOfSight {
        node: String,
        iface: String,
        direction: Direction,
        translation: String,
        /// Seen under the new addresses, but only on the hooks that
        /// traced them before it passed: podtrace began tracing them on
        /// every node (and watching a backend's veth) while it was in
        /// flight.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        in_flight: bool,
    },
    /// Not seen again, but records were lost while it was in flight (the
    /// kernel's, or a whole node's when its agent was lost): whether it
    /// went on cannot be told.
    Incomplete {
        node: String,
        iface: String,
        direction: Direction,
        /// Which records were lost, and why.
        cause: String,
    },
}
