//! A small BTF reader: enough to find struct/union member byte offsets by name, in
//! vmlinux BTF and in split module BTF (`/sys/kernel/btf/<module>` on top of vmlinux).
//! Every malformed input is an error naming what is wrong, never a panic.

use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum BtfError {
    #[error("malformed BTF ({what}): {detail}")]
    Malformed { what: String, detail: String },
    #[error("BTF {what}: struct {strukt} not found")]
    NoStruct { what: String, strukt: String },
    #[error("BTF {what}: struct {strukt} has no member {member}")]
    NoMember {
        what: String,
        strukt: String,
        member: String,
    },
    #[error("BTF {what}: {strukt}.{member} is a bitfield (bit offset {bits})")]
    Bitfield {
        what: String,
        strukt: String,
        member: String,
        bits: u32,
    },
    #[error("reading {path}: {err}")]
    Io { path: String, err: String },
}

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// Members one `member_offset` lookup looks at, at most (vmlinux: a few hundred).
const MAX_MEMBERS_SEARCHED: usize = 1 << 16;

#[derive(Debug, Clone)]
struct Member {
    name_off: u32,
    type_id: u32,
    bit_offset: u32,
}

#[derive(Debug, Clone)]
enum Ty {
    /// struct or union with members
    Composite {
        name_off: u32,
        members: Vec<Member>,
    },
    /// typedef / const / volatile / restrict / type_tag: follow `to`
    Alias {
        to: u32,
    },
    Other,
}

/// Parsed BTF (a base, or a split module merged on top of its base).
#[derive(Debug, Clone)]
pub struct Btf {
    what: String,
    /// Index = type id; id 0 is void.
    types: Vec<Ty>,
    strings: Vec<u8>,
    by_name: HashMap<String, u32>,
}

