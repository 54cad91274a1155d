//! Reading a node over rtnetlink: links (with their VXLAN settings),
//! addresses, routes (with their protocol), neighbours and the bridge FDB.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use ipnet::IpNet;
use rtnetlink::{
    packet_route::{
        address::AddressAttribute,
        link::{
            InfoData, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkLayerType,
            LinkMessage,
        },
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState},
        route::{RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol, RouteType},
        rule::{self as rtrule, RuleAttribute, RuleFlags, RuleMessage},
        AddressFamily,
    },
    Handle, IpVersion, RouteMessageBuilder,
};

use super::{
    rules::{Rule, RuleAction},
    Link, NodeView, Route, RouteKind, RouteOrigin, VxlanDevice,
};

/// The route protocol Calico's Felix writes its routes with (`proto 80`).
const FELIX_ROUTE_PROTOCOL: u8 = 80;

impl NodeView {
    /// Only the IPv4 addresses of the calling thread's namespace: the
    /// cheap look at a namespace that may be a pod's.
    pub async fn read_addresses() -> Result<Vec<(u32, Ipv4Addr)>> {
        let (connection, handle, _) =
            rtnetlink::new_connection().context("cannot open an rtnetlink socket")?;
        let task = tokio::spawn(connection);
        let addresses = read_addresses(&handle).await;
        task.abort();
        addresses
    }

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
            let (addresses, addresses6) = by_family(read_all_addresses(&handle).await?);
            let mut routes: Vec<Route> = handle
                .route()
                .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
                .execute()
                .try_filter_map(|msg| async move { Ok(route_from(msg)) })
                .try_collect()
                .await
                .context("cannot list routes")?;
            // A kernel without IPv6 has no IPv6 routes to list.
            let routes6: Vec<Route> = handle
                .route()
                .get(RouteMessageBuilder::<Ipv6Addr>::new().build())
                .execute()
                .try_filter_map(|msg| async move { Ok(route_from(msg)) })
                .try_collect()
                .await
                .unwrap_or_default();
            routes.extend(routes6);
            let Neighbours {
                resolved: neighbours,
                failed: failed_neighbours,
                fdb,
                fdb_remotes,
            } = read_neighbours(&handle).await?;
            let rules = read_rules(&handle).await?;
            let wireguard: Vec<(u32, &str, bool)> = (links.iter())
                .filter(|l| l.kind == super::wireguard::KIND)
                .map(|l| (l.index, l.name.as_str(), l.up))
                .collect();
            let wireguard = super::wireguard::read(&wireguard);
            Ok(NodeView {
                wireguard,
                rules,
                neighbours,
                failed_neighbours,
                fdb,
                fdb_remotes,
                links,
                addresses,
                addresses6,
                routes,
            })
        }
        .await;
        task.abort();
        result
    }
}

/// The id the calling thread's namespace gives the namespace `other`
/// (an open handle on it: `/run/netns/X`, `/proc/PID/ns/net`), as a
/// veth's `link-netnsid` names it; `None` when it has given it none.
pub async fn netns_id_of(other: &std::fs::File) -> Result<Option<i32>> {
    use std::os::fd::AsRawFd;

    use rtnetlink::{
        packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REQUEST},
        packet_route::{
            nsid::{NsidAttribute, NsidMessage},
            RouteNetlinkMessage,
        },
    };

    let (connection, mut handle, _) =
        rtnetlink::new_connection().context("cannot open an rtnetlink socket")?;
    let task = tokio::spawn(connection);
    let mut ask = NsidMessage::default();
    ask.attributes
        .push(NsidAttribute::Fd(other.as_raw_fd() as u32));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetNsId(ask));
    request.header.flags = NLM_F_REQUEST;
    let answers: Vec<_> = match handle.request(request) {
        Ok(stream) => stream.collect().await,
        Err(e) => {
            task.abort();
            return Err(e).context("cannot ask for a namespace id");
        }
    };
    task.abort();
    let id = answers.into_iter().find_map(|answer| match answer.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewNsId(msg)) => {
            msg.attributes.into_iter().find_map(|a| match a {
                NsidAttribute::Id(id) => Some(id),
                _ => None,
            })
        }
        _ => None,
    });
    // -1: NETNSA_NSID_NOT_ASSIGNED.
    Ok(id.filter(|id| *id >= 0))
}

