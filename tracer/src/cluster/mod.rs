//! What podtrace knows of the cluster: the Kubernetes API (`api`), the
//! inventory files that stand in for it (`inventory`, `nodes`), Services
//! (`services`, or a node's kube-proxy rules in their place:
//! `kube_proxy_rules`), the endpoint arguments checked (`argument`), and
//! cluster mode's agent pods (`agents`). Resolving the arguments into
//! traced endpoints is a phase of the run: `app::targets`.

pub mod agents;
pub mod api;
pub mod argument;
pub mod inventory;
pub mod kube_proxy_rules;
pub mod nodes;
pub mod services;

use std::{path::Path, sync::mpsc, time::Duration};

use anyhow::{bail, Context, Result};

/// How long a FIFO given as a file (`<(kubectl get pods -A -o json)`) may
/// take to deliver.
const FIFO_PATIENCE: Duration = Duration::from_secs(10);

/// Reads an inventory file (`what`: "pods file"). A FIFO that nobody
/// writes to would block forever: it gets a deadline and a one-line error.
pub fn read_file(path: &Path, what: &str) -> Result<String> {
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {what} {shown}"))?;
    if meta.is_dir() {
        bail!("{what} {shown} is a directory, not a file");
    }
    if meta.is_file() {
        return std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {what} {shown}"));
    }
    let (tx, rx) = mpsc::channel();
    let owned = path.to_path_buf();
    // A reader blocked in open(2) cannot be cancelled: it is left behind
    // and goes with the process.
    std::thread::spawn(move || {
        let _ = tx.send(std::fs::read_to_string(owned));
    });
    match rx.recv_timeout(FIFO_PATIENCE) {
        Ok(read) => read.with_context(|| format!("cannot read {what} {shown}")),
        Err(_) => bail!(
            "{what} {shown} is not a regular file and nothing was written to it within {} s",
            FIFO_PATIENCE.as_secs()
        ),
    }
}
