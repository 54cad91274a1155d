//! `cargo xtask <task>`: setup, lab, demo, test, bench.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use ipnet::Ipv4Net;
use xtask::{
    faults::Fault,
    lab::{kube_proxy::ProxyMode, Lab, LabGuard, Topology},
    podtrace_run,
    setup::{run, setup},
};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what a fresh machine lacks (rust-src, LLVM 22, bpf-linker, lab tools).
    Setup,
    /// Bring a lab cluster up or down.
    Lab {
        #[command(subcommand)]
        action: LabAction,
    },
    /// Set up, build, bring up the flannel-vxlan lab and trace a cross-node ping.
    Demo,
    /// Set up, then fmt, clippy, unit tests and kernel integration tests (as root),
    /// then the kernel suite on 5.10, 6.1 and 6.12 in VMs.
    Test {
        /// Only the kernel suite, on this kernel alone: 5.10, 6.1, 6.12 or host.
        #[arg(long)]
        kernel: Option<String>,
        /// With --kernel: only the suite's tests whose names contain one of
        /// these (comma-separated), while a test is being written.
        #[arg(long, requires = "kernel", value_delimiter = ',')]
        tests: Vec<String>,
    },
    /// The house checks `test` starts with (fmt, layers, sizes, clippy on
    /// host and eBPF crates), alone: what a commit must pass, in a minute.
    Check,
    /// Set up, then measure podtrace on the lab, and compare the figures
    /// with the committed baseline (xtask/bench-baseline.jsonl).
    Bench {
        /// Write this run's figures as the new baseline.
        #[arg(long)]
        save_baseline: bool,
        /// Only the kernel's cost per program and path (BPF_PROG_TEST_RUN,
        /// a minute), not the line-rate, cluster and churn runs.
        #[arg(long)]
        kernel_only: bool,
    },
    /// Build the agent image (release podtrace on a Debian userland) as an
    /// OCI archive for `podman load`, `docker load`, `ctr images import`
    /// or `kind load image-archive`.
    Image {
        /// Where the archive goes (default: target/image/podtrace.oci.tar).
        #[arg(long)]
        output: Option<PathBuf>,
        /// The reference it loads as (default: ghcr.io/podtrace/podtrace:<version>).
        #[arg(long)]
        name: Option<String>,
        /// Build the Debian layer again rather than reuse the cached one
        /// (for Debian's newer security updates).
        #[arg(long)]
        fresh: bool,
    },
    /// A release: the tarball (podtrace, kubectl-podpath, completions, man
    /// pages), its .sha256, the krew manifest podpath.yaml and the agent
    /// image archive, in target/dist.
    Dist(xtask::dist::Args),
    /// The lab's API stub as a server (started by `lab up --api`).
    #[command(hide = true)]
    ApiStub {
        #[arg(long, default_value = "lab")]
        prefix: String,
        /// The binary the stub's kubelet runs for `podtrace` containers.
        #[arg(long)]
        podtrace: PathBuf,
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
}

#[derive(Subcommand)]
enum LabAction {
    Up {
        #[arg(value_enum)]
        topology: Topology,
        #[arg(long, default_value = "lab")]
        prefix: String,
        /// Cluster pod CIDR (/16 or larger); each node gets one /24.
        #[arg(long)]
        pod_cidr: Option<Ipv4Net>,
        /// Also serve the Kubernetes API (a stub that plays kubelet too):
        /// point kubectl at /run/podtrace-lab/<prefix>/kubeconfig.
        #[arg(long)]
        api: bool,
        /// Also program Services as kube-proxy does (default/db, web,
        /// empty), with listeners in the backend pods.
        #[arg(long)]
        services: bool,
        /// Make the cluster dual-stack (flannel-vxlan and calico-vxlan):
        /// IPv6 underlay, VTEPs and pod addresses beside the IPv4 ones.
        #[arg(long)]
        dual_stack: bool,
        /// kube-proxy's mode, with --services.
        #[arg(long, value_enum, default_value = "iptables")]
        proxy_mode: ProxyMode,
        /// The podtrace the API's kubelet runs (default: target/release's,
        /// else target/debug's).
        #[arg(long)]
        podtrace: Option<PathBuf>,
    },
    Down {
        #[arg(long, default_value = "lab")]
        prefix: String,
    },
    /// Break the lab as a real cluster broke (see the fault catalogue).
    Fault {
        #[arg(value_enum)]
        fault: Fault,
        #[arg(long, default_value = "lab")]
        prefix: String,
    },
    /// Restore the healthy topology (rebuilds the lab).
    Heal {
        #[arg(long, default_value = "lab")]
        prefix: String,
    },
}

