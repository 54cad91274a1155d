//! Reading back a file of `--write` (`podtrace read`): podtrace's custom
//! options (see `pcapng`) give the context (section header), each hop as
//! it was traced (its packet) and the summary (statistics block), so the
//! stories are told again exactly, offline.
//! Packets without podtrace's option (a file from elsewhere, or edited)
//! are counted, not guessed at.

use std::{
    io::{BufRead, BufReader},
    path::Path,
};

use anyhow::{anyhow, bail, Context as _, Result};
use pcap_file::{
    pcapng::{
        blocks::{
            enhanced_packet::EnhancedPacketOption, interface_statistics::InterfaceStatisticsOption,
            section_header::SectionHeaderOption,
        },
        Block, PcapNgReader,
    },
    DataLink,
};

use super::pcapng::{HopRecord, PEN};
use crate::model::{bounded, ProbeResult, Summary};
use crate::{
    decode::hop::Snapshot,
    story::{journey::Journey, Context},
};

/// What a file holds, in order.
#[derive(Debug)]
pub enum Replayed {
    /// Stories after it are told with this context.
    Context(Box<Context>),
    /// One journey, with its hops as traced.
    Story(Journey),
    /// A `--probe`'s result, after the story of its last packet.
    Probe(ProbeResult),
    /// The closing counts of a trace that ended cleanly.
    Summary(Summary),
    /// Packets podtrace did not write (no podtrace option).
    Foreign(u64),
    /// The file is damaged (cut short): nothing after this is read.
    Damaged {
        /// Packets read whole before the damage.
        packets: u64,
        /// What was wrong there.
        why: String,
        /// Whether a story was cut there (not told).
        cut_story: bool,
    },
}

/// The magic numbers a classic pcap file starts with (µs and ns, either
/// byte order).
const PCAP_MAGICS: [[u8; 4]; 4] = [
    [0xd4, 0xc3, 0xb2, 0xa1],
    [0xa1, 0xb2, 0xc3, 0xd4],
    [0x4d, 0x3c, 0xb2, 0xa1],
    [0xa1, 0xb2, 0x3c, 0x4d],
];

/// Reads a whole file written by `--write`: a regular file (its size is
/// the bound), opened without blocking. A file cut short or damaged
/// gives every story before the damage, then [`Replayed::Damaged`].
pub fn read(path: &Path) -> Result<Vec<Replayed>> {
    let shown = path.display();
    let file = bounded::open_regular(path).map_err(|e| anyhow!("{shown} {e}"))?;
    let mut input = BufReader::new(file);
    let start = input
        .fill_buf()
        .with_context(|| format!("cannot read {shown}"))?;
    if start.len() >= 4 && PCAP_MAGICS.iter().any(|m| start[..4] == m[..]) {
        bail!("{shown} is a classic pcap file, not pcapng: podtrace reads the pcapng files that --write writes");
    }
    let mut reader =
        PcapNgReader::new(input).with_context(|| format!("{shown} is not a pcapng file"))?;
    let mut replay = Replay::default();
    replay.section(reader.section().options.iter().filter_map(|o| match o {
        SectionHeaderOption::CustomUtf8(c) if c.pen == PEN => Some(c.value.as_ref()),
        _ => None,
    }))?;
    while let Some(block) = reader.next_block() {
        let block = match block {
            Ok(block) => block.into_owned(),
            Err(e) => {
                replay.damaged(e.to_string());
                break;
            }
        };
        match block {
            Block::EnhancedPacket(epb) => {
                let has_l2 = reader
                    .packet_interface(&epb)
                    .is_some_and(|i| i.linktype == DataLink::ETHERNET);
                let json = podtrace_text(epb.options.iter().filter_map(|o| match o {
                    EnhancedPacketOption::CustomUtf8(c) if c.pen == PEN => Some(c.value.as_ref()),
                    _ => None,
                }));
                replay.packet(json, epb.data.to_vec(), has_l2)?;
            }
            Block::InterfaceStatistics(isb) => {
                let json = podtrace_text(isb.options.iter().filter_map(|o| match o {
                    InterfaceStatisticsOption::CustomUtf8(c) if c.pen == PEN => {
                        Some(c.value.as_ref())
                    }
                    _ => None,
                }));
                if let Some(json) = json {
                    let summary =
                        serde_json::from_str(&json).context("the summary is not readable")?;
                    replay.end_story();
                    replay.events.push(Replayed::Summary(summary));
                }
            }
            _ => {}
        }
    }
    Ok(replay.finish())
}

