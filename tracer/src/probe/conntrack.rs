//! Conntrack's translations, from ctnetlink: the entries of a node's
//! namespace that a NAT rule created (kube-proxy's DNAT, a MASQUERADE),
//! with both tuples, the zone and the mark.
//!
//! podtrace subscribes to the NEW and UPDATE events of the namespace the
//! calling thread is in (the socket stays bound to it) and also dumps the
//! table once, so that connections opened before the trace are known.
//! Events are the earliest word userspace can have of a translation: the
//! kernel sends them when the connection's first packet is confirmed, as
//! it leaves the node's stack. Only entries with a NAT bit set are
//! forwarded. Nothing is attached: the socket closes with the reading
//! thread, which ends when the trace stops listening.

use std::{net::IpAddr, time::Duration};

use anyhow::{Context, Result};
#[cfg(target_os = "linux")]
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
use tokio::sync::mpsc;

use crate::model::conntrack::{Entry, Tuple};

// linux/netfilter/nfnetlink.h, nfnetlink_conntrack.h.
pub(super) const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const NFNLGRP_CONNTRACK_NEW: u32 = 1;
const NFNLGRP_CONNTRACK_UPDATE: u32 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_MARK: u16 = 8;
const CTA_ZONE: u16 = 18;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
pub(super) const NLMSG_HDR: usize = 16;
pub(super) const NFGEN_HDR: usize = 4;
pub(super) const NLMSG_DONE: u16 = 3;
pub(super) const NLM_F_REQUEST: u16 = 1;
pub(super) const NLM_F_DUMP: u16 = 0x300;

#[cfg(target_os = "linux")]
/// Forwards the translated conntrack entries of the calling thread's
/// namespace, tagged with `node_id`: those already there, then each new
/// one.
pub fn watch(node_id: u32, tx: mpsc::UnboundedSender<(u32, Entry)>) -> Result<()> {
    let mut events = Socket::new(NETLINK_NETFILTER).context("cannot open a ctnetlink socket")?;
    events.bind(&SocketAddr::new(0, 0))?;
    for group in [NFNLGRP_CONNTRACK_NEW, NFNLGRP_CONNTRACK_UPDATE] {
        events
            .add_membership(group)
            .context("cannot subscribe to conntrack events (CONFIG_NF_CT_NETLINK)")?;
    }
    // Bursts of connections must not silently overflow the socket.
    let _ = events.set_rx_buf_sz(4 << 20);
    let mut dump = Socket::new(NETLINK_NETFILTER)?;
    dump.bind_auto()?;
    dump.send(&dump_request(), 0)
        .context("cannot dump the conntrack table")?;
    set_timeout(&events, Duration::from_millis(250))?;
    std::thread::spawn(move || {
        read_until_done(&dump, node_id, &tx);
        drop(dump);
        let mut buf = vec![0u8; 1 << 16];
        let mut overflowed = false;
        while !tx.is_closed() {
            let n = match events.recv(&mut &mut buf[..], 0) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) && !overflowed => {
                    overflowed = true;
                    eprintln!("podtrace: conntrack events were lost (the socket overflowed): some translations may be learnt late or not at all");
                    continue;
                }
                Err(_) => continue,
            };
            for entry in messages(&buf[..n]).into_iter().flatten() {
                if tx.send((node_id, entry)).is_err() {
                    return;
                }
            }
        }
    });
    Ok(())
}

#[cfg(target_os = "linux")]
/// Reads a dump's answers up to NLMSG_DONE.
fn read_until_done(socket: &Socket, node_id: u32, tx: &mpsc::UnboundedSender<(u32, Entry)>) {
    let mut buf = vec![0u8; 1 << 16];
    if set_timeout(socket, Duration::from_secs(1)).is_err() {
        return;
    }
    while let Ok(n) = socket.recv(&mut &mut buf[..], 0) {
        let mut done = n == 0;
        for message in split(&buf[..n]) {
            done |= message.kind == NLMSG_DONE;
            if let Some(entry) = entry(message.kind, message.body) {
                let _ = tx.send((node_id, entry));
            }
        }
        if done {
            return;
        }
    }
}

