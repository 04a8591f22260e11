//! Operators' drains and silences (pure: no I/O, `now` is an argument).
//!
//! A drain takes an RNIC (or every RNIC of a host) out of maintenance's way: out of every
//! pinglist, as a target and as a prober, and its findings marked "maintenance". A silence
//! keeps a finding, or a component's findings, from alerting: they still record their
//! windows, marked "silenced". Both expire (a silence always does) or are ended. The
//! store keeps them (`crate::registry`), so they survive restarts and leader changes;
//! every replica reads them back from it.

use std::collections::{BTreeMap, HashSet};

use rpingmesh_proto::operator::{Action, Finding};

use crate::registry::RegistryIndex;

/// Actions in force at once, at most.
pub const MAX_ACTIONS: usize = 10_000;
/// The longest silence (a week): a forgotten silence must not hide a fault for good.
pub const MAX_SILENCE_SEC: u32 = 7 * 24 * 3600;

pub const DRAIN: &str = "drain";
pub const SILENCE: &str = "silence";

/// A request that cannot be taken: one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionError(pub String);

#[derive(Debug, Default, Clone)]
pub struct Actions {
    by_id: BTreeMap<u64, Action>,
    next_id: u64,
}

fn live(a: &Action, now_ns: u64) -> bool {
    a.expires_unix_ns == 0 || a.expires_unix_ns > now_ns
}

impl Actions {
    /// Replaces what is held with `stored` (what the store has; another replica may have
    /// added or ended some).
    pub fn load(&mut self, stored: Vec<Action>) {
        self.by_id = stored.into_iter().map(|a| (a.id, a)).collect();
        let top = self.by_id.keys().next_back().copied().unwrap_or(0);
        self.next_id = self.next_id.max(top + 1);
    }

    /// The actions in force at `now_ns`, by id.
    pub fn in_force(&self, now_ns: u64) -> Vec<Action> {
        self.by_id
            .values()
            .filter(|a| live(a, now_ns))
            .cloned()
            .collect()
    }

    /// Ids of actions that expired by `now_ns` (to delete from the store).
    pub fn expired(&self, now_ns: u64) -> Vec<u64> {
        self.by_id
            .values()
            .filter(|a| !live(a, now_ns))
            .map(|a| a.id)
            .collect()
    }

    /// A new action with the next id (not yet held: [`Self::put`] it once stored).
    /// `ids_from` is the lowest id the store may give out (ids stay unique across
    /// replicas that each add actions: the caller passes a clock-derived floor).
    #[allow(clippy::too_many_arguments)]
    pub fn propose(
        &mut self,
        kind: &str,
        target_kind: &str,
        target: String,
        reason: String,
        by: String,
        now_ns: u64,
        duration_sec: u32,
        ids_from: u64,
    ) -> Result<Action, ActionError> {
        if self.in_force(now_ns).len() >= MAX_ACTIONS {
            return Err(ActionError(format!(
                "{MAX_ACTIONS} drains and silences are in force already; end some first"
            )));
        }
        if kind == SILENCE && (duration_sec == 0 || duration_sec > MAX_SILENCE_SEC) {
            return Err(ActionError(format!(
                "a silence lasts 1 s to {MAX_SILENCE_SEC} s (a week), not {duration_sec}"
            )));
        }
        let id = self.next_id.max(ids_from);
        self.next_id = id + 1;
        Ok(Action {
            id,
            kind: kind.to_string(),
            target_kind: target_kind.to_string(),
            target,
            reason,
            by,
            created_unix_ns: now_ns,
            expires_unix_ns: match duration_sec {
                0 => 0,
                d => now_ns.saturating_add(d as u64 * 1_000_000_000),
            },
        })
    }

    pub fn put(&mut self, a: Action) {
        self.next_id = self.next_id.max(a.id + 1);
        self.by_id.insert(a.id, a);
    }

    /// Ends action `id` now: the action as it was, if held.
    pub fn end(&mut self, id: u64) -> Option<Action> {
        self.by_id.remove(&id)
    }

    pub fn get(&self, id: u64) -> Option<&Action> {
        self.by_id.get(&id)
    }

    /// The GIDs drained at `now_ns` (hosts resolved through `idx`): none leaves nothing
    /// to filter.
    pub fn drained_gids(&self, idx: &RegistryIndex, now_ns: u64) -> HashSet<String> {
        let mut out = HashSet::new();
        for a in self
            .by_id
            .values()
            .filter(|a| a.kind == DRAIN && live(a, now_ns))
        {
            match a.target_kind.as_str() {
                "rnic" => {
                    out.insert(a.target.clone());
                }
                "host" => {
                    out.extend(
                        idx.rnics()
                            .filter(|r| r.host_name == a.target)
                            .map(|r| r.gid.clone()),
                    );
                }
                _ => {}
            }
        }
        out
    }

    /// Whether any drain is in force (most of the time none: nothing to filter).
    pub fn any_drain(&self, now_ns: u64) -> bool {
        self.by_id
            .values()
            .any(|a| a.kind == DRAIN && live(a, now_ns))
    }

    /// The action that keeps `f` from alerting at `now_ns`, as ("maintenance" |
    /// "silenced", its id): a drain of its RNIC or host (an RNIC finding is
    /// `<host>/<device>`; `idx` names a drained GID's host and device), or a silence of
    /// it or of its component. Drains first.
    pub fn suppression(
        &self,
        f: &Finding,
        idx: &RegistryIndex,
        now_ns: u64,
    ) -> Option<(&'static str, u64)> {
        let host_of = |loc: &str| match f.kind.as_str() {
            "rnic" => loc.rsplit_once('/').map(|(h, _)| h.to_string()),
            "host" => Some(loc.to_string()),
            _ => None,
        };
        let live_of = |kind: &'static str| {
            self.by_id
                .values()
                .filter(move |a| a.kind == kind && live(a, now_ns))
        };
        for a in live_of(DRAIN) {
            let hit = match a.target_kind.as_str() {
                "host" => host_of(&f.location).as_deref() == Some(a.target.as_str()),
                "rnic" => {
                    f.kind == "rnic"
                        && idx.rnic(&a.target).is_some_and(|r| {
                            format!("{}/{}", r.host_name, r.device_name) == f.location
                        })
                }
                _ => false,
            };
            if hit {
                return Some(("maintenance", a.id));
            }
        }
        for a in live_of(SILENCE) {
            let hit = match a.target_kind.as_str() {
                "finding" => a.target == f.id.to_string(),
                kind => kind == f.kind && a.target == f.location,
            };
            if hit {
                return Some(("silenced", a.id));
            }
        }
        None
    }

    /// Marks every finding of `list` that an action keeps from alerting.
    pub fn annotate(&self, list: &mut [Finding], idx: &RegistryIndex, now_ns: u64) {
        for f in list {
            let (why, id) = self.suppression(f, idx, now_ns).unwrap_or(("", 0));
            f.suppressed = why.to_string();
            f.suppressed_by = id;
        }
    }
}

#[cfg(test)]
mod tests;
