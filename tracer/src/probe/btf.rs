//! A small reader for the kernel's BTF (/sys/kernel/btf/vmlinux): struct
//! member offsets and enum values. Rust eBPF has no CO-RE, so podtrace reads
//! the running kernel's layout here and hands it to its programs as globals.

use std::collections::HashMap;

use anyhow::{anyhow, bail, Context, Result};

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
// BTF kinds, numbered as in the kernel's include/uapi/linux/btf.h.
const BTF_KIND_INT: u32 = 1;
const BTF_KIND_PTR: u32 = 2;
const BTF_KIND_ARRAY: u32 = 3;
const BTF_KIND_STRUCT: u32 = 4;
const BTF_KIND_UNION: u32 = 5;
const BTF_KIND_ENUM: u32 = 6;
const BTF_KIND_FWD: u32 = 7;
const BTF_KIND_TYPEDEF: u32 = 8;
const BTF_KIND_VOLATILE: u32 = 9;
const BTF_KIND_CONST: u32 = 10;
const BTF_KIND_RESTRICT: u32 = 11;
const BTF_KIND_FUNC: u32 = 12;
const BTF_KIND_FUNC_PROTO: u32 = 13;
const BTF_KIND_VAR: u32 = 14;
const BTF_KIND_DATASEC: u32 = 15;
const BTF_KIND_FLOAT: u32 = 16;
const BTF_KIND_DECL_TAG: u32 = 17;
const BTF_KIND_TYPE_TAG: u32 = 18;
const BTF_KIND_ENUM64: u32 = 19;

#[derive(Clone, Debug)]
struct Type {
    kind: u32,
    name: u32,
    kind_flag: bool,
    vlen: usize,
    /// Start of the kind-specific data after the 12-byte common header.
    extra: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub name: String,
    pub type_id: u32,
    pub bit_offset: u32,
}

pub struct Btf {
    data: Vec<u8>,
    strings: usize,
    strings_len: usize,
    /// Index = type id - 1.
    types: Vec<Type>,
    by_name: HashMap<(u32, String), u32>,
}

impl Btf {
    pub fn from_sys_fs() -> Result<Self> {
        let data = std::fs::read(VMLINUX).map_err(|e| {
            anyhow!("podtrace needs the kernel's BTF ({VMLINUX}: {e}); use a kernel built with CONFIG_DEBUG_INFO_BTF=y")
        })?;
        Self::parse(data).context("cannot parse the kernel's BTF")
    }

    pub fn parse(data: Vec<u8>) -> Result<Self> {
        let u16_at = |at: usize| -> Result<u16> {
            Ok(u16::from_le_bytes(
                data.get(at..at + 2)
                    .ok_or_else(|| anyhow!("truncated"))?
                    .try_into()?,
            ))
        };
        let u32_at = |at: usize| -> Result<u32> {
            Ok(u32::from_le_bytes(
                data.get(at..at + 4)
                    .ok_or_else(|| anyhow!("truncated"))?
                    .try_into()?,
            ))
        };
        if u16_at(0)? != MAGIC {
            bail!("not little-endian BTF");
        }
        let hdr_len = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let types_start = hdr_len + type_off;
        let types_end = types_start + type_len;
        let strings = hdr_len + str_off;
        if types_end > data.len() || strings + str_len > data.len() {
            bail!("sections run past the end");
        }
        let mut types = Vec::new();
        let mut at = types_start;
        while at < types_end {
            let info = u32_at(at + 4)?;
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let extra = at + 12;
            let size = match kind {
                BTF_KIND_INT | BTF_KIND_VAR | BTF_KIND_DECL_TAG => 4,
                BTF_KIND_ARRAY => 12,
                BTF_KIND_STRUCT | BTF_KIND_UNION | BTF_KIND_DATASEC | BTF_KIND_ENUM64 => 12 * vlen,
                BTF_KIND_ENUM | BTF_KIND_FUNC_PROTO => 8 * vlen,
                // Only the 12-byte common header.
                BTF_KIND_PTR | BTF_KIND_FWD | BTF_KIND_TYPEDEF | BTF_KIND_VOLATILE
                | BTF_KIND_CONST | BTF_KIND_RESTRICT | BTF_KIND_FUNC | BTF_KIND_FLOAT
                | BTF_KIND_TYPE_TAG => 0,
                other => bail!("unknown BTF kind {other}"),
            };
            types.push(Type {
                kind,
                name: u32_at(at)?,
                kind_flag: info >> 31 == 1,
                vlen,
                extra,
            });
            at = extra + size;
        }
        let mut btf = Self {
            data,
            strings,
            strings_len: str_len,
            types,
            by_name: HashMap::new(),
        };
        for (index, t) in btf.types.iter().enumerate() {
            if t.name != 0 {
                let name = btf.string(t.name);
                btf.by_name
                    .entry((t.kind, name))
                    .or_insert(index as u32 + 1);
            }
        }
        Ok(btf)
    }

