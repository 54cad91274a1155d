//! `--write FILE.pcapng`: the traced packets for Wireshark, with the story
//! attached, written as each story is told so the file is readable if
//! podtrace is killed.
//!
//! What goes where (pcapng, little endian, one section):
//! - Section Header Block: `shb_userappl` "podtrace <version>", a comment
//!   naming the traced pair, and custom UTF-8 options (2988, [`PEN`]) that
//!   together hold the JSON of the story [`Context`] (split in pieces of
//!   at most 64 KiB, an option's limit);
//! - one Interface Description Block per (node, interface, link type):
//!   `if_name` "node-1/cni0", `if_description` the role and the hooks
//!   ("bridge; tc ingress and egress"; "not watched; kernel drops only"),
//!   `if_tsresol` 9 (ns), link type Ethernet or LINKTYPE_RAW (101) for L3
//!   devices (the snapshot has no L2 header), the snap length;
//! - one Enhanced Packet Block per hop: the hop's kernel time on the wall
//!   clock, the header snapshot (captured) and skb_len (original),
//!   `epb_flags` inbound/outbound (none for a drop), `opt_comment`
//!   "#3 hop 2/8: note" ("… DROP: note" for drops, "freed inside the pod"
//!   after delivery), and on the journey's last packet a second comment
//!   "verdict: …" (and, with `--probe`, on its probe's last packet a
//!   third: the probe's result line, "probe 1 tcp:8080 → …: ✓ result");
//!   plus a custom UTF-8 option (2988, [`PEN`]) with the [`HopRecord`]
//!   JSON: everything `podtrace read` needs to tell the story again (and
//!   the new names of addresses, when a pod moved; the probe's result, on
//!   its last packet);
//! - at a clean exit, an Interface Statistics Block with a custom option:
//!   the summary's JSON.
//!
//! No custom blocks: Wireshark lists those as records among the packets.
//! It shows the custom options it does not know as such, and skips them.

use std::{
    collections::HashMap,
    io::{BufWriter, Write},
};

use anyhow::Context as _;

use serde::{Deserialize, Serialize};

use super::human::human_probe;
use crate::model::netfilter::NetfilterRule;
use crate::{
    decode::hop::{Direction, Hop, Snapshot},
    model::{ProbeResult, Summary, MAX_SNAPLEN},
    node::interfaces::Role,
    probe::clock::{monotonic_ns, realtime_offset_ns},
    story::{context::LostAgent, journey::Journey, Context, Story},
};

/// The Private Enterprise Number in podtrace's custom blocks and options:
/// IANA's 32473, reserved for documentation and examples (RFC 5612), until
/// podtrace has one of its own.
pub const PEN: u32 = 32473;
/// A custom option with UTF-8 data that may be copied.
pub const CUSTOM_UTF8: u16 = 2988;

/// The custom option of an EPB: the hop as podtrace saw it (its bytes are
/// the packet's), with the facts of its journey.
#[derive(Debug, Serialize, Deserialize)]
pub struct HopRecord {
    pub story: u64,
    pub hop: Hop,
    pub rule: Option<NetfilterRule>,
    /// The nat rules that translated the packet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nat_rules: Vec<NetfilterRule>,
    pub records_lost: bool,
    /// How many hops its story has, so that a reader of a file cut short
    /// can tell a whole story from a cut one (0: an older file).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hops: usize,
    /// The names of addresses from this story on (a pod moved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<HashMap<std::net::IpAddr, String>>,
    /// On a probe's last packet: the probe's result, as the run told it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes: Vec<ProbeResult>,
    /// On a story's first packet, when it changed since the last story
    /// written (cluster mode): what the story was told with that the
    /// file's context, written at the start, does not hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mid_run: Option<MidRun>,
}

