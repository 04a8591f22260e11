//! Fabric topology for localization (pure): which spines each ToR links to, and
//! optionally the ECMP hash that picks a spine for (source GID, destination GID, flow
//! label). With the hash, a failing probe names the two ToR-spine links it crossed; without
//! it, link problems are localized to a ToR's uplink or downlink side only.
//!
//! The one hash model shipped, `fnv1a`, is the one the simulated fabric (`sim/`) uses.
//! Real switches hash 5-tuples with vendor functions; a deployment that knows its hash
//! (or traces label paths) plugs another model in here.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

/// How packets pick a spine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EcmpModel {
    /// FNV-1a (64-bit) over the source GID text, the destination GID text, the label's
    /// four little-endian bytes and the seed's, modulo the ToR's uplink count.
    Fnv1a { seed: u32 },
}

/// Index of the uplink, in `0..uplinks`, that a packet from `src_gid` to `dst_gid` with
/// `flow_label` takes under `fnv1a` with `seed`. `uplinks` 0 gives 0.
pub fn fnv1a_uplink(
    src_gid: &str,
    dst_gid: &str,
    flow_label: u32,
    seed: u32,
    uplinks: usize,
) -> usize {
    if uplinks == 0 {
        return 0;
    }
    fnv1a_finish(fnv1a_pair(src_gid, dst_gid), flow_label, seed, uplinks)
}

fn fnv1a_eat(h: u64, bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes
        .into_iter()
        .fold(h, |h, b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The FNV-1a state after a GID pair (the part of the hash every label of the pair shares).
fn fnv1a_pair(src_gid: &str, dst_gid: &str) -> u64 {
    let h = fnv1a_eat(0xcbf2_9ce4_8422_2325, src_gid.bytes());
    let h = fnv1a_eat(h, [0xff]);
    let h = fnv1a_eat(h, dst_gid.bytes());
    fnv1a_eat(h, [0xff])
}

fn fnv1a_finish(pair: u64, flow_label: u32, seed: u32, uplinks: usize) -> usize {
    // The label's and the seed's bytes as one array: localization hashes millions of
    // labels a window, and a chained iterator here cost more than the hash.
    let (l, s) = (flow_label.to_le_bytes(), seed.to_le_bytes());
    let mut h = fnv1a_eat(pair, [l[0], l[1], l[2], l[3], s[0], s[1], s[2], s[3]]);
    // Final avalanche so the low bits depend on every input byte.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    (h % uplinks as u64) as usize
}

/// The spines one (source GID, destination GID) pair's labels take, with the GIDs hashed
/// once: localization routes every label of a path. Borrows the ToR's uplinks when both
/// ToRs have the same (a full mesh): no allocation per path.
#[derive(Debug, Clone)]
pub struct PairRoute<'t> {
    usable: Cow<'t, [u32]>,
    pair: u64,
    seed: u32,
}

impl PairRoute<'_> {
    /// The spine label `flow_label` of the pair crosses (what `spine_of` says).
    pub fn spine(&self, flow_label: u32) -> u32 {
        self.usable[fnv1a_finish(self.pair, flow_label, self.seed, self.usable.len())]
    }

    /// The spines the pair's labels spread over.
    pub fn spines(&self) -> &[u32] {
        &self.usable
    }
}

/// Direction of a ToR-spine link a probe crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LinkDir {
    /// ToR to spine.
    Up,
    /// Spine to ToR.
    Down,
}

impl LinkDir {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkDir::Up => "up",
            LinkDir::Down => "down",
        }
    }
}

/// One direction of one ToR-spine link: (ToR index, spine index, direction).
pub type DirLink = (u32, u32, LinkDir);

#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    tors: Vec<String>,
    tor_ids: HashMap<String, u32>,
    spines: Vec<String>,
    /// Per ToR, its spines (indices into `spines`) in the order the hash indexes them.
    uplinks: Vec<Vec<u32>>,
    ecmp: Option<EcmpModel>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TopologyError {
    #[error("topology: {0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> TopologyError {
    TopologyError::Invalid(msg.into())
}

