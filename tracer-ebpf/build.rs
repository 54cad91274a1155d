//! Rebuild the eBPF object whenever bpf-linker changes (a new LLVM means new
//! code generation), as aya-template does.
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
