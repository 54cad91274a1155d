//! A route of the node, of any table, as netlink lists it and as `ip
//! route` and `route -n` print it.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The tables the kernel names (`/etc/iproute2/rt_tables`).
pub(crate) const RT_TABLE_DEFAULT: u32 = 253;
pub(crate) const RT_TABLE_LOCAL: u32 = 255;

pub(crate) const RT_TABLE_MAIN: u32 = 254;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteKind {
    Unicast,
    Local,
    Blackhole,
    Unreachable,
    Prohibit,
}

/// The `proto` of a route, as `ip route` names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteOrigin {
    Kernel,
    Boot,
    Static,
    Bird,
    /// Calico's Felix (`proto 80`): VXLAN-mode routes and blackholed
    /// blocks where no BIRD runs.
    Felix,
    #[default]
    Other,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Who installed it (`proto bird` is Calico's BGP daemon).
    pub protocol: RouteOrigin,
    pub onlink: bool,
    pub kind: RouteKind,
    /// IPv4 or IPv6 (the node's routes of both families are listed).
    pub destination: IpNet,
    pub gateway: Option<IpAddr>,
    pub oif: Option<u32>,
    pub table: u32,
}

/// A table's name as `ip rule` and `ip route` print it.
pub fn table_name(table: u32) -> String {
    match table {
        RT_TABLE_MAIN => "main".into(),
        RT_TABLE_LOCAL => "local".into(),
        RT_TABLE_DEFAULT => "default".into(),
        n => n.to_string(),
    }
}

impl Route {
    /// The route out of device `dev` (None: on no device), as `ip route`
    /// prints it, then as `route -n` does (Destination Gateway Genmask
    /// Flags Iface): the one rendering of a route, for a node's own routes
    /// and for the route a node should have had alike.
    pub fn describe_on(&self, dev: Option<&str>) -> String {
        let net = self.destination;
        let mut ip_route = match self.kind {
            RouteKind::Unicast | RouteKind::Local => String::new(),
            RouteKind::Blackhole => "blackhole ".into(),
            RouteKind::Unreachable => "unreachable ".into(),
            RouteKind::Prohibit => "prohibit ".into(),
        };
        ip_route.push_str(&if net.prefix_len() == 0 {
            "default".to_string()
        } else {
            net.to_string()
        });
        if let Some(gw) = self.gateway {
            ip_route.push_str(&format!(" via {gw}"));
        }
        if let Some(dev) = dev {
            ip_route.push_str(&format!(" dev {dev}"));
        }
        // As `ip route show table all` names a table other than main.
        if self.table != RT_TABLE_MAIN {
            ip_route.push_str(&format!(" table {}", table_name(self.table)));
        }
        match self.protocol {
            RouteOrigin::Bird => ip_route.push_str(" proto bird"),
            RouteOrigin::Felix => ip_route.push_str(" proto 80"),
            _ => {}
        }
        if self.onlink {
            ip_route.push_str(" onlink");
        }
        // net-tools prints unreachable and prohibit routes as rejecting
        // ("!", no gateway, no device); a blackhole is up, on no device.
        let rejects = matches!(self.kind, RouteKind::Unreachable | RouteKind::Prohibit);
        let mut flags = String::from(if rejects { "!" } else { "U" });
        if self.gateway.is_some() {
            flags.push('G');
        }
        if net.prefix_len() == net.max_prefix_len() {
            flags.push('H');
        }
        let iface = match dev {
            _ if rejects => "-",
            Some(dev) => dev,
            None => "*",
        };
        match net {
            IpNet::V4(net) => {
                let gateway = match self.gateway {
                    _ if rejects => "-".to_string(),
                    gateway => gateway.map_or("0.0.0.0".into(), |g| g.to_string()),
                };
                format!(
                    "{ip_route} (route -n: {} {gateway} {} {flags} {iface})",
                    net.network(),
                    net.netmask()
                )
            }
            // net-tools' IPv6 table: Destination (with its length), Next
            // Hop, Flag, If; an unreachable route's interface is `lo`.
            IpNet::V6(net) => {
                let gateway = match self.gateway {
                    _ if rejects => "::".to_string(),
                    gateway => gateway.map_or("::".into(), |g| g.to_string()),
                };
                let iface = if rejects { "lo" } else { iface };
                format!("{ip_route} (route -6 -n: {net} {gateway} {flags} {iface})")
            }
        }
    }
}
