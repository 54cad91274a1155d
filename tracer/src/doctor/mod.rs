//! `podtrace doctor`: the node and CNI failures that leave no packet to
//! trace. A pod without an IP, a node whose CNI config names a plugin it
//! does not have, a flanneld that never wrote subnet.env: no tc hook ever
//! sees a packet, so the tracer has nothing to tell. The doctor looks
//! where a person would (the node's files, links, routes, sysctls and
//! firewall; the API's pods, events and nodes) and says, per check, ✓ or
//! ✗ with the evidence and the fix.
//!
//! One file per check family; `command` gathers the inputs, runs the
//! families and renders the report (human: grouped by node, failing
//! checks first; JSON). This file is the folder's index.

pub mod api;
pub mod bgp;
pub mod bird;
pub mod calico;
pub mod calico_tunnel;
mod check;
pub mod cluster;
pub mod cni_config;
pub mod cni_dirs;
mod command;
pub mod credentials;
pub mod facts;
pub mod firewall;
pub mod flannel;
pub mod ipv6;
pub mod ipv6_routes;
pub mod kernel;
pub mod next_hops;
pub mod nfqueue;
pub mod nfqueue_state;
pub mod node;
mod node_checks;
pub mod plugins;
pub mod policy_routing;
pub mod render;
pub mod tcp_sockets;
pub mod trace;
pub mod wireguard;

pub use check::{Check, Status};
pub use command::run;
pub use node_checks::node_checks;
