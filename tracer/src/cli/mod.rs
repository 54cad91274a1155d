//! Command-line arguments.

use std::{net::Ipv4Addr, path::PathBuf, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};

mod filter;
mod kube;
mod probe;
pub mod shell;
mod values;

pub use filter::{widen, FilterArgs, Proto};
pub use kube::KubeArgs;
pub use probe::ProbeArgs;
use values::parse_snaplen;
pub use values::{parse_duration, parse_ring_size};

use crate::{
    model::{Format, MAX_SNAPLEN},
    probe::AttachMode,
};

/// `podtrace --version`: the release and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PODTRACE_COMMIT"),
    ")"
);
/// `--version` in full: where cluster mode's agent image comes from too.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("PODTRACE_COMMIT"),
    ")\nagent image: no default; --image, else $PODTRACE_IMAGE, else the podtrace DaemonSet's (cargo xtask image builds one)"
);

/// What `--help` ends with: the commands people start from.
const EXAMPLES: &str = "\
Examples:
  podtrace default/web-0 default/db-0 --count 4   trace two pods from their node (root)
  kubectl podtrace web-0 db-0 --count 4           from a laptop: an agent pod per node involved
  podtrace web-0 svc/db --probe tcp:80            send a probe and tell its story
  podtrace web-0 db-0 -w /tmp/pair.pcapng         keep the packets for Wireshark too
  podtrace doctor web-0                           why a pod has no IP, or its node cannot route
  podtrace profile web-0 db-0                     per-step latency of the encapsulation path";

/// Traces packets between two pods through every hook of the node(s) and
/// tells, per packet, where it went and what happened to it.
// The command line: a trace (`podtrace SRC DST`), or a subcommand.
#[derive(Debug, Parser)]
#[command(
    name = "podtrace",
    version = VERSION,
    long_version = LONG_VERSION,
    about,
    after_help = EXAMPLES,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The trace; an `Option` so that clap builds it only without a
    /// subcommand (its SRC and DST are required).
    #[command(flatten)]
    pub trace: Option<Args>,
}

// Parsed once per run: the size difference costs nothing, and clap does not
// parse a boxed flattened `Args` the same way (its positionals break).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Tell the stories of a file written with --write again, offline.
    Read(ReadArgs),
    /// Trace one node for a cluster-mode front-end (run as a pod on that
    /// node): JSON lines on stdout. Started by the front-end, not by hand.
    #[command(hide = true)]
    Agent(AgentArgs),
    /// Check a node and the API for the failures that leave no packet to
    /// trace (CNI config and plugins, flannel/calico state, kernel and
    /// firewall, pods without an IP); exit 1 if any check failed.
    Doctor(DoctorArgs),
    /// Profile the encapsulation path of SRC ⇄ DST at line rate: per-step
    /// latency histograms aggregated in the kernel, no record per packet.
    Profile(ProfileArgs),
    /// What this node's kernel gives podtrace: each feature, what podtrace
    /// does without it, and whether every program loads (they are loaded
    /// for a moment; nothing stays attached).
    Kernel(KernelArgs),
    /// Print the completion script of a shell: `source <(podtrace
    /// completions bash)`, or save it where the shell loads completions.
    Completions(CompletionsArgs),
    /// Print the JSON Schema of `-o json`'s lines (docs/schema.json), with
    /// its version: fields are only ever added within a version.
    Schema,
    /// Write podtrace.1 and a man page per subcommand into DIR (what a
    /// release's tarball ships).
    #[command(hide = true)]
    Man(ManArgs),
}

/// `podtrace completions SHELL`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `podtrace man DIR`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// `podtrace kernel`.
#[derive(Debug, clap::Args)]
pub struct KernelArgs {
    /// human: a line per feature; json: one object.
    #[arg(short, long, value_enum, default_value = "human")]
    pub output: Format,
}

/// `--host-root` for a trace (`KubeArgs` has the doctor's wording).
const HOST_ROOT_TRACE: &str = "Each traced node's root filesystem, in --netns order (`/host` in a debug pod): when a packet vanishes or finds no route, or a pod has no IP, podtrace also says what the doctor finds wrong in its etc/cni/net.d, opt/cni/bin and run/flannel (node mode only)";
/// `--host-root` for an agent, whose front-end tells the verdicts.
pub const HOST_ROOT_AGENT: &str = "The node's root filesystem as the agent's pod mounts it (`/host`, read-only): the doctor's failing checks of the node, its etc/cni/net.d, opt/cni/bin and run/flannel too, go to the front-end for the verdicts that have no packet to blame";

