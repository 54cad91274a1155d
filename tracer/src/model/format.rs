//! What a command writes, as its flags choose.

use podtrace_common::sighting::SNAPSHOT_LEN;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Human,
    Json,
}

/// What the kernel copies of each packet (`SNAPSHOT_LEN`).
pub const MAX_SNAPLEN: u32 = SNAPSHOT_LEN as u32;
