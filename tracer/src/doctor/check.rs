//! One check's outcome, what was seen and what to do: the record every
//! check family returns and the report renders.

use serde::{Serialize, Serializer};

/// A check's outcome: passed, failed, or not checked for want of data
/// (which is never a pass).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Fail,
    NotChecked,
    Pass,
}

/// In JSON, `ok`: true, false, or null when not checked.
impl Serialize for Status {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Pass => s.serialize_bool(true),
            Self::Fail => s.serialize_bool(false),
            Self::NotChecked => s.serialize_none(),
        }
    }
}

/// One check: ✓, ✗ or not checked, what was seen, and what to do.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Check {
    /// The family: cni-config, plugins, flannel, calico, bgp, kernel, wireguard, firewall, api.
    pub family: &'static str,
    /// The node it ran on, or the pod / cluster it is about.
    pub node: String,
    pub name: String,
    #[serde(rename = "ok")]
    pub status: Status,
    pub evidence: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    pub fn pass(family: &'static str, node: &str, name: &str, evidence: String) -> Self {
        Self {
            family,
            node: node.into(),
            name: name.into(),
            status: Status::Pass,
            evidence,
            fix: None,
        }
    }

    /// No data to judge by: `not checked: <why>`, never a pass.
    pub fn not_checked(family: &'static str, node: &str, name: &str, why: &str) -> Self {
        Self {
            family,
            node: node.into(),
            name: name.into(),
            status: Status::NotChecked,
            evidence: format!("not checked: {why}"),
            fix: None,
        }
    }

    pub fn ok(&self) -> bool {
        self.status == Status::Pass
    }

    pub fn failed(&self) -> bool {
        self.status == Status::Fail
    }

    pub fn fail(
        family: &'static str,
        node: &str,
        name: &str,
        evidence: String,
        fix: String,
    ) -> Self {
        Self {
            family,
            node: node.into(),
            name: name.into(),
            status: Status::Fail,
            evidence,
            fix: Some(fix),
        }
    }

    /// A pass or a fail by a condition.
    pub fn judge(
        family: &'static str,
        node: &str,
        name: &str,
        ok: bool,
        evidence: String,
        fix: impl FnOnce() -> String,
    ) -> Self {
        if ok {
            Self::pass(family, node, name, evidence)
        } else {
            Self::fail(family, node, name, evidence, fix())
        }
    }
}