fn main() -> std::process::ExitCode {
    let done = match Cli::parse().task {
        Task::Setup => setup(),
        Task::Lab { action } => lab(action),
        Task::Demo => demo(),
        Task::Test { kernel: None, .. } => test(),
        Task::Test {
            kernel: Some(kernel),
            tests,
        } => kernel_suite(Some(&kernel), &tests),
        Task::Check => house_checks(),
        Task::Bench {
            save_baseline,
            kernel_only,
        } => bench(save_baseline, kernel_only),
        Task::Image {
            output,
            name,
            fresh,
        } => image(output, name, fresh),
        Task::Dist(args) => {
            podtrace_binary().and_then(|podtrace| xtask::dist::run(&podtrace, args))
        }
        Task::ApiStub {
            prefix,
            podtrace,
            port,
        } => Lab::load(&prefix)
            .and_then(|lab| xtask::api_stub::serve_lab(&lab, &podtrace, port, &lab.kubeconfig())),
    };
    match done {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn lab(action: LabAction) -> Result<()> {
    require_root()?;
    match action {
        LabAction::Up {
            topology,
            prefix,
            pod_cidr,
            api,
            services,
            dual_stack,
            proxy_mode,
            podtrace,
        } => {
            let lab = Lab::new(&prefix, topology, pod_cidr)?;
            lab.up()?;
            if dual_stack {
                lab.dual_stack()?;
            }
            println!("lab {prefix} ({}) is up", topology.name());
            if services {
                lab.install_services(proxy_mode)?;
                for svc in lab.services() {
                    println!("  service {} {}", svc.qualified(), svc.cluster_ip);
                }
                println!("  services: {}", lab.services_file().display());
            }
            if api {
                let podtrace = match podtrace {
                    Some(podtrace) => podtrace,
                    None => xtask::built_podtrace()?,
                };
                // The agent image first: the stub must start within seconds.
                xtask::api_stub::lab_image(&podtrace)?;
                let kubeconfig = lab.start_api(&std::env::current_exe()?, &podtrace)?;
                println!("  agents run {}", podtrace.display());
                println!(
                    "  API: KUBECONFIG={} kubectl get pods -A -o wide",
                    kubeconfig.display()
                );
            }
            for node in 1..=2 {
                println!(
                    "  {}: netns {}, IP {}, pods {}",
                    Lab::node_name(node),
                    lab.node_netns(node),
                    Lab::node_ip(node),
                    lab.node_subnet(node)
                );
            }
            for pod in lab.pods() {
                let ipv6 = pod.ipv6.map_or(String::new(), |ip| format!(" and {ip}"));
                println!(
                    "  default/{}: {}{ipv6} on {} (netns {})",
                    pod.name,
                    pod.ip,
                    Lab::node_name(pod.node),
                    pod.netns
                );
            }
            println!("  pod inventory: {}", lab.pods_file().display());
        }
        LabAction::Down { prefix } => {
            Lab::new(&prefix, Topology::FlannelVxlan, None)?.down()?;
            println!("lab {prefix} is down");
        }
        LabAction::Fault { fault, prefix } => {
            fault.apply(&Lab::load(&prefix)?)?;
            println!("lab {prefix}: {} applied", fault.name());
        }
        LabAction::Heal { prefix } => {
            let lab = Lab::load(&prefix)?;
            lab.down()?;
            lab.up()?;
            println!("lab {prefix} is healthy again");
        }
    }
    Ok(())
}

fn require_root() -> Result<()> {
    let uid = String::from_utf8(Command::new("id").arg("-u").output()?.stdout)?;
    if uid.trim() != "0" {
        bail!("this task needs root (network namespaces, eBPF): run it with sudo");
    }
    Ok(())
}

fn cargo(args: &[&str]) -> Result<()> {
    run(env!("CARGO"), args)
}

fn podtrace_binary() -> Result<PathBuf> {
    cargo(&["build", "--release", "--package", "podtrace"])?;
    Ok(xtask::target_dir(&xtask::workspace_root()?).join("release/podtrace"))
}

fn image(output: Option<PathBuf>, name: Option<String>, fresh: bool) -> Result<()> {
    let podtrace = podtrace_binary()?;
    let root = xtask::workspace_root()?;
    let output = match output {
        Some(output) => output,
        None => xtask::image::image_dir(&root).join("podtrace.oci.tar"),
    };
    xtask::image::build(
        &root,
        &xtask::image::Request {
            podtrace: &podtrace,
            output: &output,
            name: name.as_deref(),
            fresh_base: fresh,
        },
    )?
    .tell()
}

fn demo() -> Result<()> {
    require_root()?;
    let started = Instant::now();
    setup()?;
    let podtrace = podtrace_binary()?;
    eprintln!(
        "demo: setup and build took {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let guard = LabGuard::up("demo", Topology::FlannelVxlan, None)?;
    demo_trace(&podtrace, &guard.0)?;
    demo_cluster(&podtrace, &guard.0)
}

/// The same ping, told through `kubectl podtrace` against the lab's API:
/// agent pods on both nodes, one merged story.
fn demo_cluster(podtrace: &Path, lab: &Lab) -> Result<()> {
    xtask::api_stub::lab_image(podtrace)?;
    let kubeconfig = lab.start_api(&std::env::current_exe()?, podtrace)?;
    let bin = lab.state_dir().join("bin");
    std::fs::create_dir_all(&bin)?;
    let plugin = bin.join("kubectl-podtrace");
    let _ = std::fs::remove_file(&plugin);
    std::os::unix::fs::symlink(podtrace, &plugin)?;
    println!("\ndemo: cluster mode, through the lab's API:");
    println!(
        "demo: $ KUBECONFIG={} kubectl podtrace default/web-0 default/db-0 --count 2\n",
        kubeconfig.display()
    );
    let mut command = Command::new("kubectl");
    command
        .args([
            "podtrace",
            "default/web-0",
            "default/db-0",
            "--count",
            "2",
            "--duration",
            "30s",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        );
    let mut tracing = podtrace_run::start(command, Duration::from_secs(60))?;
    eprint!("{}", tracing.banner);
    if !lab.ping("web-0", lab.pod("db-0").ip, &[]) {
        bail!("web-0 cannot ping db-0: the lab is broken");
    }
    let status = tracing.child.wait()?;
    for line in tracing.stderr_lines {
        eprintln!("{line}");
    }
    lab.stop_api();
    if !status.success() {
        bail!("kubectl podtrace failed ({status})");
    }
    Ok(())
}

/// Traces web-0 → db-0 on both nodes while web-0 pings db-0 once.
fn demo_trace(podtrace: &Path, lab: &Lab) -> Result<()> {
    let (web, db) = (lab.pod("web-0"), lab.pod("db-0"));
    println!(
        "demo: flannel-vxlan lab up: web-0 {} on node-1, db-0 {} on node-2",
        web.ip, db.ip
    );
    println!("demo: $ podtrace default/web-0 default/db-0 --pods-file {} --netns {} --netns {} --count 2\n", lab.pods_file().display(), lab.node_netns(1), lab.node_netns(2));
    let mut command = Command::new(podtrace);
    command
        .args([
            "default/web-0",
            "default/db-0",
            "--count",
            "2",
            "--duration",
            "20s",
            "--pods-file",
        ])
        .arg(lab.pods_file())
        .args(["--netns", &lab.node_netns(1), "--netns", &lab.node_netns(2)]);
    let mut tracing = podtrace_run::start(command, Duration::from_secs(20))?;
    eprint!("{}", tracing.banner);
    if !lab.ping("web-0", db.ip, &[]) {
        bail!("web-0 cannot ping db-0: the lab is broken");
    }
    println!();
    let status = tracing.child.wait()?;
    for line in tracing.stderr_lines {
        eprintln!("{line}");
    }
    if !status.success() {
        bail!("podtrace failed ({status})");
    }
    Ok(())
}

fn test() -> Result<()> {
    require_root()?;
    let mut phases = xtask::phases::Phases::default();
    let passed = test_phases(&mut phases);
    eprintln!("\nxtask test: phases\n{}", phases.table());
    passed?;
    eprintln!("xtask test: all passed");
    Ok(())
}

fn test_phases(phases: &mut xtask::phases::Phases) -> Result<()> {
    phases.run("setup", setup)?;
    phases.run("house checks", house_checks)?;
    // kubectl podtrace from a laptop: the front-end without the kernel half.
    phases.run("front-end for macOS (cargo check)", || {
        xtask::macos::check(&xtask::workspace_root()?)
    })?;
    // Unit tests, then the kernel integration tests in tests/ (as root).
    phases.run("cargo test (host kernel)", || cargo(&["test"]))?;
    // A release as a user or krew gets it (the image is the lab's).
    phases.run("dist", || {
        xtask::dist::run(&podtrace_binary()?, xtask::dist::Args::without_image())
    })?;
    // The README's other command must stay true.
    phases.run("demo", demo)?;
    // The host's kernel ran every test above; the others run the suite
    // (each kernel's time is in the matrix's own table).
    phases.run("kernel matrix (VMs)", || kernel_suite(None, &[]))
}

/// Formatting, the import layers, file and function sizes, and clippy
/// with warnings as errors on the host crates and the eBPF crate.
fn house_checks() -> Result<()> {
    cargo(&["fmt", "--all", "--check"])?;
    xtask::layers::check()?;
    xtask::file_cycles::check()?;
    xtask::sizes::check()?;
    // Host crates (the default members), then the eBPF crate for its target.
    cargo(&["clippy", "--all-targets", "--", "-D", "warnings"])?;
    run(
        "rustup",
        &[
            "run",
            "nightly",
            "cargo",
            "clippy",
            "--package",
            "tracer-ebpf",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    Ok(())
}

/// The kernel suite on one kernel (`--kernel`; in a VM unless it is the
/// host's), or on every kernel of the matrix in VMs.
fn kernel_suite(kernel: Option<&str>, tests: &[String]) -> Result<()> {
    require_root()?;
    setup()?;
    xtask::vm::matrix(&xtask::workspace_root()?, kernel, tests)
}

fn bench(save_baseline: bool, kernel_only: bool) -> Result<()> {
    require_root()?;
    setup()?;
    let root = xtask::workspace_root()?;
    let figures = root.join("target/bench/figures.jsonl");
    std::fs::create_dir_all(root.join("target/bench"))?;
    let _ = std::fs::remove_file(&figures);
    // The bench's tests hand their figures over through this file.
    std::env::set_var("PODTRACE_BENCH_FIGURES", &figures);
    let mut tests = vec!["kernel_cost"];
    if !kernel_only {
        // The userspace pipeline (criterion: sightings/s as "thrpt").
        cargo(&["bench", "--package", "podtrace", "--bench", "pipeline"])?;
        tests.extend(["bench", "line_rate", "cluster", "churn"]);
    }
    let mut args = vec!["test", "--release", "--package", "podtrace"];
    for test in &tests {
        args.extend(["--test", test]);
    }
    args.extend(["--", "--ignored", "--nocapture", "--test-threads", "1"]);
    cargo(&args)?;
    let now = xtask::bench::read(&figures)?;
    let baseline_path = root.join(xtask::bench::BASELINE);
    let baseline = xtask::bench::read(&baseline_path)?;
    println!("\n{}", xtask::bench::render(&baseline, &now));
    if save_baseline {
        xtask::bench::write(&baseline_path, &now)?;
        println!("baseline written: {}", baseline_path.display());
    }
    Ok(())
}
