//! RNIC registry: a durable store behind the [`Registry`] trait (SQLite embedded by
//! default) and an in-memory [`RegistryIndex`] kept in sync with it. Pinglists are
//! answered from the index, never by a table scan per request.

mod etcd;
mod index;
mod sqlite;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use rpingmesh_proto::controller_agent::{RnicInfo, ServiceFlowReport};
use rpingmesh_proto::operator::{Action, Finding, HostHealth};

pub use etcd::{etcd_urls, EtcdRegistry, ELECTION as ETCD_ELECTION};
pub use index::RegistryIndex;
pub use sqlite::SqliteRegistry;

/// Resolved findings a store keeps (the newest by resolution time); open ones are all kept.
pub const RESOLVED_FINDINGS_KEPT: usize = 1000;

/// One registered RNIC. `gid` is always in the normalized full form.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RnicRecord {
    pub gid: String,
    pub qpn: u32,
    pub ip_address: String,
    pub host_name: String,
    pub tor_id: String,
    pub device_name: String,
    pub agent_id: String,
    /// Unix seconds of the last registration of the owning agent.
    pub last_updated: u64,
}

impl RnicRecord {
    /// As an agent registers it and operators list it.
    pub fn info(&self) -> RnicInfo {
        RnicInfo {
            gid: self.gid.clone(),
            qpn: self.qpn,
            ip_address: self.ip_address.clone(),
            host_name: self.host_name.clone(),
            tor_id: self.tor_id.clone(),
            device_name: self.device_name.clone(),
        }
    }

