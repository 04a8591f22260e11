//! Algorithm 1 of Hostping (TNET 2024): link states from path verdicts, binary network
//! tomography over the host's tree.
//!
//! Per round (one set of loopback tests):
//! 1. every link on a tested path starts `uncertain`;
//! 2. every link on a normal path is `normal`;
//! 3. the `uncertain` (or already `abnormal`) links of an abnormal path are `abnormal`,
//!    and their `abnormal_cnt` counts the abnormal paths (and RNICs) that blamed them;
//! 4. when every link of an abnormal path is `normal`, those links are `gray`; a link
//!    gray in three consecutive rounds is `flapping` (see [`gray_links`] for which links
//!    of such a path; a round that blames the link outright does not break the streak).
//!
//! Then one step the paper takes by hand ("UPI was the most suspicious: its abnormal_cnt
//! was the highest"): the abnormal links are ranked by `abnormal_cnt` and kept greedily
//! while they explain abnormal paths not yet explained, so one broken link is one
//! finding, not one per link it shares a path with. A kept link whose utilization is at
//! or over `util_high` is congested rather than failed.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::paths::LinkId;

/// A link's state after one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkState {
    Uncertain,
    Normal,
    Abnormal,
    Gray,
}

/// Why a link is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Degraded with no load to explain it: a failing link (or a misconfiguration).
    Failure,
    /// Degraded while its utilization is at or over `util_high`.
    Congestion,
    /// Gray in consecutive rounds: sometimes fine, sometimes not.
    Flapping,
}

/// One tested path's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathVerdict {
    pub rnic: String,
    pub endpoint: String,
    pub links: Vec<LinkId>,
    pub abnormal: bool,
}

/// A link named by a round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkFinding {
    pub link: LinkId,
    pub cause: Cause,
    /// Abnormal paths that blamed it this round.
    pub abnormal_cnt: u32,
    /// Distinct RNICs among them.
    pub rnics: u32,
    /// Links no path tells apart from this one (they were on exactly the same abnormal
    /// paths and on no normal one): the finding names the first, these may be it too.
    pub alternatives: Vec<LinkId>,
    /// The abnormal paths, "rnic -> endpoint".
    pub paths: Vec<String>,
}

/// The result of one round.
#[derive(Debug, Clone, PartialEq, Serialize, Default)]
pub struct Round {
    pub states: BTreeMap<LinkId, LinkState>,
    pub abnormal_cnt: BTreeMap<LinkId, u32>,
    pub findings: Vec<LinkFinding>,
}

impl Round {
    /// The state of a link in this round, as text for the tree.
    pub fn state_text(&self, link: &LinkId) -> Option<String> {
        if let Some(f) = self.findings.iter().find(|f| &f.link == link) {
            return Some(match f.cause {
                Cause::Failure => format!("ABNORMAL x{}", f.abnormal_cnt),
                Cause::Congestion => format!("CONGESTED x{}", f.abnormal_cnt),
                Cause::Flapping => "FLAPPING".to_string(),
            });
        }
        self.states.get(link).map(|s| match s {
            LinkState::Uncertain => "uncertain".to_string(),
            LinkState::Normal => "normal".to_string(),
            LinkState::Abnormal => "suspect".to_string(),
            LinkState::Gray => "gray".to_string(),
        })
    }
}

/// Algorithm 1 across rounds: the gray streaks are its memory.
#[derive(Debug, Clone, Default)]
pub struct LinkStateInference {
    gray_streak: BTreeMap<LinkId, u32>,
    /// Rounds each link was gray in, ever: breaks ties between a gray path's links.
    gray_total: BTreeMap<LinkId, u32>,
    /// Per link, whether each of its last rounds found trouble on it (blamed or gray).
    recent: BTreeMap<LinkId, std::collections::VecDeque<bool>>,
    /// Consecutive gray rounds that make a link flapping (the paper: 3).
    pub flapping_after: u32,
}

/// Rounds remembered per link for the second flapping rule.
pub const RECENT_ROUNDS: usize = 8;

