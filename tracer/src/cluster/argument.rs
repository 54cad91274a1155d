//! The SRC and DST arguments, checked before anything else runs: what
//! each one names (a pod, an address, a node, a Service), or a one-line
//! reason why it names nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV6};

use anyhow::{bail, Result};

/// What one endpoint argument names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Ip(Ipv4Addr),
    /// `ip:port`: a Service's ClusterIP and one of its ports (checked
    /// when the Services are known).
    IpPort(Ipv4Addr, u16),
    /// An IPv6 address: a dual-stack pod's, or a Service's IPv6
    /// ClusterIP; it asks for the pair's IPv6 traffic.
    Ip6(Ipv6Addr),
    /// `[addr]:port`: an IPv6 ClusterIP and one of its Service's ports.
    Ip6Port(Ipv6Addr, u16),
    Pod {
        namespace: String,
        name: String,
    },
    /// `node/<name>`: the node's InternalIP.
    Node(String),
    /// `svc/<name>` or `svc/<namespace>/<name>`: the ClusterIP.
    Service {
        namespace: String,
        name: String,
    },
}

impl Target {
    /// Parses `arg`; names without a namespace are in `namespace`.
    pub fn parse(arg: &str, namespace: &str) -> Result<Self> {
        let shown = format!("{arg:?}");
        if arg.trim().is_empty() {
            bail!("an empty pod argument: give namespace/name, a name with -n, or an IP address");
        }
        if arg.chars().any(char::is_whitespace) {
            bail!("{shown} is not a pod or an IP address: it has spaces (give namespace/name, a name with -n, or an IP address)");
        }
        if let Some(target) = address(arg)? {
            return Ok(target);
        }
        if let Some(node) = arg.strip_prefix("node/") {
            check_name(node, "node", arg)?;
            return Ok(Self::Node(node.to_string()));
        }
        if let Some(service) = arg.strip_prefix("svc/") {
            let (ns, name) = service.split_once('/').unwrap_or((namespace, service));
            check_label(ns, arg)?;
            check_name(name, "service", arg)?;
            return Ok(Self::Service {
                namespace: ns.into(),
                name: name.into(),
            });
        }
        let (ns, name) = arg.split_once('/').unwrap_or((namespace, arg));
        check_label(ns, arg)?;
        no_port_on_a_name(name, arg)?;
        check_name(name, "pod", arg)?;
        Ok(Self::Pod {
            namespace: ns.into(),
            name: name.into(),
        })
    }

    pub fn ip(&self) -> Option<Ipv4Addr> {
        match self {
            Self::Ip(ip) | Self::IpPort(ip, _) => Some(*ip),
            _ => None,
        }
    }

    /// An address argument's address, of either family.
    pub fn address(&self) -> Option<IpAddr> {
        self.ip().map(IpAddr::V4).or(self.ipv6().map(IpAddr::V6))
    }

    /// An IPv6 address argument's address.
    pub fn ipv6(&self) -> Option<Ipv6Addr> {
        match self {
            Self::Ip6(ip) | Self::Ip6Port(ip, _) => Some(*ip),
            _ => None,
        }
    }

    /// The port of an `ip:port` or `[ip]:port` argument.
    pub fn port(&self) -> Option<u16> {
        match self {
            Self::IpPort(_, port) | Self::Ip6Port(_, port) => Some(*port),
            _ => None,
        }
    }
}

/// An argument that looks like an address: an IPv4 or IPv6 address (with
/// a port: `ip:port`, `[ip]:port`), or why it is not one (an octet over
/// 255, a CIDR, a zone).
fn address(arg: &str) -> Result<Option<Target>> {
    let target = address_of_any_kind(arg)?;
    if let Some(ip) = target.as_ref().and_then(Target::address) {
        one_hosts(ip, arg)?;
    }
    Ok(target)
}

