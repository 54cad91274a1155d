//! Loading every program once, as a trace would, to learn what the
//! running kernel takes (`podtrace kernel`).

use anyhow::{Context, Result};
use aya::EbpfLoader;
use podtrace_common::{names, wireguard::PREFIX_MASK};

use super::{drops, features::DropHook, load::EBPF_OBJECT, tc, Kernel};

/// Loads every program into the running kernel and attaches the drop
/// program, as a trace would, then lets go of them all: whether this
/// kernel's verifier takes them, and how drops attach. Globals the
/// verifier sees as constants prune whole branches, so the programs are
/// loaded as a plain trace, a `--sample` trace and profile mode load them.
pub fn try_load(kernel: &Kernel, btf: &aya::Btf) -> Result<Loaded> {
    let mut loaded = Loaded {
        drop_hook: DropHook::Typed,
        ipv6_refused: None,
    };
    // (profile, sample, filtering): every branch a trace may take, and
    // what a user asks for to take it.
    let modes = [
        (0u32, 1u32, 0u32, "a plain trace"),
        (0, 2, 0, "--sample"),
        (0, 2, 1, "--sample with --proto/--port"),
        (1, 1, 1, "profile mode with --proto/--port"),
    ];
    // Each as on a node with a WireGuard device: the tagging's branches
    // too (any prefix but 0 keeps them; this one, the lowest).
    let wireguard_tag_prefix = 1u32 << PREFIX_MASK.trailing_zeros();
    for (profile, sample, filtering, asked) in modes {
        let mut ebpf = EbpfLoader::new()
            .override_global(names::LAYOUT, &kernel.layout, true)
            .override_global(names::WIREGUARD_TAG_PREFIX, &wireguard_tag_prefix, true)
            .override_global(names::PROFILE, &profile, true)
            .override_global(names::SAMPLE, &sample, true)
            .override_global(names::FILTERING, &filtering, true)
            .load(EBPF_OBJECT)
            .context("cannot load the eBPF programs")?;
        for name in tc::PROGRAMS {
            tc::program(&mut ebpf, name)?
                .load()
                .with_context(|| format!("the kernel refused {name}"))?;
        }
        // Once refused, not asked again: a refusal can take the
        // verifier its whole budget of instructions.
        if loaded.ipv6_refused.is_none() {
            if let Err(e) = tc::load_ipv6(&mut ebpf) {
                // As a trace goes on without them: IPv4 only.
                loaded.ipv6_refused = Some(format!("in {asked}: {}", first_line(&e)));
            }
        }
        loaded.drop_hook = drops::attach(&mut ebpf, btf, kernel.features.drop_reasons)?;
    }
    Ok(loaded)
}

/// The first line of an error and its causes: a verifier's refusal goes
/// on for thousands of lines of its log.
pub fn first_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// What [`try_load`] found: how drops attach, and why the IPv6 programs
/// were refused if they were (a trace then goes on with IPv4 only).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub drop_hook: DropHook,
    pub ipv6_refused: Option<String>,
}
