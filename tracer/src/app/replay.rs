//! `podtrace read FILE.pcapng`: the stories of a `--write` file told
//! again, offline and without root, through the same teller and sinks as
//! a live trace, so the story lines are the same.

use std::io::{IsTerminal, Write};

use anyhow::{bail, Result};

use super::teller::Teller;
use crate::{
    cli::ReadArgs,
    model::{ProbeResult, Summary},
    output::{
        self,
        pcapng_read::{read, Replayed},
    },
};

pub fn replay(args: &ReadArgs) -> Result<()> {
    let colour = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal(),
    };
    quiet_when_unread(replay_into(args, std::io::stdout(), colour))
}

/// `podtrace read … | head`: a reader that stopped reading is no error.
fn quiet_when_unread(told: Result<()>) -> Result<()> {
    match told {
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            Ok(())
        }
        other => other,
    }
}

fn replay_into(args: &ReadArgs, out: impl Write + 'static, colour: bool) -> Result<()> {
    let events = read(&args.file)?;
    let mut teller = Teller::plain(output::sink(args.output, out, colour));
    let mut summary = None;
    let mut probes = Vec::new();
    let mut foreign = 0;
    let mut damage = None;
    // Stories between two changes of context are told as one batch, as
    // the run told them: a packet too big for its path and the ICMP error
    // about it are paired within a batch.
    let mut batch = Vec::new();
    for event in events {
        if !matches!(event, Replayed::Story(_)) && !batch.is_empty() {
            teller.tell_all(&std::mem::take(&mut batch))?;
        }
        match event {
            Replayed::Context(ctx) => teller.ctx = *ctx,
            Replayed::Story(journey) => batch.push(journey),
            Replayed::Probe(result) => probes.push(result),
            Replayed::Summary(s) => summary = Some(s),
            Replayed::Foreign(n) => foreign = n,
            Replayed::Damaged {
                packets,
                why,
                cut_story,
            } => damage = Some((packets, why, cut_story)),
        }
    }
    teller.tell_all(&batch)?;
    if foreign > 0 {
        eprintln!("podtrace: {foreign} packets in the file were not written by podtrace: skipped");
    }
    if summary.is_none() && damage.is_none() {
        eprintln!("podtrace: the file has no summary: the trace that wrote it did not finish (the stories in it are complete)");
    }
    let mut summary = summary.unwrap_or_else(Summary::default);
    // After the stories, in the order they were sent, as the run told
    // them.
    probes.sort_by_key(|p: &ProbeResult| p.seq);
    teller.tell_probes(probes, &mut summary)?;
    teller.finish(summary)?;
    if let Some((packets, why, cut_story)) = damage {
        bail!(
            "{} is damaged after its first {packets} packets ({why}): the stories before that are told{}",
            args.file.display(),
            if cut_story {
                ", not the one it cuts"
            } else {
                ""
            }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{io, path::PathBuf, time::Instant};

    use super::*;
    use crate::{
        model::{bounded::testing, Format},
        node::interfaces::Role,
        output::{
            pcapng::{Announced, PcapWriter},
            testing::Kept,
        },
        story::{self, tests::sample_journey},
    };

    fn args(file: PathBuf) -> ReadArgs {
        ReadArgs {
            file,
            output: Format::Human,
            color: "never".into(),
        }
    }

    /// A file of three stories and a summary; the file's length after its
    /// header, and after each story.
    fn written(name: &str) -> (PathBuf, u64, Vec<u64>) {
        let path = testing::scratch(name);
        let file = std::fs::File::create(&path).unwrap();
        let len = || std::fs::metadata(&path).unwrap().len();
        let eth0 = Announced {
            node: "node-1",
            iface: "eth0",
            role: Role::Underlay,
            has_l2: true,
        };
        let ctx = crate::story::Context::default();
        let mut w = PcapWriter::create(Box::new(file), 128, "t".into(), &[eth0], &ctx).unwrap();
        let header = len();
        let journey = sample_journey();
        let mut ends = Vec::new();
        for n in 1..=3 {
            w.story(n, &journey, &story::tell(&journey, &ctx), &[])
                .unwrap();
            ends.push(len());
        }
        w.finish(&Summary::default()).unwrap();
        (path, header, ends)
    }

    /// The stories `podtrace read` tells of the file, and its error.
    fn told(path: &std::path::Path) -> (u64, Option<String>) {
        let kept = Kept::default();
        let done = replay_into(&args(path.to_path_buf()), kept.clone(), false);
        let out = kept.text();
        let stories = out
            .lines()
            .find_map(|l| l.strip_prefix("podtrace: ")?.split(" stories").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no summary: {out}"));
        (stories, done.err().map(|e| format!("{e:#}")))
    }

    #[test]
    fn a_file_cut_anywhere_tells_every_whole_story_before_the_cut() {
        let (path, header, ends) = written("whole.pcapng");
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(told(&path), (3, None));
        let cut = testing::scratch("cut.pcapng");
        for len in (header..bytes.len() as u64).step_by(5) {
            std::fs::write(&cut, &bytes[..len as usize]).unwrap();
            let whole = ends.iter().filter(|end| **end <= len).count() as u64;
            let (stories, error) = told(&cut);
            assert_eq!(stories, whole, "cut at {len}: {error:?}");
            if !ends.contains(&len) && len != header {
                let error = error.unwrap_or_else(|| panic!("cut at {len}: no damage said"));
                assert!(
                    error.contains("is damaged after its first"),
                    "cut at {len}: {error}"
                );
                assert_eq!(error.lines().count(), 1);
            }
        }
    }

    #[test]
    fn a_classic_pcap_file_is_named_as_one() {
        let path = testing::scratch("classic.pcap");
        let mut header = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        header.extend([0; 8]);
        header.extend([0xff, 0xff, 0, 0, 1, 0, 0, 0]);
        std::fs::write(&path, header).unwrap();
        let err = replay_into(&args(path.clone()), Kept::default(), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{} is a classic pcap file, not pcapng: podtrace reads the pcapng files that --write writes",
                path.display()
            )
        );
    }

    /// A `--probe` file: its probe's result on the last packet of its
    /// story, as the teller writes it.
    fn written_with_a_probe(name: &str, result: &ProbeResult) -> PathBuf {
        let path = testing::scratch(name);
        let file = std::fs::File::create(&path).unwrap();
        let ctx = crate::story::Context::default();
        let mut w = PcapWriter::create(Box::new(file), 128, "t".into(), &[], &ctx).unwrap();
        let journey = sample_journey();
        let told = story::tell(&journey, &ctx);
        w.story(1, &journey, &told, std::slice::from_ref(result))
            .unwrap();
        w.finish(&Summary::default()).unwrap();
        path
    }

    /// A run that wrote no packet, as cluster mode announces no interface
    /// before its first: its summary is still read back.
    #[test]
    fn a_file_without_a_packet_still_holds_its_summary() {
        let path = testing::scratch("empty.pcapng");
        let file = std::fs::File::create(&path).unwrap();
        let ctx = crate::story::Context::default();
        let mut w = PcapWriter::create(Box::new(file), 128, "t".into(), &[], &ctx).unwrap();
        let summary = Summary {
            sightings: 7,
            ..Default::default()
        };
        w.finish(&summary).unwrap();
        let kept = Kept::default();
        replay_into(&args(path), kept.clone(), false).unwrap();
        let out = kept.text();
        assert!(out.contains("0 stories from 7 sightings"), "{out}");
    }

    #[test]
    fn a_probes_result_is_told_again_as_the_run_told_it() {
        let result = ProbeResult {
            kind: "udp:5354".into(),
            target: "10.244.2.2:5354".into(),
            seq: 1,
            answered: false,
            silent: false,
            rtt_ms: Some(0.4321),
            result: "ICMP port unreachable: nothing listens there".into(),
            flow_id: 40000,
        };
        let path = written_with_a_probe("probe.pcapng", &result);
        let kept = Kept::default();
        replay_into(&args(path.clone()), kept.clone(), false).unwrap();
        let lines: Vec<String> = kept.text().lines().map(str::to_string).collect();
        let probe_line = crate::output::human_probe(&result);
        assert_eq!(
            lines.iter().filter(|l| **l == probe_line).count(),
            1,
            "{lines:?}"
        );
        // After the story, before the summary, as a live run tells it.
        let at = lines.iter().position(|l| *l == probe_line).unwrap();
        assert!(lines[at + 1].starts_with("podtrace: "), "{lines:?}");
        let kept = Kept::default();
        let json = ReadArgs {
            output: Format::Json,
            ..args(path)
        };
        replay_into(&json, kept.clone(), false).unwrap();
        let mut live = Vec::new();
        output::sink(Format::Json, &mut live, false)
            .probe(&result)
            .unwrap();
        let live = String::from_utf8(live).unwrap();
        assert!(
            kept.text().lines().any(|l| l == live.trim_end()),
            "{live} in {}",
            kept.text()
        );
    }

    /// A pipe whose reader went (`podtrace read … | head`).
    struct Closed;

    impl Write for Closed {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn a_reader_that_stopped_reading_is_no_error() {
        let (path, _, _) = written("piped.pcapng");
        let told = replay_into(&args(path), Closed, false);
        assert!(told.is_err());
        assert!(quiet_when_unread(told).is_ok());
    }

    #[test]
    fn a_fifo_or_dev_zero_is_named_not_read() {
        let fifo = testing::fifo("read.fifo");
        let started = Instant::now();
        let err = replay_into(&args(fifo.clone()), Kept::default(), false).unwrap_err();
        assert!(started.elapsed().as_secs() < 1);
        assert_eq!(
            err.to_string(),
            format!("{} is a FIFO, not a regular file", fifo.display())
        );
        let err = replay_into(&args("/dev/zero".into()), Kept::default(), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/dev/zero is a character device, not a regular file"
        );
    }
}