#[cfg(target_os = "linux")]
pub(super) fn set_timeout(socket: &Socket, timeout: Duration) -> Result<()> {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as _,
        tv_usec: timeout.subsec_micros() as _,
    };
    // SAFETY: a valid timeval of the size given, on an open socket.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("SO_RCVTIMEO");
    }
    Ok(())
}

/// IPCTNL_MSG_CT_GET with NLM_F_DUMP, for every family (AF_UNSPEC).
fn dump_request() -> Vec<u8> {
    request(IPCTNL_MSG_CT_GET, NLM_F_REQUEST | NLM_F_DUMP)
}

/// A ctnetlink request `message` with `flags`, for every family (AF_UNSPEC).
pub(super) fn request(message: u16, flags: u16) -> Vec<u8> {
    let len = (NLMSG_HDR + NFGEN_HDR) as u32;
    let mut out = Vec::with_capacity(len as usize);
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(&(NFNL_SUBSYS_CTNETLINK << 8 | message).to_ne_bytes());
    out.extend_from_slice(&flags.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes());
    out.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    out
}

pub(super) struct Message<'a> {
    pub(super) kind: u16,
    pub(super) body: &'a [u8],
}

/// The netlink messages of one datagram.
pub(super) fn split(mut buf: &[u8]) -> Vec<Message<'_>> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDR {
        let len = u32::from_ne_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        if len < NLMSG_HDR || len > buf.len() {
            break;
        }
        out.push(Message {
            kind: u16::from_ne_bytes([buf[4], buf[5]]),
            body: &buf[NLMSG_HDR..len],
        });
        buf = &buf[align(len).min(buf.len())..];
    }
    out
}

/// The translated entries of one datagram (`None` for others).
fn messages(buf: &[u8]) -> Vec<Option<Entry>> {
    split(buf)
        .into_iter()
        .map(|m| entry(m.kind, m.body))
        .collect()
}

pub(super) fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// Netlink attributes: (type without flags, payload).
pub(super) fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & 0x3fff;
        if len < 4 || len > buf.len() {
            return None;
        }
        let payload = &buf[4..len];
        buf = &buf[align(len).min(buf.len())..];
        Some((kind, payload))
    })
}

fn be16(b: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(..2)?.try_into().ok()?))
}

pub(super) fn be32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

fn ipv4(b: &[u8]) -> Option<IpAddr> {
    Some(IpAddr::from(<[u8; 4]>::try_from(b.get(..4)?).ok()?))
}

fn ipv6(b: &[u8]) -> Option<IpAddr> {
    Some(IpAddr::from(<[u8; 16]>::try_from(b.get(..16)?).ok()?))
}

