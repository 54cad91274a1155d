//! The human format: one block per story (hops, then the verdict,
//! coloured on a terminal), the profile table, and the summary line.

use std::io::Write;

use super::sink::Sink;
use crate::model::{ProbeResult, Summary};
use crate::story::{profile::StepLatency, Outcome, Story};

/// Writes stories as people read them.
pub struct Human<W: Write> {
    pub out: W,
    pub colour: bool,
}

impl<W: Write> Sink for Human<W> {
    fn story(&mut self, n: u64, story: &Story) -> std::io::Result<()> {
        self.out
            .write_all(human_story(n, story, self.colour).as_bytes())
    }

    fn profile(&mut self, steps: &[StepLatency]) -> std::io::Result<()> {
        self.out.write_all(human_profile(steps).as_bytes())?;
        self.out.flush()
    }

    fn summary(&mut self, summary: &Summary) -> std::io::Result<()> {
        self.out.write_all(human_summary(summary).as_bytes())?;
        self.out.flush()
    }

    fn probe(&mut self, probe: &ProbeResult) -> std::io::Result<()> {
        writeln!(self.out, "{}", human_probe(probe))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// A probe's result in one line, as a live run ends with it (and as the
/// pcapng's comment on the probe's last packet says it).
pub fn human_probe(probe: &ProbeResult) -> String {
    let mark = if probe.answered { "✓" } else { "✗" };
    format!(
        "probe {} {} → {}: {mark} {}",
        probe.seq, probe.kind, probe.target, probe.result
    )
}

fn paint(colour: bool, code: &str, text: &str) -> String {
    if colour {
        format!("\x1b[{code}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

pub fn human_story(n: u64, s: &Story, colour: bool) -> String {
    let name = |ip: std::net::IpAddr, name: &Option<String>| match name {
        Some(n) => format!("{ip} ({n})"),
        None => ip.to_string(),
    };
    // IPv6 has no IP ID; a fragment's ID is in its fragment header.
    let ip_id = match s.src {
        std::net::IpAddr::V6(_) if s.ip_id == 0 => String::new(),
        std::net::IpAddr::V6(_) => format!(", fragment id {}", s.ip_id),
        std::net::IpAddr::V4(_) => format!(", IP id {}", s.ip_id),
    };
    let mut text = format!(
        "{} {} → {}: {}{ip_id}\n",
        paint(colour, "1", &format!("#{n}")),
        name(s.src, &s.src_name),
        name(s.dst, &s.dst_name),
        s.packet,
    );
    let node_w = s.hops.iter().map(|h| h.node.len()).max().unwrap_or(0);
    let iface_w = s.hops.iter().map(|h| h.iface.len()).max().unwrap_or(0);
    let clocked = s.hops.iter().any(|h| h.clock_uncertainty_us.is_some());
    for hop in &s.hops {
        let dir = hop.direction.label();
        let uncertainty = match (clocked, hop.clock_uncertainty_us) {
            (false, _) => String::new(),
            (true, Some(u)) => format!(" ±{u:>6.1} µs"),
            (true, None) => " ".repeat(11),
        };
        text.push_str(&format!(
            "  {:>10.1} µs{uncertainty}  {:node_w$}  {:iface_w$}  {dir:7}  {:>5} B  {}\n",
            hop.t_us, hop.node, hop.iface, hop.skb_len, hop.note
        ));
    }
    let code = match s.verdict.outcome {
        Outcome::Delivered { .. } => "32",
        Outcome::LeftNode { .. } => "36",
        Outcome::Vanished { .. } | Outcome::Dropped { .. } | Outcome::NoRoute { .. } => "31",
        Outcome::Incomplete { .. } | Outcome::TranslatedOutOfSight { .. } => "33",
    };
    for freed in &s.freed_after_delivery {
        // Every echo reply to ping(8) ends so: its raw socket takes a copy.
        let said = if freed.function().starts_with("ping_") {
            "a raw socket, as ping(8) opens, gets its copy before this; no unprivileged ping socket waited for the original: not a drop on the path"
        } else {
            "the pod's own stack, not a drop on the path"
        };
        text.push_str(&format!(
            "  (then freed inside the pod: {} in {}; {said})\n",
            freed.reason, freed.location
        ));
    }
    text.push_str(&format!(
        "  verdict: {}\n",
        paint(colour, code, &s.verdict.summary)
    ));
    let api = s.verdict.policy.as_ref().and_then(|p| p.api.as_ref());
    for line in api.map(|api| api.lines()).unwrap_or_default() {
        text.push_str(&format!("  policy (API): {line}\n"));
    }
    for finding in &s.verdict.doctor {
        text.push_str(&format!(
            "  doctor: {} {}: {}\n",
            finding.family, finding.check, finding.evidence
        ));
    }
    text.push('\n');
    text
}

pub fn human_profile(steps: &[StepLatency]) -> String {
    let from_w = steps
        .iter()
        .map(|s| s.step.from.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let to_w = steps
        .iter()
        .map(|s| s.step.to.len())
        .max()
        .unwrap_or(2)
        .max(2);
    let mut text = format!(
        "datapath profile (µs per step)\n  {:from_w$}    {:to_w$}  {:>6}  {:>8}  {:>8}  {:>8}  {:>8}\n",
        "from", "to", "count", "p50", "p90", "p99", "max"
    );
    for s in steps {
        text.push_str(&format!(
            "  {:from_w$} →  {:to_w$}  {:>6}  {:>8.1}  {:>8.1}  {:>8.1}  {:>8.1}\n",
            s.step.from, s.step.to, s.count, s.p50_us, s.p90_us, s.p99_us, s.max_us
        ));
    }
    text.push('\n');
    text
}

pub fn human_summary(s: &Summary) -> String {
    let mut text = node_mode_summary(s);
    if s.lost_ringbuf_full > 0 {
        text.push_str(crate::model::KEEP_UP);
        text.push('\n');
    }
    if s.sample > 1 {
        text.push_str(&format!(
            "podtrace: sampled: 1 packet in {} told (chosen in the kernel by packet identity, every hop of it kept)\n",
            s.sample
        ));
    }
    if s.filtered_in_kernel > 0 {
        text.push_str(&format!(
            "podtrace: {} sightings of the pair left out in the kernel by --proto/--port (one per hook a packet crossed)\n",
            s.filtered_in_kernel
        ));
    }
    if s.skipped_by_filter > 0 {
        text.push_str(&format!(
            "podtrace: {} stories of the pair's other traffic skipped (not the probes')\n",
            s.skipped_by_filter
        ));
    }
    for n in &s.nodes {
        text.push_str(&format!(
            "podtrace: {}: traced by agent {}: {} sightings; lost: {} in the kernel, {} in the agent, {} on the way here{}\n",
            n.node, n.agent, n.sightings, n.lost_kernel, n.lost_agent, n.lost_transport,
            n.clock.as_deref().map(|c| format!("; clock {c}")).unwrap_or_default()
        ));
        if let Some(lost) = &n.lost {
            text.push_str(&format!("podtrace: {}: incomplete: {lost}\n", n.node));
        }
    }
    for run in &s.conntrack {
        text.push_str(&conntrack_line(run));
    }
    for after in &s.pmtu_after {
        text.push_str(&format!("podtrace: {}\n", after.words()));
    }
    if !s.untraced_nodes.is_empty() {
        text.push_str(&format!(
            "podtrace: not traced: {} (add them with --nodes)\n",
            s.untraced_nodes.join(", ")
        ));
    }
    text
}

/// A node's conntrack over the run: the failure counters that grew, and
/// the table's fill.
fn conntrack_line(run: &crate::model::conntrack::ConntrackRun) -> String {
    let failures = run.grew.failures();
    let grew = if failures.is_empty() {
        "no failure counter grew".to_string()
    } else {
        let each: Vec<String> = failures
            .iter()
            .map(|(name, n)| format!("{name} +{n}"))
            .collect();
        each.join(", ")
    };
    format!(
        "podtrace: conntrack on {} over the run: {grew}; {} of nf_conntrack_max {} entries in use\n",
        run.node, run.entries, run.max
    )
}

fn node_mode_summary(s: &Summary) -> String {
    let mut text = format!(
        "podtrace: {} stories from {} sightings on {} hooks; lost: {} (ring buffer full), {} (header copy failed); undecodable: {}; on unknown interfaces: {}; interfaces vanished: {}, added: {}\n",
        s.stories,
        s.sightings,
        s.hooks_attached,
        s.lost_ringbuf_full,
        s.lost_snapshot,
        s.undecodable,
        s.unknown_interface,
        s.interfaces_vanished,
        s.interfaces_added
    );
    if s.drops_elsewhere > 0 {
        text.push_str(&format!(
            "podtrace: {} drops of the traced addresses in namespaces podtrace does not trace, left out of the stories: neither a traced node's nor behind a traced pod's veth (a router or another namespace on this host that the packets crossed, or the same addresses in another cluster or lab here)\n",
            s.drops_elsewhere
        ));
    }
    if s.drops_without_netns > 0 {
        text.push_str(&format!(
            "podtrace: {} drops of the traced addresses with no network namespace left out: freed off any path (a socket's unread queue as it closed)\n",
            s.drops_without_netns
        ));
    }
    if s.wireguard_legs_untold > 0 {
        text.push_str(&format!(
            "podtrace: {} UDP packets WireGuard sent with a traced packet inside told in no story: the traced packet's own sighting was lost, or WireGuard segmented it and its story tells the first segment's\n",
            s.wireguard_legs_untold
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_with_records_lost_says_how_to_lose_none() {
        let lossless = human_summary(&Summary::default());
        assert!(!lossless.contains("--sample N"), "{lossless}");
        let lossy = human_summary(&Summary {
            lost_ringbuf_full: 3,
            ..Summary::default()
        });
        assert!(lossy.contains("lost: 3 (ring buffer full)"), "{lossy}");
        assert!(lossy.contains(crate::model::KEEP_UP), "{lossy}");
    }

    use crate::story::{
        policy::{
            ApiFoundBy, ApiPolicies, Enforcer, PolicyDirection, PolicyOutcome, PolicyVerdict,
        },
        tests::sample_story,
    };

    /// The API's side of a policy drop is a line under the verdict.
    #[test]
    fn the_api_policies_are_a_line_under_the_verdict() {
        let mut story = sample_story();
        story.verdict.policy = Some(PolicyVerdict {
            enforcer: Enforcer::KubeRouter,
            direction: PolicyDirection::Ingress,
            pod: Some("default/db-0".into()),
            policies: Vec::new(),
            tier: None,
            outcome: PolicyOutcome::NoPolicyAllowed,
            queue: None,
            api: Some(ApiPolicies {
                found_by: ApiFoundBy::KernelNames,
                selections: Vec::new(),
                unmatched: Vec::new(),
                unread: Some("no Kubernetes API in this mode".into()),
            }),
        });
        let text = human_story(1, &story, false);
        let verdict = text.find("  verdict: ").unwrap();
        let api = text
            .find("\n  policy (API): the API's NetworkPolicies were not read: no Kubernetes API in this mode\n")
            .unwrap_or_else(|| panic!("{text}"));
        assert!(api > verdict, "{text}");
    }
}
