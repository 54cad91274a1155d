//! Turns finished journeys into output, up to the `--count` limit, feeds
//! the `--profile` table, and writes each told journey's packets
//! (`--write`).

use std::{
    io::{IsTerminal, Write},
    net::{IpAddr, Ipv4Addr},
};

use super::probing::ProbeWatch;
use crate::{
    cli::Args,
    model::{
        conntrack::{ConntrackRun, ConntrackTable},
        ProbeResult, Summary,
    },
    node::wireguard::WireGuard,
    output::{
        self,
        pcapng::{Announced, MidRun, PcapWriter},
        Sink,
    },
    story::{
        self, journey::Journey, pmtu_followup::PmtuFollowups, profile::Profile, Context, Outcome,
        Story,
    },
};

pub(super) struct Teller<'a> {
    pub sink: Box<dyn Sink + 'a>,
    pub ctx: Context,
    pub profile: Option<Profile>,
    pub limit: Option<u64>,
    pub told: u64,
    pub pcap: Option<PcapWriter>,
    /// `--probe`: only the probes' stories are told.
    pub probe: Option<ProbeWatch>,
    /// `--probe --write`: the probes' stories, held for the pcapng until
    /// the results are known, so that each result goes on the comment of
    /// its probe's last packet (a few stories, for a second or so).
    held: Vec<HeldStory>,
    /// What went wrong in what was told, for `--fail`'s exit status.
    seen: Seen,
    /// Node mode: reads every traced node's conntrack table again, before
    /// a netfilter drop is told and at the end.
    pub conntrack_now: Option<ConntrackReader>,
    /// Node mode: reads a traced node's WireGuard devices again, before
    /// a story that ends going into one is told and that node should have
    /// taken the packet back.
    pub wireguard_now: Option<WireguardReader>,
    /// Each packet too big for its path, and what its sender sent next.
    pmtu_after: PmtuFollowups,
}

/// Reads the traced nodes' conntrack tables as they are now.
pub(super) type ConntrackReader = Box<dyn FnMut() -> Vec<ConntrackTable>>;

/// Reads a traced node's WireGuard devices as they are now, by its name.
pub(super) type WireguardReader = Box<dyn FnMut(&str) -> Option<WireGuard>>;

/// What went wrong in the stories and probe results told.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// Stories whose verdict is dropped or no_route.
    pub failed_verdicts: u64,
    /// Probes that failed: no answer came back, or a refusal (a UDP
    /// probe delivered to a silent socket went as far as it could).
    pub unanswered_probes: u64,
    /// Probe results told at all (none when a stop came first).
    pub probes_told: u64,
}

impl Seen {
    /// `--fail`'s exit status: 4 for a failed probe, or one asked for
    /// (`probe_asked`) with no result (a stop came first): what was asked
    /// first; else 3 for a drop or a missing route; else 0.
    pub fn exit_status(&self, probe_asked: bool) -> u8 {
        let probe_failed = self.unanswered_probes > 0 || probe_asked && self.probes_told == 0;
        match (probe_failed, self.failed_verdicts) {
            (true, _) => 4,
            (false, 1..) => 3,
            (false, 0) => 0,
        }
    }
}

/// A story told, not yet written to the pcapng.
struct HeldStory {
    n: u64,
    /// The probe's flow and echo sequence (`ProbeWatch::flow_of`).
    flow: (u16, u16),
    journey: Journey,
    story: Story,
    /// The mid-run context it was told with.
    mid_run: MidRun,
}

impl<'a> Teller<'a> {
    /// A teller that writes every story to `sink`, and nothing else (no
    /// limit, profile, pcapng or probes): `podtrace read`, and a stop
    /// before tracing began.
    pub fn plain(sink: Box<dyn Sink + 'a>) -> Self {
        Self {
            sink,
            ctx: Context::default(),
            profile: None,
            limit: None,
            told: 0,
            pcap: None,
            probe: None,
            held: Vec::new(),
            seen: Seen::default(),
            conntrack_now: None,
            wireguard_now: None,
            pmtu_after: PmtuFollowups::default(),
        }
    }

    /// The traced nodes' conntrack tables read again into the context.
    fn read_conntrack(&mut self) {
        if let Some(read) = &mut self.conntrack_now {
            for table in read() {
                self.ctx.conntrack.insert(table.node.clone(), table);
            }
        }
    }

    /// The WireGuard state of the node that judges `journey` read again
    /// into the context; a read that fails keeps what was read before
    /// for a while (the story then says when that was: `Watch`).
    fn read_wireguard(&mut self, journey: &Journey) {
        // Asked first: without a WireGuard device on any traced node (most
        // traces), a story pays nothing for this.
        let Some(read) = &mut self.wireguard_now else {
            return;
        };
        let judging =
            story::wireguard::receiving_node(&journey.hops, &self.ctx.nodes, &self.ctx.subnets);
        let Some(node) = judging.map(str::to_string) else {
            return;
        };
        let Some(state) = read(&node) else {
            return;
        };
        if let Some(facts) = self.ctx.nodes.get_mut(&node) {
            facts.view.wireguard = state;
        }
    }