fn tuple(buf: &[u8]) -> Option<Tuple> {
    let (mut src, mut dst, mut protocol) = (None, None, None);
    let (mut sport, mut dport) = (0, 0);
    for (kind, payload) in attrs(buf) {
        match kind {
            CTA_TUPLE_IP => {
                for (k, p) in attrs(payload) {
                    match k {
                        CTA_IP_V4_SRC => src = ipv4(p),
                        CTA_IP_V4_DST => dst = ipv4(p),
                        CTA_IP_V6_SRC => src = ipv6(p),
                        CTA_IP_V6_DST => dst = ipv6(p),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (k, p) in attrs(payload) {
                    match k {
                        CTA_PROTO_NUM => protocol = p.first().copied(),
                        CTA_PROTO_SRC_PORT => sport = be16(p).unwrap_or(0),
                        CTA_PROTO_DST_PORT => dport = be16(p).unwrap_or(0),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Some(Tuple {
        protocol: protocol?,
        src: src?,
        dst: dst?,
        sport,
        dport,
    })
}

/// A ctnetlink NEW message (an event or a dump's answer) into an entry,
/// if it is IPv4 or IPv6 and translated.
fn entry(kind: u16, body: &[u8]) -> Option<Entry> {
    if kind != (NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW) || body.len() < NFGEN_HDR {
        return None;
    }
    if body[0] != libc::AF_INET as u8 && body[0] != libc::AF_INET6 as u8 {
        return None;
    }
    let (mut orig, mut reply, mut status) = (None, None, 0);
    let (mut zone, mut mark) = (0, 0);
    for (kind, payload) in attrs(&body[NFGEN_HDR..]) {
        match kind {
            CTA_TUPLE_ORIG => orig = tuple(payload),
            CTA_TUPLE_REPLY => reply = tuple(payload),
            CTA_STATUS => status = be32(payload).unwrap_or(0),
            CTA_ZONE => zone = be16(payload).unwrap_or(0),
            CTA_MARK => mark = be32(payload).unwrap_or(0),
            _ => {}
        }
    }
    let entry = Entry {
        orig: orig?,
        reply: reply?,
        status,
        zone,
        mark,
    };
    (entry.dnat() || entry.snat()).then_some(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::conntrack::IPS_DST_NAT;
    use std::net::Ipv4Addr;

    fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut out = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(payload);
        out.resize(align(out.len()), 0);
        out
    }

    fn tuple_attr(kind: u16, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let ip = [attr(CTA_IP_V4_SRC, &src), attr(CTA_IP_V4_DST, &dst)].concat();
        let proto = [
            attr(CTA_PROTO_NUM, &[6]),
            attr(CTA_PROTO_SRC_PORT, &sport.to_be_bytes()),
            attr(CTA_PROTO_DST_PORT, &dport.to_be_bytes()),
        ]
        .concat();
        let nested = [
            attr(CTA_TUPLE_IP | 0x8000, &ip),
            attr(CTA_TUPLE_PROTO | 0x8000, &proto),
        ]
        .concat();
        attr(kind | 0x8000, &nested)
    }

    /// A NEW event as the kernel sends it for kube-proxy's DNAT of
    /// 10.96.7.7:80 to 10.244.2.3:8080, zone 5, mark 0x4000.
    fn dnat_event() -> Vec<u8> {
        let body = [
            vec![libc::AF_INET as u8, 0, 0, 0],
            tuple_attr(CTA_TUPLE_ORIG, [10, 244, 1, 2], [10, 96, 7, 7], 40000, 80),
            tuple_attr(
                CTA_TUPLE_REPLY,
                [10, 244, 2, 3],
                [10, 244, 1, 2],
                8080,
                40000,
            ),
            attr(CTA_STATUS, &(IPS_DST_NAT | 0x8).to_be_bytes()),
            attr(CTA_MARK, &0x4000u32.to_be_bytes()),
            attr(CTA_ZONE, &5u16.to_be_bytes()),
        ]
        .concat();
        let len = (NLMSG_HDR + body.len()) as u32;
        let mut msg = len.to_ne_bytes().to_vec();
        msg.extend_from_slice(&(NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW).to_ne_bytes());
        msg.extend_from_slice(&[0; 10]);
        msg.extend_from_slice(&body);
        msg
    }

    #[test]
    fn a_dnat_event_gives_both_tuples_the_zone_and_the_mark() {
        let entries = messages(&dnat_event());
        let entry = entries[0].expect("a translated entry");
        assert!(entry.dnat() && !entry.snat());
        assert_eq!(entry.orig.dst, Ipv4Addr::new(10, 96, 7, 7));
        assert_eq!(
            (entry.reply.src, entry.reply.sport),
            ("10.244.2.3".parse().unwrap(), 8080)
        );
        assert_eq!((entry.zone, entry.mark), (5, 0x4000));
    }

    #[test]
    fn an_untranslated_entry_is_not_forwarded() {
        let mut event = dnat_event();
        // Status without the NAT bits, reply from the original peer.
        let plain = entry(
            NFNL_SUBSYS_CTNETLINK << 8,
            &[
                vec![libc::AF_INET as u8, 0, 0, 0],
                tuple_attr(CTA_TUPLE_ORIG, [10, 0, 0, 1], [10, 0, 0, 2], 1, 2),
                tuple_attr(CTA_TUPLE_REPLY, [10, 0, 0, 2], [10, 0, 0, 1], 2, 1),
            ]
            .concat(),
        );
        assert_eq!(plain, None);
        // Truncated: nothing, no panic.
        event.truncate(40);
        assert!(messages(&event).into_iter().flatten().next().is_none());
    }
}
