//! `--probe` and its settings: podtrace sends the test traffic itself.

use std::time::Duration;

use super::{
    filter::{FilterArgs, Proto},
    values::parse_duration,
};
use crate::model::ProbeKind;

/// How often probes may go out at most: a probe is a question, not load.
pub const FASTEST_PROBES: Duration = Duration::from_millis(100);

#[derive(Clone, Debug, clap::Args)]
pub struct ProbeArgs {
    /// Send test traffic from the source pod's network namespace to the
    /// destination and trace exactly it: `icmp`, `tcp:PORT` (a connection)
    /// or `udp:PORT`. Ends with each probe's result beside the verdict of
    /// the packet that failed; without --count or --duration, once the
    /// probes' stories are told.
    #[arg(long, value_name = "icmp|tcp:PORT|udp:PORT", value_parser = parse_probe)]
    pub probe: Option<ProbeKind>,
    /// How many probes to send (1 to 100).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "probe",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub probe_count: u32,
    /// Time between probes (at least 100ms).
    #[arg(long, value_name = "DURATION", default_value = "1s", requires = "probe", value_parser = parse_interval)]
    pub probe_interval: Duration,
    /// How long each probe waits for its answer.
    #[arg(long, value_name = "DURATION", default_value = "1s", requires = "probe", value_parser = parse_timeout)]
    pub probe_timeout: Duration,
}

impl Default for ProbeArgs {
    fn default() -> Self {
        Self {
            probe: None,
            probe_count: 1,
            probe_interval: Duration::from_secs(1),
            probe_timeout: Duration::from_secs(1),
        }
    }
}

impl ProbeArgs {
    /// These flags, as a command line that parses back into them (an
    /// agent's).
    pub fn argv(&self) -> Vec<String> {
        let Some(probe) = self.probe else {
            return Vec::new();
        };
        let duration = |d: Duration| humantime::format_duration(d).to_string();
        vec![
            "--probe".into(),
            probe.to_string(),
            "--probe-count".into(),
            self.probe_count.to_string(),
            "--probe-interval".into(),
            duration(self.probe_interval),
            "--probe-timeout".into(),
            duration(self.probe_timeout),
        ]
    }
}

impl ProbeArgs {
    /// Whether the probe can be told at all with the other flags: one
    /// that `--proto`/`--port` leave out, or aimed at another port than
    /// DST names, would end with a ✓ or ✗ and no story of its own.
    /// `dst_port`: the port DST names (`ip:port`), if any.
    pub fn check(&self, filter: &FilterArgs, dst_port: Option<u16>) -> anyhow::Result<()> {
        let Some(probe) = self.probe else {
            return Ok(());
        };
        let protocol = match probe {
            ProbeKind::Icmp => Proto::Icmp,
            ProbeKind::Tcp(_) => Proto::Tcp,
            ProbeKind::Udp(_) => Proto::Udp,
        };
        if !filter.protos.is_empty() && !filter.protos.contains(&protocol) {
            anyhow::bail!("--probe {probe} sends {}, which --proto leaves out: its stories would not be told (add --proto {}, or drop --proto)", probe.protocol(), probe.protocol());
        }
        if let (Some(port), false) = (probe.port(), filter.ports.is_empty()) {
            if !filter.ports.contains(&port) {
                anyhow::bail!("--probe {probe} goes to port {port}, which --port leaves out: its stories would not be told (add --port {port})");
            }
        }
        if let (Some(port), Some(asked)) = (probe.port(), dst_port) {
            if port != asked {
                anyhow::bail!("--probe {probe} goes to port {port}, but DST names port {asked}: give one port (--probe {}:{asked})", probe.protocol());
            }
        }
        Ok(())
    }
}

fn parse_probe(text: &str) -> Result<ProbeKind, String> {
    text.parse()
}

fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < FASTEST_PROBES {
        return Err(format!(
            "{text}: probes go at most every {} ms",
            FASTEST_PROBES.as_millis()
        ));
    }
    Ok(interval)
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let timeout = parse_duration(text)?;
    if timeout < Duration::from_millis(1) || timeout > Duration::from_secs(60) {
        return Err(format!("{text}: a probe waits from 1 ms to 60 s"));
    }
    Ok(timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(kind: &str) -> ProbeArgs {
        ProbeArgs {
            probe: Some(kind.parse().unwrap()),
            ..ProbeArgs::default()
        }
    }

    #[test]
    fn a_probe_the_other_flags_would_leave_untold_is_refused() {
        let udp_only = FilterArgs {
            protos: vec![Proto::Udp],
            ports: vec![],
        };
        let e = probe("tcp:8080")
            .check(&udp_only, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--proto leaves out"), "{e}");
        let port_53 = FilterArgs {
            protos: vec![],
            ports: vec![53],
        };
        let e = probe("tcp:80")
            .check(&port_53, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--port leaves out"), "{e}");
        let e = probe("tcp:80")
            .check(&FilterArgs::default(), Some(53))
            .unwrap_err()
            .to_string();
        assert!(e.contains("DST names port 53"), "{e}");
        assert!(probe("udp:53").check(&port_53, Some(53)).is_ok());
        assert!(probe("icmp")
            .check(&FilterArgs::default(), Some(53))
            .is_ok());
    }
}
