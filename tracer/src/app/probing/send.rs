//! One probe, sent from the network namespace this thread is in, and its
//! answer read: a TCP connection (SYN → SYN-ACK or RST), a UDP datagram
//! (a reply, or ICMP port unreachable), an ICMP echo (a reply, or an ICMP
//! error about it). Every socket is closed before it returns.

use std::{
    io::ErrorKind,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::about::Sent;
use crate::model::ProbeKind;

/// What one probe learnt.
#[derive(Debug)]
pub(super) struct Answer {
    pub answered: bool,
    /// Nothing came back at all: no answer, no refusal.
    pub silent: bool,
    pub rtt: Option<Duration>,
    pub result: String,
}

/// A socket for `kind`, bound so that its flow is known before it sends:
/// the source port (TCP, UDP; an ICMP datagram socket's port is its echo
/// identifier). ICMP takes the unprivileged ping socket where the pod's
/// `ping_group_range` allows it (so an agent needs no CAP_NET_RAW), else
/// a raw socket, whose echo identifier is chosen by the caller.
pub(super) fn socket(kind: ProbeKind) -> std::io::Result<Socket> {
    let bound = |kind, protocol| -> std::io::Result<Socket> {
        let socket = Socket::new(Domain::IPV4, kind, Some(protocol))?;
        socket.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)).into())?;
        Ok(socket)
    };
    match kind {
        ProbeKind::Tcp(_) => bound(Type::STREAM, Protocol::TCP),
        ProbeKind::Udp(_) => bound(Type::DGRAM, Protocol::UDP),
        ProbeKind::Icmp => bound(Type::DGRAM, Protocol::ICMPV4)
            .or_else(|_| Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))),
    }
}

/// Whether `socket` is a raw one: it reads whole IPv4 packets, and its
/// echo identifier is the caller's.
pub(super) fn is_raw(socket: &Socket) -> bool {
    socket.r#type().is_ok_and(|t| t == Type::RAW)
}

/// The source port a bound socket got.
pub(super) fn local_port(socket: &Socket) -> u16 {
    socket
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .map_or(0, |a| a.port())
}

/// Sends the probe packet `sent` on `socket` and waits at most `timeout`
/// for its answer.
pub(super) fn send(socket: Socket, sent: &Sent, timeout: Duration) -> Answer {
    let waited = humantime::format_duration(timeout);
    let kind = sent.kind;
    let outcome = match kind {
        ProbeKind::Tcp(port) => connect(&socket, SocketAddrV4::new(sent.dst, port), timeout),
        ProbeKind::Udp(port) => datagram(&socket, SocketAddrV4::new(sent.dst, port), timeout),
        ProbeKind::Icmp => echo(&socket, sent, timeout),
    };
    match outcome {
        Ok(answer) => answer,
        Err(e) if matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock) => Answer {
            answered: false,
            silent: true,
            rtt: None,
            result: format!("no answer in {waited}"),
        },
        Err(e) => Answer {
            answered: false,
            silent: false,
            rtt: None,
            result: refusal(&e, kind),
        },
    }
}

/// A TCP probe refused, before its SYN's story says by what.
pub(super) const REFUSED: &str = "refused";

/// A UDP probe refused, before its datagram's story says by what (a
/// closed port, or a rule's REJECT on the way).
pub(super) const PORT_UNREACHABLE: &str = "ICMP port unreachable";

/// An error that is the network's answer, in its terms.
fn refusal(e: &std::io::Error, kind: ProbeKind) -> String {
    match (e.kind(), e.raw_os_error()) {
        // An RST or an ICMP port unreachable: connect(2) says the same of
        // both. The SYN's story tells which (`Watch::explained`).
        (ErrorKind::ConnectionRefused, _) if matches!(kind, ProbeKind::Tcp(_)) => REFUSED.into(),
        (ErrorKind::ConnectionRefused, _) => PORT_UNREACHABLE.into(),
        (_, Some(libc::EHOSTUNREACH)) => {
            "host unreachable (ICMP, or no neighbour answered ARP)".into()
        }
        (_, Some(libc::ENETUNREACH)) => "network unreachable: the pod has no route there".into(),
        (_, Some(libc::EPERM | libc::EACCES)) => {
            format!("refused by the pod's own firewall ({e})")
        }
        _ => format!("failed: {e}"),
    }
}

fn connect(socket: &Socket, to: SocketAddrV4, timeout: Duration) -> std::io::Result<Answer> {
    let sent = Instant::now();
    socket.connect_timeout(&SockAddr::from(to), timeout)?;
    let rtt = sent.elapsed();
    Ok(Answer {
        answered: true,
        silent: false,
        rtt: Some(rtt),
        result: format!("connected in {} (SYN → SYN-ACK)", millis(rtt)),
    })
}

fn datagram(socket: &Socket, to: SocketAddrV4, timeout: Duration) -> std::io::Result<Answer> {
    socket.connect(&SockAddr::from(to))?;
    socket.set_read_timeout(Some(timeout))?;
    let sent = Instant::now();
    socket.send(b"podtrace probe\n")?;
    let mut reply = [std::mem::MaybeUninit::new(0u8); 512];
    socket.recv(&mut reply)?;
    let rtt = sent.elapsed();
    Ok(Answer {
        answered: true,
        silent: false,
        rtt: Some(rtt),
        result: format!("answered in {}", millis(rtt)),
    })
}

fn echo(socket: &Socket, probe: &Sent, timeout: Duration) -> std::io::Result<Answer> {
    let to = probe.dst;
    let request = super::icmp::echo_request(probe.flow, probe.seq);
    let sent = Instant::now();
    socket.send_to(&request, &SockAddr::from(SocketAddrV4::new(to, 0)))?;
    let deadline = sent + timeout;
    let mut buf = [std::mem::MaybeUninit::new(0u8); 1500];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        // At least 1 ms: a zero timeval would wait forever.
        socket.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        let n = socket.recv(&mut buf)?;
        // SAFETY: recv initialised the first n bytes.
        let packet: Vec<u8> = buf[..n]
            .iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        let reply = if is_raw(socket) {
            super::icmp::about_our_echo(&packet, probe)
        } else {
            // A ping socket reads the ICMP message alone, with the
            // identifier the kernel gave it.
            super::icmp::about_icmp(to, &packet, probe)
        };
        let Some(reply) = reply else {
            continue;
        };
        let rtt = sent.elapsed();
        return Ok(match reply {
            super::icmp::Reply::Echo => Answer {
                answered: true,
                silent: false,
                rtt: Some(rtt),
                result: format!("echo reply in {}", millis(rtt)),
            },
            super::icmp::Reply::Error(what) => Answer {
                answered: false,
                silent: false,
                rtt: Some(rtt),
                result: what,
            },
        });
    }
}

fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}
