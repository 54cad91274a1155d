use clap::{error::ErrorKind, Parser};
use podtrace::cli::{Cli, Command};

fn main() -> std::process::ExitCode {
    // Before the runtime and anything attached; `app::run` catches them.
    podtrace::app::block_signals();
    let cli = match Cli::try_parse() {
        Ok(args) => args,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            e.exit()
        }
        Err(e) => {
            // Bad input is one line, like every other podtrace error.
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or_default();
            eprintln!("podtrace: {}", first.trim_start_matches("error: "));
            return std::process::ExitCode::from(2);
        }
    };
    let args = match (cli.command, cli.trace) {
        // Offline: no root, no runtime, nothing attached.
        (Some(Command::Read(read)), _) => return exit(podtrace::app::replay(&read)),
        (None, Some(args)) => args,
        // clap asks for SRC and DST first; this is a guard.
        (None, None) => {
            eprintln!("podtrace: give SRC and DST, or a subcommand (podtrace --help)");
            return std::process::ExitCode::from(2);
        }
    };
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
    let outcome = runtime.block_on(podtrace::app::run(args));
    // Everything attached is dropped by now: this run's file can go.
    podtrace::probe::run_registry::close();
    exit(outcome)
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
