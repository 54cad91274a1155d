//! `podtrace kernel`: what the running kernel gives podtrace, told from
//! its BTF and from loading every program for a moment, as a trace would.
//! The kernel matrix fills the README's kernel table from this.

use anyhow::Result;
use serde::Serialize;

use crate::{
    cli::KernelArgs,
    model::Format,
    probe::{features::DropHook, try_load, AttachMode, Kernel},
};

/// The kernel's report, as `-o json` prints it.
#[derive(Debug, Serialize)]
struct Report {
    #[serde(rename = "type")]
    kind: &'static str,
    release: String,
    /// kfree_skb passes a drop reason (5.17).
    drop_reasons: bool,
    /// TCX links (6.6); else clsact.
    tcx: bool,
    /// How a trace attaches by default: `tcx` or `clsact`.
    attach: &'static str,
    /// How drops attach: `tp_btf` or `raw_tracepoint`; absent if the
    /// programs did not load.
    drop_hook: Option<&'static str>,
    /// Every program loads (the verifier takes them), IPv6's aside.
    loads: bool,
    /// The IPv6 programs load too; without them IPv6 is not traced at tc.
    ipv6: bool,
    /// Why they do not, in one line.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// What podtrace does without, as the trace's banner says it.
    degraded: Vec<String>,
}

pub fn run(args: &KernelArgs) -> Result<()> {
    super::trace::require_root()?;
    let kernel = Kernel::read()?;
    let features = &kernel.features;
    let mode = features.attach_mode(AttachMode::Auto)?;
    let loaded = Kernel::typed_btf().and_then(|btf| try_load(&kernel, &btf));
    let drop_hook = loaded.as_ref().ok().map(|l| l.drop_hook);
    let ipv6_refused = loaded.as_ref().ok().and_then(|l| l.ipv6_refused.clone());
    let report = Report {
        kind: "kernel",
        release: features.release.clone(),
        drop_reasons: features.drop_reasons,
        tcx: features.tcx,
        attach: if mode == AttachMode::Tcx {
            "tcx"
        } else {
            "clsact"
        },
        drop_hook: drop_hook.map(|hook| match hook {
            DropHook::Typed => "tp_btf",
            DropHook::Raw => "raw_tracepoint",
        }),
        loads: loaded.is_ok(),
        ipv6: loaded.is_ok() && ipv6_refused.is_none(),
        error: loaded.as_ref().err().map(crate::probe::first_line),
        degraded: features
            .degraded(mode, drop_hook)
            .iter()
            .map(ToString::to_string)
            .chain(ipv6_refused.map(|e| format!("IPv6 packets are not traced at tc: {e}")))
            .collect(),
    };
    let text = match args.output {
        Format::Json => format!("{}\n", serde_json::to_string(&report)?),
        Format::Human => human(&report),
    };
    std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())?;
    if let Err(e) = loaded {
        anyhow::bail!("this kernel refuses podtrace's programs: {e:#}");
    }
    Ok(())
}

fn human(r: &Report) -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut out = format!("kernel {}\n", r.release);
    out += &format!("  drop reasons named (5.17): {}\n", yes(r.drop_reasons));
    out += &format!(
        "  TCX links (6.6): {}; traces attach by {}\n",
        yes(r.tcx),
        r.attach
    );
    match r.drop_hook {
        Some(hook) => out += &format!("  every program loads; drops attach as {hook}\n"),
        None => out += "  the programs do not load\n",
    }
    for degraded in &r.degraded {
        out += &format!("  {degraded}\n");
    }
    out
}
