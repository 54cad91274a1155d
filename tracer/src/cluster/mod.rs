//! What podtrace knows of the cluster: the Kubernetes API (`api`; how it is reached: `access`), the
//! inventory files that stand in for it (`inventory`, `nodes`), the
//! traced namespaces' NetworkPolicies (`network_policies`, listed into a
//! `policy_book`), Services
//! (`services`, or a node's kube-proxy rules in their place:
//! `kube_proxy_rules`), the endpoint arguments checked (`argument`), and
//! cluster mode's agent pods (`agents`: their Pod in `agent_pod`, what
//! their status says in `agent_status`) and their side of its lease
//! (`lease`). Resolving the arguments into
//! traced endpoints is a phase of the run: `app::targets`.

pub mod access;
pub mod agent_pod;
pub mod agent_status;
pub mod agents;
pub mod api;
pub mod argument;
pub mod inventory;
pub mod kube_proxy_rules;
pub mod lease;
pub mod network_policies;
pub mod nodes;
pub mod policy_book;
pub mod scoped;
pub mod services;

use std::{io::BufReader, path::Path, time::Duration};

use anyhow::{anyhow, Result};
use serde::de::DeserializeOwned;

use crate::model::bounded::{ReadError, Stream};

/// How long an inventory file may take to read, a FIFO given as a file
/// (`<(kubectl get pods -A -o json)`) included.
const PATIENCE: Duration = Duration::from_secs(10);
/// The most an inventory file may hold: a large cluster's
/// `kubectl get pods -A -o json` is some hundreds of MB.
const INVENTORY_MAX: u64 = 1 << 30;

/// Parses an inventory file (`what`: "pods file"; `not_a`: "a pod list")
/// as it is read, keeping only what `T` keeps: memory follows what is
/// kept, not the file's size. A regular file or a FIFO, read non-blocking
/// up to a size and a deadline; anything else, or a bound reached, is a
/// one-line error that says which.
pub fn parse_file<T: DeserializeOwned>(path: &Path, what: &str, not_a: &str) -> Result<T> {
    parse_bounded(path, what, not_a, INVENTORY_MAX, PATIENCE)
}

fn parse_bounded<T: DeserializeOwned>(
    path: &Path,
    what: &str,
    not_a: &str,
    max: u64,
    patience: Duration,
) -> Result<T> {
    let shown = path.display();
    let mut stream = Stream::open(path, max, patience).map_err(|e| match e {
        ReadError::Io(e) => anyhow!("cannot read {what} {shown}: {e}"),
        e => anyhow!("{what} {shown} {e}"),
    })?;
    let parsed = serde_json::from_reader(BufReader::with_capacity(64 << 10, &mut stream));
    parsed.map_err(|e| match stream.overrun() {
        Some(why) => anyhow!("{what} {shown} {why}"),
        None if e.is_io() => anyhow!("{what} {shown} cannot be read: {e}"),
        None => anyhow!("{shown} is not {not_a}: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use std::{io::Write, time::Instant};

    use super::*;
    use crate::{
        cluster::inventory::Inventory,
        model::bounded::testing::{fifo, writer},
    };

    /// Why a pods file of at most `max` bytes, read for `secs`, is refused.
    fn refused(path: &Path, max: u64, secs: u64) -> String {
        let parsed = parse_bounded::<serde_json::Value>(
            path,
            "pods file",
            "a pod list",
            max,
            Duration::from_secs(secs),
        );
        parsed.unwrap_err().to_string()
    }

    #[test]
    fn a_missing_inventory_says_it_cannot_be_read() {
        let err = format!(
            "{:#}",
            Inventory::load(Path::new("/nonexistent.json")).unwrap_err()
        );
        assert_eq!(
            err,
            "cannot read pods file /nonexistent.json: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn dev_zero_as_an_inventory_is_named_at_once() {
        let started = Instant::now();
        let err = format!("{:#}", Inventory::load(Path::new("/dev/zero")).unwrap_err());
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(
            err,
            "pods file /dev/zero is a character device, not a regular file"
        );
    }

    #[test]
    fn an_endless_stream_stops_at_the_size_bound_and_says_so() {
        let path = fifo("endless");
        let writer = writer(&path, |mut w| {
            let _ = w.write_all(b"{\"items\":[");
            // A pod list that never ends, until the reader goes.
            let pod =
                br#"{"metadata":{"name":"web-0","namespace":"x"},"status":{"podIP":"10.1.1.1"}},"#;
            while w.write_all(pod).is_ok() {}
        });
        let started = Instant::now();
        let err = refused(&path, 1 << 20, 10);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            err,
            format!("pods file {} is larger than 1 MiB", path.display())
        );
        writer.join().unwrap();
    }

    #[test]
    fn a_silent_fifo_ends_at_the_deadline_with_the_true_message() {
        let path = fifo("silent-inventory");
        let started = Instant::now();
        let err = refused(&path, 1 << 20, 1);
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(
            err,
            format!(
                "pods file {} is not a regular file and nothing was written to it within 1 s",
                path.display()
            )
        );
    }

    #[test]
    fn a_slow_stream_that_started_is_not_said_to_be_unwritten() {
        let path = fifo("slow");
        let writer = writer(&path, |mut w| {
            w.write_all(b"{\"items\":[").unwrap();
            std::thread::sleep(Duration::from_millis(1500));
        });
        let err = refused(&path, 1 << 20, 1);
        assert_eq!(
            err,
            format!(
                "pods file {} was still being read after 1 s (10 bytes read)",
                path.display()
            )
        );
        writer.join().unwrap();
    }

    #[test]
    fn a_pods_file_streamed_through_a_fifo_is_read() {
        let path = fifo("pods");
        let pods = r#"{"items":[{"metadata":{"name":"web-0"},"status":{"podIP":"10.1.1.2"}}]}"#;
        let writer = writer(&path, move |mut w| w.write_all(pods.as_bytes()).unwrap());
        let inventory = Inventory::load(&path).unwrap();
        assert_eq!(inventory.pods[0].qualified(), "default/web-0");
        writer.join().unwrap();
    }
}
