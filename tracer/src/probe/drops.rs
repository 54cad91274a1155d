//! The drop signal, userspace side: attaching to kfree_skb, the kernel
//! layout the drop program needs, the names of drop reasons, and drop
//! locations as symbols — all read from the running kernel (BTF,
//! /proc/kallsyms), never from a table of our own.

use std::{
    collections::HashMap,
    sync::{Mutex, OnceLock},
    thread::JoinHandle,
};

use anyhow::{anyhow, Context, Result};
#[cfg(target_os = "linux")]
use aya::{
    programs::{BtfTracePoint, RawTracePoint},
    Ebpf,
};
use podtrace_common::{drops::KernelLayout, names};

use super::{btf::Btf, features::DropHook};

#[cfg(target_os = "linux")]
/// kfree_skb as a BTF-typed tracepoint, else as a raw one (the classic
/// tracepoint would need tracefs), in the variant that reads a reason
/// only where the kernel passes one.
pub(super) fn attach(ebpf: &mut Ebpf, btf: &aya::Btf, drop_reasons: bool) -> Result<DropHook> {
    let (typed_name, raw_name) = if drop_reasons {
        (names::DROPS, names::DROPS_RAW)
    } else {
        (names::DROPS_NO_REASON, names::DROPS_RAW_NO_REASON)
    };
    let typed: Result<()> = (|| {
        let program: &mut BtfTracePoint = ebpf
            .program_mut(typed_name)
            .ok_or_else(|| anyhow!("no program {typed_name}"))?
            .try_into()?;
        program.load("kfree_skb", btf)?;
        program.attach()?;
        Ok(())
    })();
    let Err(typed_error) = typed else {
        return Ok(DropHook::Typed);
    };
    let program: &mut RawTracePoint = ebpf
        .program_mut(raw_name)
        .ok_or_else(|| anyhow!("no program {raw_name}"))?
        .try_into()?;
    program.load()?;
    program
        .attach("kfree_skb")
        .map(|_| DropHook::Raw)
        .with_context(|| {
            format!("cannot attach to the kfree_skb tracepoint (as tp_btf: {typed_error:#})")
        })
}

/// Offsets of the sk_buff, net_device and net fields the drop program reads.
/// The socket fields are optional: without them, drops that have no IP
/// header yet are not matched (and podtrace says so at start).
pub fn kernel_layout(btf: &Btf) -> Result<KernelLayout> {
    let layout = KernelLayout {
        skb_head: btf.member_offset("sk_buff", "head")?,
        skb_network_header: btf.member_offset("sk_buff", "network_header")?,
        skb_dev: btf.member_offset("sk_buff", "dev")?,
        skb_len: btf.member_offset("sk_buff", "len")?,
        skb_tail: btf.member_offset("sk_buff", "tail")?,
        skb_mark: btf.member_offset("sk_buff", "mark")?,
        skb_hash: btf.member_offset("sk_buff", "hash")?,
        dev_ifindex: btf.member_offset("net_device", "ifindex")?,
        dev_nd_net: btf.member_offset("net_device", "nd_net")?,
        net_ns_inum: btf.member_offset("net", "ns")? + btf.member_offset("ns_common", "inum")?,
        ..Default::default()
    };
    match socket_layout(btf) {
        Ok(with_socket) => Ok(with_socket(layout)),
        Err(e) => {
            eprintln!("podtrace: note: drops before the IP header exists cannot be matched on this kernel ({e:#})");
            Ok(layout)
        }
    }
}

/// The socket offsets, as a function that adds them to a layout.
fn socket_layout(btf: &Btf) -> Result<impl Fn(KernelLayout) -> KernelLayout> {
    let common = btf.member_offset("sock", "__sk_common")?;
    let in_common = |member: &str| btf.member_offset("sock_common", member).map(|o| common + o);
    let (skb_sk, sk_rcv_saddr, sk_daddr) = (
        btf.member_offset("sk_buff", "sk")?,
        in_common("skc_rcv_saddr")?,
        in_common("skc_daddr")?,
    );
    let (sk_num, sk_dport, sk_net) = (
        in_common("skc_num")?,
        in_common("skc_dport")?,
        in_common("skc_net")?,
    );
    let sk_protocol = btf.member_offset("sock", "sk_protocol")?;
    Ok(move |layout: KernelLayout| KernelLayout {
        skb_sk,
        sk_rcv_saddr,
        sk_daddr,
        sk_num,
        sk_dport,
        sk_protocol,
        sk_net,
        ..layout
    })
}

