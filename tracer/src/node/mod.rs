//! What a node looks like: its links, addresses, routes and neighbours of
//! both families, and bridge FDB, read over rtnetlink; which of its interfaces podtrace
//! watches (`interfaces`); the namespaces of traced nodes (`netns`), of
//! pods (`pod_netns`); its tunnels (`tunnels`); its root filesystem as
//! seen from a container (`host_root`); its WireGuard devices and peers,
//! over generic netlink (`wireguard`).

pub mod host_root;
pub mod interfaces;
// Off Linux, readers that say they need it (the front-end never reads a node).
#[cfg_attr(not(target_os = "linux"), path = "netlink_elsewhere.rs")]
pub mod netlink;
pub mod netns;
pub mod pod_netns;
pub mod route;
mod route_lookup;
pub mod rules;
pub mod tunnels;
pub mod wireguard;
#[cfg(target_os = "linux")]
pub mod wireguard_watch;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};

pub(crate) use route::RT_TABLE_MAIN;
pub use route::{Route, RouteKind, RouteOrigin};

/// A link recorded before `up` was read was taken as up.
fn up_by_default() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// rtnetlink kind: "veth", "bridge", "vxlan", "ipip", … ("" for physical).
    pub kind: String,
    /// Bridge (controller) this link is a port of.
    pub controller: Option<u32>,
    pub has_ethernet_header: bool,
    pub mtu: u32,
    /// Administratively up (IFF_UP). A device that is down carries no
    /// packet: the fallback `tunl0` every namespace gets once ipip.ko is
    /// loaded stays down on a node whose CNI does not use it.
    #[serde(default = "up_by_default")]
    pub up: bool,
    /// The other end lives in another network namespace (a veth whose peer
    /// is a pod's eth0, unlike cilium_host/cilium_net, both on the host).
    pub peer_in_other_netns: bool,
    /// The id this namespace gives the namespace of its other end
    /// (`link-netnsid`): unlike an ifindex, it names one namespace.
    pub peer_netns_id: Option<i32>,
    /// The ifindex of its other end (a veth's peer), in that end's
    /// namespace.
    pub peer_index: Option<u32>,
    /// For a VXLAN device: what the kernel encapsulates with.
    pub vxlan: Option<VxlanDevice>,
}

/// A VXLAN device's settings (`ip -d link show`): `id`, `dstport`,
/// `local` and `dev`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VxlanDevice {
    pub vni: Option<u32>,
    pub port: Option<u16>,
    /// Its underlay address, of either family (flannel-v6.1's is IPv6).
    pub local: Option<IpAddr>,
    /// The underlay link it sends through.
    pub dev: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    pub links: Vec<Link>,
    /// (link index, address) for every IPv4 address.
    pub addresses: Vec<(u32, Ipv4Addr)>,
    /// (link index, address) for every global IPv6 address (not
    /// link-local: no packet of a pod pair is addressed to one).
    #[serde(default)]
    pub addresses6: Vec<(u32, Ipv6Addr)>,
    /// Routes of both families, of every table.
    pub routes: Vec<Route>,
    /// Policy routing rules of both families (`ip rule`).
    #[serde(default)]
    pub rules: Vec<rules::Rule>,
    /// Neighbours of both families (ARP and NDP): (link index, address,
    /// MAC).
    pub neighbours: Vec<(u32, IpAddr, [u8; 6])>,
    /// Neighbours the kernel asked for and had no answer from (FAILED):
    /// (link index, address).
    #[serde(default)]
    pub failed_neighbours: Vec<(u32, IpAddr)>,
    /// Bridge forwarding entries: (MAC, port link index).
    pub fdb: Vec<([u8; 6], u32)>,
    /// Remote addresses of FDB entries (a VXLAN device's: its peers'
    /// VTEPs, i.e. the other nodes): (link index, remote).
    pub fdb_remotes: Vec<(u32, IpAddr)>,
    /// Its WireGuard devices and their peers (none read where it has
    /// none), or why they were not read.
    #[serde(default)]
    pub wireguard: wireguard::WireGuard,
}

