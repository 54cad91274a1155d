//! Reading a netfilter rule's text for the verdict: what a REJECT rule
//! answers the client (and kube-proxy's comment on why), whether it
//! drops what conntrack found INVALID, and which address translation a
//! nat rule makes.

use serde::Serialize;

use crate::model::netfilter::NetfilterRule;

/// A drop of what conntrack found INVALID (iptables `--ctstate INVALID`,
/// nft `ct state invalid`); `conntrack` tells why.
pub(super) fn invalid(rule: &str) -> bool {
    let lower = rule.to_ascii_lowercase();
    lower.contains("--ctstate invalid") || lower.contains("ct state invalid")
}

/// For a REJECT rule: `rejected: default/db has no endpoints` (from
/// kube-proxy's comment: on the iptables rule, or in nftables mode on the
/// `no-endpoint-services` element that led to the reject) and what the
/// client is then sent.
pub(super) fn rejection(rule: &str) -> Option<String> {
    if !rule.contains("-j REJECT") && !rule.starts_with("reject") && !rule.contains(" reject") {
        return None;
    }
    let comment = rule
        .split_once("--comment ")
        .or_else(|| rule.split_once("comment "))
        .map(|(_, rest)| {
            let rest = rest.trim_start_matches('"');
            rest.split('"').next().unwrap_or(rest).to_string()
        });
    let why = match comment {
        Some(c) if c.contains("has no endpoints") => {
            // `default/db:http has no endpoints` → `default/db has no endpoints`.
            let (svc, tail) = c.split_once(' ').unwrap_or((&c, ""));
            let svc = svc.split(':').next().unwrap_or(svc);
            format!("rejected: {svc} {tail}")
        }
        // kube-proxy's nftables map of Services without endpoints, its
        // elements commented `default/db:http`.
        Some(c) if rule.contains("@no-endpoint-services") => {
            format!(
                "rejected: {} has no endpoints",
                c.split(':').next().unwrap_or(&c)
            )
        }
        _ => "rejected".to_string(),
    };
    let answer = if rule.contains("tcp-reset") || rule.contains("reject with tcp reset") {
        "a TCP RST"
    } else if let Some((_, with)) = rule.split_once("--reject-with ") {
        match with.split_whitespace().next() {
            Some("icmp-port-unreachable") | None => "ICMP port unreachable",
            Some(other) => return Some(format!("{why} (the client is sent {other})")),
        }
    } else {
        "ICMP port unreachable"
    };
    Some(format!("{why} (the client is sent {answer})"))
}

/// Which rewrite a step is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub enum NatKind {
    #[serde(rename = "DNAT")]
    Dnat,
    /// A reply's source put back to the Service frontend (conntrack).
    #[serde(rename = "un-DNAT")]
    UnDnat,
    #[serde(rename = "SNAT")]
    Snat,
    #[serde(rename = "MASQUERADE")]
    Masquerade,
    /// A reply's destination put back to the masqueraded source.
    #[serde(rename = "un-SNAT")]
    UnSnat,
}

impl NatKind {
    pub(super) fn label(self) -> &'static str {
        match self {
            Self::Dnat => "DNAT",
            Self::UnDnat => "un-DNAT",
            Self::Snat => "SNAT",
            Self::Masquerade => "MASQUERADE",
            Self::UnSnat => "un-SNAT",
        }
    }
}

/// What a nat rule does, from its text (iptables or nft syntax).
pub fn rule_action(rule: &NetfilterRule) -> Option<NatKind> {
    let text = rule.rule.as_str();
    let has = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if has(&["-j DNAT", "dnat to", "dnat ip to"]) {
        Some(NatKind::Dnat)
    } else if has(&["-j MASQUERADE", "masquerade"]) {
        Some(NatKind::Masquerade)
    } else if has(&["-j SNAT", "snat to", "snat ip to"]) {
        Some(NatKind::Snat)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::{invalid, rejection};

    #[test]
    fn a_reject_names_the_service_without_endpoints_and_the_answer() {
        let rule = r#"-A KUBE-SERVICES -d 10.96.9.9/32 -p tcp -m comment --comment "default/empty:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable"#;
        assert_eq!(
            rejection(rule).unwrap(),
            "rejected: default/empty has no endpoints (the client is sent ICMP port unreachable)"
        );
        assert!(rejection("-A FORWARD -j DROP").is_none());
        let nft = r#"reject # handle 54, reached by service-endpoints-check: ip daddr . meta l4proto . th dport vmap @no-endpoint-services # handle 44 on element 10.96.9.9 . tcp . 80 comment "default/empty:http""#;
        assert_eq!(
            rejection(nft).unwrap(),
            "rejected: default/empty has no endpoints (the client is sent ICMP port unreachable)"
        );
        assert_eq!(
            rejection(r#"ip daddr 10.1.2.3 reject with tcp reset comment "block db-1" # handle 2"#)
                .unwrap(),
            "rejected (the client is sent a TCP RST)"
        );
        let rule = r#"-A KUBE-FORWARD -m conntrack --ctstate INVALID -m comment --comment "kubernetes forwarding conntrack rule" -j DROP"#;
        assert!(invalid(rule));
        assert!(!invalid("-A FORWARD -j DROP"));
    }
}