/// What a drop's reason is called where the kernel passes none (< 5.17)
/// and its location does not tell it either.
pub const REASON_NOT_NAMED: &str = "reason not named by this kernel";

/// `enum skb_drop_reason` of the running kernel: value → name without the
/// SKB_DROP_REASON_ prefix (NETFILTER_DROP, IP_INNOROUTES, …). `None` on a
/// kernel whose kfree_skb passes no reason.
pub struct ReasonNames(Option<HashMap<u32, String>>);

impl ReasonNames {
    pub fn from_btf(btf: &Btf, passed: bool) -> Self {
        let values = btf.enum_values("skb_drop_reason").ok().filter(|_| passed);
        Self(values.map(|values| {
            values
                .into_iter()
                .map(|(name, value)| {
                    let short = name
                        .strip_prefix("SKB_DROP_REASON_")
                        .unwrap_or(&name)
                        .to_string();
                    (value as u32, short)
                })
                .collect()
        }))
    }

    /// The reason's name, and whether it was read from the drop's
    /// `location` (`name+0xoff`) rather than passed by the kernel. Only an
    /// unambiguous location counts, where the kernel passes no reason or
    /// NOT_SPECIFIED: nf_hook_slow frees a packet only on a netfilter
    /// rule's DROP (NETFILTER_DROP on newer kernels), nf_queue only one a
    /// rule's QUEUE could not hand to a listener (none, and no bypass; or
    /// its queue full), and neigh_invalidate
    /// only the packets queued on a neighbour that FAILED to resolve
    /// (IPv6's ndisc_error_report frees them with no reason, IPv4's with
    /// NEIGH_FAILED).
    pub fn name(&self, reason: u32, location: &str) -> (String, bool) {
        let by_location = || {
            let function = location.split('+').next()?;
            LOCATION_REASONS
                .iter()
                .find(|(f, _)| *f == function)
                .map(|(_, reason)| (reason.to_string(), true))
        };
        match &self.0 {
            Some(names) => match names.get(&reason) {
                Some(name) if name == NOT_SPECIFIED => {
                    by_location().unwrap_or_else(|| (name.clone(), false))
                }
                Some(name) => (name.clone(), false),
                None => (format!("reason {reason}"), false),
            },
            None => by_location().unwrap_or_else(|| (REASON_NOT_NAMED.into(), false)),
        }
    }
}

/// The reason the kernel gives when it names none.
const NOT_SPECIFIED: &str = "NOT_SPECIFIED";

/// Functions that free a packet for one reason only, and that reason.
const LOCATION_REASONS: [(&str, &str); 3] = [
    ("nf_hook_slow", "NETFILTER_DROP"),
    ("nf_queue", "NETFILTER_DROP"),
    ("neigh_invalidate", "NEIGH_FAILED"),
];

/// Kernel text symbols, for naming drop locations (`nf_hook_slow+0x9c`).
/// Read on a thread of their own from the start of a run: the kernel
/// writes /proc/kallsyms out slowly (tens of ms on this host, a fifth of
/// a second under strace, seconds on an emulated VM), which loading the
/// programs meanwhile hides.
pub struct Symbols {
    table: OnceLock<SymbolTable>,
    reading: Mutex<Option<JoinHandle<Result<SymbolTable>>>>,
}

/// The symbols read, or why /proc/kallsyms could not be read at all.
struct SymbolTable {
    symbols: Vec<(u64, String)>,
    unreadable: Option<String>,
}

/// Why drop locations are raw addresses.
pub enum NoSymbols {
    /// /proc/kallsyms was read but shows no address to this process.
    Hidden,
    /// /proc/kallsyms could not be read: why.
    Unreadable(String),
}

