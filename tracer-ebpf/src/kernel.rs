//! Every `unsafe` of podtrace's eBPF code, behind safe functions, so that
//! the programs themselves read as plain Rust and the one argument for
//! soundness is made once, here.
//!
//! SAFETY, for every block in this file:
//! - Globals are plain integers that userspace writes before loading and
//!   that nothing writes afterwards; a volatile read only stops the
//!   compiler from folding in the zero they are declared with.
//! - Kernel memory (sk_buff, net_device, sock, net) is read only through
//!   bpf_probe_read_kernel, which checks the address and returns an error
//!   instead of faulting, so any pointer value is acceptable.
//! - Packet bytes are read through bpf_skb_load_bytes, which bounds-checks
//!   against the skb, or directly from the linear head (`Linear`), each
//!   read checked against `data_end` first as the verifier demands;
//!   `__sk_buff` fields are read through the context
//!   pointer the kernel hands the program, valid for the whole run.
//! - Map values (per-CPU scratch, ring-buffer records, counters) are
//!   written through pointers the map helpers return: per-CPU or freshly
//!   reserved, so no other program run aliases them while this one runs
//!   (tc and tracepoint programs do not sleep and run one at a time per
//!   CPU), and every byte pattern is a valid value of their plain-integer
//!   types.
//! - The helpers are called with the argument types their kernel
//!   prototypes declare.

use aya_ebpf::{
    bindings::{
        __sk_buff, bpf_fib_lookup as FibParams, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP,
        BPF_RB_NO_WAKEUP,
    },
    helpers::{bpf_fib_lookup, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_kernel_buf},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::TcContext,
};
use podtrace_common::{
    glance::Fixed,
    headers::IPV4_SADDR,
    packet::Bytes,
    profile::Histogram,
    sighting::{FIB_NOT_LOOKED_UP, SNAPSHOT_LEN},
    FlowKey,
};

/// The kernel's route for a packet: (BPF_FIB_LKUP_RET_*, output ifindex,
/// next hop: IPv4 in the first 4 bytes, or IPv6).
pub type Route = (u8, u32, [u8; 16]);

/// No route asked: every byte set, never an `Option`. LLVM may load the
/// payload of a `None` before it selects the default, and verifiers
/// before 5.19 refuse a read of stack that was never written.
pub const NO_ROUTE_ASKED: Route = (FIB_NOT_LOOKED_UP, 0, [0; 16]);

// `copy_start` bounds a length by masking with SNAPSHOT_LEN - 1.
const _: () = assert!(SNAPSHOT_LEN.is_power_of_two());

/// Offsets the direct reader accepts: the verifier wants a bounded
/// variable offset before it compares a packet pointer with `data_end`.
const LINEAR_MAX: usize = 1 << 9;

/// The value userspace gave a global at load time.
#[inline(always)]
pub fn global<T: Copy>(g: &'static T) -> T {
    unsafe { core::ptr::read_volatile(g) }
}

/// A `T` at `base + offset` in kernel memory; `None` if unreadable.
#[inline(always)]
pub fn kernel_read<T>(base: u64, offset: u32) -> Option<T> {
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T).ok() }
}

/// Fills `dst` from kernel memory at `addr`; false if unreadable.
#[inline(always)]
pub fn kernel_read_buf(addr: u64, dst: &mut [u8]) -> bool {
    unsafe { bpf_probe_read_kernel_buf(addr as *const u8, dst) }.is_ok()
}