/// How often a link went from fine to troubled or back in its recent rounds. Three
/// changes (down, up, down) is flapping, whatever each round called it: a flapping link
/// is sometimes caught down on every path of a round, which no gray streak counts. A
/// failure that starts, or one that is repaired, changes once.
fn changes(r: &std::collections::VecDeque<bool>) -> usize {
    r.iter()
        .zip(r.iter().skip(1))
        .filter(|(a, b)| a != b)
        .count()
}

impl LinkStateInference {
    pub fn new() -> Self {
        Self {
            gray_streak: BTreeMap::new(),
            gray_total: BTreeMap::new(),
            recent: BTreeMap::new(),
            flapping_after: 3,
        }
    }

    /// One round over the tested paths. `util` holds the links whose utilization is
    /// known (0..1); a link without one is judged a failure when it is blamed.
    pub fn round(
        &mut self,
        paths: &[PathVerdict],
        util: &BTreeMap<LinkId, f64>,
        util_high: f64,
    ) -> Round {
        let mut states: BTreeMap<LinkId, LinkState> = BTreeMap::new();
        for p in paths {
            for l in &p.links {
                states.entry(l.clone()).or_insert(LinkState::Uncertain);
            }
        }
        for p in paths.iter().filter(|p| !p.abnormal) {
            for l in &p.links {
                states.insert(l.clone(), LinkState::Normal);
            }
        }
        let mut abnormal_cnt: BTreeMap<LinkId, u32> = BTreeMap::new();
        let mut blamed_by: BTreeMap<LinkId, BTreeSet<usize>> = BTreeMap::new();
        let mut gray_paths: Vec<usize> = Vec::new();
        for (pi, p) in paths.iter().enumerate().filter(|(_, p)| p.abnormal) {
            let mut any = false;
            for l in &p.links {
                if matches!(states[l], LinkState::Uncertain | LinkState::Abnormal) {
                    states.insert(l.clone(), LinkState::Abnormal);
                    *abnormal_cnt.entry(l.clone()).or_default() += 1;
                    blamed_by.entry(l.clone()).or_default().insert(pi);
                    any = true;
                }
            }
            if !any {
                gray_paths.push(pi);
            }
        }
        let (gray_now, gray_tied) = gray_links(paths, &gray_paths, &self.gray_total);
        for l in gray_now.iter().chain(&gray_tied) {
            *self.gray_total.entry(l.clone()).or_default() += 1;
        }
        for l in gray_now.iter().chain(&gray_tied) {
            if states[l] == LinkState::Normal {
                states.insert(l.clone(), LinkState::Gray);
            }
        }
        // Streaks: gray adds one; a round in which all of a link's paths were fine starts
        // it over; a round that blamed it leaves it be (a flapping link can be caught
        // down for a whole round).
        for l in states.keys() {
            if gray_now.contains(l) {
                *self.gray_streak.entry(l.clone()).or_default() += 1;
            } else if !blamed_by.contains_key(l) && !gray_tied.contains(l) {
                self.gray_streak.remove(l);
            }
        }

        // Greedy explanation: the most-blamed link first; ties go to the link blamed by
        // more RNICs, then to the first in order (deterministic).
        let mut findings = Vec::new();
        let mut unexplained: BTreeSet<usize> = blamed_by.values().flatten().copied().collect();
        let mut candidates: Vec<LinkId> = blamed_by.keys().cloned().collect();
        let rnics_of = |set: &BTreeSet<usize>| -> u32 {
            set.iter()
                .map(|&i| paths[i].rnic.as_str())
                .collect::<BTreeSet<_>>()
                .len() as u32
        };
        while !unexplained.is_empty() {
            let best = candidates
                .iter()
                .map(|l| {
                    let covers: BTreeSet<usize> =
                        blamed_by[l].intersection(&unexplained).copied().collect();
                    (covers.len(), rnics_of(&covers), l.clone())
                })
                .filter(|(n, _, _)| *n > 0)
                .max_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)).then(b.2.cmp(&a.2)));
            let Some((_, rnics, link)) = best else { break };
            let covers = blamed_by[&link].clone();
            let alternatives: Vec<LinkId> = candidates
                .iter()
                .filter(|l| **l != link && blamed_by[*l] == covers)
                .cloned()
                .collect();
            candidates.retain(|l| *l != link && !alternatives.contains(l));
            for i in &covers {
                unexplained.remove(i);
            }
            let cause = match util.get(&link) {
                Some(u) if *u >= util_high => Cause::Congestion,
                _ => Cause::Failure,
            };
            findings.push(LinkFinding {
                link: link.clone(),
                cause,
                abnormal_cnt: abnormal_cnt[&link],
                rnics,
                alternatives,
                paths: covers
                    .iter()
                    .map(|&i| format!("{} -> {}", paths[i].rnic, paths[i].endpoint))
                    .collect(),
            });
        }
        // Trouble this round: named by the greedy step, or gray and told apart.
        for l in states.keys() {
            let troubled = gray_now.contains(l) || findings.iter().any(|f| &f.link == l);
            let ring = self.recent.entry(l.clone()).or_default();
            ring.push_back(troubled);
            if ring.len() > RECENT_ROUNDS {
                ring.pop_front();
            }
        }
        let flapping: BTreeSet<LinkId> = self
            .gray_streak
            .iter()
            .filter(|(_, n)| **n >= self.flapping_after)
            .map(|(l, _)| l.clone())
            .chain(
                self.recent
                    .iter()
                    .filter(|(_, r)| changes(r) >= 3)
                    .map(|(l, _)| l.clone()),
            )
            .collect();
        // A flapping link is named flapping even in a round that caught it down.
        findings.retain(|f| !flapping.contains(&f.link));
        for l in &flapping {
            let gray_paths: Vec<String> = paths
                .iter()
                .filter(|p| p.abnormal && p.links.contains(l))
                .map(|p| format!("{} -> {}", p.rnic, p.endpoint))
                .collect();
            findings.push(LinkFinding {
                link: l.clone(),
                cause: Cause::Flapping,
                abnormal_cnt: gray_paths.len() as u32,
                rnics: 0,
                alternatives: Vec::new(),
                paths: gray_paths,
            });
        }
        Round {
            states,
            abnormal_cnt,
            findings,
        }
    }
}

