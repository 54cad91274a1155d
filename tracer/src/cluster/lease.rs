//! The agent's side of the front-end's lease: it stops once the front-end
//! is gone, and sends `--probe`s only once the front-end says every agent
//! traces.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};

/// How often an agent reads the lease.
pub(super) const LEASE_POLL: Duration = Duration::from_secs(2);

/// The agent's side of the lease: resolves once the front-end is gone
/// (lease deleted, or not renewed for `stale`); returns why.
pub async fn lease_lost(client: Client, namespace: &str, lease: &str, stale: Duration) -> String {
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let mut seen = None;
    let mut changed = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(LEASE_POLL).await;
        match leases.get_opt(lease).await {
            Ok(None) => return format!("lease {lease} is gone"),
            Ok(Some(l)) => {
                let renewed = l
                    .spec
                    .and_then(|s| s.renew_time)
                    .map(|t| format!("{:?}", t.0));
                if renewed != seen {
                    seen = renewed;
                    changed = tokio::time::Instant::now();
                }
            }
            Err(_) => {}
        }
        if changed.elapsed() > stale {
            return format!(
                "lease {lease} was not renewed for {} s: the front-end is gone",
                stale.as_secs()
            );
        }
    }
}

/// The annotation the front-end puts on its lease once every agent
/// traces: an agent that sends `--probe`s waits for it, so that no hook on
/// the probes' way is still being attached.
pub const ALL_TRACING: &str = "podtrace.io/all-agents-tracing";

/// Waits until the front-end says every agent traces (its lease's
/// [`ALL_TRACING`]); false if it has not said so within `patience`.
pub async fn all_tracing(client: Client, namespace: &str, lease: &str, patience: Duration) -> bool {
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let until = tokio::time::Instant::now() + patience;
    while tokio::time::Instant::now() < until {
        if let Ok(Some(lease)) = leases.get_opt(lease).await {
            let said = lease
                .metadata
                .annotations
                .is_some_and(|a| a.contains_key(ALL_TRACING));
            if said {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}
