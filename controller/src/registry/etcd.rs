//! The etcd store: the registry shared by several controller replicas.
//!
//! Layout under [`PREFIX`] (`etcdctl get --prefix /rpingmesh/` shows them):
//! - `agents/<agent_id>`: the agent and its RNICs as one JSON document, attached to the
//!   agent's lease (TTL = `stale_threshold_sec`), so a dead agent's entries expire in etcd
//!   itself whichever replica it last talked to;
//! - `findings/<id, 20 digits>`: a finding (protobuf), written by the analysis leader only;
//! - `hosts/<hostname>`: a host's newest Hostping report (protobuf);
//! - `service/<agent_id>`: the agent's current service flows as one full-sync
//!   ServiceFlowReport (protobuf), under the agent's lease; every replica watches them
//!   into its service-path table;
//! - `audit/<time>-<writer>-<seq>`: the audit trail, every replica's lines (`audit.rs`);
//! - `actions/<id, 20 digits>`: operators' drains and silences (protobuf, `actions.rs`).
//!
//! The in-memory [`RegistryIndex`] is fed by a watch of `agents/` alone (this replica's
//! writes and every other replica's arrive the same way); a write returns only after the
//! watch has applied its revision, so the replica that took a registration answers the
//! next pinglist request with it. GetPinglist never reads etcd.
//!
//! etcd-client is async and the [`Registry`] trait is not (SQLite's calls are cheap and
//! local): the client lives on a thread of its own with a current-thread runtime, and
//! each call waits for its answer with a bound ([`CALL_TIMEOUT`]).

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use prost::Message;
use rpingmesh_proto::controller_agent::{RnicInfo, ServiceFlowReport};
use rpingmesh_proto::operator::{Finding, HostHealth};
use serde::{Deserialize, Serialize};

use super::{
    AgentRecord, Registry, RegistryError, RegistryIndex, RnicRecord, RESOLVED_FINDINGS_KEPT,
};

mod actions;
mod audit;
mod doc;
mod watch;

use doc::AgentDoc;
use watch::{follow, follow_service, get_all, load_agents};

const AGENTS: &str = "/rpingmesh/agents/";
const FINDINGS: &str = "/rpingmesh/findings/";
const HOSTS: &str = "/rpingmesh/hosts/";
const STATE: &str = "/rpingmesh/analyzer_state/";
const SERVICE: &str = "/rpingmesh/service/";
/// The election of the replica that runs analysis (see `crate::leader`).
pub const ELECTION: &str = "/rpingmesh/election/analyzer";

/// How long a registry call waits for etcd before it fails (the gRPC call then fails
/// with it; the agent retries).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long reading a whole prefix (page by page) may take.
pub const LOAD_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the first load may wait for etcd at start.
pub const CONNECT_WAIT: Duration = Duration::from_secs(15);

/// `host:port[,host:port...]` as client URLs (`http://` unless a scheme is given).
pub fn etcd_urls(endpoints: &str) -> Vec<String> {
    endpoints
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.contains("://") {
                s.to_string()
            } else {
                format!("http://{s}")
            }
        })
        .collect()
}

fn agent_key(agent_id: &str) -> String {
    format!("{AGENTS}{agent_id}")
}

fn etcd_err(e: etcd_client::Error) -> RegistryError {
    RegistryError::Other(format!("etcd: {e}"))
}

/// A key and its value.
type KeyValue = (Vec<u8>, Vec<u8>);

/// Work for the etcd thread: given a client, the future it runs there.
type Job = Box<dyn FnOnce(Client) -> JobFuture + Send>;
type JobFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// The revision the watch has applied to the index, for writers to wait on.
#[derive(Default)]
struct Applied {
    rev: Mutex<i64>,
    moved: Condvar,
}

impl Applied {
    fn set(&self, rev: i64) {
        let mut r = self.rev.lock().unwrap_or_else(|e| e.into_inner());
        if rev > *r {
            *r = rev;
            self.moved.notify_all();
        }
    }

    fn wait(&self, rev: i64, bound: Duration) -> Result<(), RegistryError> {
        let deadline = Instant::now() + bound;
        let mut r = self.rev.lock().unwrap_or_else(|e| e.into_inner());
        while *r < rev {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RegistryError::Other(format!(
                    "etcd: the watch did not deliver revision {rev} within {bound:?} (at {})",
                    *r
                )));
            }
            r = self
                .moved
                .wait_timeout(r, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }
}

