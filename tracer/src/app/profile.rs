//! `podtrace profile SRC DST`: the trace's resolve and attach phases with
//! the kernel in profile mode, then no stream of records: the step
//! histograms are read every second (a live line on a terminal) and at
//! exit, and told as one table (human or JSON) and, with `--plot`, as SVG.

use std::{
    io::{IsTerminal, Write},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use podtrace_common::profile::{hook_parts, StepKey};

use super::{
    stop::Stop,
    stream::{drive, Source},
    trace::{require_root, resolve_and_attach, Trace},
};
use crate::{
    cli::{Args, ProfileArgs},
    decode::hop::Direction,
    model::{Format, MAX_SNAPLEN},
    output::plot,
    probe::shared_maps,
    story::steps::{self, KernelStep},
};

/// A trace's flags that profile mode has no use for (it keeps no packet,
/// it counts them all in the kernel): refused rather than ignored, so
/// that nobody waits for a `--count` or a `--write` file that never comes.
fn refuse_trace_only_flags(args: &Args) -> Result<()> {
    let given = [
        (args.count.is_some(), "--count"),
        (args.write.is_some(), "--write"),
        (args.snaplen != MAX_SNAPLEN, "--snaplen"),
        (args.sample != 1, "--sample"),
        (args.profile, "--profile"),
        (args.fail, "--fail"),
        // The doctor's findings join verdicts, and profile mode has none.
        (!args.kube.host_root.is_empty(), "--host-root"),
    ];
    match given.iter().find(|(given, _)| *given) {
        Some((_, flag)) => anyhow::bail!(
            "{flag} is a trace's flag: podtrace profile counts every packet in the kernel and tells no story (stop it with --duration or Ctrl-C)"
        ),
        None => Ok(()),
    }
}

pub async fn run(profile: ProfileArgs) -> Result<()> {
    let ProfileArgs {
        trace: mut args,
        plot: plot_file,
    } = profile;
    refuse_trace_only_flags(&args)?;
    args.in_kernel_profile = true;
    // One stamp map for every node of this kernel: the wire is a step.
    args.shared_stamps = match shared_maps::private_bpffs() {
        Ok(dir) => Some(dir),
        Err(e) => {
            eprintln!("podtrace: the wire between nodes is not profiled ({e:#}): each node keeps its own stamps");
            None
        }
    };
    // Profiling names no rule: no nft tracing table to slow the path.
    args.no_ruleset_changes = true;
    require_root()?;
    let mut stop = Stop::catch()?;
    let Some(mut trace) = resolve_and_attach(&args, &mut stop).await? else {
        return Ok(());
    };
    let started = Instant::now();
    let live = std::io::stderr().is_terminal();
    let mut profiling = Profiling {
        trace: &mut trace,
        started,
        live,
    };
    drive(&mut profiling, Some(&mut stop), args.duration, false).await?;
    let steps = steps::chain(read(&trace)?);
    let unmeasured = trace
        .nodes
        .iter()
        .map(|node| node.probe.stamps_evicted())
        .sum::<Result<u64>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let pair = format!(
        "{} ⇄ {}",
        trace.ctx.label(trace.targets.src.ip),
        trace.ctx.label(trace.targets.dst.ip)
    );
    drop(trace);
    if live {
        eprintln!();
    }
    tell(&steps, args.output, &pair, seconds, unmeasured)?;
    if let Some(file) = plot_file {
        std::fs::write(&file, plot::svg(&steps))
            .with_context(|| format!("cannot write {}", file.display()))?;
    }
    Ok(())
}

/// A profiled trace as a stream loop's source: its steps shown live each
/// second on a terminal.
struct Profiling<'a> {
    trace: &'a mut Trace,
    started: Instant,
    live: bool,
}

impl Source for Profiling<'_> {
    type Event = ();

    fn tick_every(&self) -> Duration {
        Duration::from_secs(1)
    }

    async fn next(&mut self) -> Option<()> {
        // Only drops reach the ring in profile mode: not told here.
        match self.trace.sightings.recv().await {
            Some(_) => Some(()),
            None => std::future::pending().await,
        }
    }

    async fn take(&mut self, _: ()) -> Result<()> {
        Ok(())
    }

    async fn tick(&mut self) -> Result<()> {
        if self.live {
            progress(&read(self.trace)?, self.started);
        }
        Ok(())
    }
}

/// Every node's steps, hooks named (a step from another node's hook is
/// the wire).
fn read(trace: &Trace) -> Result<Vec<KernelStep>> {
    let name = |hook: u32| {
        let (node, ifindex, direction) = hook_parts(hook);
        let Some(node) = trace.nodes.get(node as usize) else {
            return format!("node{node}/if{ifindex}");
        };
        let iface = node
            .interfaces
            .get(&ifindex)
            .map_or_else(|| format!("if{ifindex}"), |w| w.name.to_string());
        let direction = if direction == 0 {
            Direction::Ingress
        } else {
            Direction::Egress
        };
        format!("{}/{iface}:{}", node.name, direction.label())
    };
    let mut out = Vec::new();
    for node in &trace.nodes {
        for (StepKey { from, to }, h) in node.probe.steps()? {
            out.push(steps::step(&node.name, name(from), name(to), &h));
        }
    }
    Ok(out)
}

/// The live line: time, packets seen on their first step, steps.
fn progress(steps: &[KernelStep], started: Instant) {
    let samples: u64 = steps.iter().map(|s| s.packets).sum();
    eprint!(
        "\rpodtrace profile: {:.0} s, {samples} step samples on {} steps   ",
        started.elapsed().as_secs_f64(),
        steps.len()
    );
    let _ = std::io::stderr().flush();
}

/// `unmeasured`: steps the kernel could not time (their packet's stamp
/// was taken by another packet in flight), said rather than lost.
fn tell(
    steps: &[KernelStep],
    format: Format,
    pair: &str,
    seconds: f64,
    unmeasured: u64,
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match format {
        Format::Json => {
            let line = serde_json::json!({
                "type": "profile_steps",
                "pair": pair,
                "seconds": seconds,
                "steps": steps,
                "steps_unmeasured": unmeasured,
            });
            writeln!(out, "{line}")?;
            return Ok(());
        }
        Format::Human if steps.is_empty() => {
            writeln!(out, "podtrace profile: {pair}, {seconds:.1} s: no traced packet crossed two hooks (no traffic between them while it ran?)")?;
        }
        Format::Human => {
            writeln!(out, "podtrace profile: {pair}, {seconds:.1} s; per step, in-kernel histograms (µs; share of its direction's time)")?;
            writeln!(
                out,
                "{:>9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6}  step",
                "packets", "p50", "p90", "p99", "max", "bytes", "share"
            )?;
            for s in steps {
                writeln!(
                    out,
                    "{:>9} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>+6} {:>5.0}%  {} → {}",
                    s.packets,
                    s.p50_us,
                    s.p90_us,
                    s.p99_us,
                    s.max_us,
                    s.bytes_added,
                    s.share * 100.0,
                    s.from,
                    s.to
                )?;
            }
        }
    }
    if unmeasured > 0 {
        writeln!(out, "podtrace profile: about {unmeasured} steps not measured: their packets' stamps were taken by other packets in flight (too many at once in one of the kernel's buckets)")?;
    }
    Ok(())
}
