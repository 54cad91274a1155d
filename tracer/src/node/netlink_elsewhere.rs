//! `netlink` in a build for another OS than Linux (the cluster-mode
//! front-end on macOS): there is no rtnetlink to read a node with, so each
//! reader says so. Same signatures as netlink.rs.

use std::net::Ipv4Addr;

use anyhow::Result;

use super::NodeView;
use crate::model::needs_linux;

impl NodeView {
    pub async fn read_addresses() -> Result<Vec<(u32, Ipv4Addr)>> {
        Err(needs_linux("reading a node's addresses"))
    }

    pub async fn read() -> Result<Self> {
        Err(needs_linux("reading a node over rtnetlink"))
    }
}

pub async fn netns_id_of(_: &std::fs::File) -> Result<Option<i32>> {
    Err(needs_linux("naming a network namespace"))
}

pub async fn source_toward(_: Ipv4Addr) -> Result<Option<Ipv4Addr>> {
    Err(needs_linux("a route lookup"))
}