    /// `info` as `agent_id` registered it at `last_updated` (Unix seconds).
    pub fn of_info(info: RnicInfo, agent_id: &str, last_updated: u64) -> Self {
        RnicRecord {
            gid: info.gid,
            qpn: info.qpn,
            ip_address: info.ip_address,
            host_name: info.host_name,
            tor_id: info.tor_id,
            device_name: info.device_name,
            agent_id: agent_id.into(),
            last_updated,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AgentRecord {
    pub agent_id: String,
    pub agent_ip: String,
    pub hostname: String,
    pub tor_id: String,
    pub last_updated: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry store: {0}")]
    Store(#[from] rusqlite::Error),
    #[error("registry store: {0}")]
    Other(String),
}

/// A durable RNIC store. Implementations do no caching; [`IndexedRegistry`] keeps the
/// in-memory index.
pub trait Registry: Send {
    /// A store shared by several controllers (etcd) keeps `index` current itself, from a
    /// watch that carries every replica's writes, and returns true: it has loaded it and
    /// its writes return once the index shows them. A local store returns false and the
    /// index is loaded from it and updated beside each write.
    fn attach_index(&mut self, _index: &Arc<RwLock<RegistryIndex>>) -> Result<bool, RegistryError> {
        Ok(false)
    }
    /// Stores `agent` and replaces that agent's previous RNIC set with `rnics`, all
    /// stamped `now`. A GID owned by another agent moves to this one.
    fn register_agent(
        &mut self,
        agent: &AgentRecord,
        rnics: &[RnicRecord],
        now: u64,
    ) -> Result<(), RegistryError>;
    fn list_agents(&self) -> Result<Vec<AgentRecord>, RegistryError>;
    fn list_rnics(&self) -> Result<Vec<RnicRecord>, RegistryError>;
    fn lookup_rnic(&self, gid: &str) -> Result<Option<RnicRecord>, RegistryError>;
    /// Refreshes `last_updated` of the agent and its RNICs; returns RNICs touched.
    fn touch(&mut self, agent_id: &str, now: u64) -> Result<usize, RegistryError>;
    /// Forgets an agent and its RNICs; the number of RNICs it had.
    fn delete_agent(&mut self, agent_id: &str) -> Result<usize, RegistryError>;
    /// Deletes RNICs not updated for more than `stale_after` seconds (and agents left
    /// without RNICs); returns the number of RNICs removed.
    fn remove_stale(&mut self, now: u64, stale_after: u64) -> Result<usize, RegistryError>;
    /// Moves every agent's and RNIC's `last_updated` forward by `by` seconds, never
    /// past `now` and never back (see [`IndexedRegistry::excuse`]); returns the RNICs.
    fn excuse_all(&mut self, by: u64, now: u64) -> Result<usize, RegistryError>;
    /// Stores the localizer's findings, replacing any stored under the same id, and keeps
    /// only the newest [`RESOLVED_FINDINGS_KEPT`] resolved ones.
    fn save_findings(&mut self, findings: &[Finding]) -> Result<(), RegistryError>;
    /// Every stored finding, by id. A row that cannot be read back is logged and skipped.
    fn load_findings(&self) -> Result<Vec<Finding>, RegistryError>;
    /// A store shared by replicas keeps each agent's current service flows (`report`: the
    /// full set) for the others; a local store has nothing to share.
    fn save_service_flows(&mut self, _report: &ServiceFlowReport) -> Result<(), RegistryError> {
        Ok(())
    }
    /// A store shared by replicas hands over every replica's service-flow sets as they are
    /// saved (full-sync reports); None for a local store.
    fn shared_service_flows(
        &mut self,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<ServiceFlowReport>> {
        None
    }
    /// Stores a piece of the analyzer's learned state under `key` (the gray detector's
    /// baseline), replacing what was there.
    fn save_state(&mut self, key: &str, value: &[u8]) -> Result<(), RegistryError>;
    /// What `save_state` stored under `key`, if anything.
    fn load_state(&self, key: &str) -> Result<Option<Vec<u8>>, RegistryError>;
    /// Stores a host's newest Hostping report, replacing the one before.
    fn save_host(&mut self, h: &HostHealth) -> Result<(), RegistryError>;
    /// Every host's newest report, by hostname (unreadable rows logged and skipped).
    fn load_hosts(&self) -> Result<Vec<HostHealth>, RegistryError>;
    /// Appends audit lines (JSON, oldest first) to the store's audit trail, which keeps
    /// the newest [`crate::audit::TRAIL_KEPT`].
    fn append_audit(&mut self, lines: &[String]) -> Result<(), RegistryError>;
    /// The newest `limit` lines of the audit trail (every replica's), newest first.
    fn recent_audit(&self, limit: usize) -> Result<Vec<String>, RegistryError>;
    /// Stores an operator's drain or silence (replacing one of the same id).
    fn save_action(&mut self, a: &Action) -> Result<(), RegistryError>;
    /// Forgets action `id` (ended or expired).
    fn delete_action(&mut self, id: u64) -> Result<(), RegistryError>;
    /// Every stored action (unreadable ones logged and skipped).
    fn load_actions(&self) -> Result<Vec<Action>, RegistryError>;
}

/// Which registry store the controller's `database_uri` selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUri {
    SqliteMemory,
    SqliteFile(PathBuf),
    Etcd(String),
}

/// Opens the store selected by `database_uri`; agent entries in etcd live
/// `stale_threshold_sec` past their last heartbeat.
pub fn open_store(
    db: &DatabaseUri,
    stale_threshold_sec: u64,
) -> Result<Box<dyn Registry>, RegistryError> {
    match db {
        DatabaseUri::SqliteMemory => Ok(Box::new(SqliteRegistry::open_in_memory()?)),
        DatabaseUri::SqliteFile(p) => Ok(Box::new(SqliteRegistry::open(p)?)),
        DatabaseUri::Etcd(ep) => Ok(Box::new(EtcdRegistry::connect(ep, stale_threshold_sec)?)),
    }
}

/// The store plus its in-memory index. Writers serialize on the store mutex and
/// update the index under it, so index and store never diverge; readers take only
/// the index read lock.
pub struct IndexedRegistry {
    store: Mutex<Box<dyn Registry>>,
    index: Arc<RwLock<RegistryIndex>>,
    /// The store keeps the index itself (etcd); writes here leave it alone.
    store_feeds_index: bool,
}

impl IndexedRegistry {
    /// Wraps `store` and loads the index from it.
    pub fn new(mut store: Box<dyn Registry>) -> Result<Self, RegistryError> {
        let index = Arc::new(RwLock::new(RegistryIndex::default()));
        let store_feeds_index = store.attach_index(&index)?;
        if !store_feeds_index {
            let agents = store.list_agents()?;
            let rnics = store.list_rnics()?;
            index
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .load(agents, rnics);
        }
        Ok(Self {
            store: Mutex::new(store),
            index,
            store_feeds_index,
        })
    }

    /// A write to the store, then to the index unless the store feeds it: the store's
    /// answer, or its error with the index untouched.
    fn write<T, U>(
        &self,
        store_write: impl FnOnce(&mut dyn Registry) -> Result<T, RegistryError>,
        index_write: impl FnOnce(&mut RegistryIndex) -> U,
    ) -> Result<T, RegistryError> {
        // The store stays locked until the index has the write too: two writes land in
        // both in the same order.
        let mut store = self.store();
        let answer = store_write(&mut **store)?;
        if let Some(mut idx) = self.local_index() {
            index_write(&mut idx);
        }
        drop(store);
        Ok(answer)
    }

    /// The store, locked (a panic while it was held leaves it usable: each call is one
    /// store operation).
    fn store(&self) -> std::sync::MutexGuard<'_, Box<dyn Registry>> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The index after a local write (a store that feeds it has updated it already).
    fn local_index(&self) -> Option<std::sync::RwLockWriteGuard<'_, RegistryIndex>> {
        (!self.store_feeds_index).then(|| self.index.write().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn register_agent(
        &self,
        agent: &AgentRecord,
        rnics: &[RnicRecord],
        now: u64,
    ) -> Result<(), RegistryError> {
        self.write(
            |store| store.register_agent(agent, rnics, now),
            |idx| idx.register_agent(agent, rnics, now),
        )
    }

    /// Forgets an agent and its RNICs in the store and the index; the number of RNICs.
    pub fn delete_agent(&self, agent_id: &str) -> Result<usize, RegistryError> {
        self.write(
            |store| store.delete_agent(agent_id),
            |idx| idx.remove_agent(agent_id),
        )
    }

    pub fn touch(&self, agent_id: &str, now: u64) -> Result<usize, RegistryError> {
        self.write(
            |store| store.touch(agent_id, now),
            |idx| idx.touch(agent_id, now),
        )
    }

    /// The controller did not watch for `by` seconds (it was down, stopped or stalled):
    /// nobody could heartbeat to it, so that time does not count against anyone's
    /// liveness. Every `last_updated` moves forward by `by`, at most to `now`; at start
    /// (`by` = `u64::MAX`) everyone counts as refreshed now. Without this, a controller
    /// down or frozen for longer than the active threshold would hand out empty
    /// pinglists (or purge everyone) until each agent's next heartbeat arrived. A really
    /// dead RNIC still goes inactive after one active threshold of watching.
    pub fn excuse(&self, by: u64, now: u64) -> Result<usize, RegistryError> {
        self.write(
            |store| store.excuse_all(by, now),
            |idx| idx.excuse_all(by, now),
        )
    }

    pub fn remove_stale(&self, now: u64, stale_after: u64) -> Result<usize, RegistryError> {
        self.write(
            |store| store.remove_stale(now, stale_after),
            |idx| idx.remove_stale(now, stale_after),
        )
    }

    /// Read access to the index (pinglists, lookups). Do not hold across an await.
    pub fn index(&self) -> RwLockReadGuard<'_, RegistryIndex> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Persists findings (the index is not involved: findings live in the analyzer).
    pub fn save_findings(&self, findings: &[Finding]) -> Result<(), RegistryError> {
        if findings.is_empty() {
            return Ok(());
        }
        self.store().save_findings(findings)
    }

    /// The stored findings (at start, to restore the localizer).
    pub fn load_findings(&self) -> Result<Vec<Finding>, RegistryError> {
        self.store().load_findings()
    }

    /// Shares an agent's full service-flow set with the other replicas (shared stores).
    pub fn save_service_flows(&self, report: &ServiceFlowReport) -> Result<(), RegistryError> {
        self.store().save_service_flows(report)
    }

    /// The other replicas' service-flow sets as they come (shared stores; taken once).
    pub fn shared_service_flows(
        &self,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<ServiceFlowReport>> {
        self.store().shared_service_flows()
    }

    /// Whether the store is shared by replicas (etcd).
    pub fn is_shared(&self) -> bool {
        self.store_feeds_index
    }

    /// Persists a host's newest Hostping report.
    pub fn save_state(&self, key: &str, value: &[u8]) -> Result<(), RegistryError> {
        self.store().save_state(key, value)
    }

    pub fn load_state(&self, key: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        self.store().load_state(key)
    }

    pub fn save_host(&self, h: &HostHealth) -> Result<(), RegistryError> {
        self.store().save_host(h)
    }

    /// The stored host reports (at start).
    pub fn load_hosts(&self) -> Result<Vec<HostHealth>, RegistryError> {
        self.store().load_hosts()
    }

    pub fn append_audit(&self, lines: &[String]) -> Result<(), RegistryError> {
        self.store().append_audit(lines)
    }

    pub fn recent_audit(&self, limit: usize) -> Result<Vec<String>, RegistryError> {
        self.store().recent_audit(limit)
    }

    pub fn save_action(&self, a: &Action) -> Result<(), RegistryError> {
        self.store().save_action(a)
    }

    pub fn delete_action(&self, id: u64) -> Result<(), RegistryError> {
        self.store().delete_action(id)
    }

    pub fn load_actions(&self) -> Result<Vec<Action>, RegistryError> {
        self.store().load_actions()
    }

    /// Store-level RNIC listing (for consistency checks and tools).
    pub fn store_rnics(&self) -> Result<Vec<RnicRecord>, RegistryError> {
        self.store().list_rnics()
    }
}

#[cfg(test)]
mod tests;
