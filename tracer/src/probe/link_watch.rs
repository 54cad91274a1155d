//! Interface changes during a trace: a pod that restarts gets a new veth
//! (podtrace attaches to it), and an interface can vanish (its TCX links go
//! with it; podtrace says so and counts it).

use anyhow::{Context, Result};
use futures::StreamExt;
use rtnetlink::{
    packet_core::NetlinkPayload,
    packet_route::{AddressFamily, RouteNetlinkMessage},
    MulticastGroup,
};
use tokio::sync::mpsc;

use crate::node::Link;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkChange {
    Added(Link),
    Removed(Link),
}

/// Subscribes to link events of the calling thread's network namespace
/// (the socket stays bound to it) and forwards them tagged with `node_id`.
pub fn watch(node_id: u32, tx: mpsc::UnboundedSender<(u32, LinkChange)>) -> Result<()> {
    let (connection, _handle, mut messages) =
        rtnetlink::new_multicast_connection(&[MulticastGroup::Link])
            .context("cannot subscribe to link events")?;
    tokio::spawn(connection);
    tokio::spawn(async move {
        while let Some((message, _)) = messages.next().await {
            // AF_BRIDGE copies report bridge-port changes of the same links.
            let change = match message.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link))
                    if link.header.interface_family == AddressFamily::Unspec =>
                {
                    LinkChange::Added(Link::from(link))
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(link))
                    if link.header.interface_family == AddressFamily::Unspec =>
                {
                    LinkChange::Removed(Link::from(link))
                }
                _ => continue,
            };
            if tx.send((node_id, change)).is_err() {
                return;
            }
        }
    });
    Ok(())
}
