//! A failing doctor check, as a verdict and the wire carry it.

use serde::{Deserialize, Serialize};

/// A failing check, as a verdict carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema, Deserialize)]
pub struct Finding {
    pub family: String,
    pub check: String,
    pub evidence: String,
    pub fix: Option<String>,
}
