//! The node's IPv4 TCP sockets, as /proc/net/tcp lists them inside its
//! namespace (a BGP session is one).

use std::net::Ipv4Addr;

/// One IPv4 TCP socket of /proc/net/tcp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSocket {
    pub local: (Ipv4Addr, u16),
    pub remote: (Ipv4Addr, u16),
    pub state: u8,
}

/// The sockets of /proc/net/tcp's text (addresses in the kernel's byte
/// order, printed as a native u32).
pub fn parse_proc_net_tcp(text: &str) -> Vec<TcpSocket> {
    let endpoint = |field: &str| -> Option<(Ipv4Addr, u16)> {
        let (ip, port) = field.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?;
        Some((ip.to_ne_bytes().into(), u16::from_str_radix(port, 16).ok()?))
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            Some(TcpSocket {
                local: endpoint(fields.get(1)?)?,
                remote: endpoint(fields.get(2)?)?,
                state: u8::from_str_radix(fields.get(3)?, 16).ok()?,
            })
        })
        .collect()
}
