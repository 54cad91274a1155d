//! How tc programs are attached (`--attach`): a choice every build parses,
//! made by the kernel half (`tc`).

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// TCX links where the kernel has them (≥ 6.6), clsact otherwise.
    Auto,
    /// TCX links (kernel ≥ 6.6): the kernel removes them when podtrace's
    /// fds close, even after kill -9.
    Tcx,
    /// A clsact qdisc and tc filters (older kernels): after a kill -9 they
    /// stay until the next podtrace start removes them.
    Clsact,
}
