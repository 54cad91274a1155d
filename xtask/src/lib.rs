//! Developer tasks for podtrace, and the netns lab that the integration
//! tests share with `cargo xtask lab`.

pub mod api_stub;
pub mod faults;
pub mod lab;
pub mod layers;
pub mod podtrace_run;
mod rust_tokens;
pub mod setup;
pub mod sizes;
pub mod vm;