/// The topology file (YAML):
/// ```yaml
/// spines: [spine1, spine2]
/// tors:                      # every ToR and its spines, in hash order
///   tor1: [spine1, spine2]
///   tor2: [spine1, spine2]
/// ecmp: {model: fnv1a, seed: 0}   # optional
/// ```
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopologyFile {
    spines: Vec<String>,
    tors: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    ecmp: Option<EcmpFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EcmpFile {
    model: String,
    #[serde(default)]
    seed: u32,
}

impl Topology {
    /// Every ToR linked to every spine, in the spines' order.
    pub fn full_mesh(tors: &[String], spines: &[String], ecmp: Option<EcmpModel>) -> Self {
        let all: Vec<u32> = (0..spines.len() as u32).collect();
        let links = tors.iter().map(|t| (t.clone(), all.clone())).collect();
        Self::from_links(links, spines.to_vec(), ecmp)
    }

    fn from_links(
        links: Vec<(String, Vec<u32>)>,
        spines: Vec<String>,
        ecmp: Option<EcmpModel>,
    ) -> Self {
        let mut tors = Vec::with_capacity(links.len());
        let mut uplinks = Vec::with_capacity(links.len());
        let mut tor_ids = HashMap::with_capacity(links.len());
        for (t, l) in links {
            tor_ids.insert(t.clone(), tors.len() as u32);
            tors.push(t);
            uplinks.push(l);
        }
        Topology {
            tors,
            tor_ids,
            spines,
            uplinks,
            ecmp,
        }
    }

    /// Parses and checks a topology file; every error names what is wrong.
    pub fn from_yaml(text: &str) -> Result<Self, TopologyError> {
        let f: TopologyFile = serde_saphyr::from_str(text)
            .map_err(|e| invalid(format!("not a topology file: {e}")))?;
        if f.spines.is_empty() {
            return Err(invalid("`spines` is empty"));
        }
        if f.tors.is_empty() {
            return Err(invalid("`tors` is empty"));
        }
        let mut spine_ids = HashMap::new();
        for (i, s) in f.spines.iter().enumerate() {
            if s.is_empty() {
                return Err(invalid("a spine has an empty name"));
            }
            if spine_ids.insert(s.as_str(), i as u32).is_some() {
                return Err(invalid(format!("spine `{s}` is listed twice")));
            }
        }
        let mut links = Vec::with_capacity(f.tors.len());
        for (tor, ups) in &f.tors {
            if ups.is_empty() {
                return Err(invalid(format!("ToR `{tor}` has no spines")));
            }
            let mut ids = Vec::with_capacity(ups.len());
            for s in ups {
                let Some(&id) = spine_ids.get(s.as_str()) else {
                    return Err(invalid(format!(
                        "ToR `{tor}` links to `{s}`, which is not in `spines`"
                    )));
                };
                if ids.contains(&id) {
                    return Err(invalid(format!("ToR `{tor}` lists `{s}` twice")));
                }
                ids.push(id);
            }
            links.push((tor.clone(), ids));
        }
        let ecmp = match f.ecmp {
            None => None,
            Some(e) if e.model == "fnv1a" => Some(EcmpModel::Fnv1a { seed: e.seed }),
            Some(e) => {
                return Err(invalid(format!(
                    "ecmp model `{}` is unknown (known: fnv1a)",
                    e.model
                )))
            }
        };
        Ok(Self::from_links(links, f.spines, ecmp))
    }

    pub fn ecmp(&self) -> Option<EcmpModel> {
        self.ecmp
    }

    pub fn tor_index(&self, tor: &str) -> Option<u32> {
        self.tor_ids.get(tor).copied()
    }

    pub fn tor_name(&self, i: u32) -> &str {
        &self.tors[i as usize]
    }

    pub fn spine_name(&self, i: u32) -> &str {
        &self.spines[i as usize]
    }

    pub fn tor_count(&self) -> usize {
        self.tors.len()
    }

    /// Spines of ToR `t` in hash order.
    pub fn uplinks(&self, t: u32) -> &[u32] {
        &self.uplinks[t as usize]
    }

    /// A link's name: `<tor>-<spine>`, as operators and scenario files write it.
    pub fn link_name(&self, tor: u32, spine: u32) -> String {
        format!("{}-{}", self.tor_name(tor), self.spine_name(spine))
    }

    /// The spine a packet from `src_gid` on ToR `src_tor` to `dst_gid` on ToR `dst_tor`
    /// with `flow_label` crosses: `None` without a hash model, for a ToR-local packet, or
    /// when the two ToRs share no spine.
    pub fn spine_of(
        &self,
        src_tor: u32,
        dst_tor: u32,
        src_gid: &str,
        dst_gid: &str,
        flow_label: u32,
    ) -> Option<u32> {
        Some(
            self.pair_route(src_tor, dst_tor, src_gid, dst_gid)?
                .spine(flow_label),
        )
    }

    /// The spines of a GID pair, label by label (see [`PairRoute`]): `None` as for
    /// `spine_of`.
    pub fn pair_route(
        &self,
        src_tor: u32,
        dst_tor: u32,
        src_gid: &str,
        dst_gid: &str,
    ) -> Option<PairRoute<'_>> {
        if src_tor == dst_tor {
            return None;
        }
        let EcmpModel::Fnv1a { seed } = self.ecmp?;
        let usable = self.shared_spines(src_tor, dst_tor);
        if usable.is_empty() {
            return None;
        }
        Some(PairRoute {
            usable,
            pair: fnv1a_pair(src_gid, dst_gid),
            seed,
        })
    }

    /// The source ToR's uplinks that reach the destination ToR, in hash order (what the
    /// source hashes over): borrowed when the two ToRs have the same uplinks.
    pub fn shared_spines(&self, src_tor: u32, dst_tor: u32) -> Cow<'_, [u32]> {
        let ups = self.uplinks(src_tor);
        let dst_ups = self.uplinks(dst_tor);
        if ups == dst_ups {
            Cow::Borrowed(ups)
        } else {
            Cow::Owned(
                ups.iter()
                    .copied()
                    .filter(|s| dst_ups.contains(s))
                    .collect(),
            )
        }
    }

    /// Spines in the topology.
    pub fn spine_count(&self) -> usize {
        self.spines.len()
    }

    /// Directed ToR-spine links (both directions of every ToR-spine pair), the size of
    /// a table indexed by [`Topology::link_index`].
    pub fn link_count(&self) -> usize {
        2 * self.cable_count()
    }

    /// A dense index of a directed link, for tables the localizer fills per label.
    pub fn link_index(&self, (tor, spine, dir): DirLink) -> usize {
        2 * self.cable_index(tor, spine) + (dir == LinkDir::Down) as usize
    }

    /// ToR-spine pairs (a link both ways), the size of a table indexed by
    /// [`Topology::cable_index`].
    pub fn cable_count(&self) -> usize {
        self.tors.len() * self.spines.len()
    }

    pub fn cable_index(&self, tor: u32, spine: u32) -> usize {
        tor as usize * self.spines.len() + spine as usize
    }

    /// The directed link at a dense index (the inverse of [`Topology::link_index`]).
    pub fn link_at(&self, i: usize) -> DirLink {
        let cable = i / 2;
        let n = self.spines.len().max(1);
        let dir = if i.is_multiple_of(2) {
            LinkDir::Up
        } else {
            LinkDir::Down
        };
        ((cable / n) as u32, (cable % n) as u32, dir)
    }

    /// The two directed links a packet crosses (up at the source ToR, down at the
    /// destination ToR), when `spine_of` knows the spine.
    pub fn route(
        &self,
        src_tor: u32,
        dst_tor: u32,
        src_gid: &str,
        dst_gid: &str,
        flow_label: u32,
    ) -> Option<[DirLink; 2]> {
        let s = self.spine_of(src_tor, dst_tor, src_gid, dst_gid, flow_label)?;
        Some([(src_tor, s, LinkDir::Up), (dst_tor, s, LinkDir::Down)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(p: &str, n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("{p}{i}")).collect()
    }

    #[test]
    fn hash_spreads_labels_evenly_over_spines() {
        // 64 labels x 200 pairs over 4 spines: each spine within 10% of a quarter.
        let mut count = [0usize; 4];
        for pair in 0..200 {
            let (a, b) = (format!("fe80::{pair}"), format!("fe80::{}", pair + 1000));
            for label in 0..64u32 {
                count[fnv1a_uplink(&a, &b, label * 7919, 0, 4)] += 1;
            }
        }
        let n = 200 * 64;
        for c in count {
            let share = c as f64 / n as f64;
            assert!((share - 0.25).abs() < 0.025, "share {share}: {count:?}");
        }
    }

    #[test]
    fn hash_depends_on_every_input_and_direction() {
        let base = fnv1a_uplink("a", "b", 1, 0, 1 << 30);
        assert_ne!(base, fnv1a_uplink("b", "a", 1, 0, 1 << 30), "direction");
        assert_ne!(base, fnv1a_uplink("a", "b", 2, 0, 1 << 30), "label");
        assert_ne!(base, fnv1a_uplink("a", "b", 1, 1, 1 << 30), "seed");
        assert_eq!(base, fnv1a_uplink("a", "b", 1, 0, 1 << 30), "deterministic");
        assert_eq!(fnv1a_uplink("a", "b", 1, 0, 0), 0);
    }

    #[test]
    fn different_labels_of_one_pair_take_different_spines() {
        let t = Topology::full_mesh(
            &names("tor", 2),
            &names("spine", 4),
            Some(EcmpModel::Fnv1a { seed: 3 }),
        );
        let mut seen = std::collections::BTreeSet::new();
        for label in 0..32 {
            seen.insert(t.spine_of(0, 1, "g1", "g2", label).unwrap());
        }
        assert_eq!(seen.len(), 4);
        assert_eq!(t.spine_of(0, 0, "g1", "g2", 1), None, "ToR-local");
        let [up, down] = t.route(0, 1, "g1", "g2", 5).unwrap();
        assert_eq!(
            (up.0, up.2, down.0, down.2),
            (0, LinkDir::Up, 1, LinkDir::Down)
        );
        assert_eq!(up.1, down.1);
        assert_eq!(t.link_name(1, 2), "tor2-spine3");
    }

    #[test]
    fn dense_link_and_cable_indices_cover_the_tables_once() {
        let t = Topology::full_mesh(&names("tor", 3), &names("spine", 5), None);
        let mut seen = vec![0u8; t.link_count()];
        let mut cables = vec![0u8; t.cable_count()];
        for tor in 0..3 {
            for spine in 0..5 {
                cables[t.cable_index(tor, spine)] += 1;
                for dir in [LinkDir::Up, LinkDir::Down] {
                    let i = t.link_index((tor, spine, dir));
                    assert_eq!(i / 2, t.cable_index(tor, spine));
                    assert_eq!(t.link_at(i), (tor, spine, dir));
                    seen[i] += 1;
                }
            }
        }
        assert!(seen.iter().chain(&cables).all(|&n| n == 1));
        // Same uplinks: the pair route borrows them.
        assert!(matches!(t.shared_spines(0, 1), Cow::Borrowed(_)));
    }

    #[test]
    fn without_a_hash_no_route() {
        let t = Topology::full_mesh(&names("tor", 2), &names("spine", 2), None);
        assert_eq!(t.route(0, 1, "a", "b", 1), None);
    }

    #[test]
    fn file_parses_and_partial_meshes_hash_over_shared_spines() {
        let t = Topology::from_yaml(
            "spines: [s1, s2, s3]\ntors:\n  a: [s1, s2]\n  b: [s2, s3]\necmp: {model: fnv1a, seed: 9}\n",
        )
        .unwrap();
        let (a, b) = (t.tor_index("a").unwrap(), t.tor_index("b").unwrap());
        for label in 0..20 {
            assert_eq!(
                t.spine_of(a, b, "x", "y", label),
                Some(1),
                "only s2 is shared"
            );
        }
        assert_eq!(t.ecmp(), Some(EcmpModel::Fnv1a { seed: 9 }));
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let cases = [
            ("spines: []\ntors: {a: [s]}\n", "`spines` is empty"),
            ("spines: [s]\ntors: {}\n", "`tors` is empty"),
            (
                "spines: [s, s]\ntors: {a: [s]}\n",
                "spine `s` is listed twice",
            ),
            ("spines: [s]\ntors: {a: []}\n", "ToR `a` has no spines"),
            (
                "spines: [s]\ntors: {a: [x]}\n",
                "links to `x`, which is not in `spines`",
            ),
            ("spines: [s]\ntors: {a: [s, s]}\n", "lists `s` twice"),
            (
                "spines: [s]\ntors: {a: [s]}\necmp: {model: crc}\n",
                "ecmp model `crc` is unknown",
            ),
            (
                "spines: [s]\ntors: {a: [s]}\nextra: 1\n",
                "not a topology file",
            ),
            ("[1, 2]", "not a topology file"),
        ];
        for (text, want) in cases {
            let e = Topology::from_yaml(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }
}