    fn u32_at(&self, at: usize) -> u32 {
        u32::from_le_bytes(self.data[at..at + 4].try_into().expect("4 bytes"))
    }

    fn string(&self, offset: u32) -> String {
        let start = self.strings + offset as usize;
        let end = self.strings + self.strings_len;
        let bytes = &self.data[start.min(end)..end];
        let len = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..len]).into_owned()
    }

    fn get(&self, id: u32) -> Option<&Type> {
        self.types.get((id as usize).checked_sub(1)?)
    }

    fn members(&self, id: u32) -> Vec<Member> {
        let Some(t) = self
            .get(id)
            .filter(|t| matches!(t.kind, BTF_KIND_STRUCT | BTF_KIND_UNION))
        else {
            return Vec::new();
        };
        (0..t.vlen)
            .map(|i| {
                let at = t.extra + i * 12;
                let offset = self.u32_at(at + 8);
                Member {
                    name: self.string(self.u32_at(at)),
                    type_id: self.u32_at(at + 4),
                    // With kind_flag, the high 8 bits are a bitfield size.
                    bit_offset: if t.kind_flag {
                        offset & 0x00ff_ffff
                    } else {
                        offset
                    },
                }
            })
            .collect()
    }

    /// Byte offset of `member` in `struct name`, looking through anonymous
    /// structs and unions as C does (`skb->dev` sits in nested unions).
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u32> {
        let id = self
            .by_name
            .get(&(BTF_KIND_STRUCT, name.to_string()))
            .copied()
            .ok_or_else(|| anyhow!("the kernel's BTF has no struct {name}"))?;
        let bits = self
            .find_member(id, member)
            .ok_or_else(|| anyhow!("the kernel's struct {name} has no member {member}"))?;
        if bits % 8 != 0 {
            bail!("{name}.{member} is a bitfield");
        }
        Ok(bits / 8)
    }

    fn find_member(&self, id: u32, member: &str) -> Option<u32> {
        for m in self.members(id) {
            if m.name == member {
                return Some(m.bit_offset);
            }
            if m.name.is_empty() {
                if let Some(inner) = self.find_member(m.type_id, member) {
                    return Some(m.bit_offset + inner);
                }
            }
        }
        None
    }

    /// Whether `enum name` has a value called `value`: how a kernel says
    /// it knows a map type or attach type (`BPF_MAP_TYPE_RINGBUF`), which
    /// follows backports where a version number would not.
    pub fn has_enum_value(&self, name: &str, value: &str) -> bool {
        self.enum_values(name)
            .is_ok_and(|values| values.iter().any(|(v, _)| v == value))
    }

    /// How many arguments a raw tracepoint hands its programs: the
    /// parameters of `btf_trace_<name>` (a typedef of a pointer to a
    /// function whose first parameter is the context), less that context.
    pub fn tracepoint_args(&self, name: &str) -> Result<usize> {
        let typedef = format!("btf_trace_{name}");
        let id = self
            .by_name
            .get(&(BTF_KIND_TYPEDEF, typedef.clone()))
            .copied()
            .ok_or_else(|| anyhow!("the kernel's BTF has no {typedef}"))?;
        // TYPEDEF and PTR name their target where a size would be.
        let target = |id: u32| self.get(id).map(|t| self.u32_at(t.extra - 4));
        let proto = target(id)
            .and_then(target)
            .and_then(|proto| self.get(proto))
            .filter(|t| t.kind == BTF_KIND_FUNC_PROTO)
            .ok_or_else(|| anyhow!("{typedef} is not a pointer to a function"))?;
        Ok(proto.vlen.saturating_sub(1))
    }

    /// The values of `enum name` (or enum64), as (name, value).
    pub fn enum_values(&self, name: &str) -> Result<Vec<(String, i64)>> {
        let id = self
            .by_name
            .get(&(BTF_KIND_ENUM, name.to_string()))
            .or_else(|| self.by_name.get(&(BTF_KIND_ENUM64, name.to_string())))
            .copied()
            .ok_or_else(|| anyhow!("the kernel's BTF has no enum {name}"))?;
        let t = self.get(id).expect("indexed");
        Ok((0..t.vlen)
            .map(|i| {
                if t.kind == BTF_KIND_ENUM {
                    let at = t.extra + i * 8;
                    (
                        self.string(self.u32_at(at)),
                        i64::from(self.u32_at(at + 4) as i32),
                    )
                } else {
                    let at = t.extra + i * 12;
                    let value =
                        u64::from(self.u32_at(at + 4)) | u64::from(self.u32_at(at + 8)) << 32;
                    (self.string(self.u32_at(at)), value as i64)
                }
            })
            .collect())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A hand-built BTF blob: `struct outer { int a; union { struct { int b;
    /// long c; }; int d; }; }` and `enum reason { R_OK = 0, R_DROP = 12 }`.
    pub(crate) fn sample() -> Vec<u8> {
        let strings =
            b"\0int\0outer\0a\0b\0c\0d\0reason\0R_OK\0R_DROP\0long\0btf_trace_kfree_skb\0";
        let s = |name: &str| -> u32 {
            let needle = [name.as_bytes(), b"\0"].concat();
            strings
                .windows(needle.len())
                .position(|w| w == needle)
                .unwrap() as u32
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            words
                .iter()
                .for_each(|w| types.extend_from_slice(&w.to_le_bytes()))
        };
        let info = |kind: u32, vlen: u32| (kind << 24) | vlen;
        push(&[s("int"), info(BTF_KIND_INT, 0), 4, 32]); // 1: int
        push(&[s("long"), info(BTF_KIND_INT, 0), 8, 64]); // 2: long
        push(&[0, info(BTF_KIND_STRUCT, 2), 16, s("b"), 1, 0, s("c"), 2, 64]); // 3: anon struct
        push(&[0, info(BTF_KIND_UNION, 2), 16, 0, 3, 0, s("d"), 1, 0]); // 4: anon union
        push(&[
            s("outer"),
            info(BTF_KIND_STRUCT, 2),
            24,
            s("a"),
            1,
            0,
            0,
            4,
            64,
        ]); // 5: outer
        push(&[
            s("reason"),
            info(BTF_KIND_ENUM, 2),
            4,
            s("R_OK"),
            0,
            s("R_DROP"),
            12,
        ]); // 6
            // `typedef void (*btf_trace_kfree_skb)(void *, long, long)`: the
            // context and two tracepoint arguments.
        push(&[0, info(BTF_KIND_FUNC_PROTO, 3), 0, 0, 2, 0, 2, 0, 2]); // 7
        push(&[0, info(BTF_KIND_PTR, 0), 7]); // 8
        push(&[s("btf_trace_kfree_skb"), info(BTF_KIND_TYPEDEF, 0), 8]); // 9
        let mut blob = Vec::new();
        blob.extend_from_slice(&MAGIC.to_le_bytes());
        blob.extend_from_slice(&[1, 0]);
        for word in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            blob.extend_from_slice(&word.to_le_bytes());
        }
        blob.extend_from_slice(&types);
        blob.extend_from_slice(strings);
        blob
    }

    #[test]
    fn offsets_through_anonymous_members_and_enum_names() {
        let btf = Btf::parse(sample()).unwrap();
        assert_eq!(btf.member_offset("outer", "a").unwrap(), 0);
        assert_eq!(btf.member_offset("outer", "b").unwrap(), 8);
        assert_eq!(btf.member_offset("outer", "c").unwrap(), 16);
        assert_eq!(btf.member_offset("outer", "d").unwrap(), 8);
        assert!(btf
            .member_offset("outer", "zz")
            .unwrap_err()
            .to_string()
            .contains("no member zz"));
        assert!(btf.member_offset("nope", "a").is_err());
        assert_eq!(
            btf.enum_values("reason").unwrap(),
            [("R_OK".to_string(), 0), ("R_DROP".to_string(), 12)]
        );
    }

    #[test]
    fn a_tracepoints_arguments_are_counted_without_its_context() {
        let btf = Btf::parse(sample()).unwrap();
        assert_eq!(btf.tracepoint_args("kfree_skb").unwrap(), 2);
        assert!(btf.tracepoint_args("consume_skb").is_err());
        assert!(btf.has_enum_value("reason", "R_DROP"));
        assert!(!btf.has_enum_value("reason", "R_NONE"));
        assert!(!btf.has_enum_value("nope", "R_OK"));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(Btf::parse(vec![0; 8]).is_err());
        let mut truncated = sample();
        truncated.truncate(40);
        assert!(Btf::parse(truncated).is_err());
    }
}
