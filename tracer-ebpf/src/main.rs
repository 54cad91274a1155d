//! podtrace's kernel side.
//!
//! tc classifiers that report every packet of the traced flow, plain or
//! inside a VXLAN / Geneve / IPIP tunnel, as one fixed-size [`Sighting`] on a
//! ring buffer. They never change a packet's bytes or its fate (a traced
//! packet going into WireGuard gets a tag in its skb hash, `wireguard.rs`,
//! which may steer its encrypted packet to another queue or bond link):
//! they return
//! TC_ACT_UNSPEC (TCX_NEXT), so the next program on the hook (a CNI's) and
//! the kernel's own path run as if podtrace were not there.
//! In profile mode they aggregate step latencies in the kernel instead
//! (`profile.rs`).
#![no_std]
#![no_main]

mod drops;
mod kernel;
mod maps;
mod profile;
mod sighting;
mod tc;
mod wireguard;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
