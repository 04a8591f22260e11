//! In-memory registry index: by GID, by ToR (with a dense ToR list for uniform
//! sampling) and by agent. Pure data structure; mirrors the store's semantics exactly.

use std::collections::HashMap;

use super::{AgentRecord, RnicRecord};

#[derive(Debug, Default)]
struct TorEntry {
    id: String,
    gids: Vec<String>,
}

#[derive(Debug, Default)]
struct AgentEntry {
    info: AgentRecord,
    gids: Vec<String>,
}

#[derive(Debug, Default)]
pub struct RegistryIndex {
    rnics: HashMap<String, RnicRecord>,
    /// Dense list so a random ToR is one index draw; `tor_pos` maps id -> position.
    tors: Vec<TorEntry>,
    tor_pos: HashMap<String, usize>,
    agents: HashMap<String, AgentEntry>,
}

fn remove_str(v: &mut Vec<String>, s: &str) {
    if let Some(i) = v.iter().position(|x| x == s) {
        v.swap_remove(i);
    }
}

impl RegistryIndex {
    /// Replaces the content with the store's rows.
    pub fn load(&mut self, agents: Vec<AgentRecord>, rnics: Vec<RnicRecord>) {
        *self = Self::default();
        for a in agents {
            self.agents.insert(
                a.agent_id.clone(),
                AgentEntry {
                    info: a,
                    gids: Vec::new(),
                },
            );
        }
        for r in rnics {
            self.insert_rnic(r);
        }
    }

    fn insert_rnic(&mut self, r: RnicRecord) {
        if self.rnics.contains_key(&r.gid) {
            self.remove_rnic(&r.gid.clone());
        }
        let pos = match self.tor_pos.get(&r.tor_id) {
            Some(&p) => p,
            None => {
                self.tors.push(TorEntry {
                    id: r.tor_id.clone(),
                    gids: Vec::new(),
                });
                self.tor_pos.insert(r.tor_id.clone(), self.tors.len() - 1);
                self.tors.len() - 1
            }
        };
        self.tors[pos].gids.push(r.gid.clone());
        self.agents
            .entry(r.agent_id.clone())
            .or_insert_with(|| AgentEntry {
                info: AgentRecord {
                    agent_id: r.agent_id.clone(),
                    tor_id: r.tor_id.clone(),
                    last_updated: r.last_updated,
                    ..Default::default()
                },
                gids: Vec::new(),
            })
            .gids
            .push(r.gid.clone());
        self.rnics.insert(r.gid.clone(), r);
    }

    /// Removes one RNIC from every view; the owning agent stays (callers decide).
    fn remove_rnic(&mut self, gid: &str) -> Option<RnicRecord> {
        let r = self.rnics.remove(gid)?;
        if let Some(&p) = self.tor_pos.get(&r.tor_id) {
            remove_str(&mut self.tors[p].gids, gid);
            if self.tors[p].gids.is_empty() {
                self.tor_pos.remove(&r.tor_id);
                self.tors.swap_remove(p);
                if p < self.tors.len() {
                    let moved = self.tors[p].id.clone();
                    self.tor_pos.insert(moved, p);
                }
            }
        }
        if let Some(a) = self.agents.get_mut(&r.agent_id) {
            remove_str(&mut a.gids, gid);
        }
        Some(r)
    }

    /// Same semantics as [`super::Registry::register_agent`].
    pub fn register_agent(&mut self, agent: &AgentRecord, rnics: &[RnicRecord], now: u64) {
        if let Some(prev) = self.agents.get(&agent.agent_id) {
            for g in prev.gids.clone() {
                self.remove_rnic(&g);
            }
        }
        let mut info = agent.clone();
        info.last_updated = now;
        self.agents.insert(
            agent.agent_id.clone(),
            AgentEntry {
                info,
                gids: Vec::new(),
            },
        );
        let mut previous_owners = Vec::new();
        for r in rnics {
            if let Some(old) = self.rnics.get(&r.gid) {
                if old.agent_id != agent.agent_id {
                    previous_owners.push(old.agent_id.clone());
                }
            }
            let mut r = r.clone();
            r.agent_id = agent.agent_id.clone();
            r.last_updated = now;
            self.insert_rnic(r);
        }
        // An agent whose last GID moved here disappears, as in the store.
        for o in previous_owners {
            if self.agents.get(&o).is_some_and(|a| a.gids.is_empty()) {
                self.agents.remove(&o);
            }
        }
    }

