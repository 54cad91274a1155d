//! Reading back a file of `--write` (`podtrace read`): podtrace's custom
//! options (see `pcapng`) give the context (section header), each hop as
//! it was traced (its packet) and the summary (statistics block), so the
//! stories are told again exactly, offline.
//! Packets without podtrace's option (a file from elsewhere, or edited)
//! are counted, not guessed at.

use std::{fs::File, io::BufReader, path::Path};

use anyhow::{Context as _, Result};
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
use crate::model::Summary;
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
    /// The closing counts of a trace that ended cleanly.
    Summary(Summary),
    /// Packets podtrace did not write (no podtrace option).
    Foreign(u64),
}

/// Reads a whole file written by `--write`.
pub fn read(path: &Path) -> Result<Vec<Replayed>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut reader = PcapNgReader::new(BufReader::new(file))
        .with_context(|| format!("{} is not a pcapng file", path.display()))?;
    let mut replay = Replay::default();
    replay.section(reader.section().options.iter().filter_map(|o| match o {
        SectionHeaderOption::CustomUtf8(c) if c.pen == PEN => Some(c.value.as_ref()),
        _ => None,
    }))?;
    while let Some(block) = reader.next_block() {
        let block = block
            .with_context(|| format!("{} is damaged", path.display()))?
            .into_owned();
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
    /// The story being read: its number and hops.
    story: Option<(u64, Journey)>,
    foreign: u64,
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
        let Some(json) = json else {
            self.foreign += 1;
            return Ok(());
        };
        let mut record: HopRecord =
            serde_json::from_str(&json).context("a packet's podtrace option is not a hop")?;
        record.hop.snapshot = Snapshot { bytes, has_l2 };
        if let Some((n, journey)) = &mut self.story {
            if *n == record.story {
                journey.hops.push(record.hop);
                return Ok(());
            }
        }
        self.end_story();
        if let Some(names) = record.names {
            self.ctx.names = names;
            self.events
                .push(Replayed::Context(Box::new(self.ctx.clone())));
        }
        let mut journey = Journey::new(vec![record.hop]);
        journey.rule = record.rule;
        journey.nat_rules = record.nat_rules;
        journey.records_lost = record.records_lost;
        self.story = Some((record.story, journey));
        Ok(())
    }

    fn end_story(&mut self) {
        if let Some((_, journey)) = self.story.take() {
            self.events.push(Replayed::Story(journey));
        }
    }

    fn finish(mut self) -> Vec<Replayed> {
        self.end_story();
        if self.foreign > 0 {
            self.events.push(Replayed::Foreign(self.foreign));
        }
        self.events
    }
}
