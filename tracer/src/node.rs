//! What a node's network namespace looks like: its links, addresses and
//! IPv4 routes, read over rtnetlink.

use std::net::Ipv4Addr;

use anyhow::{Context, Result};
use futures::TryStreamExt;
use ipnet::Ipv4Net;
use rtnetlink::{
    packet_route::{
        address::AddressAttribute,
        link::{InfoKind, LinkAttribute, LinkInfo, LinkLayerType, LinkMessage},
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage},
        route::{RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteType},
        AddressFamily,
    },
    RouteMessageBuilder,
};
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// rtnetlink kind: "veth", "bridge", "vxlan", "ipip", … ("" for physical).
    pub kind: String,
    /// Bridge (controller) this link is a port of.
    pub controller: Option<u32>,
    pub has_ethernet_header: bool,
    pub mtu: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteKind {
    Unicast,
    Local,
    Blackhole,
    Unreachable,
    Prohibit,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Route {
    pub onlink: bool,
    pub kind: RouteKind,
    pub destination: Ipv4Net,
    pub gateway: Option<Ipv4Addr>,
    pub oif: Option<u32>,
    pub table: u32,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeView {
    pub links: Vec<Link>,
    /// (link index, address) for every IPv4 address.
    pub addresses: Vec<(u32, Ipv4Addr)>,
    pub routes: Vec<Route>,
    /// IPv4 neighbours: (link index, address, MAC).
    pub neighbours: Vec<(u32, Ipv4Addr, [u8; 6])>,
    /// Bridge forwarding entries: (MAC, port link index).
    pub fdb: Vec<([u8; 6], u32)>,
}

const RT_TABLE_MAIN: u32 = 254;

impl NodeView {
    /// Reads the view of the network namespace the calling thread is in.
    pub async fn read() -> Result<Self> {
        let (connection, handle, _) =
            rtnetlink::new_connection().context("cannot open an rtnetlink socket")?;
        let task = tokio::spawn(connection);
        let result = async {
            let links: Vec<Link> = handle
                .link()
                .get()
                .execute()
                .map_ok(Link::from)
                .try_collect()
                .await
                .context("cannot list links")?;
            let addresses = handle
                .address()
                .get()
                .execute()
                .try_filter_map(|msg| async move {
                    Ok(msg.attributes.iter().find_map(|a| match a {
                        AddressAttribute::Local(std::net::IpAddr::V4(ip))
                        | AddressAttribute::Address(std::net::IpAddr::V4(ip)) => {
                            Some((msg.header.index, *ip))
                        }
                        _ => None,
                    }))
                })
                .try_collect()
                .await
                .context("cannot list addresses")?;
            let routes = handle
                .route()
                .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
                .execute()
                .try_filter_map(|msg| async move { Ok(route_from(msg)) })
                .try_collect()
                .await
                .context("cannot list routes")?;
            let mut neighbours = Vec::new();
            let mut fdb = Vec::new();
            for family in [AddressFamily::Inet, AddressFamily::Bridge] {
                let entries: Vec<NeighbourMessage> = handle
                    .neighbours()
                    .get()
                    .set_address_family(family)
                    .execute()
                    .try_collect()
                    .await
                    .context("cannot list neighbours")?;
                for entry in entries {
                    let mac = entry.attributes.iter().find_map(|a| match a {
                        NeighbourAttribute::LinkLayerAddress(mac) => {
                            <[u8; 6]>::try_from(mac.as_slice()).ok()
                        }
                        _ => None,
                    });
                    let ip = entry.attributes.iter().find_map(|a| match a {
                        NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => Some(*ip),
                        _ => None,
                    });
                    match (family, mac, ip) {
                        (AddressFamily::Inet, Some(mac), Some(ip)) => {
                            neighbours.push((entry.header.ifindex, ip, mac))
                        }
                        (AddressFamily::Bridge, Some(mac), _) => {
                            fdb.push((mac, entry.header.ifindex))
                        }
                        _ => {}
                    }
                }
            }
            Ok(NodeView {
                neighbours,
                fdb,
                links,
                addresses,
                routes,
            })
        }
        .await;
        task.abort();
        result
    }

    pub fn link(&self, index: u32) -> Option<&Link> {
        self.links.iter().find(|l| l.index == index)
    }

    pub fn link_named(&self, name: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.name == name)
    }

    /// The link holding `ip`, if the node owns it.
    pub fn link_with_address(&self, ip: Ipv4Addr) -> Option<&Link> {
        self.addresses
            .iter()
            .find(|(_, a)| *a == ip)
            .and_then(|(index, _)| self.link(*index))
    }

    /// The route as `ip route` prints it, then as `route -n` does
    /// (Destination Gateway Genmask Flags Iface).
    pub fn describe(&self, route: &Route) -> String {
        let dev = route
            .oif
            .and_then(|i| self.link(i))
            .map_or("?", |l| l.name.as_str());
        let net = route.destination;
        let mut ip_route = match route.kind {
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
        if let Some(gw) = route.gateway {
            ip_route.push_str(&format!(" via {gw}"));
        }
        if route.oif.is_some() {
            ip_route.push_str(&format!(" dev {dev}"));
        }
        if route.onlink {
            ip_route.push_str(" onlink");
        }
        let mut flags = String::from("U");
        if route.gateway.is_some() {
            flags.push('G');
        }
        if net.prefix_len() == 32 {
            flags.push('H');
        }
        if route.kind != RouteKind::Unicast {
            flags = "!".into();
        }
        let gateway = route.gateway.unwrap_or(Ipv4Addr::UNSPECIFIED);
        let iface = if route.oif.is_some() { dev } else { "-" };
        format!(
            "{ip_route} (route -n: {} {gateway} {} {flags} {iface})",
            net.network(),
            net.netmask()
        )
    }

    /// The host-side interface of the local pod with `ip`: the device of
    /// its /32 route (Calico), or the bridge port its MAC was learnt on
    /// (Flannel: neighbour entry on the bridge, then the bridge's FDB).
    pub fn pod_interface(&self, ip: Ipv4Addr) -> Option<&Link> {
        let host_route = self
            .route_to(ip)
            .filter(|r| r.destination.prefix_len() == 32 && r.gateway.is_none())
            .and_then(|r| r.oif)
            .and_then(|oif| self.link(oif))
            .filter(|l| l.kind == "veth");
        host_route.or_else(|| {
            let (bridge, _, mac) = self.neighbours.iter().find(|(_, addr, _)| *addr == ip)?;
            let port = self
                .fdb
                .iter()
                .filter(|(m, _)| m == mac)
                .filter_map(|(_, port)| self.link(*port))
                .find(|l| l.controller == Some(*bridge) && l.kind == "veth")?;
            Some(port)
        })
    }

    /// The main-table route the kernel would pick for `dst` (longest prefix).
    pub fn route_to(&self, dst: Ipv4Addr) -> Option<&Route> {
        self.routes
            .iter()
            .filter(|r| r.table == RT_TABLE_MAIN && r.destination.contains(&dst))
            .max_by_key(|r| r.destination.prefix_len())
    }
}

impl From<LinkMessage> for Link {
    fn from(msg: LinkMessage) -> Self {
        let mut link = Link {
            index: msg.header.index,
            name: String::new(),
            kind: String::new(),
            controller: None,
            has_ethernet_header: msg.header.link_layer_type == LinkLayerType::Ether,
            mtu: 0,
        };
        for attr in msg.attributes {
            match attr {
                LinkAttribute::IfName(name) => link.name = name,
                LinkAttribute::Controller(index) => link.controller = Some(index),
                LinkAttribute::Mtu(mtu) => link.mtu = mtu,
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        if let LinkInfo::Kind(kind) = info {
                            link.kind = kind_name(&kind);
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }
}

fn kind_name(kind: &InfoKind) -> String {
    match kind {
        InfoKind::Veth => "veth".into(),
        InfoKind::Bridge => "bridge".into(),
        InfoKind::Vxlan => "vxlan".into(),
        InfoKind::IpIp => "ipip".into(),
        InfoKind::Geneve => "geneve".into(),
        InfoKind::Wireguard => "wireguard".into(),
        InfoKind::Dummy => "dummy".into(),
        other => format!("{other:?}").to_lowercase(),
    }
}

fn route_from(msg: RouteMessage) -> Option<Route> {
    let mut destination = None;
    let mut gateway = None;
    let mut oif = None;
    let mut table = u32::from(msg.header.table);
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => destination = Some(*ip),
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gateway = Some(*ip),
            RouteAttribute::Oif(index) => oif = Some(*index),
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    let destination = Ipv4Net::new(
        destination.unwrap_or(Ipv4Addr::UNSPECIFIED),
        msg.header.destination_prefix_length,
    )
    .ok()?;
    Some(Route {
        destination,
        gateway,
        oif,
        table,
        onlink: msg.header.flags.contains(RouteFlags::Onlink),
        kind: match msg.header.kind {
            RouteType::BlackHole => RouteKind::Blackhole,
            RouteType::Unreachable => RouteKind::Unreachable,
            RouteType::Prohibit => RouteKind::Prohibit,
            RouteType::Local | RouteType::Broadcast => RouteKind::Local,
            _ => RouteKind::Unicast,
        },
    })
}

/// Node views for tests: a Flannel vxlan node-1 as the lab builds it.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    pub(crate) fn link(index: u32, name: &str, kind: &str) -> Link {
        Link {
            index,
            name: name.into(),
            kind: kind.into(),
            controller: None,
            has_ethernet_header: kind != "ipip",
            mtu: if kind == "vxlan" { 1450 } else { 1500 },
        }
    }

    pub(crate) fn route(dst: &str, oif: u32) -> Route {
        Route {
            destination: dst.parse().unwrap(),
            gateway: None,
            oif: Some(oif),
            table: 254,
            onlink: false,
            kind: RouteKind::Unicast,
        }
    }

    pub(crate) fn flannel_node() -> NodeView {
        let mut veth = link(5, "veth1a2b", "veth");
        veth.controller = Some(3);
        NodeView {
            links: vec![
                link(1, "lo", ""),
                link(2, "eth0", "veth"),
                link(3, "cni0", "bridge"),
                link(4, "flannel.1", "vxlan"),
                veth,
                link(6, "tunl0", "ipip"),
            ],
            addresses: vec![
                (2, "192.0.2.11".parse().unwrap()),
                (3, "10.244.1.1".parse().unwrap()),
            ],
            neighbours: vec![(3, "10.244.1.2".parse().unwrap(), [2, 0, 0, 0, 1, 2])],
            fdb: vec![([2, 0, 0, 0, 1, 2], 5), ([2, 0, 0, 0, 1, 2], 3)],
            routes: vec![
                Route {
                    gateway: Some("192.0.2.1".parse().unwrap()),
                    ..route("0.0.0.0/0", 2)
                },
                route("10.244.1.0/24", 3),
                Route {
                    gateway: Some("10.244.2.0".parse().unwrap()),
                    onlink: true,
                    ..route("10.244.2.0/24", 4)
                },
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{fixtures::route, *};

    #[test]
    fn a_local_pods_host_interface_is_found_by_route_or_by_bridge_fdb() {
        // Flannel: the neighbour entry on cni0 gives the MAC, the FDB the port.
        let view = fixtures::flannel_node();
        assert_eq!(
            view.pod_interface("10.244.1.2".parse().unwrap())
                .unwrap()
                .name,
            "veth1a2b"
        );
        assert!(view.pod_interface("10.244.1.9".parse().unwrap()).is_none());
        // Calico: the /32 route's device.
        let mut calico = fixtures::flannel_node();
        calico.links.push(fixtures::link(7, "cali12345", "veth"));
        calico.routes.push(route("10.245.1.2/32", 7));
        assert_eq!(
            calico
                .pod_interface("10.245.1.2".parse().unwrap())
                .unwrap()
                .name,
            "cali12345"
        );
    }

    #[test]
    fn routes_read_as_ip_route_and_route_n_print_them() {
        let view = NodeView {
            links: vec![Link {
                index: 4,
                name: "flannel.1".into(),
                kind: "vxlan".into(),
                controller: None,
                has_ethernet_header: true,
                mtu: 1450,
            }],
            ..Default::default()
        };
        let flannel = Route {
            gateway: Some("10.244.2.0".parse().unwrap()),
            onlink: true,
            ..route("10.244.2.0/24", 4)
        };
        assert_eq!(
            view.describe(&flannel),
            "10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink (route -n: 10.244.2.0 10.244.2.0 255.255.255.0 UG flannel.1)"
        );
        let blackhole = Route {
            kind: RouteKind::Blackhole,
            oif: None,
            ..route("10.245.1.0/24", 0)
        };
        assert_eq!(
            view.describe(&blackhole),
            "blackhole 10.245.1.0/24 (route -n: 10.245.1.0 0.0.0.0 255.255.255.0 ! -)"
        );
    }

    #[test]
    fn longest_prefix_wins_and_other_tables_are_ignored() {
        let view = NodeView {
            routes: vec![
                route("0.0.0.0/0", 1),
                route("10.244.0.0/16", 2),
                route("10.244.2.0/24", 3),
                Route {
                    table: 255,
                    ..route("10.244.2.2/32", 4)
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            view.route_to("10.244.2.2".parse().unwrap()).unwrap().oif,
            Some(3)
        );
        assert_eq!(
            view.route_to("10.244.9.1".parse().unwrap()).unwrap().oif,
            Some(2)
        );
        assert_eq!(
            view.route_to("8.8.8.8".parse().unwrap()).unwrap().oif,
            Some(1)
        );
    }
}
