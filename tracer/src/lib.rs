//! podtrace: an eBPF packet tracer for Kubernetes pod traffic.
//!
//! One module per job: `sightings` (tc programs, the kernel signal),
//! `node` (the node's links and routes), `interfaces` (what to watch),
//! `decode` (header snapshots), `journey` (pure correlation), `story`
//! (hop notes and verdicts), `render` (text and JSON).

pub mod app;
pub mod btf;
pub mod cli;
pub mod cluster;
pub mod decode;
pub mod drops;
pub mod explain;
pub mod interfaces;
pub mod inventory;
pub mod journey;
pub mod link_watch;
pub mod netfilter;
pub mod netns;
pub mod node;
pub mod profile;
pub mod render;
pub mod sightings;
pub mod story;
pub mod targets;
pub mod traced;