fn rd32(d: &[u8], off: usize) -> Option<u32> {
    d.get(off..off + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

impl Btf {
    /// Parse a standalone (base) BTF blob, e.g. /sys/kernel/btf/vmlinux.
    pub fn parse(what: &str, data: &[u8]) -> Result<Btf, BtfError> {
        let mut b = Btf {
            what: what.to_string(),
            types: vec![Ty::Other],
            strings: Vec::new(),
            by_name: HashMap::new(),
        };
        b.add(data, 0)?;
        Ok(b)
    }

    /// Parse module BTF whose type ids and string offsets continue those of `base`.
    pub fn parse_split(what: &str, data: &[u8], base: &Btf) -> Result<Btf, BtfError> {
        let mut b = base.clone();
        b.what = what.to_string();
        let base_str = b.strings.len() as u32;
        b.add(data, base_str)?;
        Ok(b)
    }

    pub fn from_file(path: &Path, base: Option<&Btf>) -> Result<Btf, BtfError> {
        let data = std::fs::read(path).map_err(|e| BtfError::Io {
            path: path.display().to_string(),
            err: e.to_string(),
        })?;
        let what = path.display().to_string();
        match base {
            Some(base) => Btf::parse_split(&what, &data, base),
            None => Btf::parse(&what, &data),
        }
    }

    fn bad(&self, detail: impl Into<String>) -> BtfError {
        BtfError::Malformed {
            what: self.what.clone(),
            detail: detail.into(),
        }
    }

    fn add(&mut self, d: &[u8], str_base: u32) -> Result<(), BtfError> {
        if d.len() < 24 {
            return Err(self.bad(format!(
                "{} bytes, shorter than the 24-byte header",
                d.len()
            )));
        }
        let magic = u16::from_le_bytes([d[0], d[1]]);
        if magic != MAGIC {
            return Err(self.bad(format!(
                "bad magic {magic:#06x} (want 0xeb9f, little-endian)"
            )));
        }
        if d[2] != 1 {
            return Err(self.bad(format!("unsupported version {}", d[2])));
        }
        let h = |i| rd32(d, i).unwrap_or(0) as usize;
        let (hdr_len, type_off, type_len, str_off, str_len) = (h(4), h(8), h(12), h(16), h(20));
        let sec = |off: usize, len: usize, name: &str| -> Result<&[u8], BtfError> {
            let start = hdr_len.checked_add(off);
            let end = start.and_then(|s| s.checked_add(len));
            match (start, end) {
                (Some(s), Some(e)) if e <= d.len() => Ok(&d[s..e]),
                _ => Err(self.bad(format!(
                    "{name} section {off}+{len} beyond {} bytes",
                    d.len()
                ))),
            }
        };
        let types = sec(type_off, type_len, "type")?;
        let strs = sec(str_off, str_len, "string")?;
        if str_base == 0 && strs.first().is_some_and(|c| *c != 0) {
            return Err(self.bad("string section does not start with NUL"));
        }
        self.strings.extend_from_slice(strs);
        let mut p = 0usize;
        while p < types.len() {
            let at = p;
            let trunc = || BtfError::Malformed {
                what: self.what.clone(),
                detail: format!("type {} truncated at byte {at}", self.types.len()),
            };
            let name_off = rd32(types, p).ok_or_else(trunc)?;
            let info = rd32(types, p + 4).ok_or_else(trunc)?;
            let size_or_type = rd32(types, p + 8).ok_or_else(trunc)?;
            p += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kflag = info >> 31 == 1;
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
                k => {
                    return Err(self.bad(format!("type {} has unknown kind {k}", self.types.len())))
                }
            };
            if p + extra > types.len() {
                return Err(trunc());
            }
            let ty = match kind {
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        let m = p + 12 * i;
                        let raw = rd32(types, m + 8).ok_or_else(trunc)?;
                        members.push(Member {
                            name_off: rd32(types, m).ok_or_else(trunc)?,
                            type_id: rd32(types, m + 4).ok_or_else(trunc)?,
                            // with kind_flag the top 8 bits hold the bitfield size
                            bit_offset: if kflag { raw & 0xff_ffff } else { raw },
                        });
                    }
                    Ty::Composite { name_off, members }
                }
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    Ty::Alias { to: size_or_type }
                }
                _ => Ty::Other,
            };
            p += extra;
            if let Ty::Composite { name_off, members } = &ty {
                let name = self.str_at(*name_off)?.to_string();
                for m in members {
                    self.str_at(m.name_off)?;
                }
                // First complete definition wins (forward declarations are KIND_FWD).
                if !name.is_empty() {
                    let id = self.types.len() as u32;
                    self.by_name.entry(name).or_insert(id);
                }
            }
            self.types.push(ty);
        }
        // Member type ids must point at existing types.
        let n = self.types.len() as u32;
        for (id, t) in self.types.iter().enumerate() {
            match t {
                Ty::Composite { members, .. } => {
                    if let Some(m) = members.iter().find(|m| m.type_id >= n) {
                        return Err(self.bad(format!(
                            "type {id} member refers to type {} of {n}",
                            m.type_id
                        )));
                    }
                }
                Ty::Alias { to } if *to >= n => {
                    return Err(self.bad(format!("type {id} refers to type {to} of {n}")))
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn str_at(&self, off: u32) -> Result<&str, BtfError> {
        let s = self.strings.get(off as usize..).ok_or_else(|| {
            self.bad(format!(
                "string offset {off} beyond {} bytes",
                self.strings.len()
            ))
        })?;
        let end = s
            .iter()
            .position(|c| *c == 0)
            .ok_or_else(|| self.bad(format!("string at {off} not NUL-terminated")))?;
        std::str::from_utf8(&s[..end]).map_err(|_| self.bad(format!("string at {off} not UTF-8")))
    }

    pub fn has_struct(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// Byte offset of `member` in struct/union `strukt`, looking through anonymous
    /// struct/union members.
    pub fn member_offset(&self, strukt: &str, member: &str) -> Result<u32, BtfError> {
        let id = *self.by_name.get(strukt).ok_or_else(|| BtfError::NoStruct {
            what: self.what.clone(),
            strukt: strukt.into(),
        })?;
        let mut budget = MAX_MEMBERS_SEARCHED;
        let bits = self
            .find_member(id, member, 0, 0, &mut budget)
            .ok_or_else(|| BtfError::NoMember {
                what: self.what.clone(),
                strukt: strukt.into(),
                member: member.into(),
            })?;
        if bits % 8 != 0 {
            return Err(BtfError::Bitfield {
                what: self.what.clone(),
                strukt: strukt.into(),
                member: member.into(),
                bits,
            });
        }
        Ok(bits / 8)
    }

    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.types.get(id as usize) {
                Some(Ty::Alias { to }) => id = *to,
                _ => break,
            }
        }
        id
    }

    /// Malformed BTF can nest a struct in itself through anonymous members, which would
    /// make the search exponential: `budget` bounds the members it looks at. Offsets that
    /// overflow are not found either.
    fn find_member(
        &self,
        id: u32,
        member: &str,
        base_bits: u32,
        depth: u32,
        budget: &mut usize,
    ) -> Option<u32> {
        if depth > 8 {
            return None;
        }
        let Some(Ty::Composite { members, .. }) = self.types.get(id as usize) else {
            return None;
        };
        *budget = budget.checked_sub(members.len())?;
        for m in members {
            let name = self.str_at(m.name_off).ok()?;
            if name == member {
                return base_bits.checked_add(m.bit_offset);
            }
        }
        for m in members
            .iter()
            .filter(|m| self.str_at(m.name_off).is_ok_and(str::is_empty))
        {
            let Some(bits) = base_bits.checked_add(m.bit_offset) else {
                continue;
            };
            if let Some(b) =
                self.find_member(self.resolve(m.type_id), member, bits, depth + 1, budget)
            {
                return Some(b);
            }
        }
        None
    }
}

/// Kernel offsets the kprobe programs need (`agent_common::event::KOFF_*`), resolved from
/// `<btf_dir>/vmlinux` plus the first of `ib_core`, `ib_uverbs` that defines `ib_qp`
/// (or vmlinux itself when RDMA is built in).
pub fn resolve_kernel_offsets(
    btf_dir: &Path,
) -> Result<[u32; rpingmesh_agent_common::event::KOFF_COUNT], BtfError> {
    let vmlinux = Btf::from_file(&btf_dir.join("vmlinux"), None)?;
    let mut btf = None;
    for module in ["ib_core", "ib_uverbs"] {
        let p = btf_dir.join(module);
        if p.exists() {
            let m = Btf::from_file(&p, Some(&vmlinux))?;
            if m.has_struct("ib_qp") {
                btf = Some(m);
                break;
            }
        }
    }
    let btf = btf.unwrap_or(vmlinux);
    kernel_offsets_from(&btf)
}

/// The task offsets alone (vmlinux BTF), for the exit program in uprobe mode, where the
/// ib_core structs need not exist.
pub fn resolve_task_offsets(
    btf_dir: &Path,
) -> Result<[u32; rpingmesh_agent_common::event::KOFF_COUNT], BtfError> {
    let vmlinux = Btf::from_file(&btf_dir.join("vmlinux"), None)?;
    task_offsets_from(&vmlinux)
}

/// Task and signal members every tracing mode uses (process identity, exit).
const TASK_MEMBERS: [(usize, &str, &str); 4] = {
    use rpingmesh_agent_common::event::*;
    [
        (KOFF_TASK_TGID, "task_struct", "tgid"),
        (KOFF_TASK_COMM, "task_struct", "comm"),
        (KOFF_TASK_SIGNAL, "task_struct", "signal"),
        (KOFF_SIGNAL_LIVE, "signal_struct", "live"),
    ]
};

/// Offsets of the task members only (`KOFF_EXIT_VALID` set, `KOFF_VALID` not).
pub fn task_offsets_from(
    btf: &Btf,
) -> Result<[u32; rpingmesh_agent_common::event::KOFF_COUNT], BtfError> {
    use rpingmesh_agent_common::event::*;
    let mut o = [0u32; KOFF_COUNT];
    for (idx, s, m) in TASK_MEMBERS {
        o[idx] = btf.member_offset(s, m)?;
    }
    o[KOFF_EXIT_VALID] = 1;
    Ok(o)
}

/// Offsets from an already-parsed BTF that defines the ib_core structs.
pub fn kernel_offsets_from(
    btf: &Btf,
) -> Result<[u32; rpingmesh_agent_common::event::KOFF_COUNT], BtfError> {
    use rpingmesh_agent_common::event::*;
    let mut o = task_offsets_from(btf)?;
    let table = [
        (KOFF_QP_DEVICE, "ib_qp", "device"),
        (KOFF_QP_QP_NUM, "ib_qp", "qp_num"),
        (KOFF_QP_QP_TYPE, "ib_qp", "qp_type"),
        (KOFF_QP_PORT, "ib_qp", "port"),
        (KOFF_DEVICE_NAME, "ib_device", "name"),
        (KOFF_ATTR_QP_STATE, "ib_qp_attr", "qp_state"),
        (KOFF_ATTR_DEST_QP_NUM, "ib_qp_attr", "dest_qp_num"),
        (KOFF_ATTR_PORT_NUM, "ib_qp_attr", "port_num"),
        (KOFF_ATTR_AH_ATTR, "ib_qp_attr", "ah_attr"),
        (KOFF_AH_GRH, "rdma_ah_attr", "grh"),
        (KOFF_AH_SL, "rdma_ah_attr", "sl"),
        (KOFF_AH_PORT_NUM, "rdma_ah_attr", "port_num"),
        (KOFF_AH_FLAGS, "rdma_ah_attr", "ah_flags"),
        (KOFF_GRH_DGID, "ib_global_route", "dgid"),
        (KOFF_GRH_FLOW_LABEL, "ib_global_route", "flow_label"),
        (KOFF_GRH_SGID_INDEX, "ib_global_route", "sgid_index"),
        (KOFF_GRH_HOP_LIMIT, "ib_global_route", "hop_limit"),
        (KOFF_GRH_TRAFFIC_CLASS, "ib_global_route", "traffic_class"),
        (KOFF_QP_RES, "ib_qp", "res"),
        (KOFF_RES_TASK, "rdma_restrack_entry", "task"),
    ];
    for (idx, s, m) in table {
        o[idx] = btf.member_offset(s, m)?;
    }
    o[KOFF_VALID] = 1;
    Ok(o)
}

/// A BTF blob around a type section and a string section: the header the parser reads
/// (magic 0xeb9f, version 1, no flags, 24 header bytes, then the sections' offsets and
/// lengths). The tests and the fuzz seeds build their BTF with it.
#[doc(hidden)]
pub fn encode_blob(types: &[u8], strings: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(24 + types.len() + strings.len());
    d.extend_from_slice(&0xeb9fu16.to_le_bytes());
    d.extend_from_slice(&[1, 0]);
    let (tl, sl) = (types.len() as u32, strings.len() as u32);
    for v in [24u32, 0, tl, tl, sl] {
        d.extend_from_slice(&v.to_le_bytes());
    }
    d.extend_from_slice(types);
    d.extend_from_slice(strings);
    d
}

#[cfg(test)]
pub(crate) mod testutil {
    /// Build a tiny BTF blob: `struct outer { int a; union { int b; int c; }; int d:3 bitfield at bit 66 }`.
    pub fn tiny() -> Vec<u8> {
        let strings = b"\0int\0outer\0a\0b\0c\0d\0".to_vec();
        // offsets: int=1 outer=5 a=11 b=13 c=15 d=17
        let mut t = Vec::new();
        let ty = |t: &mut Vec<u8>, name: u32, info: u32, sz: u32| {
            t.extend_from_slice(&name.to_le_bytes());
            t.extend_from_slice(&info.to_le_bytes());
            t.extend_from_slice(&sz.to_le_bytes());
        };
        let mem = |t: &mut Vec<u8>, name: u32, ty: u32, off: u32| {
            t.extend_from_slice(&name.to_le_bytes());
            t.extend_from_slice(&ty.to_le_bytes());
            t.extend_from_slice(&off.to_le_bytes());
        };
        // 1: int
        ty(&mut t, 1, 1 << 24, 4);
        t.extend_from_slice(&32u32.to_le_bytes());
        // 2: anonymous union { b; c }
        ty(&mut t, 0, (5 << 24) | 2, 4);
        mem(&mut t, 13, 1, 0);
        mem(&mut t, 15, 1, 0);
        // 3: struct outer { a @0; <anon> @32; d @66 }
        ty(&mut t, 5, (4 << 24) | 3, 12);
        mem(&mut t, 11, 1, 0);
        mem(&mut t, 0, 2, 32);
        mem(&mut t, 17, 1, 66);
        super::encode_blob(&t, &strings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BTF with one `int` and the given structs (members all `int`, byte offsets).
    fn build(structs: &[(&str, &[(&str, u32)])]) -> Vec<u8> {
        let mut strings = b"\0int\0".to_vec();
        let mut name = |s: &str| {
            let off = strings.len() as u32;
            strings.extend_from_slice(s.as_bytes());
            strings.push(0);
            off
        };
        let mut t = Vec::new();
        let w = |t: &mut Vec<u8>, v: [u32; 3]| {
            v.iter().for_each(|x| t.extend_from_slice(&x.to_le_bytes()))
        };
        w(&mut t, [1, 1 << 24, 4]);
        t.extend_from_slice(&32u32.to_le_bytes());
        for (sname, members) in structs {
            let n = name(sname);
            w(&mut t, [n, (4 << 24) | members.len() as u32, 256]);
            for (m, off) in members.iter() {
                let mn = name(m);
                w(&mut t, [mn, 1, off * 8]);
            }
        }
        super::encode_blob(&t, &strings)
    }

    #[test]
    fn kernel_offsets_from_ib_structs() {
        use rpingmesh_agent_common::event::*;
        let data = build(&[
            (
                "ib_qp",
                &[
                    ("device", 0),
                    ("qp_num", 120),
                    ("qp_type", 132),
                    ("port", 140),
                    ("res", 160),
                ],
            ),
            ("ib_device", &[("name", 40)]),
            ("rdma_restrack_entry", &[("task", 16)]),
            (
                "task_struct",
                &[("tgid", 1200), ("comm", 1800), ("signal", 2000)],
            ),
            ("signal_struct", &[("live", 4)]),
            (
                "ib_qp_attr",
                &[
                    ("qp_state", 0),
                    ("dest_qp_num", 28),
                    ("ah_attr", 48),
                    ("port_num", 200),
                ],
            ),
            (
                "rdma_ah_attr",
                &[("grh", 0), ("sl", 40), ("port_num", 44), ("ah_flags", 48)],
            ),
            (
                "ib_global_route",
                &[
                    ("dgid", 8),
                    ("flow_label", 24),
                    ("sgid_index", 28),
                    ("hop_limit", 29),
                    ("traffic_class", 30),
                ],
            ),
        ]);
        let b = Btf::parse("synthetic", &data).unwrap();
        let o = kernel_offsets_from(&b).unwrap();
        assert_eq!(o[KOFF_VALID], 1);
        assert_eq!(
            (o[KOFF_QP_QP_NUM], o[KOFF_QP_PORT], o[KOFF_DEVICE_NAME]),
            (120, 140, 40)
        );
        assert_eq!(
            (
                o[KOFF_ATTR_AH_ATTR],
                o[KOFF_ATTR_PORT_NUM],
                o[KOFF_AH_FLAGS]
            ),
            (48, 200, 48)
        );
        assert_eq!(
            (
                o[KOFF_GRH_DGID],
                o[KOFF_GRH_FLOW_LABEL],
                o[KOFF_GRH_TRAFFIC_CLASS]
            ),
            (8, 24, 30)
        );
        assert_eq!(
            (
                o[KOFF_QP_RES],
                o[KOFF_RES_TASK],
                o[KOFF_TASK_TGID],
                o[KOFF_TASK_COMM]
            ),
            (160, 16, 1200, 1800)
        );
        assert_eq!(
            (o[KOFF_TASK_SIGNAL], o[KOFF_SIGNAL_LIVE], o[KOFF_EXIT_VALID]),
            (2000, 4, 1)
        );
        // Uprobe mode: the task members alone.
        let t = task_offsets_from(&b).unwrap();
        assert_eq!(
            (t[KOFF_VALID], t[KOFF_EXIT_VALID], t[KOFF_TASK_SIGNAL]),
            (0, 1, 2000)
        );
        // A kernel whose ib_qp lacks a member: error names it.
        let data = build(&[
            ("ib_qp", &[("device", 0)]),
            ("task_struct", &[("tgid", 1), ("comm", 2), ("signal", 3)]),
            ("signal_struct", &[("live", 4)]),
        ]);
        let e = kernel_offsets_from(&Btf::parse("k", &data).unwrap()).unwrap_err();
        assert_eq!(e.to_string(), "BTF k: struct ib_qp has no member qp_num");
    }

    #[test]
    fn split_btf_continues_base_ids_and_strings() {
        let base = Btf::parse("base", &testutil::tiny()).unwrap();
        // A split blob: one struct whose member refers to base type 1 (int).
        let strings = b"\0modst\0m\0".to_vec();
        let base_str = base.strings.len() as u32;
        let mut t = Vec::new();
        for v in [base_str + 1, (4 << 24) | 1, 4, base_str + 7, 1, 32] {
            t.extend_from_slice(&v.to_le_bytes());
        }
        let d = super::encode_blob(&t, &strings);
        let m = Btf::parse_split("mod", &d, &base).unwrap();
        assert_eq!(m.member_offset("modst", "m"), Ok(4));
        assert_eq!(m.member_offset("outer", "c"), Ok(4));
    }

    #[test]
    fn tiny_offsets_and_anonymous_members() {
        let b = Btf::parse("tiny", &testutil::tiny()).unwrap();
        assert_eq!(b.member_offset("outer", "a"), Ok(0));
        assert_eq!(b.member_offset("outer", "c"), Ok(4));
        assert!(matches!(
            b.member_offset("outer", "d"),
            Err(BtfError::Bitfield { bits: 66, .. })
        ));
        assert!(matches!(
            b.member_offset("outer", "zz"),
            Err(BtfError::NoMember { .. })
        ));
        assert!(matches!(
            b.member_offset("nope", "a"),
            Err(BtfError::NoStruct { .. })
        ));
    }

    #[test]
    fn malformed_inputs_are_errors() {
        let good = testutil::tiny();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", vec![]),
            ("bad magic", {
                let mut d = good.clone();
                d[0] = 0;
                d
            }),
            ("truncated", good[..good.len() - 20].to_vec()),
            ("types cut", {
                let mut d = good.clone();
                d.truncate(24 + 30);
                d
            }),
            ("unknown kind", {
                let mut d = good.clone();
                d[24 + 7] = 30;
                d
            }),
            ("bad string offset", {
                let mut d = good.clone();
                d[24 + 12 + 4 + 12] = 0xff;
                d[24 + 12 + 4 + 13] = 0xff;
                d
            }),
            ("dangling type id", {
                let mut d = good.clone();
                d[24 + 16 + 12 + 4] = 99;
                d
            }),
        ];
        for (name, data) in cases {
            let r = Btf::parse("t", &data);
            assert!(
                matches!(r, Err(BtfError::Malformed { .. })),
                "{name}: {r:?}"
            );
            let msg = r.unwrap_err().to_string();
            assert!(msg.starts_with("malformed BTF (t)"), "{name}: {msg}");
        }
    }

    /// BTF of `struct task_struct` (type 1) with `members` (name offset, type, bit
    /// offset; name 0 is anonymous, 13 is "tgid") and an anonymous struct (type 2)
    /// holding `tgid` at bit 32.
    fn nested(members: &[(u32, u32, u32)]) -> Vec<u8> {
        let strings = b"\0task_struct\0tgid\0";
        let mut t = Vec::new();
        let w = |t: &mut Vec<u8>, v: [u32; 3]| {
            v.iter().for_each(|x| t.extend_from_slice(&x.to_le_bytes()))
        };
        w(&mut t, [1, (4 << 24) | members.len() as u32, 8]);
        for m in members {
            w(&mut t, [m.0, m.1, m.2]);
        }
        w(&mut t, [0, (4 << 24) | 1, 8]);
        w(&mut t, [13, 1, 32]);
        super::encode_blob(&t, strings)
    }

    #[test]
    fn offsets_through_anonymous_members_that_overflow_are_not_found() {
        let b = Btf::parse("t", &nested(&[(0, 2, 64)])).unwrap();
        assert_eq!(b.member_offset("task_struct", "tgid"), Ok(12));
        // Found by fuzzing: the nested offset overflowed u32 (a panic in debug builds).
        let b = Btf::parse("t", &nested(&[(0, 2, u32::MAX - 7)])).unwrap();
        let e = b.member_offset("task_struct", "tgid").unwrap_err();
        assert!(matches!(e, BtfError::NoMember { .. }), "{e}");
    }

    #[test]
    fn a_struct_nested_in_itself_ends_quickly() {
        // 24 anonymous members that are the struct itself: 24^9 visits without a bound.
        let b = Btf::parse("t", &nested(&[(0, 1, 0); 24])).unwrap();
        let started = std::time::Instant::now();
        let e = b.member_offset("task_struct", "tgid").unwrap_err();
        assert!(matches!(e, BtfError::NoMember { .. }), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