/// CLOCK_MONOTONIC, shared by all namespaces.
#[inline(always)]
pub fn ktime_ns() -> u64 {
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub fn contains<K, V>(map: &HashMap<K, V>, key: &K) -> bool {
    unsafe { map.get(key) }.is_some()
}

/// A copy of the value at `key`, if there is one.
#[inline(always)]
pub fn lookup<K, V: Copy>(map: &HashMap<K, V>, key: &K) -> Option<V> {
    unsafe { map.get(key) }.copied()
}

/// Runs `f` on this CPU's histogram at `key`, inserting a copy of `zero`'s
/// (never written) first if there is none.
#[inline(always)]
pub fn step_histogram<K>(
    map: &PerCpuHashMap<K, Histogram>,
    zero: &PerCpuArray<Histogram>,
    key: &K,
    f: impl FnOnce(&mut Histogram),
) {
    let mut value = map.get_ptr_mut(key);
    if value.is_none() {
        let Some(zeroed) = zero.get_ptr(0) else {
            return;
        };
        // By reference: a copy would not fit on the eBPF stack.
        #[allow(clippy::needless_borrows_for_generic_args)]
        let _ = map.insert(key, unsafe { &*zeroed }, 0);
        value = map.get_ptr_mut(key);
    }
    if let Some(value) = value {
        f(unsafe { &mut *value });
    }
}

/// Runs `f` on the value at `index` of an array; `None` if there is none.
#[inline(always)]
pub fn with_array<T, R>(map: &Array<T>, index: u32, f: impl FnOnce(&T) -> R) -> Option<R> {
    map.get(index).map(f)
}

/// Runs `f` on this CPU's value at `index`; `None` if there is none.
#[inline(always)]
pub fn with_per_cpu<T, R>(
    map: &PerCpuArray<T>,
    index: u32,
    f: impl FnOnce(&mut T) -> R,
) -> Option<R> {
    let value = map.get_ptr_mut(index)?;
    Some(f(unsafe { &mut *value }))
}

/// Reserves a `T` on the ring buffer, lets `fill` write all of it, then
/// submits it; false if the ring buffer is full. With `wake_bytes` set,
/// userspace is woken only by the record that makes the waiting bytes
/// cross it (0: the kernel's default, a wakeup whenever userspace had
/// caught up). Not on every record past it: each wakeup is an IPI (a VM
/// exit on a guest), and a reader that lags behind a line-rate flow would
/// otherwise be sent one per record, slowing the very datapath it
/// watches. A crossing missed between CPUs costs nothing: userspace also
/// drains on a timer.
#[inline(always)]
pub fn submit_with<T: 'static>(ring: &RingBuf, wake_bytes: u64, fill: impl FnOnce(&mut T)) -> bool {
    let Some(mut entry) = ring.reserve::<T>(0) else {
        return false;
    };
    fill(unsafe { &mut *entry.as_mut_ptr() });
    let flags = if wake_bytes == 0 {
        0
    } else {
        // Includes this record: the producer moved at reservation.
        let waiting = ring.query(u64::from(BPF_RB_AVAIL_DATA));
        let before = waiting.saturating_sub(core::mem::size_of::<T>() as u64);
        if before < wake_bytes && waiting >= wake_bytes {
            BPF_RB_FORCE_WAKEUP
        } else {
            BPF_RB_NO_WAKEUP
        }
    };
    entry.submit(u64::from(flags));
    true
}

/// The packet of a tc program, as a byte source for the shared parser.
pub struct Skb<'a>(pub &'a TcContext);

impl Skb<'_> {
    #[inline(always)]
    fn fields(&self) -> &__sk_buff {
        unsafe { &*self.0.skb.skb }
    }

    #[inline(always)]
    pub fn ifindex(&self) -> u32 {
        self.fields().ifindex
    }

    #[inline(always)]
    pub fn len(&self) -> u32 {
        self.fields().len
    }

    #[inline(always)]
    pub fn mark(&self) -> u32 {
        self.fields().mark
    }

    /// skb->hash as it is (0 where none was set): not recomputed.
    #[inline(always)]
    pub fn hash(&self) -> u32 {
        self.fields().hash
    }

    /// Copies the packet's first `len` bytes (1..=SNAPSHOT_LEN) into `dst`.
    #[inline(always)]
    pub fn copy_start(&self, dst: &mut [u8; SNAPSHOT_LEN], len: usize) -> bool {
        // Verifiers before 6.8 lose a range checked on a copy of the
        // register (LLVM turns `len != 0 && len <= N` into one compare of
        // `len - 1`), and 6.1's then refuses a length that may be 0. A
        // mask on a value the optimizer cannot see through gives every
        // verifier the range itself: ((len - 1) & (N - 1)) + 1 is len for
        // 1..=N, and provably within 1..=N.
        let len = core::hint::black_box(len);
        if len == 0 || len > SNAPSHOT_LEN {
            return false;
        }
        let bounded = ((len - 1) & (SNAPSHOT_LEN - 1)) + 1;
        let copied = unsafe {
            aya_ebpf::helpers::bpf_skb_load_bytes(
                self.0.skb.skb.cast(),
                0,
                dst.as_mut_ptr().cast(),
                bounded as u32,
            )
        };
        copied == 0
    }

    /// bpf_fib_lookup for the packet as arriving on this interface: the
    /// BPF_FIB_LKUP_RET_* code and the output ifindex and next hop of the
    /// family asked (NO_ROUTE_ASKED if the helper itself failed).
    #[inline(always)]
    pub fn fib_lookup(&self, ipv6: bool, params: &mut FibParams) -> Route {
        params.ifindex = self.ifindex();
        let rc = unsafe {
            bpf_fib_lookup(
                self.0.skb.skb.cast(),
                params,
                core::mem::size_of::<FibParams>() as i32,
                0,
            )
        };
        if rc < 0 {
            return NO_ROUTE_ASKED;
        }
        // The kernel writes the next hop over the destination it was asked.
        let mut nexthop = [0u8; 16];
        if ipv6 {
            let words = unsafe { params.__bindgen_anon_4.ipv6_dst };
            let mut i = 0;
            while i < 4 {
                let w = words[i].to_ne_bytes();
                nexthop[4 * i] = w[0];
                nexthop[4 * i + 1] = w[1];
                nexthop[4 * i + 2] = w[2];
                nexthop[4 * i + 3] = w[3];
                i += 1;
            }
        } else {
            let w = unsafe { params.__bindgen_anon_4.ipv4_dst }.to_ne_bytes();
            nexthop[..4].copy_from_slice(&w);
        }
        (rc as u8, params.ifindex, nexthop)
    }
}

