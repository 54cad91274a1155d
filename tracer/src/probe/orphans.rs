//! clsact filters a killed podtrace left where no run file tells of them:
//! its /run/podtrace was not this run's (a container that mounts none of
//! the host's, or another container's). They are found in the kernel, by
//! what podtrace's filters are (its programs, at its priority, under a
//! run's own handle), and judged by their run's sign of life in their
//! namespace (`run_liveness`). Filters of runs whose files this run sees
//! are left to the run files' sweep; a filter whose run lives stays.

use anyhow::{anyhow, bail, Context, Result};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use rtnetlink::{
    packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST},
    packet_route::{
        link::{LinkAttribute, LinkMessage},
        tc::{TcAttribute, TcFilterBpfOption, TcHandle, TcMessage, TcOption},
        RouteNetlinkMessage,
    },
};

use super::{
    run_liveness,
    run_registry::{self, Exclusive, Held, Record},
    tc,
};
use crate::node::netns::Namespace;

/// One of podtrace's clsact filters, as the kernel lists it.
#[derive(Debug)]
struct PodtraceFilter {
    ifindex: u32,
    ifname: String,
    ingress: bool,
    handle: u32,
}

/// Inside `netns`, before this run attaches there: the filters of killed
/// runs whose files are not here. Not finding them leaves them, as before
/// this sweep existed: no reason not to trace.
pub fn sweep_in(netns: &Namespace) {
    let swept = netns.run(|| {
        let lock = run_registry::exclusive()?;
        sweep(&lock, netns, run_registry::filter_handle()?)
    });
    if let Err(e) = swept {
        eprintln!("podtrace: cannot look for filters killed podtraces left: {e:#}");
    }
}

/// In the current thread's namespace (`netns`): removes the filters of
/// dead runs that no run file tells of, and says so. `own`: this run's
/// handle.
fn sweep(lock: &Exclusive, netns: &Namespace, own: u32) -> Result<()> {
    let with_files = run_registry::handles_with_files();
    let mut removed: Vec<String> = Vec::new();
    for filter in podtrace_filters()? {
        let judged_elsewhere = filter.handle == own || with_files.contains(&filter.handle);
        if judged_elsewhere || run_liveness::alive(filter.handle) {
            continue;
        }
        let record = Record::at(
            netns,
            Held::Filter {
                ifindex: filter.ifindex,
                ifname: filter.ifname.clone(),
                ingress: filter.ingress,
                priority: tc::PRIORITY,
                handle: filter.handle,
            },
        );
        // Its qdisc stays: whether podtrace added it was in the lost run
        // file, and a podtrace in another container, which this one's
        // lock does not exclude, may be attaching to it right now.
        tc::remove_filter(lock, &record).with_context(|| {
            format!(
                "cannot remove a dead podtrace's filter on {}",
                filter.ifname
            )
        })?;
        if !removed.contains(&filter.ifname) {
            removed.push(filter.ifname);
        }
    }
    if !removed.is_empty() {
        eprintln!(
            "podtrace: removed the clsact filters a killed podtrace left on {} (its run file is not in this podtrace's /run/podtrace)",
            removed.join(", ")
        );
    }
    Ok(())
}

/// podtrace's filters on both clsact hooks of every interface of the
/// current thread's namespace.
fn podtrace_filters() -> Result<Vec<PodtraceFilter>> {
    let mut socket = Socket::new(NETLINK_ROUTE).context("cannot open an rtnetlink socket")?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut found = Vec::new();
    let links = dump(
        &socket,
        RouteNetlinkMessage::GetLink(LinkMessage::default()),
    )?;
    for link in links {
        let RouteNetlinkMessage::NewLink(link) = link else {
            continue;
        };
        let Some(ifname) = link.attributes.iter().find_map(|a| match a {
            LinkAttribute::IfName(name) => Some(name.clone()),
            _ => None,
        }) else {
            continue;
        };
        for ingress in [true, false] {
            let mut ask = TcMessage::with_index(link.header.index as i32);
            ask.header.parent = TcHandle {
                major: TcHandle::CLSACT.major,
                minor: if ingress {
                    TcHandle::MIN_INGRESS
                } else {
                    TcHandle::MIN_EGRESS
                },
            };
            for filter in dump(&socket, RouteNetlinkMessage::GetTrafficFilter(ask))? {
                let RouteNetlinkMessage::NewTrafficFilter(filter) = filter else {
                    continue;
                };
                if let Some(handle) = podtrace_handle(&filter) {
                    found.push(PodtraceFilter {
                        ifindex: link.header.index,
                        ifname: ifname.clone(),
                        ingress,
                        handle,
                    });
                }
            }
        }
    }
    Ok(found)
}

/// The handle of a filter that is podtrace's: one of its programs, at its
/// priority, under a handle a run chose (the kernel's own are from
/// 0x8000_0000).
fn podtrace_handle(filter: &TcMessage) -> Option<u32> {
    let priority = (filter.header.info >> 16) as u16;
    let handle = u32::from(filter.header.handle);
    let program = filter.attributes.iter().find_map(|a| match a {
        TcAttribute::Options(options) => options.iter().find_map(|o| match o {
            TcOption::Bpf(TcFilterBpfOption::ProgName(name)) => Some(name.as_str()),
            _ => None,
        }),
        _ => None,
    })?;
    // The kernel names a program by its first 15 bytes.
    let ours = tc::PROGRAMS
        .iter()
        .any(|p| program.starts_with(&p[..p.len().min(15)]));
    (ours && priority == tc::PRIORITY && handle != 0 && handle < 0x8000_0000).then_some(handle)
}

/// One dump request's answers, until the kernel says it is done.
fn dump(socket: &Socket, request: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>> {
    let mut message = NetlinkMessage::from(request);
    message.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    message.finalize();
    let mut bytes = vec![0; message.buffer_len()];
    message.serialize(&mut bytes);
    socket.send(&bytes, 0).context("rtnetlink send")?;
    let mut answers = Vec::new();
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        let n = socket
            .recv(&mut &mut buffer[..], 0)
            .context("rtnetlink receive")?;
        let mut at = 0;
        while at + 4 <= n {
            let len = u32::from_ne_bytes(buffer[at..at + 4].try_into()?) as usize;
            if len < 16 || at + len > n {
                bail!("a truncated rtnetlink answer");
            }
            let answer = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buffer[at..at + len])
                .map_err(|e| anyhow!("an rtnetlink answer that does not parse: {e}"))?;
            at += (len + 3) & !3;
            match answer.payload {
                NetlinkPayload::Done(_) => return Ok(answers),
                NetlinkPayload::InnerMessage(inner) => answers.push(inner),
                NetlinkPayload::Error(e) => bail!("rtnetlink: {e}"),
                _ => {}
            }
        }
    }
}