/// The etcd store. See the module docs.
pub struct EtcdRegistry {
    endpoints: String,
    jobs: mpsc::Sender<Job>,
    client: Client,
    lease_ttl: i64,
    /// This replica's lease of each agent it registered (another replica may hold a
    /// newer one: a keepalive that finds the lease gone grants a new one).
    leases: Mutex<HashMap<String, i64>>,
    index: Option<Arc<RwLock<RegistryIndex>>>,
    applied: Arc<Applied>,
    /// Service-flow sets from the watch, until the controller takes the receiver.
    service_rx: Option<tokio::sync::mpsc::UnboundedReceiver<ServiceFlowReport>>,
    audit_keys: audit::AuditKeys,
}

impl EtcdRegistry {
    /// Connects to `endpoints` (`host:port[,host:port...]`); agent entries live
    /// `lease_ttl_sec` after their last registration or heartbeat.
    pub fn connect(endpoints: &str, lease_ttl_sec: u64) -> Result<Self, RegistryError> {
        let eps = etcd_urls(endpoints);
        if eps.is_empty() {
            return Err(RegistryError::Other(
                "database_uri etcd://: no endpoint given".into(),
            ));
        }
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let eps_thread = eps.clone();
        std::thread::Builder::new()
            .name("etcd-registry".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("etcd thread runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let opts = ConnectOptions::new()
                        .with_connect_timeout(Duration::from_secs(3))
                        .with_timeout(CALL_TIMEOUT)
                        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5))
                        .with_keep_alive_while_idle(true);
                    let client = match Client::connect(&eps_thread, Some(opts)).await {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("etcd {eps_thread:?}: {e}")));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(client.clone()));
                    // Jobs arrive on a std channel: wait for them off this runtime's
                    // thread so that running jobs and the watch go on meanwhile.
                    let (atx, mut arx) = tokio::sync::mpsc::unbounded_channel::<Job>();
                    std::thread::Builder::new()
                        .name("etcd-jobs".into())
                        .spawn(move || {
                            while let Ok(j) = rx.recv() {
                                if atx.send(j).is_err() {
                                    break;
                                }
                            }
                        })
                        .expect("spawning the etcd job relay");
                    while let Some(job) = arx.recv().await {
                        tokio::spawn(job(client.clone()));
                    }
                });
            })
            .map_err(|e| RegistryError::Other(format!("etcd thread: {e}")))?;
        let client = ready_rx
            .recv_timeout(CONNECT_WAIT)
            .map_err(|_| {
                RegistryError::Other(format!(
                    "etcd {endpoints}: no connection in {CONNECT_WAIT:?}"
                ))
            })?
            .map_err(RegistryError::Other)?;
        Ok(EtcdRegistry {
            endpoints: endpoints.to_string(),
            jobs,
            client,
            lease_ttl: lease_ttl_sec.max(2) as i64,
            leases: Mutex::new(HashMap::new()),
            index: None,
            applied: Arc::new(Applied::default()),
            service_rx: None,
            audit_keys: audit::AuditKeys::new(),
        })
    }

    /// A client for other users of the same etcd (the leader election).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Runs `f` on the etcd thread and waits (at most [`CALL_TIMEOUT`] plus a margin).
    fn call<T, F, Fut>(&self, what: &str, f: F) -> Result<T, RegistryError>
    where
        T: Send + 'static,
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, RegistryError>> + Send + 'static,
    {
        self.call_within(what, CALL_TIMEOUT + Duration::from_secs(1), f)
    }

    /// As [`Self::call`], for work of many requests (a whole prefix, page by page).
    fn call_within<T, F, Fut>(&self, what: &str, bound: Duration, f: F) -> Result<T, RegistryError>
    where
        T: Send + 'static,
        F: FnOnce(Client) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T, RegistryError>> + Send + 'static,
    {
        let (tx, rx) = mpsc::sync_channel(1);
        let job: Job = Box::new(move |c| {
            Box::pin(async move {
                let _ = tx.send(f(c).await);
            })
        });
        self.jobs
            .send(job)
            .map_err(|_| RegistryError::Other("etcd: the client thread is gone".into()))?;
        rx.recv_timeout(bound).map_err(|_| {
            RegistryError::Other(format!(
                "etcd {}: {what} timed out after {bound:?}",
                self.endpoints
            ))
        })?
    }

    fn index(&self) -> Result<&Arc<RwLock<RegistryIndex>>, RegistryError> {
        self.index
            .as_ref()
            .ok_or_else(|| RegistryError::Other("etcd: the index is not attached".into()))
    }

    /// The agent's lease, kept alive once (etcd's KeepAliveOnce), or a new one when this
    /// replica has none or it expired.
    fn lease_for(&self, agent_id: &str) -> Result<i64, RegistryError> {
        let known = self
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(agent_id)
            .copied();
        let ttl = self.lease_ttl;
        let id = self.call("lease", move |mut c| async move {
            if let Some(id) = known {
                let (mut keeper, mut stream) = c.lease_keep_alive(id).await.map_err(etcd_err)?;
                keeper.keep_alive().await.map_err(etcd_err)?;
                if let Some(r) = stream.message().await.map_err(etcd_err)? {
                    if r.ttl() > 0 {
                        return Ok(id);
                    }
                }
            }
            Ok(c.lease_grant(ttl, None).await.map_err(etcd_err)?.id())
        })?;
        self.leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(agent_id.to_string(), id);
        Ok(id)
    }

    /// Commits `txn` and waits until the index has applied it.
    fn commit(&self, what: &str, txn: Txn) -> Result<(), RegistryError> {
        let rev = self.call(what, move |mut c| async move {
            let r = c.txn(txn).await.map_err(etcd_err)?;
            Ok(r.header().map(|h| h.revision()).unwrap_or(0))
        })?;
        self.applied.wait(rev, CALL_TIMEOUT)
    }

    /// Every protobuf message under `prefix`; one that does not decode is logged (`skipped`)
    /// and left out.
    fn load_messages<M: Message + Default>(
        &self,
        prefix: &'static str,
        skipped: &str,
    ) -> Result<Vec<M>, RegistryError> {
        Ok(self
            .get_prefix(prefix)?
            .iter()
            .filter_map(|(k, v)| match M::decode(v.as_slice()) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(key = %String::from_utf8_lossy(k), error = %e, "{skipped}");
                    None
                }
            })
            .collect())
    }

    fn get_prefix(&self, prefix: &'static str) -> Result<Vec<KeyValue>, RegistryError> {
        self.call_within("get", LOAD_TIMEOUT, move |mut c| async move {
            Ok(get_all(&mut c, prefix).await?.1)
        })
    }

    /// Every agent document that decodes (a bad one is skipped, as the index load does).
    fn agent_docs(&self) -> Result<impl Iterator<Item = AgentDoc>, RegistryError> {
        let kvs = self.get_prefix(AGENTS)?;
        Ok(kvs
            .into_iter()
            .filter_map(|(k, v)| AgentDoc::decode(&k, &v).ok()))
    }
}

