//! podtrace: an eBPF packet tracer for Kubernetes pod traffic.
//!
//! The pipeline runs one way, one folder per stage:
//! - [`probe`]: kernel signals and their loading and attaching — tc
//!   sightings (`probe::tc`), drops (`probe::drops`), netfilter rule tracing
//!   (`probe::netfilter`), conntrack's translations (`probe::conntrack`),
//!   link changes, the kernel's BTF layout;
//! - [`node`]: what a node looks like (links, routes, neighbours), which
//!   interfaces are watched, the traced namespaces, a traced node set up;
//! - [`cni`]: one file per CNI backend (flannel-vxlan, flannel-host-gw,
//!   calico-bird, calico-vxlan, calico-ipip, unknown): how it is recognised,
//!   its tunnel, the routes it needs, where a pod's interface is;
//! - [`cluster`]: the Kubernetes API, inventory files, argument resolution;
//! - [`decode`]: a kernel record into a hop (headers, node, interface);
//! - [`story`]: journeys (pure correlation), hop notes (`story::notes`),
//!   verdicts, explanations, the profile;
//! - [`output`]: one file per format (human, JSON);
//! - [`app`]: one trace in phases (resolve, attach, stream, finish);
//! - [`doctor`]: `podtrace doctor`, one file per check family: the node
//!   and CNI failures that leave no packet to trace.

pub mod app;
pub mod cli;
pub mod cluster;
pub mod cni;
pub mod decode;
pub mod doctor;
pub mod model;
pub mod node;
pub mod output;
pub mod probe;
pub mod story;