/// `podtrace profile SRC DST`.
#[derive(Debug, clap::Args)]
// No verdict for the doctor's findings to join: hidden, and refused when given.
#[command(mut_arg("host_root", |a| a.hide(true)))]
pub struct ProfileArgs {
    #[command(flatten)]
    pub trace: Args,
    /// Also draw each step's latency histogram as SVG.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// `podtrace read FILE.pcapng`.
#[derive(Debug, clap::Args)]
pub struct ReadArgs {
    /// A pcapng file written by `podtrace --write`.
    #[arg(value_name = "FILE.pcapng")]
    pub file: PathBuf,
    /// human: stories to read; json: one object per line for programs.
    #[arg(short, long, value_enum, default_value = "human")]
    pub output: Format,
    /// Colour: auto (on a terminal), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub color: String,
}

/// Traces packets between two pods through every hook of the node(s) and
/// tells, per packet, where it went and what happened to it.
#[derive(Debug, Parser)]
#[command(name = "podtrace", version, about)]
#[command(mut_arg("host_root", |a| a.help(HOST_ROOT_TRACE)))]
#[group(id = "trace")]
pub struct Args {
    /// Source pod: namespace/name, name (with -n), or an IP address (an
    /// IPv6 one asks for the pair's IPv6 traffic alone).
    // `Cli` builds its optional trace only when this group is present, but
    // clap leaves the group empty in a struct that flattens another
    // (clap-rs/clap#4570, #4697): the required SRC joins it by hand.
    #[arg(group = "trace")]
    pub src: String,
    /// Destination: a pod (namespace/name, name with -n), an IP address, a
    /// Service (`svc/<name>`, a ClusterIP, `ClusterIP:port`,
    /// `[IPv6 ClusterIP]:port`) or `node/<name>`.
    pub dst: String,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Services and their EndpointSlices in `kubectl get
    /// svc,endpointslices -A -o json` format, instead of the API: a
    /// ClusterIP or `svc/<name>` destination is followed to its backends.
    #[arg(long, value_name = "FILE")]
    pub services_file: Option<PathBuf>,
    /// The cluster's pod CIDR (repeatable), e.g. 10.244.0.0/16; also read
    /// from /run/flannel/subnet.env when present.
    #[arg(long, value_name = "CIDR")]
    pub pod_cidr: Vec<ipnet::Ipv4Net>,
    /// A node's own IP, to find its underlay interface when nothing else
    /// tells (repeatable: each traced node takes the one it holds).
    #[arg(long, value_name = "IP")]
    pub node_ip: Vec<Ipv4Addr>,
    /// IPv4 only: of dual-stack pods, leave their IPv6 traffic out.
    #[arg(short = '4', long = "ipv4-only", conflicts_with = "ipv6_only")]
    pub ipv4_only: bool,
    /// IPv6 only: of dual-stack pods, trace their IPv6 pair alone.
    #[arg(short = '6', long = "ipv6-only")]
    pub ipv6_only: bool,
    /// human: stories to read; json: one object per line for programs.
    #[arg(short, long, value_enum, default_value = "human")]
    pub output: Format,
    /// Stop after this many packet stories (at least 1).
    #[arg(short, long, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Stop after this long (e.g. 10s, 500ms, 2m, 1h 30m).
    #[arg(short, long, value_parser = values::parse_trace_duration)]
    pub duration: Option<Duration>,
    /// At exit, print the latency of every hop-to-hop step (p50/p90/p99).
    #[arg(long)]
    pub profile: bool,
    /// Set by `podtrace profile`: step histograms in the kernel.
    #[arg(skip)]
    pub in_kernel_profile: bool,
    /// Set by `podtrace profile`: a bpffs directory private to podtrace
    /// where every node's probe finds the same packet stamps.
    #[arg(skip)]
    pub shared_stamps: Option<std::path::PathBuf>,
    /// Without a Services list (API, --services-file), do not read the
    /// traced nodes' kube-proxy rules for a ClusterIP's backends: learn
    /// each translation from conntrack as its connection opens (its first
    /// packet is then not followed past the DNAT).
    #[arg(long)]
    pub no_kube_proxy_rules: bool,
    /// Do not add podtrace's nft tracing table: netfilter drops are then
    /// reported without the rule that dropped them.
    #[arg(long)]
    pub no_ruleset_changes: bool,
    /// The kernel's ring buffer of records, per node (e.g. 16MiB, 64MiB; a
    /// power of two from 4KiB). Larger holds longer bursts.
    #[arg(long, value_name = "SIZE", default_value = "16MiB", value_parser = parse_ring_size)]
    pub ring_buffer: u32,
    /// Keep one traced packet in N, chosen in the kernel by a hash of the
    /// packet's identity, so every hop of a kept packet is kept: stories
    /// of a flow at line rate, without losses.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub sample: u32,
    /// How to attach to tc hooks.
    #[arg(long, value_enum, default_value = "auto")]
    pub attach: AttachMode,
    /// Colour: auto (on a terminal), always, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub color: String,
    /// Also write the traced packets (headers) as pcapng for Wireshark,
    /// one interface per node and hook, each packet with its story;
    /// `-` for stdout (the stories then go to stderr).
    #[arg(short, long, value_name = "FILE.pcapng")]
    pub write: Option<String>,
    /// Exit with a status a script can test, as ping and curl --fail do:
    /// 3 when a story's verdict is dropped or no_route, 4 when a --probe
    /// failed (no answer, or refused) (0 otherwise; 1 an error, 2 a usage
    /// error).
    #[arg(long)]
    pub fail: bool,
    /// Bytes of each packet to write with --write (at most the default:
    /// what the kernel copies of each packet).
    #[arg(long, value_name = "BYTES", default_value_t = MAX_SNAPLEN, value_parser = parse_snaplen)]
    pub snaplen: u32,
    #[command(flatten)]
    pub probe: ProbeArgs,
    #[command(flatten)]
    pub filter: FilterArgs,

