// Off Linux every arm that runs a node's trace is compiled out.
#![cfg_attr(not(target_os = "linux"), allow(unreachable_code, unused_variables))]

use clap::{error::ErrorKind, Parser};
use podtrace::cli::{shell, Args, Cli, Command};
// The never-panicking eprintln! (lib.rs says why).
use podtrace::eprintln;

/// A pod named without a namespace is in the kubeconfig context's, as
/// kubectl's (an agent is told its front-end's).
fn settle_namespace(cli: &mut Cli) {
    let kube = match &mut cli.command {
        Some(Command::Doctor(doctor)) => Some(&mut doctor.kube),
        Some(Command::Profile(profile)) => Some(&mut profile.trace.kube),
        Some(_) => None,
        None => cli.trace.as_mut().map(|trace| &mut trace.kube),
    };
    if let Some(kube) = kube {
        podtrace::cluster::access::settle_namespace(kube);
    }
}

fn main() -> std::process::ExitCode {
    // Before the runtime and anything attached; `app::run` catches them.
    podtrace::app::block_signals();
    if let Some(words) = completion_request() {
        print!("{}", shell::complete_words(&words));
        return std::process::ExitCode::SUCCESS;
    }
    let mut cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            e.exit()
        }
        Err(e) => {
            // clap's usage error whole: what is wrong on its first line,
            // then the missing argument or the values it takes, its tip
            // and the usage. podtrace's own errors stay one line.
            let rendered = e.render().to_string();
            let said = rendered.trim_end().trim_start_matches("error: ");
            eprintln!("podtrace: {said}");
            return std::process::ExitCode::from(2);
        }
    };
    settle_namespace(&mut cli);
    if let Some(done) = offline(&cli).or_else(|| refused_off_linux(&cli)) {
        return done;
    }
    // One thread: setns(2) is per thread, and every netlink socket and tc
    // attachment must be made inside the namespace podtrace entered.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("podtrace: cannot start: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = match (cli.command, cli.trace) {
        (None, Some(trace)) => return trace_and_exit(&runtime, trace),
        #[cfg(target_os = "linux")]
        (Some(Command::Agent(agent)), _) => runtime.block_on(podtrace::app::agent::run(agent)),
        (Some(Command::Doctor(doctor)), _) => {
            // Nothing is attached: a signal ends it, saying so.
            podtrace::app::die_saying(
                "podtrace: doctor stopped by a signal before its checks finished\n",
            );
            return match runtime.block_on(podtrace::doctor::run(doctor)) {
                Ok(true) => std::process::ExitCode::SUCCESS,
                Ok(false) => std::process::ExitCode::from(1),
                Err(e) => {
                    eprintln!("podtrace: {e:#}");
                    std::process::ExitCode::from(2)
                }
            };
        }
        #[cfg(target_os = "linux")]
        (Some(Command::Kernel(kernel)), _) => podtrace::app::kernel::run(&kernel),
        #[cfg(target_os = "linux")]
        (Some(Command::Profile(profile)), _) => {
            runtime.block_on(podtrace::app::profile::run(profile))
        }
        // Read, completions, schema and man are told above, without a runtime;
        // off Linux, so are the refusals.
        (Some(_), _) => unreachable!("told above"),
        // clap asks for SRC and DST first; this is a guard.
        (None, None) => {
            eprintln!("podtrace: give SRC and DST, or a subcommand (podtrace --help)");
            return std::process::ExitCode::from(2);
        }
    };
    // Everything attached is dropped by now: this run's file can go.
    #[cfg(target_os = "linux")]
    podtrace::probe::run_registry::close();
    exit(outcome)
}

/// The commands that need no root, no runtime and nothing attached: their
/// exit status, or `None` for the others.
fn offline(cli: &Cli) -> Option<std::process::ExitCode> {
    match &cli.command {
        Some(Command::Read(read)) => {
            podtrace::app::die_saying(
                "podtrace: read stopped by a signal: the stories above are those told so far\n",
            );
            Some(exit(podtrace::app::replay(read)))
        }
        Some(Command::Completions(completions)) => {
            shell::completions(completions.shell, &mut std::io::stdout());
            Some(std::process::ExitCode::SUCCESS)
        }
        Some(Command::Man(man)) => Some(exit(write_man_pages(&man.dir))),
        Some(Command::Schema) => {
            let text = podtrace::output::schema::text();
            let written = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
            Some(exit(written.map_err(anyhow::Error::from)))
        }
        _ => None,
    }
}

