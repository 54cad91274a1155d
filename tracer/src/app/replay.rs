//! `podtrace read FILE.pcapng`: the stories of a `--write` file told
//! again, offline and without root, through the same teller and sinks as
//! a live trace, so the story lines are the same.

use std::io::IsTerminal;

use anyhow::Result;

use super::teller::Teller;
use crate::{
    cli::ReadArgs,
    model::Summary,
    output::{
        self,
        pcapng_read::{read, Replayed},
    },
    story::Context,
};

pub fn replay(args: &ReadArgs) -> Result<()> {
    let events = read(&args.file)?;
    let colour = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal(),
    };
    let mut teller = Teller {
        sink: output::sink(args.output, std::io::stdout(), colour),
        ctx: Context::default(),
        profile: None,
        limit: None,
        told: 0,
        pcap: None,
    };
    let mut summary = None;
    let mut foreign = 0;
    for event in events {
        match event {
            Replayed::Context(ctx) => teller.ctx = *ctx,
            Replayed::Story(journey) => {
                teller.tell_all(std::slice::from_ref(&journey))?;
            }
            Replayed::Summary(s) => summary = Some(s),
            Replayed::Foreign(n) => foreign = n,
        }
    }
    if foreign > 0 {
        eprintln!("podtrace: {foreign} packets in the file were not written by podtrace: skipped");
    }
    if summary.is_none() {
        eprintln!("podtrace: the file has no summary: the trace that wrote it did not finish (the stories in it are complete)");
    }
    teller.finish(summary.unwrap_or_else(Summary::default))?;
    Ok(())
}