    /// Cluster mode: start an agent pod on each node involved and merge
    /// their records (the default as `kubectl podtrace`). Needs no root.
    /// (`--cluster NAME` is kubectl's: the kubeconfig cluster.)
    #[arg(long)]
    pub cluster_mode: bool,
    /// Namespace of the agent pods and the lease.
    #[arg(long, default_value = "podtrace", value_name = "NAMESPACE")]
    pub agent_namespace: String,
    /// Agent image (else $PODTRACE_IMAGE, else the podtrace DaemonSet's;
    /// `cargo xtask image` builds one).
    #[arg(long)]
    pub image: Option<String>,
    /// More nodes to trace: `all`, or names separated by commas.
    #[arg(long, value_name = "all|NODE,…")]
    pub nodes: Option<String>,
    /// Testing only: shift one agent's wall clock, `[NODE=]DURATION`
    /// (default node: the destination's); e.g. `node-2=3s`, `-2s`.
    #[arg(long, hide = true, value_name = "[NODE=]DURATION")]
    pub clock_skew_for_testing: Option<String>,
}

/// `podtrace agent`: a trace of one node, for a cluster-mode front-end.
#[derive(Debug, clap::Args)]
#[command(mut_arg("host_root", |a| a.help(HOST_ROOT_AGENT)))]
pub struct AgentArgs {
    #[command(flatten)]
    pub trace: Args,
    /// The node this agent runs on (as the API names it).
    #[arg(long)]
    pub node: Option<String>,
    /// The front-end's lease: stop when it goes stale.
    #[arg(long)]
    pub lease: Option<String>,
    /// This agent's own pod, removed when the front-end is gone.
    #[arg(long)]
    pub pod: Option<String>,
    /// Send each hop's header bytes (up to `--snaplen`): the front-end
    /// writes them (`--write`).
    #[arg(long)]
    pub send_headers: bool,
}

/// `podtrace doctor [<pod>…]`.
#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Pods to look at (namespace/name, or name with -n): their node, their
    /// sandbox events, the firewall between them.
    pub pods: Vec<String>,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// The node examined here (default: the node whose InternalIP this
    /// network namespace holds).
    #[arg(long, value_name = "NAME")]
    pub node: Vec<String>,
    /// human: the checks to read; json: one report for programs.
    #[arg(short, long, value_enum, default_value = "human")]
    pub output: Format,
    /// Do not examine the node this runs on (API checks only).
    #[arg(long)]
    pub api_only: bool,
    /// Testing only: the conntrack table size to judge usage against (the
    /// kernel's nf_conntrack_max is read-only outside the initial netns).
    #[arg(long, hide = true, value_name = "N")]
    pub conntrack_max_for_testing: Option<u64>,
    /// The doctor inside a trace: the nodes the trace involves. The API
    /// is then asked for the traced pods and these nodes by name, never
    /// for the whole cluster.
    #[arg(skip)]
    pub trace_nodes: Option<Vec<String>>,
}