/// `ip` can be one pod's or Service's own: not an address every namespace
/// has (loopback, unspecified) nor one that reaches many (multicast,
/// broadcast), nor an IPv4 address written as IPv6.
fn one_hosts(ip: IpAddr, arg: &str) -> Result<()> {
    let what = match ip {
        IpAddr::V4(v4) if v4.is_loopback() => {
            "a loopback address: every network namespace has its own"
        }
        IpAddr::V4(v4) if v4.is_unspecified() => "the unspecified address",
        IpAddr::V4(v4) if v4.is_multicast() => "a multicast address",
        IpAddr::V4(v4) if v4.is_broadcast() => "the broadcast address",
        IpAddr::V6(v6) if v6.is_loopback() => {
            "a loopback address: every network namespace has its own"
        }
        IpAddr::V6(v6) if v6.is_unspecified() => "the unspecified address",
        IpAddr::V6(v6) if v6.is_multicast() => "a multicast address",
        IpAddr::V6(v6) if v6.is_unicast_link_local() => {
            "a link-local address: every interface has its own"
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => bail!("{arg} is an IPv4 address written as IPv6: give {v4}"),
            None => return Ok(()),
        },
        IpAddr::V4(_) => return Ok(()),
    };
    bail!("{arg} is {what}, not one pod's or Service's: give the pod's own address, namespace/name, or svc/name")
}

fn address_of_any_kind(arg: &str) -> Result<Option<Target>> {
    if let Ok(ip) = arg.parse::<Ipv4Addr>() {
        return Ok(Some(Target::Ip(ip)));
    }
    // Bracketed without a port too, as a URL writes it: `[fd00::1]`.
    let unbracketed = arg.strip_prefix('[').and_then(|a| a.strip_suffix(']'));
    if let Ok(ip) = unbracketed.unwrap_or(arg).parse::<Ipv6Addr>() {
        return Ok(Some(Target::Ip6(ip)));
    }
    if let Ok(socket) = arg.parse::<SocketAddrV6>() {
        if socket.scope_id() != 0 {
            bail!("{arg}: a zone (%) names a link, not a pod's or Service's address");
        }
        return Ok(Some(Target::Ip6Port(*socket.ip(), socket.port())));
    }
    if let Some((ip, len)) = arg.split_once('/') {
        let address = ip.parse::<Ipv4Addr>().is_ok() || ip.parse::<Ipv6Addr>().is_ok();
        if address && len.parse::<u8>().is_ok() {
            bail!("{arg} is a network, not an address: give one address (e.g. {ip})");
        }
    }
    if arg.contains("::") || (arg.starts_with('[') && arg.contains(']')) {
        bail!("{arg} is not an IPv6 address (as in fd00:10:244:1::2, or [fd00:10:96::a]:80 with a port)");
    }
    if let Some((ip, port)) = arg.rsplit_once(':') {
        if let Ok(ip) = ip.parse::<Ipv4Addr>() {
            return match port.parse::<u16>() {
                // A Service's ClusterIP:port; whether it is one is checked
                // against the Services (`targets`).
                Ok(port) if port > 0 => Ok(Some(Target::IpPort(ip, port))),
                _ => bail!("{arg}: {port:?} is not a port (1 to 65535)"),
            };
        }
    }
    let dotted_digits = arg.contains('.') && arg.chars().all(|c| c.is_ascii_digit() || c == '.');
    if dotted_digits {
        bail!(
            "{arg} is not an IPv4 address: it needs four numbers from 0 to 255, as in 10.244.1.2"
        );
    }
    Ok(None)
}

/// `db-0:8080`: a pod takes no port (only a ClusterIP does); the port is a
/// filter, so say which flag, and whether the number could be one at all.
fn no_port_on_a_name(name: &str, arg: &str) -> Result<()> {
    let Some((pod, port)) = name.rsplit_once(':') else {
        return Ok(());
    };
    if pod.is_empty() || port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()) {
        return Ok(());
    }
    match port.parse::<u16>() {
        Ok(port) if port > 0 => bail!(
            "{arg:?}: a pod argument takes no port (ip:port is for a Service's ClusterIP): give {pod} --port {port}"
        ),
        _ => bail!("{arg:?}: {port:?} is not a port (1 to 65535), and a pod argument takes none: filter with --port N"),
    }
}

