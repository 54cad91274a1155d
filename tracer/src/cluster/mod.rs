//! What podtrace knows of the cluster: the Kubernetes API (`api`), the
//! inventory files that stand in for it (`inventory`, `nodes`), and the
//! resolution of the two pod arguments into traced endpoints (`targets`).

pub mod api;
pub mod inventory;
pub mod nodes;
pub mod targets;

pub use nodes::NodeSubnet;
