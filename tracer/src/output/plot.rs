//! `podtrace profile --plot FILE.svg`: one latency histogram per step,
//! stacked, as hand-written SVG (no drawing crate for a few rectangles).

use std::fmt::Write;

use crate::story::steps::KernelStep;

const WIDTH: f64 = 760.0;
const PANEL: f64 = 150.0;
const MARGIN: f64 = 50.0;

/// The SVG document: a `<g class="histogram">` per step, bars on a log
/// time axis (µs), heights in packets.
pub fn svg(steps: &[KernelStep]) -> String {
    let height = MARGIN + PANEL * steps.len() as f64;
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    out.push('\n');
    let _ = writeln!(
        out,
        r#"<text x="10" y="20" font-size="14">podtrace profile: per-step latency (µs, log scale)</text>"#
    );
    for (i, step) in steps.iter().enumerate() {
        panel(&mut out, step, MARGIN / 2.0 + PANEL * i as f64 + 10.0);
    }
    out.push_str("</svg>\n");
    out
}

/// x of `us` on a log axis from 0.5 µs to 1 s.
fn x_of(us: f64) -> f64 {
    let (lo, hi) = (0.5f64.ln(), 1e6f64.ln());
    MARGIN + (us.max(0.5).ln() - lo) / (hi - lo) * (WIDTH - 2.0 * MARGIN)
}

fn panel(out: &mut String, step: &KernelStep, top: f64) {
    let base = top + PANEL - 30.0;
    let tallest = step.buckets.iter().map(|b| b.2).max().unwrap_or(1) as f64;
    let _ = writeln!(
        out,
        r#"<g class="histogram" data-step="{} → {}">"#,
        escape(&step.from),
        escape(&step.to)
    );
    let _ = writeln!(
        out,
        r#"<text x="{MARGIN}" y="{}">{} → {}: {} packets, p50 {:.1} µs, p99 {:.1} µs</text>"#,
        top + 12.0,
        escape(&step.from),
        escape(&step.to),
        step.packets,
        step.p50_us,
        step.p99_us
    );
    for (lo, hi, n) in &step.buckets {
        let (x0, x1) = (x_of(*lo), x_of(*hi));
        let h = (*n as f64 / tallest) * (PANEL - 50.0);
        let _ = writeln!(
            out,
            r##"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="#4a7ebb"><title>{lo}–{hi} µs: {n}</title></rect>"##,
            base - h,
            (x1 - x0).max(1.0)
        );
    }
    let _ = writeln!(
        out,
        r#"<line x1="{MARGIN}" y1="{base}" x2="{}" y2="{base}" stroke="black"/>"#,
        WIDTH - MARGIN
    );
    for us in [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6] {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{us}</text>"#,
            x_of(us),
            base + 14.0
        );
    }
    out.push_str("</g>\n");
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
