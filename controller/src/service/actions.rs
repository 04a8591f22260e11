//! Operators' drains and silences in the running controller: held as the store has them
//! (refreshed on every replica), applied to pinglists (a drained RNIC neither probes nor
//! is probed) and to findings (marked silenced or in maintenance, and not alerting).

use std::collections::BTreeMap;

use rpingmesh_proto::controller_agent::PingTarget;
use rpingmesh_proto::operator::{Action, Finding, FindingEvent};

use super::ControllerState;
use crate::actions::{ActionError, Actions};
use crate::localize::ComponentKind;
use crate::registry::{RegistryError, RegistryIndex};

/// Open findings per kind that alert, and per (kind, "silenced" | "maintenance") the
/// others.
pub type OpenByKind = (
    BTreeMap<&'static str, usize>,
    BTreeMap<(&'static str, &'static str), usize>,
);

impl ControllerState {
    fn actions_read(&self) -> std::sync::RwLockReadGuard<'_, Actions> {
        self.actions.read().unwrap_or_else(|e| e.into_inner())
    }

    fn actions_write(&self) -> std::sync::RwLockWriteGuard<'_, Actions> {
        self.actions.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes what the store holds (another replica's drains and silences), and deletes
    /// the expired ones from it. Every replica, every few seconds.
    pub fn refresh_actions(&self) -> Result<(), RegistryError> {
        let stored = self.registry.load_actions()?;
        let now = self.now_ns();
        let mut a = self.actions_write();
        a.load(stored);
        let expired = a.expired(now);
        drop(a);
        for id in expired {
            self.registry.delete_action(id)?;
            self.actions_write().end(id);
        }
        Ok(())
    }

    /// Proposes, stores, then holds a new action; the caller audits.
    #[allow(clippy::too_many_arguments)]
    pub fn take_action(
        &self,
        kind: &str,
        target_kind: &str,
        target: String,
        reason: String,
        by: String,
        duration_sec: u32,
    ) -> Result<Result<Action, ActionError>, RegistryError> {
        let now = self.now_ns();
        // Ids from a microsecond clock: replicas that each add one never collide.
        let proposed = self.actions_write().propose(
            kind,
            target_kind,
            target,
            reason,
            by,
            now,
            duration_sec,
            now / 1_000,
        );
        let Ok(a) = proposed else {
            return Ok(proposed);
        };
        self.registry.save_action(&a)?;
        self.actions_write().put(a.clone());
        Ok(Ok(a))
    }

    /// Ends action `id`: it as it was, or None when no such action is held.
    pub fn end_action(&self, id: u64) -> Result<Option<Action>, RegistryError> {
        if self.actions_read().get(id).is_none() {
            return Ok(None);
        }
        self.registry.delete_action(id)?;
        Ok(self.actions_write().end(id))
    }

    pub fn actions_in_force(&self) -> Vec<Action> {
        self.actions_read().in_force(self.now_ns())
    }

    /// Removes drained RNICs from `targets`; a drained requester gets none. Nothing to do
    /// (and no set built) while no drain is in force.
    pub fn drop_drained(
        &self,
        idx: &RegistryIndex,
        requesters: &[&str],
        targets: &mut Vec<PingTarget>,
    ) {
        let a = self.actions_read();
        let now = self.now_ns();
        if !a.any_drain(now) {
            return;
        }
        let drained = a.drained_gids(idx, now);
        if requesters.iter().all(|g| drained.contains(*g)) {
            targets.clear();
        } else {
            targets.retain(|t| !drained.contains(&t.target_gid));
        }
    }

    /// Marks the findings an action keeps from alerting.
    pub fn annotate(&self, list: &mut [Finding]) {
        let idx = self.registry.index();
        self.actions_read().annotate(list, &idx, self.now_ns());
    }

    /// As [`Self::annotate`], for the changes a findings tick publishes.
    pub(super) fn annotate_events(&self, idx: &RegistryIndex, events: &mut [FindingEvent]) {
        let a = self.actions_read();
        let now = self.now_ns();
        for f in events.iter_mut().filter_map(|e| e.finding.as_mut()) {
            a.annotate(std::slice::from_mut(f), idx, now);
        }
    }

    /// Open component findings per kind: (alerting ones, per (kind, "silenced" |
    /// "maintenance") the others). Every kind present, 0 when none.
    pub fn open_by_kind_and_suppression(&self) -> OpenByKind {
        let Some(a) = self.analyzer() else {
            return Default::default();
        };
        let mut open: Vec<Finding> = a
            .localizer()
            .list(1, "")
            .into_iter()
            .filter(|f| f.open)
            .collect();
        drop(a);
        self.annotate(&mut open);
        let mut alerting: BTreeMap<&'static str, usize> =
            ComponentKind::ALL.iter().map(|k| (k.as_str(), 0)).collect();
        let mut quiet: BTreeMap<(&'static str, &'static str), usize> = ComponentKind::ALL
            .iter()
            .flat_map(|k| [(k.as_str(), "silenced"), (k.as_str(), "maintenance")])
            .map(|k| (k, 0))
            .collect();
        for f in &open {
            let Some(k) = ComponentKind::parse(&f.kind) else {
                continue;
            };
            match f.suppressed.as_str() {
                "" => *alerting.entry(k.as_str()).or_default() += 1,
                "silenced" => *quiet.entry((k.as_str(), "silenced")).or_default() += 1,
                _ => *quiet.entry((k.as_str(), "maintenance")).or_default() += 1,
            }
        }
        (alerting, quiet)
    }
}