/// The source address the calling thread's namespace sends from toward
/// `dst` (`ip route get DST`'s `src`); `None` where it has no route.
pub async fn source_toward(dst: Ipv4Addr) -> Result<Option<Ipv4Addr>> {
    let (connection, handle, _) =
        rtnetlink::new_connection().context("cannot open an rtnetlink socket")?;
    let task = tokio::spawn(connection);
    let asked = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(dst, 32)
        .build();
    let answer: Result<Vec<RouteMessage>, _> =
        handle.route().get(asked).execute().try_collect().await;
    task.abort();
    // Unreachable is an answer too: no source.
    Ok(answer
        .unwrap_or_default()
        .iter()
        .flat_map(|m| &m.attributes)
        .find_map(|a| match a {
            RouteAttribute::PrefSource(RouteAddress::Inet(ip)) => Some(*ip),
            _ => None,
        }))
}

/// (link index, address) of every IPv4 address.
async fn read_addresses(handle: &Handle) -> Result<Vec<(u32, Ipv4Addr)>> {
    Ok(by_family(read_all_addresses(handle).await?).0)
}

/// (link index, address) of each family.
type Addresses = (Vec<(u32, Ipv4Addr)>, Vec<(u32, Ipv6Addr)>);

/// Addresses by family: IPv4, and global IPv6 (link-local ones, fe80::/10,
/// are no pod's or node's address a packet is traced by).
fn by_family(all: Vec<(u32, IpAddr)>) -> Addresses {
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for (index, ip) in all {
        match ip {
            IpAddr::V4(ip) => v4.push((index, ip)),
            IpAddr::V6(ip) if !ip.is_unicast_link_local() => v6.push((index, ip)),
            IpAddr::V6(_) => {}
        }
    }
    (v4, v6)
}

/// (link index, address) of every address of both families: an IPv4
/// one's local address (its peer's on a point-to-point link is not its
/// own), an IPv6 one's address.
async fn read_all_addresses(handle: &Handle) -> Result<Vec<(u32, IpAddr)>> {
    handle
        .address()
        .get()
        .execute()
        .try_filter_map(|msg| async move {
            Ok(msg.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(ip @ IpAddr::V4(_))
                | AddressAttribute::Address(ip @ IpAddr::V4(_))
                | AddressAttribute::Address(ip @ IpAddr::V6(_)) => Some((msg.header.index, *ip)),
                _ => None,
            }))
        })
        .try_collect()
        .await
        .context("cannot list addresses")
}

/// The neighbour tables, as `NodeView` keeps them.
#[derive(Default)]
struct Neighbours {
    /// Both families: (link, address, MAC).
    resolved: Vec<(u32, IpAddr, [u8; 6])>,
    /// Both families, FAILED: (link, address).
    failed: Vec<(u32, IpAddr)>,
    /// Bridge FDB entries: (MAC, port).
    fdb: Vec<([u8; 6], u32)>,
    /// The remote IPs of VXLAN FDB entries: (link, remote).
    fdb_remotes: Vec<(u32, IpAddr)>,
}

