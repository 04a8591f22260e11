//! How an agent and its RNICs are stored in etcd: one JSON document per agent, and its
//! conversion to and from the registry's records.

use super::*;

/// One agent as stored: what `RegistryIndex::register_agent` takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct AgentDoc {
    pub(super) agent_id: String,
    pub(super) agent_ip: String,
    pub(super) hostname: String,
    pub(super) tor_id: String,
    pub(super) last_updated: u64,
    /// As registered (the message's JSON: its field names).
    pub(super) rnics: Vec<RnicInfo>,
}

impl AgentDoc {
    pub(super) fn new(agent: &AgentRecord, rnics: &[RnicRecord], now: u64) -> Self {
        AgentDoc {
            agent_id: agent.agent_id.clone(),
            agent_ip: agent.agent_ip.clone(),
            hostname: agent.hostname.clone(),
            tor_id: agent.tor_id.clone(),
            last_updated: now,
            rnics: rnics.iter().map(RnicRecord::info).collect(),
        }
    }

    pub(super) fn of_index(idx: &RegistryIndex, agent_id: &str) -> Option<Self> {
        let a = idx.agent(agent_id)?;
        let rnics: Vec<RnicRecord> = idx
            .agent_gids(agent_id)
            .iter()
            .filter_map(|g| idx.rnic(g).cloned())
            .collect();
        Some(Self::new(a, &rnics, a.last_updated))
    }

    pub(super) fn records(&self) -> (AgentRecord, Vec<RnicRecord>) {
        let agent = AgentRecord {
            agent_id: self.agent_id.clone(),
            agent_ip: self.agent_ip.clone(),
            hostname: self.hostname.clone(),
            tor_id: self.tor_id.clone(),
            last_updated: self.last_updated,
        };
        let rnics = self
            .rnics
            .iter()
            .map(|r| RnicRecord::of_info(r.clone(), &self.agent_id, self.last_updated))
            .collect();
        (agent, rnics)
    }

    /// A stored document; a value that is not one is logged and skipped by the caller.
    pub(super) fn decode(key: &[u8], value: &[u8]) -> Result<Self, String> {
        let d: AgentDoc = serde_json::from_slice(value).map_err(|e| {
            format!(
                "etcd key {}: not an agent document: {e}",
                String::from_utf8_lossy(key)
            )
        })?;
        if AGENTS
            .as_bytes()
            .iter()
            .chain(d.agent_id.as_bytes())
            .ne(key.iter())
        {
            return Err(format!(
                "etcd key {}: holds agent {:?}",
                String::from_utf8_lossy(key),
                d.agent_id
            ));
        }
        Ok(d)
    }
}