    fn limit_reached(&self) -> bool {
        self.limit.is_some_and(|n| self.told >= n)
    }

    /// Tells the journeys' stories, then hands them to the output at
    /// once: one write for a batch, not one per story, so that a flow at
    /// line rate is not told a syscall per packet. False once no more
    /// stories are wanted.
    pub fn tell_all(&mut self, journeys: &[Journey]) -> std::io::Result<bool> {
        let mut wanted = true;
        // A packet too big for its path, and the ICMP error about it the
        // correlator finished with it.
        let errors = story::pmtu::pair(journeys);
        for (i, journey) in journeys.iter().enumerate() {
            let pmtu = (errors.iter())
                .find(|(subject, _)| *subject == i)
                .map(|(_, error)| error.map(|e| &journeys[e]));
            wanted = self.tell(journey, pmtu)?;
            if !wanted {
                break;
            }
        }
        self.sink.flush()?;
        Ok(wanted)
    }

    /// Tells the journey's story; false once no more stories are wanted.
    /// `pmtu`: for a packet too big for its path, the ICMP error about it
    /// if one was seen.
    fn tell(&mut self, journey: &Journey, pmtu: Option<Option<&Journey>>) -> std::io::Result<bool> {
        if self.limit_reached() {
            return Ok(false);
        }
        let probe_flow = match &mut self.probe {
            Some(watch) => match watch.flow_of(journey) {
                Some(flow) => Some(flow),
                None => {
                    watch.skipped += 1;
                    return Ok(true);
                }
            },
            None => None,
        };
        if journey.ends_in_a_netfilter_drop() {
            self.read_conntrack();
        }
        self.read_wireguard(journey);
        let mut story = story::tell(journey, &self.ctx);
        if let Some(error) = pmtu {
            let told = error.map(|e| (e, story::tell(e, &self.ctx)));
            let told = told.as_ref().map(|(e, s)| (*e, s));
            story::pmtu::attach(&mut story, told, |ip| self.ctx.label(ip).to_string());
        }
        if matches!(
            story.verdict.outcome,
            Outcome::Dropped { .. } | Outcome::NoRoute { .. }
        ) {
            self.seen.failed_verdicts += 1;
        }
        if let (Some(watch), Some(flow)) = (&mut self.probe, probe_flow) {
            watch.told(flow, &story);
        }
        self.told += 1;
        self.sink.story(self.told, &story)?;
        self.pmtu_after.told(journey, &story, self.told);
        if let Some(pcap) = &mut self.pcap {
            let mid_run = MidRun::of(&self.ctx);
            match probe_flow {
                Some(flow) => self.held.push(HeldStory {
                    n: self.told,
                    flow,
                    journey: journey.clone(),
                    story: story.clone(),
                    mid_run,
                }),
                None => {
                    pcap.told_with(mid_run);
                    pcap.story(self.told, journey, &story, &[])?;
                }
            }
        }
        if let Some(profile) = &mut self.profile {
            profile.add(&story);
        }
        Ok(!self.limit_reached())
    }

    /// `--probe`'s results, each beside the verdict of its packet that
    /// failed, after the stories; the pair's other traffic skipped is
    /// counted in `summary`. `podtrace read` (no watch) tells the results
    /// as the file has them.
    pub fn tell_probes(
        &mut self,
        results: Vec<ProbeResult>,
        summary: &mut Summary,
    ) -> std::io::Result<()> {
        let results: Vec<ProbeResult> = match &self.probe {
            Some(watch) => {
                summary.skipped_by_filter = watch.skipped;
                results.into_iter().map(|r| watch.explained(r)).collect()
            }
            None => results,
        };
        for result in &results {
            let went_through =
                (self.probe.as_ref()).is_some_and(|w| w.delivered_to_silence(result));
            self.seen.unanswered_probes += u64::from(!result.answered && !went_through);
            self.seen.probes_told += 1;
            self.sink.probe(result)?;
        }
        self.write_held(&results)?;
        self.sink.flush()
    }

    /// Writes the held stories to the pcapng, each probe's result on its
    /// last packet.
    fn write_held(&mut self, results: &[ProbeResult]) -> std::io::Result<()> {
        let (Some(pcap), Some(watch)) = (&mut self.pcap, &self.probe) else {
            return Ok(());
        };
        let held = std::mem::take(&mut self.held);
        let flows: Vec<(u16, u16)> = held.iter().map(|h| h.flow).collect();
        let mut ended: Vec<Vec<ProbeResult>> = vec![Vec::new(); held.len()];
        for result in results {
            if let Some(last) = watch.last_story_of(&flows, result) {
                ended[last].push(result.clone());
            }
        }
        for (h, ended) in held.into_iter().zip(ended) {
            pcap.told_with(h.mid_run);
            pcap.story(h.n, &h.journey, &h.story, &ended)?;
        }
        Ok(())
    }

