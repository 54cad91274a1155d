//! Builds the eBPF object (tracer-ebpf) for bpfel-unknown-none with the
//! nightly toolchain and bpf-linker, as aya-template does; the userspace
//! binary embeds it.
fn main() -> anyhow::Result<()> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tracer-ebpf");
    println!("cargo:rerun-if-changed={root}");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracer-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