/// The parts of a cluster-mode run's context that change while it runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MidRun {
    /// How far off each node's clock may be (its cross-node steps').
    #[serde(default, skip_serializing_if = "HashMap::is_empty")]
    pub clock_uncertainty_ns: HashMap<String, u64>,
    /// Nodes whose agent was lost, for the stories it leaves incomplete.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lost_agents: Vec<LostAgent>,
}

impl MidRun {
    pub fn of(ctx: &Context) -> Self {
        Self {
            clock_uncertainty_ns: ctx.clock_uncertainty_ns.clone(),
            lost_agents: ctx.lost_agents.clone(),
        }
    }

    /// Into the context a story is told again in.
    pub fn apply(self, ctx: &mut Context) {
        ctx.clock_uncertainty_ns = self.clock_uncertainty_ns;
        ctx.lost_agents = self.lost_agents;
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Where the traced packets are written.
pub struct PcapWriter {
    out: Box<dyn Write>,
    /// Interface ids by (node, interface, has an L2 header).
    interfaces: HashMap<(String, String, bool), u32>,
    snaplen: u32,
    /// CLOCK_REALTIME − CLOCK_MONOTONIC at start: kernel time to wall clock.
    wall_offset_ns: i128,
    /// Packets written.
    pub packets: u64,
    /// Names changed since the last story written.
    renamed: Option<HashMap<std::net::IpAddr, String>>,
    /// The mid-run context last written, and the one the next story was
    /// told with.
    mid_run_written: MidRun,
    mid_run: MidRun,
}

/// An interface podtrace watches, announced before any packet.
pub struct Announced<'a> {
    pub node: &'a str,
    pub iface: &'a str,
    pub role: Role,
    pub has_l2: bool,
}

/// The `--write` destination: a new file, or stdout for `-`.
pub fn open(path: &str) -> anyhow::Result<Box<dyn Write>> {
    if path == "-" {
        return Ok(Box::new(BufWriter::new(std::io::stdout())));
    }
    let file = std::fs::File::create(path).with_context(|| format!("cannot write {path}"))?;
    Ok(Box::new(BufWriter::new(file)))
}

impl PcapWriter {
    /// Writes the section header, the watched interfaces and the context.
    pub fn create(
        out: Box<dyn Write>,
        snaplen: u32,
        title: String,
        watched: &[Announced<'_>],
        ctx: &Context,
    ) -> std::io::Result<Self> {
        let mut writer = Self {
            out,
            interfaces: HashMap::new(),
            snaplen: snaplen.clamp(1, MAX_SNAPLEN),
            wall_offset_ns: realtime_offset_ns().into(),
            packets: 0,
            renamed: None,
            mid_run_written: MidRun::default(),
            mid_run: MidRun::default(),
        };
        let mut body = Block::new();
        body.u32(0x1A2B_3C4D); // byte-order magic
        body.u16(1); // major version
        body.u16(0); // minor version
        body.bytes(&(-1i64).to_le_bytes()); // section length: unknown
        let appl = format!("podtrace {}", env!("CARGO_PKG_VERSION"));
        body.option(opt::SHB_USERAPPL, appl.as_bytes());
        body.option(opt::COMMENT, title.as_bytes());
        body.custom_options(&serde_json::to_string(ctx)?);
        body.end_options();
        writer.write(block::SECTION_HEADER, body)?;
        for w in watched {
            writer.interface(w.node, w.iface, w.role, w.has_l2)?;
        }
        writer.out.flush()?;
        Ok(writer)
    }

    /// Hops timed on another kernel than this process's (cluster mode:
    /// the reference node's timeline): its (realtime − monotonic) offset
    /// puts them on the wall clock.
    pub fn time_by(&mut self, realtime_offset_ns: i64) {
        self.wall_offset_ns = realtime_offset_ns.into();
    }

    /// The mid-run context the next story was told with (cluster mode),
    /// for `podtrace read` to tell it alike.
    pub fn told_with(&mut self, mid_run: MidRun) {
        self.mid_run = mid_run;
    }

    /// A pod moved: the next story's first packet carries the new names.
    pub fn renamed(&mut self, names: &HashMap<std::net::IpAddr, String>) {
        self.renamed = Some(names.clone());
    }

    /// The journey's packets, one EPB per hop, then a flush. `probes`: the
    /// results of the `--probe`s this story ends, on its last packet.
    pub fn story(
        &mut self,
        n: u64,
        journey: &Journey,
        story: &Story,
        probes: &[ProbeResult],
    ) -> std::io::Result<()> {
        let comments = hop_comments(n, journey, story);
        for (i, (hop, comment)) in journey.hops.iter().zip(comments).enumerate() {
            let mut comments = vec![comment];
            let last = i + 1 == journey.hops.len();
            if last {
                comments.push(format!("verdict: {}", story.verdict.summary));
                comments.extend(probes.iter().map(human_probe));
            }
            let record = HopRecord {
                story: n,
                // Its bytes are the packet's, not the record's again.
                hop: Hop {
                    snapshot: Snapshot::default(),
                    ..hop.clone()
                },
                rule: journey.rule.clone(),
                nat_rules: journey.nat_rules.clone(),
                records_lost: journey.records_lost,
                hops: journey.hops.len(),
                names: self.renamed.take(),
                probes: if last { probes.to_vec() } else { Vec::new() },
                mid_run: (i == 0 && self.mid_run != self.mid_run_written).then(|| {
                    self.mid_run_written = self.mid_run.clone();
                    self.mid_run.clone()
                }),
            };
            self.packet(hop, &record, &comments)?;
        }
        self.out.flush()
    }

    /// The closing counts, on an ISB of the first interface; the file is
    /// complete.
    pub fn finish(&mut self, summary: &Summary) -> std::io::Result<()> {
        if self.interfaces.is_empty() {
            // Nothing announced (cluster mode announces an interface with
            // its first packet): an interface of none, which the
            // summary's block names.
            let none = ("podtrace".to_string(), "none".to_string(), true);
            self.new_interface(none, "no traced packet was written")?;
        }
        let ns = u64::try_from(i128::from(realtime_offset_ns()) + i128::from(monotonic_ns()))
            .unwrap_or(0);
        let mut body = Block::new();
        body.u32(0);
        body.u32((ns >> 32) as u32);
        body.u32(ns as u32);
        body.custom_options(&serde_json::to_string(summary)?);
        body.end_options();
        self.write(block::INTERFACE_STATISTICS, body)?;
        self.out.flush()
    }

    fn packet(
        &mut self,
        hop: &Hop,
        record: &HopRecord,
        comments: &[String],
    ) -> std::io::Result<()> {
        let id = self.interface(&hop.node, &hop.iface, hop.role, hop.snapshot.has_l2)?;
        let bytes = &hop.snapshot.bytes;
        let data = &bytes[..bytes.len().min(self.snaplen as usize)];
        let wall = i128::from(hop.ktime_ns) + self.wall_offset_ns;
        let ns = u64::try_from(wall.max(0)).unwrap_or(u64::MAX);
        let mut body = Block::new();
        body.u32(id);
        body.u32((ns >> 32) as u32);
        body.u32(ns as u32);
        body.u32(data.len() as u32);
        // A drop's skb may start past the IP header the snapshot holds:
        // its length is not the packet's.
        body.u32(hop.snapshot.original_len(&hop.packet, hop.skb_len));
        body.bytes(data);
        body.pad();
        for comment in comments {
            body.option(opt::COMMENT, comment.as_bytes());
        }
        // epb_flags bits 0-1: 01 inbound, 10 outbound (a drop has neither).
        match hop.direction {
            Direction::Ingress => body.option(opt::EPB_FLAGS, &1u32.to_le_bytes()),
            Direction::Egress => body.option(opt::EPB_FLAGS, &2u32.to_le_bytes()),
            Direction::Drop => {}
        }
        body.custom_options(&serde_json::to_string(record)?);
        body.end_options();
        self.write(block::ENHANCED_PACKET, body)?;
        self.packets += 1;
        Ok(())
    }

    /// The id of the interface's IDB, written the first time it is needed.
    fn interface(
        &mut self,
        node: &str,
        iface: &str,
        role: Role,
        has_l2: bool,
    ) -> std::io::Result<u32> {
        let key = (node.to_string(), iface.to_string(), has_l2);
        match self.interfaces.get(&key) {
            Some(id) => Ok(*id),
            None => self.new_interface(key, &describe(role)),
        }
    }

    /// Writes the IDB of an interface not announced yet, keyed by (node,
    /// interface, has an L2 header).
    fn new_interface(
        &mut self,
        key: (String, String, bool),
        description: &str,
    ) -> std::io::Result<u32> {
        let (node, iface, has_l2) = (&key.0, &key.1, key.2);
        let id = self.interfaces.len() as u32;
        let mut body = Block::new();
        body.u16(if has_l2 {
            LINKTYPE_ETHERNET
        } else {
            LINKTYPE_RAW
        });
        body.u16(0); // reserved
        body.u32(self.snaplen);
        body.option(opt::IF_NAME, format!("{node}/{iface}").as_bytes());
        body.option(opt::IF_DESCRIPTION, description.as_bytes());
        body.option(opt::IF_TSRESOL, &[9]);
        body.end_options();
        self.write(block::INTERFACE_DESCRIPTION, body)?;
        self.interfaces.insert(key, id);
        Ok(id)
    }

    /// A block: type, total length, body, total length again.
    fn write(&mut self, kind: u32, body: Block) -> std::io::Result<()> {
        let total = (body.0.len() + 12) as u32;
        self.out.write_all(&kind.to_le_bytes())?;
        self.out.write_all(&total.to_le_bytes())?;
        self.out.write_all(&body.0)?;
        self.out.write_all(&total.to_le_bytes())
    }
}

/// pcapng block types.
mod block {
    pub const SECTION_HEADER: u32 = 0x0A0D_0D0A;
    pub const INTERFACE_DESCRIPTION: u32 = 1;
    pub const INTERFACE_STATISTICS: u32 = 5;
    pub const ENHANCED_PACKET: u32 = 6;
}

/// pcapng option codes.
mod opt {
    pub const COMMENT: u16 = 1;
    pub const SHB_USERAPPL: u16 = 4;
    pub const IF_NAME: u16 = 2;
    pub const IF_DESCRIPTION: u16 = 3;
    pub const IF_TSRESOL: u16 = 9;
    pub const EPB_FLAGS: u16 = 2;
}

const LINKTYPE_ETHERNET: u16 = 1;
/// Raw IP: the packet starts at its IPv4 header.
const LINKTYPE_RAW: u16 = 101;

/// A block's body, little endian, 32-bit aligned where pcapng wants it.
struct Block(Vec<u8>);

impl Block {
    fn new() -> Self {
        Self(Vec::new())
    }