impl Args {
    /// The trace an agent runs for this one: `src` and `dst` as the
    /// front-end resolved them, the flags that matter on a node, and every
    /// other flag at its default. Every field is named here, so that a new
    /// flag is decided for agents where it is added.
    pub fn for_agent(&self, src: String, dst: String) -> Args {
        Args {
            src,
            dst,
            kube: KubeArgs {
                namespace: Some(self.kube.namespace().to_string()),
                kubeconfig: None,
                context: None,
                // An agent reaches the API as its own service account.
                cluster: None,
                user: None,
                impersonate: None,
                impersonate_groups: Vec::new(),
                token: None,
                server: None,
                request_timeout: None,
                pods_file: None,
                nodes_file: None,
                netns: Vec::new(),
                host_root: Vec::new(),
                // The agent sets its own (`--node`).
                agent_on: None,
            },
            services_file: None,
            pod_cidr: self.pod_cidr.clone(),
            node_ip: self.node_ip.clone(),
            ipv4_only: self.ipv4_only,
            ipv6_only: self.ipv6_only,
            output: Format::Human,
            count: None,
            duration: None,
            profile: false,
            in_kernel_profile: false,
            shared_stamps: None,
            no_kube_proxy_rules: self.no_kube_proxy_rules,
            no_ruleset_changes: self.no_ruleset_changes,
            // What each node's kernel side keeps: the same on every node,
            // so that a sampled packet is kept on all of them.
            ring_buffer: self.ring_buffer,
            sample: self.sample,
            attach: self.attach,
            color: "auto".into(),
            write: None,
            // The front-end decides the exit status from the stories.
            fail: false,
            // What an agent sends of each packet, when asked for headers.
            snaplen: self.snaplen,
            // The front-end's: an agent sends none.
            probe: ProbeArgs::default(),
            // Chosen in each node's kernel.
            filter: self.filter.clone(),
            cluster_mode: false,
            agent_namespace: self.agent_namespace.clone(),
            image: None,
            nodes: None,
            // Each agent's own, when the front-end sets it.
            clock_skew_for_testing: None,
        }
    }
}

impl AgentArgs {
    /// `agent …`, the command line that parses back into these arguments:
    /// the one place an agent's command line is written. It writes what
    /// `Args::for_agent` keeps; `an_agent_command_line_parses_back` holds
    /// the round trip.
    pub fn argv(&self) -> Vec<String> {
        let trace = &self.trace;
        let mut argv = vec![
            "agent".to_string(),
            trace.src.clone(),
            trace.dst.clone(),
            "-n".into(),
            trace.kube.namespace().to_string(),
        ];
        for cidr in &trace.pod_cidr {
            argv.extend(["--pod-cidr".into(), cidr.to_string()]);
        }
        let attach = trace
            .attach
            .to_possible_value()
            .expect("no mode is skipped");
        argv.extend(["--attach".into(), attach.get_name().to_string()]);
        if trace.no_ruleset_changes {
            argv.push("--no-ruleset-changes".into());
        }
        if trace.no_kube_proxy_rules {
            argv.push("--no-kube-proxy-rules".into());
        }
        // The families the front-end traces: every agent the same.
        if trace.ipv4_only {
            argv.push("-4".into());
        }
        if trace.ipv6_only {
            argv.push("-6".into());
        }
        if self.send_headers {
            argv.push("--send-headers".into());
        }
        argv.extend([
            "--snaplen".into(),
            trace.snaplen.to_string(),
            "--sample".into(),
            trace.sample.to_string(),
            "--ring-buffer".into(),
            trace.ring_buffer.to_string(),
        ]);
        for ip in &trace.node_ip {
            argv.extend(["--node-ip".into(), ip.to_string()]);
        }
        if let Some(skew) = &trace.clock_skew_for_testing {
            // One word: a negative skew (`-2s`) would read as a flag.
            argv.push(format!("--clock-skew-for-testing={skew}"));
        }
        let named = [
            ("--node", &self.node),
            ("--lease", &self.lease),
            ("--pod", &self.pod),
        ];
        for (flag, value) in named {
            if let Some(value) = value {
                argv.extend([flag.to_string(), value.clone()]);
            }
        }
        argv.extend(trace.probe.argv());
        argv.extend(trace.filter.argv());
        argv.extend(["--agent-namespace".into(), trace.agent_namespace.clone()]);
        for root in &trace.kube.host_root {
            argv.extend(["--host-root".into(), root.display().to_string()]);
        }
        argv
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// `--version` names the commit and where the agent image comes
    /// from; `--help` ends with examples and leaves out `agent`, which
    /// only a front-end starts (and which still parses).
    #[test]
    fn version_and_help_say_what_a_user_needs() {
        let mut command = Cli::command();
        let version = command.render_long_version();
        assert!(version.contains(" (commit "), "{version}");
        assert!(version.contains("agent image: no default"), "{version}");
        let help = command.render_long_help().to_string();
        assert!(
            help.contains("Examples:\n  podtrace default/web-0"),
            "{help}"
        );
        assert!(!help.contains("\n  agent "), "{help}");
        assert!(Cli::try_parse_from(["podtrace", "agent", "a", "b"]).is_ok());
    }

    #[test]
    fn the_shared_flags_reach_a_trace_and_the_doctor() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["podtrace", "a", "b", "-n", "ns", "--netns", "n1"]).unwrap();
        let trace = cli.trace.expect("a trace");
        assert!(cli.command.is_none());
        assert_eq!((trace.src.as_str(), trace.dst.as_str()), ("a", "b"));
        assert_eq!(trace.kube.namespace(), "ns");
        assert_eq!(trace.kube.netns, ["n1"]);

