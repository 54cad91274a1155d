//! Node mode: one trace on this node, from arguments to stories (the
//! phases `resolve`, `attach`, `stream`, `finish`). Linux only: it loads
//! programs and enters namespaces.

use anyhow::{bail, Result};

use super::{
    masquerade, node_stream, probing, stop,
    stop::Stop,
    teller::{new_teller, Seen},
    trace::{attach, finish, require_root, resolve_unless_stopped},
};
use crate::{cli::Args, cluster::inventory::PodWithoutIp, doctor, output::pcapng, story::Context};

/// A trace on this node; what went wrong in the stories told (`--fail`).
pub async fn run(args: Args) -> Result<Seen> {
    probing::check(&args)?;
    require_root()?;
    // Before anything is attached: a signal from here on ends the trace
    // through the normal drop path.
    let mut stop = Stop::catch()?;
    // Before anything is attached: a path that cannot be written is bad input.
    let write = args.write.as_deref().map(pcapng::open).transpose()?;
    let Some(resolved) = resolve_unless_stopped(&args, &mut stop).await else {
        stop::stopped_before_tracing(new_teller(&args, Context::default(), None))?;
        return Ok(Seen::default());
    };
    let resolved = match resolved {
        Err(e) if e.downcast_ref::<PodWithoutIp>().is_some() => {
            match doctor::trace::no_ip(&args).await {
                Some(finding) => bail!("{finding}"),
                None => return Err(e),
            }
        }
        other => other?,
    };
    let probing = probing::prepare(
        &args,
        &resolved.targets,
        &resolved.ctx,
        &resolved.namespaces,
    )
    .await?;
    let mut trace = attach(&args, resolved).await?;
    masquerade::trace_masquerade_sources(&mut trace)?;
    // Only now that every hook is attached: each probe is seen whole.
    trace.probes = probing.map(probing::start);
    let summary = node_stream::here(&args, &mut trace, &mut stop, write).await?;
    finish(trace, summary)
}