async fn read_neighbours(handle: &Handle) -> Result<Neighbours> {
    let mut read = Neighbours::default();
    for family in [
        AddressFamily::Inet,
        AddressFamily::Inet6,
        AddressFamily::Bridge,
    ] {
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
                NeighbourAttribute::Destination(NeighbourAddress::Inet(ip)) => {
                    Some(IpAddr::V4(*ip))
                }
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(ip)) => {
                    Some(IpAddr::V6(*ip))
                }
                // AF_BRIDGE entries carry their remote as raw bytes.
                NeighbourAttribute::Destination(NeighbourAddress::Other(bytes)) => {
                    match bytes.len() {
                        4 => <[u8; 4]>::try_from(bytes.as_slice()).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(bytes.as_slice())
                            .ok()
                            .map(IpAddr::from),
                        _ => None,
                    }
                }
                _ => None,
            });
            match (family, mac, ip) {
                (AddressFamily::Inet | AddressFamily::Inet6, Some(mac), Some(ip)) => {
                    read.resolved.push((entry.header.ifindex, ip, mac))
                }
                // Asked and never answered (ARP or NDP): what packets to
                // that next hop meet until the entry is forgotten.
                (AddressFamily::Inet | AddressFamily::Inet6, None, Some(ip))
                    if entry.header.state == NeighbourState::Failed =>
                {
                    read.failed.push((entry.header.ifindex, ip))
                }
                (AddressFamily::Bridge, Some(mac), remote) => {
                    read.fdb.push((mac, entry.header.ifindex));
                    // A VXLAN device's entries name the remote VTEP.
                    (read.fdb_remotes).extend(remote.map(|ip| (entry.header.ifindex, ip)));
                }
                _ => {}
            }
        }
    }
    Ok(read)
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
            up: msg.header.flags.contains(LinkFlags::Up),
            peer_in_other_netns: false,
            peer_netns_id: None,
            peer_index: None,
            vxlan: None,
        };
        for attr in msg.attributes {
            match attr {
                LinkAttribute::IfName(name) => link.name = name,
                LinkAttribute::Controller(index) => link.controller = Some(index),
                LinkAttribute::Mtu(mtu) => link.mtu = mtu,
                LinkAttribute::LinkNetNsId(id) => {
                    link.peer_in_other_netns = true;
                    link.peer_netns_id = Some(id);
                }
                LinkAttribute::Link(index) => link.peer_index = Some(index),
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match info {
                            LinkInfo::Kind(kind) => link.kind = kind_name(&kind),
                            LinkInfo::Data(InfoData::Vxlan(settings)) => {
                                link.vxlan = Some(vxlan_device(&settings))
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        link
    }
}

fn vxlan_device(settings: &[InfoVxlan]) -> VxlanDevice {
    let mut device = VxlanDevice::default();
    for setting in settings {
        match setting {
            InfoVxlan::Id(vni) => device.vni = Some(*vni),
            InfoVxlan::Port(port) => device.port = Some(*port),
            InfoVxlan::Local(ip) => device.local = Some(IpAddr::V4(*ip)),
            InfoVxlan::Local6(ip) => device.local = Some(IpAddr::V6(*ip)),
            InfoVxlan::Link(index) => device.dev = Some(*index),
            _ => {}
        }
    }
    device
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
            RouteAttribute::Destination(RouteAddress::Inet(ip)) => {
                destination = Some(IpAddr::V4(*ip))
            }
            RouteAttribute::Destination(RouteAddress::Inet6(ip)) => {
                destination = Some(IpAddr::V6(*ip))
            }
            RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gateway = Some(IpAddr::V4(*ip)),
            RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gateway = Some(IpAddr::V6(*ip)),
            RouteAttribute::Oif(index) => oif = Some(*index),
            RouteAttribute::Table(t) => table = *t,
            _ => {}
        }
    }
    let unspecified = match msg.header.address_family {
        AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    let destination = IpNet::new(
        destination.unwrap_or(unspecified),
        msg.header.destination_prefix_length,
    )
    .ok()?;
    Some(Route {
        destination,
        gateway,
        oif,
        table,
        onlink: msg.header.flags.contains(RouteFlags::Onlink),
        protocol: match msg.header.protocol {
            RouteProtocol::Kernel => RouteOrigin::Kernel,
            RouteProtocol::Boot => RouteOrigin::Boot,
            RouteProtocol::Static => RouteOrigin::Static,
            RouteProtocol::Bird => RouteOrigin::Bird,
            RouteProtocol::Other(FELIX_ROUTE_PROTOCOL) => RouteOrigin::Felix,
            _ => RouteOrigin::Other,
        },
        kind: match msg.header.kind {
            RouteType::BlackHole => RouteKind::Blackhole,
            RouteType::Unreachable => RouteKind::Unreachable,
            RouteType::Prohibit => RouteKind::Prohibit,
            RouteType::Local | RouteType::Broadcast => RouteKind::Local,
            _ => RouteKind::Unicast,
        },
    })
}

/// The policy rules of both families (`ip rule`, `ip -6 rule`); a kernel
/// without IPv6 has none of its own to list.
async fn read_rules(handle: &Handle) -> Result<Vec<Rule>> {
    let mut rules: Vec<Rule> = handle
        .rule()
        .get(IpVersion::V4)
        .execute()
        .try_filter_map(|msg| async move { Ok(rule_from(msg)) })
        .try_collect()
        .await
        .context("cannot list policy rules")?;
    let rules6: Vec<Rule> = handle
        .rule()
        .get(IpVersion::V6)
        .execute()
        .try_filter_map(|msg| async move { Ok(rule_from(msg)) })
        .try_collect()
        .await
        .unwrap_or_default();
    rules.extend(rules6);
    Ok(rules)
}

fn rule_from(msg: RuleMessage) -> Option<Rule> {
    let header = &msg.header;
    let ipv6 = match header.family {
        AddressFamily::Inet => false,
        AddressFamily::Inet6 => true,
        _ => return None,
    };
    let mut rule = Rule {
        invert: header.flags.contains(RuleFlags::Invert),
        unsupported: (header.tos != 0).then(|| format!("tos {:#x}", header.tos)),
        ..Rule::selecting_all(0, ipv6, RuleAction::Nop)
    };
    let mut table = u32::from(header.table);
    let mut goto = None;
    let (mut mark, mut mask) = (None, None);
    let mut unevaluated = Vec::new();
    for attr in &msg.attributes {
        match attr {
            RuleAttribute::Priority(p) => rule.priority = *p,
            RuleAttribute::Source(ip) => rule.from = IpNet::new(*ip, header.src_len).ok(),
            RuleAttribute::Destination(ip) => rule.to = IpNet::new(*ip, header.dst_len).ok(),
            RuleAttribute::Iifname(name) => rule.iif = Some(name.clone()),
            RuleAttribute::Oifname(name) => rule.oif = Some(name.clone()),
            RuleAttribute::FwMark(m) => mark = Some(*m),
            RuleAttribute::FwMask(m) => mask = Some(*m),
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::Goto(p) => goto = Some(*p),
            // The kernel says u32::MAX for none.
            RuleAttribute::SuppressPrefixLen(len) => {
                rule.suppress_prefixlen = u8::try_from(*len).ok()
            }
            RuleAttribute::SuppressIfGroup(group) if *group != u32::MAX => {
                unevaluated.push(format!("suppress_ifgroup {group}"))
            }
            RuleAttribute::L3MDev(true) => unevaluated.push("l3mdev".into()),
            RuleAttribute::UidRange(range) => {
                unevaluated.push(format!("uidrange {}-{}", range.start, range.end))
            }
            RuleAttribute::IpProtocol(proto) => unevaluated.push(format!("ipproto {proto:?}")),
            RuleAttribute::SourcePortRange(_) => unevaluated.push("sport".into()),
            RuleAttribute::DestinationPortRange(_) => unevaluated.push("dport".into()),
            RuleAttribute::TunId(id) => unevaluated.push(format!("tun_id {id}")),
            _ => {}
        }
    }
    if !unevaluated.is_empty() {
        rule.unsupported.get_or_insert(unevaluated.join(" "));
    }
    // An unmasked mark matches all its bits.
    rule.fwmark = mark.map(|mark| (mark, mask.unwrap_or(u32::MAX)));
    rule.action = match header.action {
        rtrule::RuleAction::ToTable => RuleAction::Lookup(table),
        rtrule::RuleAction::Goto => RuleAction::Goto(goto.unwrap_or(0)),
        rtrule::RuleAction::Blackhole => RuleAction::Blackhole,
        rtrule::RuleAction::Unreachable => RuleAction::Unreachable,
        rtrule::RuleAction::Prohibit => RuleAction::Prohibit,
        _ => RuleAction::Nop,
    };
    Some(rule)
}