/// podtrace's custom options of a block, joined; none if it has none.
fn podtrace_text<'a>(pieces: impl Iterator<Item = &'a str>) -> Option<String> {
    let text: String = pieces.collect();
    (!text.is_empty()).then_some(text)
}

/// The file read so far.
#[derive(Default)]
struct Replay {
    events: Vec<Replayed>,
    ctx: Context,
    /// The story being read: its number and hops, and how many hops it
    /// has (0: not written).
    story: Option<(u64, Journey, usize)>,
    /// The results of the probes the story being read ends.
    probes: Vec<ProbeResult>,
    foreign: u64,
    /// Packets read.
    packets: u64,
}

impl Replay {
    /// The section header's context.
    fn section<'a>(&mut self, pieces: impl Iterator<Item = &'a str>) -> Result<()> {
        let json = podtrace_text(pieces).context("the file was not written by podtrace --write")?;
        self.ctx = serde_json::from_str(&json).context("the story context is not readable")?;
        self.events
            .push(Replayed::Context(Box::new(self.ctx.clone())));
        Ok(())
    }

    /// A packet: the next hop of its story, or the first of a new one.
    fn packet(&mut self, json: Option<String>, bytes: Vec<u8>, has_l2: bool) -> Result<()> {
        self.packets += 1;
        let Some(json) = json else {
            self.foreign += 1;
            return Ok(());
        };
        let mut record: HopRecord =
            serde_json::from_str(&json).context("a packet's podtrace option is not a hop")?;
        record.hop.snapshot = Snapshot { bytes, has_l2 };
        if let Some((n, journey, _)) = &mut self.story {
            if *n == record.story {
                journey.hops.push(record.hop);
                self.probes.append(&mut record.probes);
                return Ok(());
            }
        }
        self.end_story();
        self.probes.append(&mut record.probes);
        let mid_run = record.mid_run.take().map(|m| m.apply(&mut self.ctx));
        let renamed = record.names.take().map(|names| self.ctx.names = names);
        if mid_run.is_some() || renamed.is_some() {
            self.events
                .push(Replayed::Context(Box::new(self.ctx.clone())));
        }
        let mut journey = Journey::new(vec![record.hop]);
        journey.rule = record.rule;
        journey.nat_rules = record.nat_rules;
        journey.records_lost = record.records_lost;
        self.story = Some((record.story, journey, record.hops));
        Ok(())
    }

    fn end_story(&mut self) {
        if let Some((_, journey, _)) = self.story.take() {
            self.events.push(Replayed::Story(journey));
        }
        let probes = std::mem::take(&mut self.probes);
        self.events.extend(probes.into_iter().map(Replayed::Probe));
    }

    /// The file is damaged here: the story being read is told if it is
    /// whole, and said to be cut if not.
    fn damaged(&mut self, why: String) {
        let whole = self
            .story
            .as_ref()
            .is_some_and(|(_, journey, hops)| *hops > 0 && journey.hops.len() == *hops);
        let cut_story = self.story.is_some() && !whole;
        if whole {
            self.end_story();
        }
        self.story = None;
        self.probes.clear();
        self.events.push(Replayed::Damaged {
            packets: self.packets,
            why,
            cut_story,
        });
    }

    fn finish(mut self) -> Vec<Replayed> {
        // Cut at a block's end: the story being read may lack hops.
        let cut = self
            .story
            .as_ref()
            .is_some_and(|(_, journey, hops)| *hops > 0 && journey.hops.len() != *hops);
        if cut {
            self.damaged("the file ends inside a story".into());
        }
        self.end_story();
        if self.foreign > 0 {
            self.events.push(Replayed::Foreign(self.foreign));
        }
        self.events
    }
}
