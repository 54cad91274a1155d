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
        route::{RouteAddress, RouteAttribute, RouteMessage},
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
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Route {
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
            Ok(NodeView {
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
        };
        for attr in msg.attributes {
            match attr {
                LinkAttribute::IfName(name) => link.name = name,
                LinkAttribute::Controller(index) => link.controller = Some(index),
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
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(dst: &str, oif: u32) -> Route {
        Route {
            destination: dst.parse().unwrap(),
            gateway: None,
            oif: Some(oif),
            table: 254,
        }
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
