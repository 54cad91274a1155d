//! Strings that name a fixed set of things (a CNI backend, why a rule is
//! unnamed): `&'static str`, so that a hop or a context copies a pointer,
//! and leaked once when read back from a file.

use serde::{Deserialize, Deserializer};

/// A `&'static str` that serde's derive does not take for a borrow of the
/// input (it only sees through a written `&`): read with [`leak_str`].
pub type StaticStr = &'static str;

/// A `&'static str` read back from a file (`podtrace read`): the few such
/// strings of a context are leaked, once per context read.
pub fn leak_str<'de, D: Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    Ok(String::deserialize(d)?.leak())
}

/// An optional `&'static str` read back from a file, as [`leak_str`].
pub fn leak_opt_str<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'static str>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.map(|s| &*s.leak()))
}
