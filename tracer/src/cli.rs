//! Command-line arguments.

use std::{net::Ipv4Addr, path::PathBuf, time::Duration};

use clap::Parser;

use crate::{output::Format, probe::AttachMode};

/// Traces packets between two pods through every hook of the node(s) and
/// tells, per packet, where it went and what happened to it.
#[derive(Debug, Parser)]
#[command(name = "podtrace", version, about)]
pub struct Args {
    /// Source pod: namespace/name, name (with -n), or an IPv4 address.
    pub src: String,
    /// Destination pod: namespace/name, name (with -n), or an IPv4 address.
    pub dst: String,
    /// Namespace for pod names given without one.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Kubeconfig to reach the API (default: KUBECONFIG, ~/.kube/config,
    /// then the in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,
    /// Pod inventory in `kubectl get pods -A -o json` format, instead of
    /// the API.
    #[arg(long, value_name = "FILE")]
    pub pods_file: Option<PathBuf>,
    /// Node list in `kubectl get nodes -o json` format: pod subnets and
    /// CNI annotations, to name the route a node should have had.
    #[arg(long, value_name = "FILE")]
    pub nodes_file: Option<PathBuf>,
    /// The cluster's pod CIDR (repeatable), e.g. 10.244.0.0/16; also read
    /// from /run/flannel/subnet.env when present.
    #[arg(long, value_name = "CIDR")]
    pub pod_cidr: Vec<ipnet::Ipv4Net>,
    /// Trace inside this network namespace (a name from `ip netns` or a
    /// path such as /proc/PID/ns/net). Repeat it to trace several nodes in
    /// one run.
    #[arg(long, value_name = "NETNS")]
    pub netns: Vec<String>,
    /// The node's own IP, to find the underlay interface when neither the
    /// pod inventory nor the default route tells.
    #[arg(long)]
    pub node_ip: Option<Ipv4Addr>,
    #[arg(short, long, value_enum, default_value = "human")]
    pub output: Format,
    /// Stop after this many packet stories.
    #[arg(short, long)]
    pub count: Option<u64>,
    /// Stop after this long (e.g. 10s, 500ms, 2m).
    #[arg(short, long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// At exit, print the latency of every hop-to-hop step (p50/p90/p99).
    #[arg(long)]
    pub profile: bool,
    /// Do not add podtrace's nft tracing table: netfilter drops are then
    /// reported without the rule that dropped them.
    #[arg(long)]
    pub no_ruleset_changes: bool,
    /// How to attach to tc hooks.
    #[arg(long, value_enum, default_value = "auto")]
    pub attach: AttachMode,
    /// Colour: auto (on a terminal), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub color: String,
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("not a duration: {text}"))?;
    let seconds = match unit {
        "" | "s" => number,
        "ms" => number / 1000.0,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {text} (use ms, s, m or h)"
            ))
        }
    };
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("3 weeks").is_err());
    }
}