/// What podtrace learnt about one traced node at start.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct NodeFacts {
    pub view: NodeView,
    /// net.ipv4.ip_forward.
    pub forwarding: bool,
    /// The CNI backend it runs (`cni::Backend::name`).
    #[serde(deserialize_with = "crate::model::interned::leak_str")]
    pub cni: crate::model::interned::StaticStr,
    /// Subnets it delivers locally, through a bridge or a pod veth.
    pub local_pod_subnets: Vec<IpNet>,
    /// The traced pods that are local here, and their host interfaces.
    pub pod_interfaces: Vec<(IpAddr, String)>,
    /// The cluster's pod CIDR as the node's CNI devices suggest it, and
    /// the evidence ("flannel.1's 10.244.1.0/32").
    pub inferred_pod_cidr: Option<(Ipv4Net, String)>,
}

impl Link {
    /// An overlay device: what it sends is encapsulated, so it is never
    /// the underlay.
    pub fn is_tunnel(&self) -> bool {
        matches!(
            self.kind.as_str(),
            "vxlan" | "ipip" | "geneve" | "wireguard"
        )
    }
}

impl NodeView {
    pub fn link(&self, index: u32) -> Option<&Link> {
        self.links.iter().find(|l| l.index == index)
    }

    pub fn link_named(&self, name: &str) -> Option<&Link> {
        self.links.iter().find(|l| l.name == name)
    }

    /// The namespace's own IPv4 addresses.
    pub fn own_addresses(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.addresses.iter().map(|(_, ip)| *ip)
    }

    /// Whether `ip` (of either family) is one of the namespace's own
    /// addresses.
    pub fn holds(&self, ip: impl Into<IpAddr>) -> bool {
        match ip.into() {
            IpAddr::V4(v4) => self.own_addresses().any(|a| a == v4),
            IpAddr::V6(v6) => self.addresses6.iter().any(|(_, a)| *a == v6),
        }
    }

    /// The link holding `ip`, if the node owns it.
    pub fn link_with_address(&self, ip: impl Into<IpAddr>) -> Option<&Link> {
        let index = match ip.into() {
            IpAddr::V4(v4) => self.addresses.iter().find(|(_, a)| *a == v4)?.0,
            IpAddr::V6(v6) => self.addresses6.iter().find(|(_, a)| *a == v6)?.0,
        };
        self.link(index)
    }

    /// The route as `ip route` prints it, then as `route -n` does
    /// (Destination Gateway Genmask Flags Iface).
    pub fn describe(&self, route: &Route) -> String {
        let dev = route
            .oif
            .map(|i| self.link(i).map_or("?", |l| l.name.as_str()));
        route.describe_on(dev)
    }

    /// The link the main table's IPv4 default route leaves by.
    pub fn default_route_link(&self) -> Option<&Link> {
        self.route_to(Ipv4Addr::UNSPECIFIED)
            .filter(|r| r.destination.prefix_len() == 0)
            .and_then(|r| self.link(r.oif?))
    }

    /// The link on whose subnet `ip` is, reached without a gateway: the
    /// connected route's device (`192.0.2.0/24 dev eth0 proto kernel`),
    /// unless it is a tunnel.
    pub fn link_on_subnet_of(&self, ip: impl Into<IpAddr>) -> Option<&Link> {
        self.route_to(ip)
            .filter(|r| r.kind == RouteKind::Unicast && r.gateway.is_none())
            .filter(|r| r.destination.prefix_len() > 0)
            .and_then(|r| self.link(r.oif?))
            .filter(|l| !l.is_tunnel())
    }

