//! The userspace pipeline under criterion (`cargo xtask bench` runs it):
//! decode + correlate + tell of recorded sightings, eight hops a story, so
//! that a change that slows the path from ring buffer to story shows as a
//! number (target: at least 1 M sightings/s).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use etherparse::PacketBuilder;
use podtrace::{
    decode::{
        decode,
        hop::{Direction, Hop, Snapshot},
    },
    model::{Format, Name},
    node::interfaces::Role,
    output::{self, Sink},
    story::{
        correlator::{Correlator, Waits},
        tell, Context,
    },
};

const STORIES: u64 = 2_000;
const HOPS: u64 = 8;

fn frame(seq: u16) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ethernet2([2; 6], [4; 6])
        .ipv4([10, 244, 1, 2], [10, 244, 2, 2], 64)
        .icmpv4_echo_request(7, seq)
        .write(&mut out, &[0u8; 56])
        .expect("a frame");
    out
}

/// The names a traced node holds, shared by its hops as `place` shares
/// them.
struct Names {
    node: Name,
    ifaces: Vec<Name>,
}

impl Names {
    fn new() -> Self {
        Self {
            node: "node-1".into(),
            ifaces: (0..HOPS).map(|h| format!("if{h}").into()).collect(),
        }
    }
}

fn hop(f: &[u8], i: u64, h: u64, names: &Names) -> Hop {
    let head = &f[..f.len().min(128)];
    Hop {
        ktime_ns: i * 10_000_000 + h * 1_000,
        node: names.node.clone(),
        iface: names.ifaces[h as usize].clone(),
        role: Role::PodVeth,
        direction: Direction::Ingress,
        skb_len: f.len() as u32,
        mark: 0,
        packet: decode(head, true).expect("decodes"),
        drop: None,
        route: None,
        // What `place` copies for `--write`.
        snapshot: Snapshot {
            bytes: head.to_vec(),
            has_l2: true,
        },
    }
}

/// Every story told from `frames`, each seen at `HOPS` hooks, and written
/// to `sink` when there is one.
fn pipeline(frames: &[Vec<u8>], ctx: &Context, mut sink: Option<&mut dyn Sink>) -> usize {
    let mut correlator = Correlator::new(Waits {
        idle_ns: 1_000_000,
        patience_ns: 1_000_000,
        arp_ns: 1_000_000,
        ..Waits::default()
    });
    let names = Names::new();
    let mut told = 0;
    for (i, f) in frames.iter().enumerate() {
        for h in 0..HOPS {
            correlator.observe(hop(f, i as u64, h, &names));
        }
        for journey in correlator.take_finished(i as u64 * 10_000_000) {
            let story = tell(&journey, ctx);
            if let Some(sink) = sink.as_mut() {
                sink.story(told as u64, &story).expect("written");
            }
            told += usize::from(!story.hops.is_empty());
        }
    }
    told + correlator.take_all().len()
}

fn sightings(c: &mut Criterion) {
    let frames: Vec<Vec<u8>> = (0..STORIES).map(|i| frame(i as u16)).collect();
    let ctx = Context::default();
    let mut group = c.benchmark_group("userspace");
    group.throughput(Throughput::Elements(STORIES * HOPS));
    group.sample_size(20);
    group.bench_function("decode+correlate+tell", |b| {
        b.iter(|| assert_eq!(pipeline(&frames, &ctx, None) as u64, STORIES))
    });
    // What `-o json` adds: every story serialized (to a sink that keeps
    // nothing, so the number is podtrace's, not the disk's).
    let mut json = output::sink(Format::Json, std::io::sink(), false);
    group.bench_function("decode+correlate+tell+json", |b| {
        b.iter(|| assert_eq!(pipeline(&frames, &ctx, Some(json.as_mut())) as u64, STORIES))
    });
    group.finish();
}

criterion_group!(benches, sightings);
criterion_main!(benches);