        let cli = Cli::try_parse_from(["podtrace", "doctor", "p", "--host-root", "/h"]).unwrap();
        assert!(cli.trace.is_none());
        let Some(Command::Doctor(doctor)) = cli.command else {
            panic!("not the doctor: {:?}", cli.command);
        };
        assert_eq!(doctor.pods, ["p"]);
        assert_eq!(doctor.kube.namespace(), "default");
        assert_eq!(doctor.kube.host_root, [PathBuf::from("/h")]);
    }

    #[test]
    fn host_root_says_what_it_does_for_each_command() {
        let cli = Cli::command();
        let help = |command: Option<&str>| {
            let command = match command {
                Some(name) => cli.find_subcommand(name).expect(name),
                None => &cli,
            };
            let arg = command.get_arguments().find(|a| a.get_id() == "host_root");
            arg.and_then(|a| a.get_help())
                .expect("--host-root")
                .to_string()
        };
        assert!(help(None).starts_with("Each traced node's root filesystem"));
        assert!(help(None).ends_with("(node mode only)"));
        assert!(help(Some("doctor")).contains("without it a --netns node's files are not examined"));
        let profile = cli.find_subcommand("profile").expect("profile");
        let host_root = profile.get_arguments().find(|a| a.get_id() == "host_root");
        assert!(host_root.expect("--host-root").is_hide_set());
        assert_eq!(help(Some("agent")), HOST_ROOT_AGENT);
    }

    #[test]
    fn an_agent_command_line_parses_back() {
        let front = Cli::try_parse_from([
            "podtrace",
            "a",
            "b",
            "-n",
            "ns",
            "--pod-cidr",
            "10.244.0.0/16",
            "--attach",
            "clsact",
            "--no-ruleset-changes",
            "--no-kube-proxy-rules",
            "--sample",
            "4",
            "--ring-buffer",
            "4MiB",
            "--node-ip",
            "192.0.2.11",
            "--agent-namespace",
            "tracing",
            "--output",
            "json",
            "--count",
            "3",
            "--netns",
            "n1",
            "--proto",
            "udp",
            "--port",
            "53",
            "-6",
            "--write",
            "out.pcapng",
            "--snaplen",
            "96",
        ])
        .unwrap()
        .trace
        .expect("a trace");
        let mut agent = AgentArgs {
            trace: front.for_agent("ns/a".into(), "ns/b".into()),
            node: Some("node-1".into()),
            lease: Some("lease".into()),
            pod: Some("pod".into()),
            send_headers: true,
        };
        agent.trace.kube.host_root = vec![PathBuf::from("/host")];
        agent.trace.clock_skew_for_testing = Some("-2s".into());
        let argv = std::iter::once("podtrace".to_string()).chain(agent.argv());
        let Some(Command::Agent(parsed)) = Cli::try_parse_from(argv).unwrap().command else {
            panic!("not an agent");
        };
        assert_eq!(format!("{parsed:?}"), format!("{agent:?}"));
    }
}