    /// A traced pod has a new address: stories name it from now on.
    pub fn rename(&mut self, ip: Ipv4Addr, name: String) {
        self.ctx.names.insert(ip.into(), name);
        if let Some(pcap) = &mut self.pcap {
            pcap.renamed(&self.ctx.names);
        }
    }

    /// Prints the summary; what went wrong in what was told.
    pub fn finish(mut self, mut summary: Summary) -> std::io::Result<Seen> {
        if let Some(profile) = &self.profile {
            self.sink.profile(&profile.latencies())?;
        }
        summary.stories = self.told;
        summary.pmtu_after = std::mem::take(&mut self.pmtu_after).finish();
        self.read_conntrack();
        let mut runs: Vec<ConntrackRun> = self
            .ctx
            .conntrack
            .values()
            .map(ConntrackRun::from)
            .collect();
        runs.sort_by(|a, b| a.node.cmp(&b.node));
        // A replayed trace read no counters: its summary keeps the
        // recorded ones.
        if !runs.is_empty() {
            summary.conntrack = runs;
        }
        // A run stopped before the probes' results: their stories as told.
        self.write_held(&[])?;
        if let Some(pcap) = &mut self.pcap {
            pcap.finish(&summary)?;
            eprintln!(
                "podtrace: wrote {} packets of {} stories; {} sightings told no story (undecodable, unknown interface, or past --count)",
                pcap.packets,
                summary.stories,
                summary.sightings.saturating_sub(pcap.packets)
            );
        }
        self.sink.summary(&summary)?;
        Ok(self.seen)
    }
}

/// The teller of a trace of `args`; `ends`: the traced pair's source and
/// destination, where `--probe` sends its probes (none before tracing).
pub(super) fn new_teller(
    args: &Args,
    ctx: Context,
    ends: Option<(Ipv4Addr, Ipv4Addr)>,
) -> Teller<'static> {
    // `-w -` puts the packets on stdout: the stories go to stderr.
    let (out, terminal): (Box<dyn Write>, bool) = if args.write.as_deref() == Some("-") {
        (buffered(std::io::stderr()), std::io::stderr().is_terminal())
    } else {
        (buffered(std::io::stdout()), std::io::stdout().is_terminal())
    };
    let colour = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => terminal,
    };
    Teller {
        sink: output::sink(args.output, out, colour),
        ctx,
        profile: args.profile.then(Profile::default),
        limit: args.count,
        told: 0,
        pcap: None,
        probe: args
            .probe
            .probe
            .zip(ends)
            .map(|(kind, ends)| ProbeWatch::new(kind, ends)),
        held: Vec::new(),
        seen: Seen::default(),
        conntrack_now: None,
        wireguard_now: None,
        pmtu_after: PmtuFollowups::default(),
    }
}

/// Stories are written a batch at a time (`Teller::tell_all` flushes).
fn buffered(out: impl Write + 'static) -> Box<dyn Write> {
    Box::new(std::io::BufWriter::with_capacity(1 << 16, out))
}

/// The `--write` file: `watched`, the interfaces announced before any
/// packet (others are announced as their first packet comes); `ends`,
/// the traced pair, for its title.
pub(super) fn pcap_writer(
    out: Box<dyn Write>,
    args: &Args,
    watched: &[Announced<'_>],
    ends: (IpAddr, IpAddr),
    ctx: &Context,
) -> std::io::Result<PcapWriter> {
    let title = format!("podtrace {} ⇄ {}", ctx.label(ends.0), ctx.label(ends.1));
    PcapWriter::create(out, args.snaplen, title, watched, ctx)
}

#[cfg(test)]
mod tests {
    use super::Seen;

    #[test]
    fn fails_exit_status_puts_a_failed_probe_before_a_drop() {
        let seen = |unanswered_probes, failed_verdicts| Seen {
            failed_verdicts,
            unanswered_probes,
            probes_told: 1,
        };
        assert_eq!(seen(0, 0).exit_status(true), 0);
        assert_eq!(seen(0, 2).exit_status(false), 3);
        assert_eq!(seen(1, 0).exit_status(true), 4);
        assert_eq!(seen(1, 5).exit_status(true), 4);
        // A probe asked for and a stop before its result: not a success.
        assert_eq!(Seen::default().exit_status(true), 4);
        assert_eq!(Seen::default().exit_status(false), 0);
    }
}