impl Bytes for Skb<'_> {
    #[inline(always)]
    fn u8_at(&self, at: usize) -> Option<u8> {
        self.0.load(at).ok()
    }

    #[inline(always)]
    fn u16_at(&self, at: usize) -> Option<u16> {
        self.0.load::<u16>(at).ok().map(u16::from_be)
    }

    /// One skb load for the whole pair.
    #[inline(always)]
    fn pair_at(&self, l3: usize) -> Option<FlowKey> {
        self.0.load(l3 + IPV4_SADDR).ok()
    }
}

/// The linear head of a tc packet, read directly (`data`..`data_end`): no
/// helper call per field, which is most of what an untraced packet costs.
/// A read past `data_end` returns `None` and remembers it (`short`), so the
/// caller can read the packet again through [`Skb`] when the headers run
/// on into paged data.
pub struct Linear {
    data: usize,
    end: usize,
    short: core::cell::Cell<bool>,
}

impl Linear {
    #[inline(always)]
    pub fn new(ctx: &TcContext) -> Self {
        Linear {
            data: ctx.data(),
            end: ctx.data_end(),
            short: core::cell::Cell::new(false),
        }
    }

    /// Whether some read ran past the linear head.
    #[inline(always)]
    pub fn was_short(&self) -> bool {
        self.short.get()
    }

    /// Address of `N` readable bytes at `at`, checked against `data_end`.
    #[inline(always)]
    fn at<const N: usize>(&self, at: usize) -> Option<*const u8> {
        // Hidden from the optimizer, so that each read keeps its own
        // check in the form the verifier follows (see `[u8]`'s Bytes).
        let at = core::hint::black_box(at);
        if at >= LINEAR_MAX {
            return None;
        }
        let start = self.data + at;
        // Compared as `start + N > end`, not folded into `start >= end`:
        // only the former gives the verifier a range for `start`.
        if core::hint::black_box(start + N) > self.end {
            self.short.set(true);
            return None;
        }
        Some(start as *const u8)
    }
}

/// One check against `data_end` for a whole span at a constant offset
/// (inlined, `at` is a constant in every caller): the verifier then knows
/// every byte of it, and reads cost no check each.
impl Fixed for Linear {
    #[inline(always)]
    fn fixed<const N: usize>(&self, at: usize) -> Option<&[u8; N]> {
        let start = self.data + at;
        if start + N > self.end {
            return None;
        }
        Some(unsafe { &*(start as *const [u8; N]) })
    }
}

impl Bytes for Linear {
    #[inline(always)]
    fn u8_at(&self, at: usize) -> Option<u8> {
        self.at::<1>(at).map(|p| unsafe { *p })
    }

    #[inline(always)]
    fn u16_at(&self, at: usize) -> Option<u16> {
        let p = self.at::<2>(at)?;
        Some(u16::from_be_bytes(unsafe { [*p, *p.add(1)] }))
    }

    #[inline(always)]
    fn bytes_at<const N: usize>(&self, at: usize) -> Option<[u8; N]> {
        let p = self.at::<N>(at)?;
        Some(unsafe { core::ptr::read_unaligned(p as *const [u8; N]) })
    }

    /// One bounds check for the whole pair.
    #[inline(always)]
    fn pair_at(&self, l3: usize) -> Option<FlowKey> {
        let p = self.at::<8>(l3 + IPV4_SADDR)?;
        Some(unsafe { core::ptr::read_unaligned(p as *const FlowKey) })
    }
}