/// Off Linux (the cluster-mode front-end alone), what needs this
/// machine's kernel is refused in one line.
fn refused_off_linux(cli: &Cli) -> Option<std::process::ExitCode> {
    if cfg!(target_os = "linux") {
        return None;
    }
    let what = podtrace::app::elsewhere::needs_the_kernel(cli, cluster_mode)?;
    eprintln!("{}", podtrace::app::elsewhere::refusal(what));
    Some(std::process::ExitCode::from(2))
}

/// A trace, in cluster mode or on this node; its exit status.
fn trace_and_exit(runtime: &tokio::runtime::Runtime, trace: Args) -> std::process::ExitCode {
    let (fail, probe_asked) = (trace.fail, trace.probe.probe.is_some());
    let seen = match cluster_mode(&trace) {
        true => runtime.block_on(podtrace::app::front::run(trace)),
        #[cfg(target_os = "linux")]
        false => runtime.block_on(podtrace::app::run(trace)),
        #[cfg(not(target_os = "linux"))]
        false => unreachable!("node mode is refused off Linux"),
    };
    // Everything attached is dropped by now: this run's file can go.
    #[cfg(target_os = "linux")]
    podtrace::probe::run_registry::close();
    exit_seen(seen, fail.then_some(probe_asked))
}

/// kubectl's plugin dispatch runs `kubectl-<plugin>`: cluster mode,
/// unless node-mode inputs (--netns, --pods-file) say otherwise.
fn cluster_mode(trace: &Args) -> bool {
    trace.cluster_mode
        || (invoked_as_kubectl_plugin()
            && trace.kube.netns.is_empty()
            && trace.kube.pods_file.is_none())
}

/// A trace's exit status: with `--fail` (`Some(probe asked)`), what went
/// wrong in its stories (3 a drop or no route, 4 a probe failed).
fn exit_seen(
    outcome: anyhow::Result<podtrace::app::Seen>,
    fail: Option<bool>,
) -> std::process::ExitCode {
    match (outcome, fail) {
        (Ok(seen), Some(probe_asked)) => {
            std::process::ExitCode::from(seen.exit_status(probe_asked))
        }
        (Ok(_), None) => std::process::ExitCode::SUCCESS,
        (Err(e), _) => exit(Err(e)),
    }
}

fn exit(outcome: anyhow::Result<()>) -> std::process::ExitCode {
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("podtrace: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The name this program was run as (argv[0]'s file name).
fn invoked_as() -> Option<String> {
    let argv0 = std::env::args_os().next()?;
    let name = std::path::Path::new(&argv0).file_name()?;
    Some(name.to_string_lossy().into_owned())
}

fn invoked_as_kubectl_plugin() -> bool {
    invoked_as().is_some_and(|name| shell::is_kubectl_plugin_name(&name))
}

/// The words to complete when kubectl's plugin completion asks: run as
/// `kubectl_complete-<name>`, or as `podtrace __complete WORD…`.
fn completion_request() -> Option<Vec<std::ffi::OsString>> {
    let mut args = std::env::args_os().skip(1);
    if invoked_as().is_some_and(|name| name.starts_with(shell::KUBECTL_COMPLETE_PREFIX)) {
        return Some(args.collect());
    }
    match args.next() {
        Some(first) if first == shell::COMPLETE => Some(args.collect()),
        _ => None,
    }
}

/// `podtrace man DIR`, saying which pages it wrote.
fn write_man_pages(dir: &std::path::Path) -> anyhow::Result<()> {
    let pages = shell::man_pages(dir)
        .map_err(|e| anyhow::anyhow!("cannot write man pages in {}: {e}", dir.display()))?;
    for page in pages {
        println!("{}", page.display());
    }
    Ok(())
}