/// The links step 4 marks gray: (told apart, tied). Of an abnormal path whose links all
/// look normal, the paper marks every link; we pick the link the evidence points at, so
/// a flapping memory channel seen through three RNICs' paths does not also start a gray
/// streak on each RNIC's own link. Links that stay tied are gray too, but their streaks
/// neither grow nor start over: the round could not tell which of them it was.
fn gray_links(
    paths: &[PathVerdict],
    gray_paths: &[usize],
    history: &BTreeMap<LinkId, u32>,
) -> (BTreeSet<LinkId>, BTreeSet<LinkId>) {
    let (mut out, mut tied) = (BTreeSet::new(), BTreeSet::new());
    let mut open: BTreeSet<usize> = gray_paths.iter().copied().collect();
    while !open.is_empty() {
        let mut count: BTreeMap<&LinkId, usize> = BTreeMap::new();
        for &i in &open {
            for l in &paths[i].links {
                *count.entry(l).or_default() += 1;
            }
        }
        // Most gray paths now; then the largest share of its tested paths abnormal (a
        // UPI that carries ten fine paths is not the flapper beside a memory channel
        // whose every other path failed); then the most gray rounds before (one gray
        // path names all of its links; the history tells the flapping one apart).
        let past = |l: &LinkId| history.get(l).copied().unwrap_or(0);
        let share = |l: &LinkId| {
            let on: Vec<&PathVerdict> = paths.iter().filter(|p| p.links.contains(l)).collect();
            // Compared as a fraction over a common denominator, exactly.
            let bad = on.iter().filter(|p| p.abnormal).count() as u64;
            (bad * 1_000_000) / on.len().max(1) as u64
        };
        let key = |l: &LinkId, n: usize| (n, share(l), past(l));
        let Some(most) = count.iter().map(|(l, n)| key(l, *n)).max() else {
            break;
        };
        let top: Vec<LinkId> = count
            .iter()
            .filter(|(l, n)| key(l, **n) == most)
            .map(|(l, _)| (*l).clone())
            .collect();
        open.retain(|&i| !paths[i].links.iter().any(|l| top.contains(l)));
        if top.len() == 1 {
            out.extend(top);
        } else {
            tied.extend(top);
        }
    }
    (out, tied)
}

#[cfg(test)]
mod tests;
