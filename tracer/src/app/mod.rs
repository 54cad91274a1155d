//! One trace, from arguments to stories: on this node (`on_node`, in four
//! phases: `resolve`: the pod arguments, names of addresses, the
//! namespaces; `attach`: every traced node set up (`traced`); `stream`:
//! sightings, rules and link changes into journeys, told as they finish
//! (`teller`); `finish`: what is still open, the loss counters, the
//! summary, then everything attached is dropped), or through agent pods
//! (`front`, cluster mode, the only one off Linux).
//!
//! `elsewhere`: what a build for another OS than Linux refuses.
//! `replay` tells the stories of a `--write` file again (`podtrace read`).

#[cfg(target_os = "linux")]
pub mod agent;
mod connections;
pub mod elsewhere;
#[cfg(target_os = "linux")]
mod follow;
pub mod front;
#[cfg(target_os = "linux")]
pub mod kernel;
#[cfg(target_os = "linux")]
mod losses;
#[cfg(target_os = "linux")]
mod masquerade;
#[cfg(target_os = "linux")]
mod node_stream;
#[cfg(target_os = "linux")]
mod on_node;
mod pairs;
#[cfg(target_os = "linux")]
mod pod_interfaces;
mod probing;
#[cfg(target_os = "linux")]
pub mod profile;
mod replay;
mod service_target;
#[cfg(target_os = "linux")]
mod sightings;
mod stop;
mod story_context;
mod stream;
pub mod targets;
mod teller;
#[cfg(target_os = "linux")]
mod trace;
#[cfg(target_os = "linux")]
pub mod traced;
pub mod wire;

#[cfg(target_os = "linux")]
pub use on_node::run;
pub use replay::replay;
pub use stop::{block_signals, die_saying, STOPPED_BEFORE_TRACING};
pub use teller::Seen;