    fn u16(&mut self, v: u16) {
        self.0.extend(v.to_le_bytes());
    }

    fn u32(&mut self, v: u32) {
        self.0.extend(v.to_le_bytes());
    }

    fn bytes(&mut self, v: &[u8]) {
        self.0.extend(v);
    }

    fn pad(&mut self) {
        self.0.resize(self.0.len().next_multiple_of(4), 0);
    }

    /// An option: code, length, value padded to 32 bits (a value longer
    /// than an option can hold is cut: only comments could be).
    fn option(&mut self, code: u16, value: &[u8]) {
        let value = &value[..value.len().min(usize::from(u16::MAX))];
        self.u16(code);
        self.u16(value.len() as u16);
        self.bytes(value);
        self.pad();
    }

    /// `text` in custom UTF-8 options with [`PEN`], as many as it takes;
    /// a reader joins them in order.
    fn custom_options(&mut self, mut text: &str) {
        const MOST: usize = u16::MAX as usize - 4;
        while !text.is_empty() {
            let mut cut = text.len().min(MOST);
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            let mut value = PEN.to_le_bytes().to_vec();
            value.extend(&text.as_bytes()[..cut]);
            self.option(CUSTOM_UTF8, &value);
            text = &text[cut..];
        }
    }

    fn end_options(&mut self) {
        self.u32(0);
    }
}

/// An interface's role and the hooks that see it, for `if_description`.
fn describe(role: Role) -> String {
    let what = match role {
        Role::PodVeth => "pod veth",
        Role::Bridge => "bridge",
        Role::Tunnel => "tunnel",
        Role::Underlay => "underlay",
        Role::Other => return "not watched; kernel drops only".into(),
    };
    format!("{what}; tc ingress and egress (and kernel drops)")
}

/// One comment per hop of the journey: its story number and note; the
/// drops after delivery, which the story keeps out of its path, say so.
fn hop_comments(n: u64, journey: &Journey, story: &Story) -> Vec<String> {
    let delivered = journey.delivered_at();
    let total = journey.hops.len();
    let mut lines = story.hops.iter();
    journey
        .hops
        .iter()
        .enumerate()
        .map(|(i, hop)| {
            let at = format!("#{n} hop {}/{total}", i + 1);
            let freed = delivered.is_some_and(|d| i > d) && hop.direction == Direction::Drop;
            match (&hop.drop, freed) {
                (Some(d), true) => format!(
                    "{at}: freed inside the pod after delivery: {} in {} (not a drop on the path)",
                    d.reason, d.location
                ),
                (drop, _) => {
                    let note = lines.next().map_or("", |l| l.note.as_str());
                    let drop = if drop.is_some() { " DROP" } else { "" };
                    format!("{at}{drop}: {note}")
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        output::pcapng_read::{read, Replayed},
        story::{self, tests::sample_journey},
    };
    use std::net::Ipv4Addr;

    #[test]
    fn a_written_story_reads_back_the_same() {
        let journey = sample_journey();
        // More than one option holds: the context is split and joined.
        let mut ctx = Context::default();
        for i in 0..5000u32 {
            let ip = Ipv4Addr::from(0x0a00_0000 + i);
            ctx.names.insert(ip.into(), format!("default/pod-é-{i}"));
        }
        let told = story::tell(&journey, &ctx);
        let path = std::env::temp_dir().join(format!("podtrace-{}.pcapng", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let eth0 = Announced {
            node: "node-1",
            iface: "eth0",
            role: Role::Underlay,
            has_l2: true,
        };
        let mut w = PcapWriter::create(
            Box::new(file),
            crate::model::format::MAX_SNAPLEN,
            "test".into(),
            &[eth0],
            &ctx,
        )
        .unwrap();
        w.story(1, &journey, &told, &[]).unwrap();
        w.finish(&Summary::default()).unwrap();
        assert_eq!(w.packets, 8);
        drop(w);
        let events = read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let journeys: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Replayed::Story(j) => Some(j),
                _ => None,
            })
            .collect();
        assert_eq!(journeys, [&journey]);
        let Some(Replayed::Context(read_ctx)) = events.first() else {
            panic!("no context first: {events:?}")
        };
        assert_eq!(read_ctx.names, ctx.names);
        assert_eq!(story::tell(journeys[0], read_ctx), told);
        assert!(matches!(events.last(), Some(Replayed::Summary(_))));
    }

    #[test]
    fn comments_carry_the_story_number_and_note() {
        let journey = sample_journey();
        let told = story::tell(&journey, &Context::default());
        let comments = hop_comments(7, &journey, &told);
        assert_eq!(
            comments[2],
            "#7 hop 3/8: routed (TTL 64→63), into the tunnel device"
        );
    }
}
