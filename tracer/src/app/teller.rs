//! Turns finished journeys into output, up to the `--count` limit, feeds
//! the `--profile` table, and writes each told journey's packets
//! (`--write`).

use std::net::Ipv4Addr;

use crate::{
    model::Summary,
    output::{pcapng::PcapWriter, Sink},
    story::{self, journey::Journey, profile::Profile, Context},
};

pub(super) struct Teller<'a> {
    pub sink: Box<dyn Sink + 'a>,
    pub ctx: Context,
    pub profile: Option<Profile>,
    pub limit: Option<u64>,
    pub told: u64,
    pub pcap: Option<PcapWriter>,
}

impl Teller<'_> {
    fn limit_reached(&self) -> bool {
        self.limit.is_some_and(|n| self.told >= n)
    }

    /// Tells the journeys' stories, then hands them to the output at
    /// once: one write for a batch, not one per story, so that a flow at
    /// line rate is not told a syscall per packet. False once no more
    /// stories are wanted.
    pub fn tell_all(&mut self, journeys: &[Journey]) -> std::io::Result<bool> {
        let mut wanted = true;
        for journey in journeys {
            wanted = self.tell(journey)?;
            if !wanted {
                break;
            }
        }
        self.sink.flush()?;
        Ok(wanted)
    }

    /// Tells the journey's story; false once no more stories are wanted.
    fn tell(&mut self, journey: &Journey) -> std::io::Result<bool> {
        if self.limit_reached() {
            return Ok(false);
        }
        let story = story::tell(journey, &self.ctx);
        self.told += 1;
        self.sink.story(self.told, &story)?;
        if let Some(pcap) = &mut self.pcap {
            pcap.story(self.told, journey, &story)?;
        }
        if let Some(profile) = &mut self.profile {
            profile.add(&story);
        }
        Ok(!self.limit_reached())
    }

    /// A traced pod has a new address: stories name it from now on.
    pub fn rename(&mut self, ip: Ipv4Addr, name: String) {
        self.ctx.names.insert(ip, name);
        if let Some(pcap) = &mut self.pcap {
            pcap.renamed(&self.ctx.names);
        }
    }

    pub fn finish(mut self, mut summary: Summary) -> std::io::Result<()> {
        if let Some(profile) = &self.profile {
            self.sink.profile(&profile.latencies())?;
        }
        summary.stories = self.told;
        if let Some(pcap) = &mut self.pcap {
            pcap.finish(&summary)?;
            eprintln!(
                "podtrace: wrote {} packets of {} stories; {} sightings told no story (undecodable, unknown interface, or past --count)",
                pcap.packets,
                summary.stories,
                summary.sightings.saturating_sub(pcap.packets)
            );
        }
        self.sink.summary(&summary)
    }
}