impl Registry for EtcdRegistry {
    fn save_service_flows(&mut self, report: &ServiceFlowReport) -> Result<(), RegistryError> {
        let lease = self.lease_for(&report.agent_id)?;
        let (key, value) = (
            format!("{SERVICE}{}", report.agent_id),
            report.encode_to_vec(),
        );
        self.call("save service flows", move |mut c| async move {
            c.put(key, value, Some(PutOptions::new().with_lease(lease)))
                .await
                .map_err(etcd_err)?;
            Ok(())
        })
    }

    fn shared_service_flows(
        &mut self,
    ) -> Option<tokio::sync::mpsc::UnboundedReceiver<ServiceFlowReport>> {
        self.service_rx.take()
    }

    fn attach_index(&mut self, index: &Arc<RwLock<RegistryIndex>>) -> Result<bool, RegistryError> {
        let (idx, applied) = (index.clone(), self.applied.clone());
        // First load here, so a controller that cannot read etcd fails at start.
        let deadline = Instant::now() + CONNECT_WAIT;
        let rev = loop {
            let i = idx.clone();
            match self.call(
                "load",
                move |mut c| async move { load_agents(&mut c, &i).await },
            ) {
                Ok(rev) => break rev,
                Err(e) if Instant::now() >= deadline => {
                    return Err(RegistryError::Other(format!(
                        "etcd {}: cannot load the registry: {e}",
                        self.endpoints
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(300)),
            }
        };
        applied.set(rev);
        let job: Job = Box::new(move |c| Box::pin(follow(c, idx, applied, rev + 1)));
        self.jobs
            .send(job)
            .map_err(|_| RegistryError::Other("etcd: the client thread is gone".into()))?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        self.service_rx = Some(rx);
        let job: Job = Box::new(move |c| Box::pin(follow_service(c, tx)));
        self.jobs
            .send(job)
            .map_err(|_| RegistryError::Other("etcd: the client thread is gone".into()))?;
        self.index = Some(index.clone());
        Ok(true)
    }

    fn register_agent(
        &mut self,
        agent: &AgentRecord,
        rnics: &[RnicRecord],
        now: u64,
    ) -> Result<(), RegistryError> {
        let lease = self.lease_for(&agent.agent_id)?;
        let doc = AgentDoc::new(agent, rnics, now);
        let mut ops = vec![TxnOp::put(
            agent_key(&agent.agent_id),
            serde_json::to_vec(&doc).expect("serializable"),
            Some(PutOptions::new().with_lease(lease)),
        )];
        // GIDs that move here leave their previous owner's document (or the owner goes).
        let moved: Vec<(String, Option<AgentDoc>)> = {
            let idx = self.index()?.read().unwrap_or_else(|e| e.into_inner());
            let mut owners: Vec<String> = rnics
                .iter()
                .filter_map(|r| idx.rnic(&r.gid))
                .filter(|r| r.agent_id != agent.agent_id)
                .map(|r| r.agent_id.clone())
                .collect();
            owners.sort();
            owners.dedup();
            owners
                .into_iter()
                .map(|o| {
                    let rest = AgentDoc::of_index(&idx, &o).map(|mut d| {
                        d.rnics.retain(|r| rnics.iter().all(|n| n.gid != r.gid));
                        d
                    });
                    (o, rest.filter(|d| !d.rnics.is_empty()))
                })
                .collect()
        };
        for (owner, rest) in moved {
            match rest {
                Some(d) => {
                    // Keeps the owner's lease: read it from etcd.
                    let key = agent_key(&owner);
                    let k = key.clone();
                    let lease = self.call("get", move |mut c| async move {
                        let r = c.get(k, None).await.map_err(etcd_err)?;
                        Ok(r.kvs().first().map(|kv| kv.lease()).unwrap_or(0))
                    })?;
                    let opts = (lease != 0).then(|| PutOptions::new().with_lease(lease));
                    ops.push(TxnOp::put(
                        key,
                        serde_json::to_vec(&d).expect("serializable"),
                        opts,
                    ));
                }
                None => ops.push(TxnOp::delete(agent_key(&owner), None)),
            }
        }
        self.commit("register", Txn::new().and_then(ops))
    }

    fn list_agents(&self) -> Result<Vec<AgentRecord>, RegistryError> {
        Ok(self.agent_docs()?.map(|d| d.records().0).collect())
    }

    fn list_rnics(&self) -> Result<Vec<RnicRecord>, RegistryError> {
        Ok(self.agent_docs()?.flat_map(|d| d.records().1).collect())
    }

    fn lookup_rnic(&self, gid: &str) -> Result<Option<RnicRecord>, RegistryError> {
        Ok(self.list_rnics()?.into_iter().find(|r| r.gid == gid))
    }

    fn touch(&mut self, agent_id: &str, now: u64) -> Result<usize, RegistryError> {
        let doc = {
            let idx = self.index()?.read().unwrap_or_else(|e| e.into_inner());
            AgentDoc::of_index(&idx, agent_id)
        };
        let Some(mut doc) = doc else {
            return Ok(0);
        };
        doc.last_updated = now;
        let lease = self.lease_for(agent_id)?;
        let n = doc.rnics.len();
        self.commit(
            "touch",
            Txn::new().and_then(vec![TxnOp::put(
                agent_key(agent_id),
                serde_json::to_vec(&doc).expect("serializable"),
                Some(PutOptions::new().with_lease(lease)),
            )]),
        )?;
        Ok(n)
    }

    fn delete_agent(&mut self, agent_id: &str) -> Result<usize, RegistryError> {
        let n = {
            let idx = self.index()?.read().unwrap_or_else(|e| e.into_inner());
            idx.agent_gids(agent_id).len()
        };
        self.commit(
            "delete",
            Txn::new().and_then(vec![TxnOp::delete(agent_key(agent_id), None)]),
        )?;
        self.leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(agent_id);
        Ok(n)
    }

    /// Leases expire agents in etcd itself (TTL = the stale threshold).
    fn remove_stale(&mut self, _now: u64, _stale_after: u64) -> Result<usize, RegistryError> {
        Ok(0)
    }

    /// Not for a shared store: other replicas heard the heartbeats this one missed, and
    /// etcd's leases tick on in etcd.
    fn excuse_all(&mut self, _by: u64, _now: u64) -> Result<usize, RegistryError> {
        Ok(0)
    }

    fn save_findings(&mut self, findings: &[Finding]) -> Result<(), RegistryError> {
        let ops: Vec<TxnOp> = findings
            .iter()
            .map(|f| TxnOp::put(format!("{FINDINGS}{:020}", f.id), f.encode_to_vec(), None))
            .collect();
        self.call("save findings", move |mut c| async move {
            c.txn(Txn::new().and_then(ops)).await.map_err(etcd_err)?;
            Ok(())
        })?;
        // Only the newest resolved ones are kept.
        let mut resolved: Vec<(u64, u64)> = self
            .load_findings()?
            .iter()
            .filter(|f| !f.open)
            .map(|f| (f.resolved_unix_ns, f.id))
            .collect();
        if resolved.len() > RESOLVED_FINDINGS_KEPT {
            resolved.sort_unstable();
            let drop: Vec<TxnOp> = resolved[..resolved.len() - RESOLVED_FINDINGS_KEPT]
                .iter()
                .map(|(_, id)| TxnOp::delete(format!("{FINDINGS}{id:020}"), None))
                .collect();
            self.call("trim findings", move |mut c| async move {
                c.txn(Txn::new().and_then(drop)).await.map_err(etcd_err)?;
                Ok(())
            })?;
        }
        Ok(())
    }

    fn load_findings(&self) -> Result<Vec<Finding>, RegistryError> {
        self.load_messages(FINDINGS, "stored finding skipped")
    }

    fn save_state(&mut self, key: &str, value: &[u8]) -> Result<(), RegistryError> {
        let (key, value) = (format!("{STATE}{key}"), value.to_vec());
        self.call("save analyzer state", move |mut c| async move {
            c.put(key, value, None).await.map_err(etcd_err)?;
            Ok(())
        })
    }

    fn load_state(&self, key: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        let key = format!("{STATE}{key}");
        self.call("load analyzer state", move |mut c| async move {
            let r = c.get(key, None).await.map_err(etcd_err)?;
            Ok(r.kvs().first().map(|kv| kv.value().to_vec()))
        })
    }

    fn save_host(&mut self, h: &HostHealth) -> Result<(), RegistryError> {
        let (key, value) = (format!("{HOSTS}{}", h.hostname), h.encode_to_vec());
        self.call("save host", move |mut c| async move {
            c.put(key, value, None).await.map_err(etcd_err)?;
            Ok(())
        })
    }

    fn load_hosts(&self) -> Result<Vec<HostHealth>, RegistryError> {
        self.load_messages(HOSTS, "stored host report skipped")
    }

    fn append_audit(&mut self, lines: &[String]) -> Result<(), RegistryError> {
        self.append_audit_lines(lines)
    }

    fn recent_audit(&self, limit: usize) -> Result<Vec<String>, RegistryError> {
        self.recent_audit_lines(limit)
    }

    fn save_action(&mut self, a: &rpingmesh_proto::operator::Action) -> Result<(), RegistryError> {
        self.put_action(a)
    }

    fn delete_action(&mut self, id: u64) -> Result<(), RegistryError> {
        self.remove_action(id)
    }

    fn load_actions(&self) -> Result<Vec<rpingmesh_proto::operator::Action>, RegistryError> {
        self.load_messages(actions::ACTIONS, "stored action skipped")
    }
}
