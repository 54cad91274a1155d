//! Address translations (Services, SNAT) as the cluster, the wire and the
//! stories share them.

use std::{fmt, net::IpAddr};

use serde::{Deserialize, Serialize};

/// An address and port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frontend {
    /// IPv4, or IPv6 (a dual-stack Service's IPv6 ClusterIP).
    pub ip: IpAddr,
    pub port: u16,
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// One way kube-proxy rewrites a destination: `front` (ClusterIP:port or
/// node IP:NodePort) to `back` (a backend pod's IP:targetPort). Or, with
/// `source`, one connection's source rewrite (SNAT, MASQUERADE, learnt
/// from conntrack): `back` is the original source, `front` what it became.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Translation {
    pub protocol: u8,
    pub front: Frontend,
    pub back: Frontend,
    /// `namespace/name` of the Service, when known (a translation learnt
    /// from conntrack has no name).
    pub service: Option<String>,
    /// `namespace/name` of the backend pod, when known.
    pub backend: Option<String>,
    #[serde(default)]
    pub source: bool,
}