    /// The link a packet for `dst` leaves by toward its route's gateway
    /// (`10.247.2.0/24 via 192.0.2.42 dev eth0 proto bird`); where that
    /// device is a tunnel (`via 192.0.2.12 dev tunl0 onlink`), the link
    /// on whose subnet the gateway is. None for a destination reached
    /// without a gateway (a local pod's veth or bridge).
    pub fn link_toward_gateway(&self, dst: impl Into<IpAddr>) -> Option<&Link> {
        let route = self
            .route_to(dst)
            .filter(|r| r.kind == RouteKind::Unicast)?;
        let gateway = route.gateway?;
        match self.link(route.oif?)? {
            link if !link.is_tunnel() => Some(link),
            _ => self.link_on_subnet_of(gateway),
        }
    }

    /// The veth a host route (/32, or /128) sends `ip` to (Calico's way of
    /// reaching a local pod).
    pub fn host_route_interface(&self, ip: impl Into<IpAddr>) -> Option<&Link> {
        self.route_to(ip)
            .filter(|r| r.destination.prefix_len() == r.destination.max_prefix_len())
            .filter(|r| r.gateway.is_none())
            .and_then(|r| r.oif)
            .and_then(|oif| self.link(oif))
            .filter(|l| l.kind == "veth")
    }

    /// The bridge port `ip`'s MAC was learnt on: the neighbour entry on a
    /// bridge gives the MAC, the bridge's FDB the port (a local pod behind
    /// cni0, as Flannel and the bridge plugin wire it).
    pub fn bridge_port_of(&self, ip: impl Into<IpAddr>) -> Option<&Link> {
        let ip = ip.into();
        let (bridge, _, mac) = self.neighbours.iter().find(|(_, addr, _)| *addr == ip)?;
        self.fdb
            .iter()
            .filter(|(m, _)| m == mac)
            .filter_map(|(_, port)| self.link(*port))
            .find(|l| l.controller == Some(*bridge) && l.kind == "veth")
    }