impl Symbols {
    /// Starts reading /proc/kallsyms; the first question waits for it.
    pub fn from_kallsyms() -> Self {
        let reading = std::thread::spawn(|| {
            let text =
                std::fs::read_to_string("/proc/kallsyms").context("cannot read /proc/kallsyms")?;
            Ok(SymbolTable::parse(&text))
        });
        Self {
            table: OnceLock::new(),
            reading: Mutex::new(Some(reading)),
        }
    }

    pub fn parse(text: &str) -> Self {
        Self {
            table: OnceLock::from(SymbolTable::parse(text)),
            reading: Mutex::new(None),
        }
    }

    fn table(&self) -> &SymbolTable {
        self.table.get_or_init(|| {
            let reading = self.reading.lock().expect("not poisoned").take();
            let read = reading.map(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err(anyhow!("the thread reading it panicked")))
            });
            match read {
                Some(Ok(table)) => table,
                // Drops are still told, at raw addresses; the banner says why.
                Some(Err(e)) => SymbolTable {
                    symbols: Vec::new(),
                    unreadable: Some(format!("{e:#}")),
                },
                None => SymbolTable::parse(""),
            }
        })
    }

    /// Why no drop location can be named, if none can.
    pub fn missing(&self) -> Option<NoSymbols> {
        let table = self.table();
        match &table.unreadable {
            Some(why) => Some(NoSymbols::Unreadable(why.clone())),
            None => table.symbols.is_empty().then_some(NoSymbols::Hidden),
        }
    }

    /// `name+0xoffset` of the function holding `addr`, or the raw address.
    pub fn name(&self, addr: u64) -> String {
        let symbols = &self.table().symbols;
        let at = symbols.partition_point(|(a, _)| *a <= addr);
        match at.checked_sub(1).map(|i| &symbols[i]) {
            Some((start, name)) => format!("{name}+{:#x}", addr - start),
            None => format!("{addr:#x}"),
        }
    }
}

impl SymbolTable {
    fn parse(text: &str) -> Self {
        let mut symbols: Vec<(u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
                let kind = fields.next()?;
                let name = fields.next()?;
                (addr != 0 && matches!(kind, "t" | "T")).then(|| (addr, name.to_string()))
            })
            .collect();
        symbols.sort_unstable();
        Self {
            symbols,
            unreadable: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_are_named_by_the_function_that_holds_them() {
        let symbols = Symbols::parse(
            "ffffffff81000000 T _stext\nffffffff81a00000 t nf_hook_slow\nffffffff81a00200 T ip_forward\n0000000000000000 A fixed\nffffffff81a00100 d some_data\n",
        );
        assert_eq!(symbols.name(0xffffffff81a0009c), "nf_hook_slow+0x9c");
        assert_eq!(symbols.name(0xffffffff81a00200), "ip_forward+0x0");
        assert_eq!(symbols.name(0x10), "0x10");
    }

    #[test]
    fn without_reasons_only_a_netfilter_location_names_one() {
        let unnamed = ReasonNames(None);
        assert_eq!(
            unnamed.name(0, "nf_hook_slow+0x9c"),
            ("NETFILTER_DROP".to_string(), true)
        );
        // A rule's QUEUE that no listener took (kfree_skb, no reason).
        let unspecified = ReasonNames(Some(HashMap::from([(1, NOT_SPECIFIED.to_string())])));
        assert_eq!(
            unspecified.name(1, "nf_queue+0x5c"),
            ("NETFILTER_DROP".to_string(), true)
        );
        assert_eq!(
            unnamed.name(0, "ip_error+0x3a"),
            (REASON_NOT_NAMED.to_string(), false)
        );
        let named = ReasonNames(Some(HashMap::from([(2, "NO_SOCKET".to_string())])));
        assert_eq!(
            named.name(2, "nf_hook_slow+0x9c"),
            ("NO_SOCKET".to_string(), false)
        );
        assert_eq!(named.name(9, "x+0x1"), ("reason 9".to_string(), false));
    }
}
