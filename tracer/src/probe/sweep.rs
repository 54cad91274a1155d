//! What a dead run left, removed before this run attaches anything: the
//! run registry finds the dead runs' records, this file knows how each
//! kind of holding (a tc filter, an nft table) is taken away.

use anyhow::Result;

use super::run_registry::{self, Exclusive, Held, Record};

/// Once per process, before the first attach.
pub(super) fn sweep_dead_runs() -> Result<()> {
    run_registry::sweep_dead_runs(remove_dead)
}

fn remove_dead(lock: &Exclusive, record: &Record) -> Result<()> {
    match &record.held {
        #[cfg(target_os = "linux")]
        Held::Filter { .. } => super::tc::remove_filter(lock, record),
        #[cfg(not(target_os = "linux"))]
        Held::Filter { .. } => Err(crate::model::needs_linux("removing a tc filter")),
        Held::Table { name } => super::nft::delete_table(name),
    }
}