    /// The links of a kind ("vxlan", "bridge", …).
    pub fn links_of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Link> + 'a {
        self.links.iter().filter(move |l| l.kind == kind)
    }

    /// Whether Calico's BIRD installed any of its routes (`proto bird`).
    pub fn runs_bird(&self) -> bool {
        self.routes.iter().any(|r| r.protocol == RouteOrigin::Bird)
    }

    /// The Calico IPAM blocks of either family blackholed here, one per
    /// block affine to the node: by BIRD, which exports them to its peers
    /// (`blackhole 10.244.8.0/26 proto bird`), or by Felix where no BIRD
    /// runs (VXLAN mode, `proto 80`).
    pub fn calico_blocks(&self) -> impl Iterator<Item = IpNet> + '_ {
        let calico = |o: RouteOrigin| matches!(o, RouteOrigin::Bird | RouteOrigin::Felix);
        (self.routes.iter())
            .filter(move |r| r.kind == RouteKind::Blackhole && calico(r.protocol))
            .map(|r| r.destination)
    }

    /// The main-table route the kernel would pick for `dst` (longest
    /// prefix, among the routes of `dst`'s family).
    pub fn route_to(&self, dst: impl Into<IpAddr>) -> Option<&Route> {
        let dst = dst.into();
        self.routes
            .iter()
            .filter(|r| r.table == RT_TABLE_MAIN && r.destination.contains(&dst))
            .max_by_key(|r| r.destination.prefix_len())
    }
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
            up: true,
            peer_in_other_netns: kind == "veth",
            peer_netns_id: None,
            peer_index: None,
            vxlan: None,
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
            protocol: RouteOrigin::Boot,
        }
    }

    /// A Calico BGP node-`n` of two as netlink reads it, with no default
    /// route: its IPAM block 10.247.n.0/24 blackholed, its pod
    /// 10.247.n.5's /32 to a cali veth, the other node's block learnt by
    /// BIRD via its address 192.0.2.4x on ens3, and the unused tunl0.
    pub(crate) fn calico_bgp_node(n: u8) -> NodeView {
        let other = 3 - n;
        let bird = |dst: String, gateway: Option<String>, oif: Option<u32>| Route {
            protocol: RouteOrigin::Bird,
            gateway: gateway.map(|g| g.parse().unwrap()),
            oif,
            ..route(&dst, 0)
        };
        NodeView {
            links: vec![
                link(1, "lo", ""),
                link(2, "ens3", ""),
                Link {
                    up: false,
                    ..link(3, "tunl0", "ipip")
                },
                link(7, "cali1f2e3d4c5b6", "veth"),
            ],
            addresses: vec![
                (1, "127.0.0.1".parse().unwrap()),
                (2, format!("192.0.2.4{n}").parse().unwrap()),
            ],
            routes: vec![
                Route {
                    protocol: RouteOrigin::Kernel,
                    ..route("192.0.2.0/24", 2)
                },
                Route {
                    kind: RouteKind::Blackhole,
                    ..bird(format!("10.247.{n}.0/24"), None, None)
                },
                route(&format!("10.247.{n}.5/32"), 7),
                bird(
                    format!("10.247.{other}.0/24"),
                    Some(format!("192.0.2.4{other}")),
                    Some(2),
                ),
            ],
            ..Default::default()
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
                Link {
                    vxlan: Some(VxlanDevice {
                        vni: Some(1),
                        port: Some(8472),
                        local: Some("192.0.2.11".parse().unwrap()),
                        dev: Some(2),
                    }),
                    ..link(4, "flannel.1", "vxlan")
                },
                veth,
                // Down, as ipip.ko leaves it where no CNI uses it.
                Link {
                    up: false,
                    ..link(6, "tunl0", "ipip")
                },
            ],
            addresses: vec![
                (2, "192.0.2.11".parse().unwrap()),
                (3, "10.244.1.1".parse().unwrap()),
            ],
            neighbours: vec![(3, "10.244.1.2".parse().unwrap(), [2, 0, 0, 0, 1, 2])],
            fdb: vec![([2, 0, 0, 0, 1, 2], 5), ([2, 0, 0, 0, 1, 2], 3)],
            fdb_remotes: vec![(4, "192.0.2.12".parse().unwrap())],
            failed_neighbours: Vec::new(),
            addresses6: Vec::new(),
            rules: Vec::new(),
            wireguard: Default::default(),
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
    fn routes_read_as_ip_route_and_route_n_print_them() {
        let view = NodeView {
            links: vec![Link {
                index: 4,
                name: "flannel.1".into(),
                kind: "vxlan".into(),
                controller: None,
                has_ethernet_header: true,
                mtu: 1450,
                up: true,
                peer_in_other_netns: false,
                peer_netns_id: None,
                peer_index: None,
                vxlan: None,
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
            "blackhole 10.245.1.0/24 (route -n: 10.245.1.0 0.0.0.0 255.255.255.0 U *)"
        );
        // As net-tools 2.10 prints them (checked in a scratch netns).
        let bird = Route {
            protocol: RouteOrigin::Bird,
            ..blackhole.clone()
        };
        assert_eq!(
            view.describe(&bird),
            "blackhole 10.245.1.0/24 proto bird (route -n: 10.245.1.0 0.0.0.0 255.255.255.0 U *)"
        );
        let unreachable = Route {
            kind: RouteKind::Unreachable,
            ..route("10.246.0.5/32", 0)
        };
        assert_eq!(
            view.describe(&Route {
                oif: None,
                ..unreachable
            }),
            "unreachable 10.246.0.5/32 (route -n: 10.246.0.5 - 255.255.255.255 !H -)"
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
            view.route_to("10.244.2.2".parse::<IpAddr>().unwrap())
                .unwrap()
                .oif,
            Some(3)
        );
        assert_eq!(
            view.route_to("10.244.9.1".parse::<IpAddr>().unwrap())
                .unwrap()
                .oif,
            Some(2)
        );
        assert_eq!(
            view.route_to("8.8.8.8".parse::<IpAddr>().unwrap())
                .unwrap()
                .oif,
            Some(1)
        );
    }
}
