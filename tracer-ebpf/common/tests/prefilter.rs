//! The pre-filter of traced pairs, as the kernel asks it: exact while few
//! pairs are traced, bits and FLOWS beyond; and a change of pairs written
//! so that a program reading the entry halfway through a write never
//! calls an untraced pair traced, nor turns a traced one away.

use podtrace_common::prefilter::{TracedPairs, EXACT_PAIRS};
use podtrace_common::FlowKey;

fn pair(a: u8, b: u8) -> FlowKey {
    FlowKey {
        src: [10, 244, 1, a],
        dst: [10, 244, 2, b],
    }
}

fn both_ways(a: u8, b: u8) -> [FlowKey; 2] {
    let there = pair(a, b);
    [
        there,
        FlowKey {
            src: there.dst,
            dst: there.src,
        },
    ]
}

/// What the kernel decides: the entry, else FLOWS (`flows`).
fn traced(entry: &TracedPairs, flows: &[FlowKey], key: &FlowKey) -> bool {
    entry.answer(key).unwrap_or_else(|| flows.contains(key))
}

#[test]
fn a_few_pairs_are_answered_exactly_without_flows() {
    let pairs = both_ways(2, 3);
    let entry = TracedPairs::of(&pairs);
    assert_eq!(entry.answer(&pairs[0]), Some(true));
    assert_eq!(entry.answer(&pairs[1]), Some(true));
    for i in (0..=255).filter(|&i| i != 3) {
        assert_eq!(entry.answer(&pair(2, i)), Some(false), "10.244.2.{i}");
    }
}

#[test]
fn many_pairs_leave_the_decision_to_flows_behind_the_bits() {
    let pairs: Vec<FlowKey> = (1..=EXACT_PAIRS as u8 / 2 + 1)
        .flat_map(|i| both_ways(i, i))
        .collect();
    let entry = TracedPairs::of(&pairs);
    assert_eq!(entry.exact_len, 0);
    assert!(pairs.iter().all(|p| entry.answer(p).is_none()));
    let turned_away = (100..=250).filter(|&i| entry.answer(&pair(i, i)) == Some(false));
    // Both bits of an untraced pair are rarely both set.
    assert!(turned_away.count() > 140);
}

fn bytes(entry: &TracedPairs) -> Vec<u8> {
    // SAFETY: plain #[repr(C)] integers, padding included as a field.
    unsafe {
        std::slice::from_raw_parts(
            (entry as *const TracedPairs).cast::<u8>(),
            size_of::<TracedPairs>(),
        )
    }
    .to_vec()
}

/// Every entry a reader may see while `to` is copied over `from`: the
/// first `cut` bytes of one and the rest of the other, either way round.
fn halfway(from: &TracedPairs, to: &TracedPairs) -> Vec<TracedPairs> {
    let (a, b) = (bytes(from), bytes(to));
    let mut seen = Vec::new();
    for cut in 0..=a.len() {
        for (head, tail) in [(&b, &a), (&a, &b)] {
            let mut mixed = head[..cut].to_vec();
            mixed.extend_from_slice(&tail[cut..]);
            // SAFETY: every byte pattern is a valid TracedPairs.
            seen.push(unsafe { std::ptr::read_unaligned(mixed.as_ptr().cast()) });
        }
    }
    seen
}

/// Replays a change of traced pairs from `before` to `after` as
/// userspace writes it, checking what a reader decides at every instant
/// of every write.
fn replay(before: &[FlowKey], after: &[FlowKey], others: &[FlowKey]) {
    let start = TracedPairs::of(before);
    let during: Vec<FlowKey> = before.iter().chain(after).copied().collect();
    let widened = start.widened(&during);
    let [unlisted, listed] = TracedPairs::settled(after);
    // The first write while FLOWS still holds `before`, the others once
    // it holds `after`.
    let writes = [
        (start, widened, before),
        (widened, unlisted, after),
        (unlisted, listed, after),
    ];
    for (from, to, flows) in writes {
        for entry in halfway(&from, &to) {
            for key in flows {
                assert!(traced(&entry, flows, key), "{key:?} turned away");
            }
            for key in others.iter().filter(|k| !flows.contains(k)) {
                assert!(!traced(&entry, flows, key), "{key:?} called traced");
            }
        }
    }
    assert_eq!(listed, TracedPairs::of(after));
}

#[test]
fn a_change_of_pairs_read_halfway_answers_as_before_or_after() {
    let others: Vec<FlowKey> = (1..40).flat_map(|i| both_ways(i, i + 1)).collect();
    let one = both_ways(2, 3);
    let other = both_ways(4, 5);
    // A Service's connection to a new backend: one listed pair for another.
    replay(&one, &other, &others);
    // More pairs than the list holds, and back.
    let many: Vec<FlowKey> = (10..16).flat_map(|i| both_ways(i, i + 1)).collect();
    replay(&one, &many, &others);
    replay(&many, &other, &others);
    // The first pairs, written before any program runs.
    replay(&[], &one, &others);
}