    /// Forgets an agent and its RNICs (its entry expired or was deleted in a shared store).
    pub fn remove_agent(&mut self, agent_id: &str) {
        if let Some(a) = self.agents.remove(agent_id) {
            for g in a.gids {
                self.remove_rnic(&g);
            }
        }
    }

    /// Same semantics as [`super::Registry::excuse_all`].
    pub fn excuse_all(&mut self, by: u64, now: u64) {
        let excused = |t: u64| t.max(t.saturating_add(by).min(now));
        for a in self.agents.values_mut() {
            a.info.last_updated = excused(a.info.last_updated);
        }
        for r in self.rnics.values_mut() {
            r.last_updated = excused(r.last_updated);
        }
    }

    pub fn touch(&mut self, agent_id: &str, now: u64) -> usize {
        let Some(a) = self.agents.get_mut(agent_id) else {
            return 0;
        };
        a.info.last_updated = now;
        for g in &a.gids {
            if let Some(r) = self.rnics.get_mut(g) {
                r.last_updated = now;
            }
        }
        a.gids.len()
    }

    /// Removes RNICs with `last_updated < now - stale_after` and agents left empty.
    pub fn remove_stale(&mut self, now: u64, stale_after: u64) -> usize {
        let cutoff = now.saturating_sub(stale_after);
        let stale: Vec<String> = self
            .rnics
            .values()
            .filter(|r| r.last_updated < cutoff)
            .map(|r| r.gid.clone())
            .collect();
        for g in &stale {
            self.remove_rnic(g);
        }
        self.agents.retain(|_, a| !a.gids.is_empty());
        stale.len()
    }

    pub fn rnic(&self, gid: &str) -> Option<&RnicRecord> {
        self.rnics.get(gid)
    }

    pub fn agent(&self, agent_id: &str) -> Option<&AgentRecord> {
        self.agents.get(agent_id).map(|a| &a.info)
    }

    pub fn agent_gids(&self, agent_id: &str) -> &[String] {
        self.agents
            .get(agent_id)
            .map(|a| a.gids.as_slice())
            .unwrap_or(&[])
    }

    /// GIDs registered on `tor_id` (active or not).
    pub fn tor_gids(&self, tor_id: &str) -> &[String] {
        self.tor_pos
            .get(tor_id)
            .map(|&p| self.tors[p].gids.as_slice())
            .unwrap_or(&[])
    }

    /// Number of ToRs with at least one registered RNIC.
    pub fn tor_count(&self) -> usize {
        self.tors.len()
    }

    /// The ToR at dense position `i` (< `tor_count()`) and its GIDs.
    pub fn tor_at(&self, i: usize) -> (&str, &[String]) {
        let t = &self.tors[i];
        (&t.id, &t.gids)
    }

    pub fn rnics(&self) -> impl Iterator<Item = &RnicRecord> {
        self.rnics.values()
    }

    pub fn agents(&self) -> impl Iterator<Item = &AgentRecord> {
        self.agents.values().map(|a| &a.info)
    }

    pub fn len(&self) -> usize {
        self.rnics.len()
    }

    pub fn agent_count(&self) -> usize {
        self.agents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rnics.is_empty()
    }

    /// Internal consistency (tests): every view agrees with `rnics`.
    #[cfg(test)]
    pub(crate) fn check(&self) {
        let mut n = 0;
        for (i, t) in self.tors.iter().enumerate() {
            assert_eq!(self.tor_pos[&t.id], i);
            assert!(!t.gids.is_empty());
            for g in &t.gids {
                assert_eq!(self.rnics[g].tor_id, t.id);
                n += 1;
            }
        }
        assert_eq!(n, self.rnics.len());
        assert_eq!(self.tor_pos.len(), self.tors.len());
        let m: usize = self.agents.values().map(|a| a.gids.len()).sum();
        assert_eq!(m, self.rnics.len());
        for (id, a) in &self.agents {
            for g in &a.gids {
                assert_eq!(&self.rnics[g].agent_id, id);
            }
        }
    }
}