/// A namespace is an RFC 1123 label.
fn check_label(ns: &str, arg: &str) -> Result<()> {
    let valid = !ns.is_empty()
        && ns.len() <= 63
        && ns
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !ns.starts_with('-')
        && !ns.ends_with('-');
    if !valid {
        bail!("{arg:?}: {ns:?} is not a namespace (lowercase letters, digits and '-', at most 63)");
    }
    Ok(())
}

/// Pod, node and Service names are RFC 1123 subdomains (Services are
/// labels, which are subdomains too).
fn check_name(name: &str, kind: &str, arg: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if !valid {
        if name.contains('/') {
            bail!("{arg:?} has too many '/': a {kind} is namespace/name");
        }
        bail!("{arg:?}: {name:?} is not a {kind} name (lowercase letters, digits, '-' and '.')");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(arg: &str) -> String {
        Target::parse(arg, "default").unwrap_err().to_string()
    }

    #[test]
    fn addresses_no_pod_can_own_are_refused_in_one_line() {
        for (arg, says) in [
            ("127.0.0.1", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("ff02::1", "multicast"),
            ("fe80::1", "link-local"),
            ("::ffff:10.244.1.2", "give 10.244.1.2"),
            ("127.0.0.1:80", "loopback"),
            ("10.244.2.3:65536", "\"65536\" is not a port"),
            ("10.244.2.3:0", "\"0\" is not a port"),
        ] {
            let e = error(arg);
            assert!(e.contains(says) && e.lines().count() == 1, "{arg}: {e}");
        }
        assert!(Target::parse("10.244.2.3:8080", "default").is_ok());
    }

    #[test]
    fn pods_addresses_nodes_and_services() {
        let pod = |ns: &str, name: &str| Target::Pod {
            namespace: ns.into(),
            name: name.into(),
        };
        assert_eq!(
            Target::parse("web-0", "default").unwrap(),
            pod("default", "web-0")
        );
        assert_eq!(
            Target::parse("kube-system/coredns-5d78c9869d-abcde", "x").unwrap(),
            pod("kube-system", "coredns-5d78c9869d-abcde")
        );
        assert_eq!(
            Target::parse("10.244.1.2", "x").unwrap(),
            Target::Ip(Ipv4Addr::new(10, 244, 1, 2))
        );
        assert_eq!(
            Target::parse("node/worker-1", "x").unwrap(),
            Target::Node("worker-1".into())
        );
        assert_eq!(
            Target::parse("svc/db", "prod").unwrap(),
            Target::Service {
                namespace: "prod".into(),
                name: "db".into()
            }
        );
    }

    #[test]
    fn garbage_says_what_is_wrong_with_the_argument() {
        assert!(error("").contains("empty"), "{}", error(""));
        assert!(error("foo bar").contains("has spaces"));
        assert!(error("10.244.1.300").contains("not an IPv4 address"));
        assert!(error("10.244.1.2/24").contains("is a network"));
        assert_eq!(
            Target::parse("10.96.0.1:80", "x").unwrap(),
            Target::IpPort(Ipv4Addr::new(10, 96, 0, 1), 80)
        );
        assert!(error("10.96.0.1:99999").contains("\"99999\" is not a port"));
        assert_eq!(
            Target::parse("fd00:10:244:1::2", "x").unwrap(),
            Target::Ip6("fd00:10:244:1::2".parse().unwrap())
        );
        assert_eq!(
            Target::parse("[fd00:10:96::a]:80", "x").unwrap(),
            Target::Ip6Port("fd00:10:96::a".parse().unwrap(), 80)
        );
        assert_eq!(
            Target::parse("[fd00:10:244:1::2]", "x").unwrap(),
            Target::Ip6("fd00:10:244:1::2".parse().unwrap())
        );
        assert!(error("fd00::/64").contains("is a network"));
        assert!(error("fd00::zz").contains("not an IPv6 address"));
        assert!(error("[fe80::1%2]:80").contains("zone"));
        assert!(error("Web_0").contains("not a pod name"));
        assert!(error("db-0:99999").contains("\"99999\" is not a port"));
        assert!(error("default/db-0:8080").contains("give db-0 --port 8080"));
        assert!(error("a/b/c").contains("too many '/'"));
        assert!(error("Kube-System/x").contains("not a namespace"));
    }
}
