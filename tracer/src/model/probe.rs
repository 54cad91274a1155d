//! `--probe`: the test traffic podtrace sends itself, and what came of it.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// What to send: an ICMP echo, a TCP connection, or a UDP datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeKind {
    Icmp,
    Tcp(u16),
    Udp(u16),
}

impl ProbeKind {
    /// The IP protocol's name, as `--probe` and the JSON say it.
    pub fn protocol(self) -> &'static str {
        match self {
            Self::Icmp => "icmp",
            Self::Tcp(_) => "tcp",
            Self::Udp(_) => "udp",
        }
    }

    pub fn port(self) -> Option<u16> {
        match self {
            Self::Icmp => None,
            Self::Tcp(port) | Self::Udp(port) => Some(port),
        }
    }
}

impl fmt::Display for ProbeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port() {
            Some(port) => write!(f, "{}:{port}", self.protocol()),
            None => f.write_str(self.protocol()),
        }
    }
}

impl FromStr for ProbeKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (protocol, port) = match text.split_once(':') {
            Some((protocol, port)) => (protocol, Some(port)),
            None => (text, None),
        };
        let number = |port: Option<&str>| -> Result<u16, String> {
            let port =
                port.ok_or_else(|| format!("{text}: {protocol} needs a port ({protocol}:PORT)"))?;
            match port.parse::<u32>() {
                Ok(n @ 1..=65535) => Ok(n as u16),
                _ => Err(format!("{text}: the port must be a number from 1 to 65535")),
            }
        };
        match protocol {
            "icmp" if port.is_none() => Ok(Self::Icmp),
            "icmp" => Err(format!("{text}: icmp takes no port")),
            "tcp" => Ok(Self::Tcp(number(port)?)),
            "udp" => Ok(Self::Udp(number(port)?)),
            _ => Err(format!("{text}: not a probe (icmp, tcp:PORT or udp:PORT)")),
        }
    }
}

/// What one probe sent and what came back: a `{"type":"probe", …}` record.
#[derive(Clone, Debug, PartialEq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct ProbeResult {
    /// `tcp:8080`.
    pub kind: String,
    /// The address it was sent to (`10.244.2.2:8080`, a ClusterIP too).
    pub target: String,
    /// Which probe of `--probe-count`, from 1.
    pub seq: u32,
    pub answered: bool,
    /// Nothing came back at all (no answer, no refusal) before the probe's
    /// timeout.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub silent: bool,
    /// From sending to the answer (SYN → SYN-ACK, echo → reply).
    pub rtt_ms: Option<f64>,
    /// `connected in 0.41 ms (SYN → SYN-ACK)`, `refused (RST)` (the SYN
    /// was delivered: the pod's stack answered), `no answer in 1 s`, with
    /// the verdict of the packet that failed (`refused: rejected …`).
    pub result: String,
    /// How its packets are told apart from the pair's other traffic: its
    /// source port (TCP, UDP) or its echo identifier (ICMP).
    #[serde(skip)]
    pub flow_id: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_parse_and_bad_ones_say_what_is_wrong() {
        assert_eq!("icmp".parse(), Ok(ProbeKind::Icmp));
        assert_eq!("tcp:8080".parse(), Ok(ProbeKind::Tcp(8080)));
        assert_eq!("udp:53".parse(), Ok(ProbeKind::Udp(53)));
        assert_eq!(ProbeKind::Tcp(8080).to_string(), "tcp:8080");
        for (bad, says) in [
            ("tcp:0", "from 1 to 65535"),
            ("tcp:70000", "from 1 to 65535"),
            ("tcp:abc", "from 1 to 65535"),
            ("tcp", "needs a port"),
            ("sctp:1", "not a probe"),
            ("icmp:3", "takes no port"),
        ] {
            let error = bad.parse::<ProbeKind>().unwrap_err();
            assert!(
                error.starts_with(bad) && error.contains(says),
                "{bad}: {error}"
            );
        }
    }
}
