//! Embedded SQLite store (bundled SQLite; no server to run).

use std::path::Path;

use prost::Message;
use rpingmesh_proto::operator::{Action, Finding, HostHealth};
use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{AgentRecord, Registry, RegistryError, RnicRecord, RESOLVED_FINDINGS_KEPT};
use crate::audit::TRAIL_KEPT;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS agents (
    agent_id TEXT PRIMARY KEY,
    agent_ip TEXT NOT NULL,
    hostname TEXT NOT NULL,
    tor_id TEXT NOT NULL,
    last_updated_epoch INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS rnics (
    gid TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    qpn INTEGER NOT NULL,
    ip_address TEXT NOT NULL,
    host_name TEXT NOT NULL,
    tor_id TEXT NOT NULL,
    device_name TEXT NOT NULL,
    last_updated_epoch INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS rnics_last_updated ON rnics(last_updated_epoch);
CREATE INDEX IF NOT EXISTS rnics_agent ON rnics(agent_id);
-- The localizer's findings (added after the registry tables: IF NOT EXISTS migrates a
-- store from before). `body` is the prost-encoded operator.v1.Finding, the truth; the
-- other columns are copies for pruning and inspection with the sqlite3 shell.
CREATE TABLE IF NOT EXISTS findings (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    location TEXT NOT NULL,
    open INTEGER NOT NULL,
    opened_unix_ns INTEGER NOT NULL,
    resolved_unix_ns INTEGER NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS findings_resolved ON findings(open, resolved_unix_ns);
-- Each host's newest Hostping report (`body`: prost-encoded operator.v1.HostHealth).
CREATE TABLE IF NOT EXISTS host_health (
    hostname TEXT PRIMARY KEY,
    agent_id TEXT NOT NULL,
    checked_unix_ns INTEGER NOT NULL,
    findings INTEGER NOT NULL,
    body BLOB NOT NULL
);
-- The analyzer's learned state by name (the gray detector's baseline, JSON).
CREATE TABLE IF NOT EXISTS analyzer_state (
    key TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
-- Operators' drains and silences in force (`body`: prost-encoded operator.v1.Action).
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY,
    body BLOB NOT NULL
);
-- The audit trail: one JSON line per audited call, in the order written.
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    line TEXT NOT NULL
);
";

const RNIC_COLUMNS: &str =
    "gid, qpn, ip_address, host_name, tor_id, device_name, agent_id, last_updated_epoch";

pub struct SqliteRegistry {
    conn: Connection,
    /// Resolved findings kept by `save_findings` ([`RESOLVED_FINDINGS_KEPT`]).
    resolved_kept: usize,
    /// Audit lines kept ([`TRAIL_KEPT`]).
    audit_kept: usize,
}

fn rnic_from_row(r: &Row<'_>) -> rusqlite::Result<RnicRecord> {
    Ok(RnicRecord {
        gid: r.get(0)?,
        qpn: r.get(1)?,
        ip_address: r.get(2)?,
        host_name: r.get(3)?,
        tor_id: r.get(4)?,
        device_name: r.get(5)?,
        agent_id: r.get(6)?,
        last_updated: r.get::<_, i64>(7)?.max(0) as u64,
    })
}

/// SQLite INTEGER is i64; clamp so a far-future clock cannot overflow.
fn epoch(now: u64) -> i64 {
    now.min(i64::MAX as u64) as i64
}

impl SqliteRegistry {
    pub fn open(path: &Path) -> Result<Self, RegistryError> {
        // The shipped config keeps the registry under /var/lib/rpingmesh: create the
        // directory on first start (systemd's StateDirectory does it for the unit).
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() && !dir.is_dir() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    RegistryError::Other(format!(
                        "database directory {} does not exist and cannot be created ({e}); \
                         create it or set database_uri",
                        dir.display()
                    ))
                })?;
            }
        }
        let conn = Connection::open(path)?;
        // WAL + NORMAL: a registration commit does not fsync; a crash loses at most the
        // last registrations, which agents repeat periodically anyway.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Self::init(conn)
    }

    pub fn open_in_memory() -> Result<Self, RegistryError> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<Self, RegistryError> {
        conn.execute_batch(SCHEMA)?;
        Ok(Self {
            conn,
            resolved_kept: RESOLVED_FINDINGS_KEPT,
            audit_kept: TRAIL_KEPT,
        })
    }

    /// Changes how many resolved findings are kept (tests; at least 1).
    pub fn set_resolved_findings_kept(&mut self, n: usize) {
        self.resolved_kept = n.max(1);
    }

    /// Changes how many audit lines are kept (tests; at least 1).
    pub fn set_audit_kept(&mut self, n: usize) {
        self.audit_kept = n.max(1);
    }
}

impl Registry for SqliteRegistry {
    fn register_agent(
        &mut self,
        agent: &AgentRecord,
        rnics: &[RnicRecord],
        now: u64,
    ) -> Result<(), RegistryError> {
        let tx = self.conn.transaction()?;
        tx.prepare_cached(
            "INSERT OR REPLACE INTO agents (agent_id, agent_ip, hostname, tor_id, last_updated_epoch)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![agent.agent_id, agent.agent_ip, agent.hostname, agent.tor_id, epoch(now)])?;
        // Owners losing a GID to this agent (a moved RNIC); found by primary key.
        let mut previous_owners: Vec<String> = Vec::new();
        {
            let mut owner = tx.prepare_cached("SELECT agent_id FROM rnics WHERE gid = ?1")?;
            for r in rnics {
                if let Some(o) = owner
                    .query_row(params![r.gid], |row| row.get::<_, String>(0))
                    .optional()?
                {
                    if o != agent.agent_id && !previous_owners.contains(&o) {
                        previous_owners.push(o);
                    }
                }
            }
        }
        tx.prepare_cached("DELETE FROM rnics WHERE agent_id = ?1")?
            .execute(params![agent.agent_id])?;
        {
            let mut ins = tx.prepare_cached(
                "INSERT OR REPLACE INTO rnics
                 (gid, qpn, ip_address, host_name, tor_id, device_name, agent_id, last_updated_epoch)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?;
            for r in rnics {
                ins.execute(params![
                    r.gid,
                    r.qpn,
                    r.ip_address,
                    r.host_name,
                    r.tor_id,
                    r.device_name,
                    agent.agent_id,
                    epoch(now)
                ])?;
            }
        }
        // An agent whose last GID moved here disappears (indexed lookups only).
        {
            let mut del = tx.prepare_cached(
                "DELETE FROM agents WHERE agent_id = ?1
                 AND NOT EXISTS (SELECT 1 FROM rnics WHERE rnics.agent_id = ?1)",
            )?;
            for o in &previous_owners {
                del.execute(params![o])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn list_agents(&self) -> Result<Vec<AgentRecord>, RegistryError> {
        let mut st = self.conn.prepare_cached(
            "SELECT agent_id, agent_ip, hostname, tor_id, last_updated_epoch FROM agents",
        )?;
        let rows = st.query_map([], |r| {
            Ok(AgentRecord {
                agent_id: r.get(0)?,
                agent_ip: r.get(1)?,
                hostname: r.get(2)?,
                tor_id: r.get(3)?,
                last_updated: r.get::<_, i64>(4)?.max(0) as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn list_rnics(&self) -> Result<Vec<RnicRecord>, RegistryError> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {RNIC_COLUMNS} FROM rnics"))?;
        let rows = st.query_map([], rnic_from_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn lookup_rnic(&self, gid: &str) -> Result<Option<RnicRecord>, RegistryError> {
        let mut st = self
            .conn
            .prepare_cached(&format!("SELECT {RNIC_COLUMNS} FROM rnics WHERE gid = ?1"))?;
        Ok(st.query_row(params![gid], rnic_from_row).optional()?)
    }

    fn touch(&mut self, agent_id: &str, now: u64) -> Result<usize, RegistryError> {
        let tx = self.conn.transaction()?;
        tx.prepare_cached("UPDATE agents SET last_updated_epoch = ?2 WHERE agent_id = ?1")?
            .execute(params![agent_id, epoch(now)])?;
        let n = tx
            .prepare_cached("UPDATE rnics SET last_updated_epoch = ?2 WHERE agent_id = ?1")?
            .execute(params![agent_id, epoch(now)])?;
        tx.commit()?;
        Ok(n)
    }

    fn excuse_all(&mut self, by: u64, now: u64) -> Result<usize, RegistryError> {
        let tx = self.conn.transaction()?;
        // `by` is capped at `now` so the sum stays in range.
        let (by, now) = (epoch(by.min(now)), epoch(now));
        tx.prepare_cached(
            "UPDATE agents SET last_updated_epoch = \
             max(last_updated_epoch, min(last_updated_epoch + ?1, ?2))",
        )?
        .execute(params![by, now])?;
        let n = tx
            .prepare_cached(
                "UPDATE rnics SET last_updated_epoch = \
                 max(last_updated_epoch, min(last_updated_epoch + ?1, ?2))",
            )?
            .execute(params![by, now])?;
        tx.commit()?;
        Ok(n)
    }

    fn save_findings(&mut self, findings: &[Finding]) -> Result<(), RegistryError> {
        let tx = self.conn.transaction()?;
        {
            let mut up = tx.prepare_cached(
                "INSERT OR REPLACE INTO findings
                 (id, kind, location, open, opened_unix_ns, resolved_unix_ns, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            for f in findings {
                up.execute(params![
                    epoch(f.id),
                    f.kind,
                    f.location,
                    f.open,
                    epoch(f.opened_unix_ns),
                    epoch(f.resolved_unix_ns),
                    f.encode_to_vec()
                ])?;
            }
        }
        if findings.iter().any(|f| !f.open) {
            tx.prepare_cached(
                "DELETE FROM findings WHERE open = 0 AND id NOT IN
                 (SELECT id FROM findings WHERE open = 0
                  ORDER BY resolved_unix_ns DESC, id DESC LIMIT ?1)",
            )?
            .execute(params![self.resolved_kept.min(i64::MAX as usize) as i64])?;
        }
        tx.commit()?;
        Ok(())
    }

    fn load_findings(&self) -> Result<Vec<Finding>, RegistryError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT id, body FROM findings ORDER BY id")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1))))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, body) = row?;
            let decoded = body
                .map_err(|e| e.to_string())
                .and_then(|b| Finding::decode(b.as_slice()).map_err(|e| e.to_string()));
            match decoded {
                Ok(f) if f.id == id as u64 => out.push(f),
                Ok(f) => tracing::error!(
                    row_id = id,
                    body_id = f.id,
                    "stored finding skipped: its body names another id"
                ),
                Err(e) => tracing::error!(
                    row_id = id,
                    error = %e,
                    "stored finding skipped: its body cannot be decoded"
                ),
            }
        }
        Ok(out)
    }

    fn save_state(&mut self, key: &str, value: &[u8]) -> Result<(), RegistryError> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO analyzer_state (key, value) VALUES (?1, ?2)")?
            .execute(params![key, value])?;
        Ok(())
    }

    fn load_state(&self, key: &str) -> Result<Option<Vec<u8>>, RegistryError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT value FROM analyzer_state WHERE key = ?1")?;
        let mut rows = st.query(params![key])?;
        Ok(match rows.next()? {
            Some(r) => Some(r.get::<_, Vec<u8>>(0)?),
            None => None,
        })
    }

    fn save_host(&mut self, h: &HostHealth) -> Result<(), RegistryError> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO host_health (hostname, agent_id, checked_unix_ns, findings, body)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                h.hostname,
                h.agent_id,
                epoch(h.checked_unix_ns),
                h.findings.len() as i64,
                h.encode_to_vec()
            ])?;
        Ok(())
    }

    fn load_hosts(&self) -> Result<Vec<HostHealth>, RegistryError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT hostname, body FROM host_health ORDER BY hostname")?;
        let rows = st.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (name, body) = row?;
            match HostHealth::decode(body.as_slice()) {
                Ok(h) if h.hostname == name => out.push(h),
                Ok(_) => {
                    tracing::error!(hostname = %name, "stored host report skipped: its body names another host")
                }
                Err(e) => {
                    tracing::error!(hostname = %name, error = %e, "stored host report skipped: its body cannot be decoded")
                }
            }
        }
        Ok(out)
    }

    fn append_audit(&mut self, lines: &[String]) -> Result<(), RegistryError> {
        let tx = self.conn.transaction()?;
        {
            let mut ins = tx.prepare_cached("INSERT INTO audit (line) VALUES (?1)")?;
            for l in lines {
                ins.execute(params![l])?;
            }
            // Row ids only grow (the newest row is never deleted), so the newest N are
            // those within N of the largest.
            tx.prepare_cached("DELETE FROM audit WHERE id <= (SELECT MAX(id) FROM audit) - ?1")?
                .execute(params![self.audit_kept as i64])?;
        }
        tx.commit()?;
        Ok(())
    }

    fn save_action(&mut self, a: &Action) -> Result<(), RegistryError> {
        self.conn
            .prepare_cached("INSERT OR REPLACE INTO actions (id, body) VALUES (?1, ?2)")?
            .execute(params![epoch(a.id), a.encode_to_vec()])?;
        Ok(())
    }

    fn delete_action(&mut self, id: u64) -> Result<(), RegistryError> {
        self.conn
            .prepare_cached("DELETE FROM actions WHERE id = ?1")?
            .execute(params![epoch(id)])?;
        Ok(())
    }

    fn load_actions(&self) -> Result<Vec<Action>, RegistryError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT id, body FROM actions ORDER BY id")?;
        let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, body) = row?;
            match Action::decode(body.as_slice()) {
                Ok(a) => out.push(a),
                Err(e) => {
                    tracing::error!(id, error = %e, "stored action skipped: its body cannot be decoded")
                }
            }
        }
        Ok(out)
    }

    fn recent_audit(&self, limit: usize) -> Result<Vec<String>, RegistryError> {
        let mut st = self
            .conn
            .prepare_cached("SELECT line FROM audit ORDER BY id DESC LIMIT ?1")?;
        let rows = st.query_map(params![limit.min(i64::MAX as usize) as i64], |r| {
            r.get::<_, String>(0)
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn delete_agent(&mut self, agent_id: &str) -> Result<usize, RegistryError> {
        let tx = self.conn.transaction()?;
        let n = tx
            .prepare_cached("DELETE FROM rnics WHERE agent_id = ?1")?
            .execute(params![agent_id])?;
        tx.prepare_cached("DELETE FROM agents WHERE agent_id = ?1")?
            .execute(params![agent_id])?;
        tx.commit()?;
        Ok(n)
    }

    fn remove_stale(&mut self, now: u64, stale_after: u64) -> Result<usize, RegistryError> {
        let cutoff = epoch(now.saturating_sub(stale_after));
        let tx = self.conn.transaction()?;
        let n = tx
            .prepare_cached("DELETE FROM rnics WHERE last_updated_epoch < ?1")?
            .execute(params![cutoff])?;
        tx.prepare_cached(
            "DELETE FROM agents
             WHERE NOT EXISTS (SELECT 1 FROM rnics WHERE rnics.agent_id = agents.agent_id)",
        )?
        .execute([])?;
        tx.commit()?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpingmesh_proto::operator::{FindingEvidence, FindingPath};

    fn finding(id: u64, open: bool, resolved_unix_ns: u64) -> Finding {
        Finding {
            id,
            kind: "rnic".into(),
            location: format!("host-{id}/mlx5_0"),
            symptom: "down".into(),
            severity: "down".into(),
            confidence: 0.75,
            opened_unix_ns: 1_000 + id,
            last_seen_unix_ns: 2_000 + id,
            resolved_unix_ns,
            open,
            evidence: Some(FindingEvidence {
                windows: 3,
                paths: vec![FindingPath {
                    source_gid: "fd00:0000:0000:0000:0000:0000:0000:0001".into(),
                    target_gid: "fd00:0000:0000:0000:0000:0000:0000:0002".into(),
                    probe_total: 60,
                    probe_failed: 60,
                    network_rtt_p50_ns: 0,
                }],
                paths_total: 12,
                probe_total: 720,
                probe_failed: 700,
                flow_labels: vec![7, 9],
                direction: "up".into(),
                excess_ns: 0,
                detail: "12 of 12 paths to and from it fail".into(),
                loss_ratio: 0.0,
                loss_ratio_stderr: 0.0,
                score: 0.0,
            }),
            impact: Vec::new(),
            suppressed: String::new(),
            suppressed_by: 0,
        }
    }

    #[test]
    fn findings_round_trip_through_a_file_and_upsert_by_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("reg.db");
        {
            let mut st = SqliteRegistry::open(&path).unwrap();
            st.save_findings(&[finding(1, true, 0), finding(2, false, 5_000)])
                .unwrap();
            // The same id again replaces the row: finding 1 resolves.
            let mut f1 = finding(1, false, 6_000);
            f1.symptom = "flapping".into();
            st.save_findings(&[f1]).unwrap();
        }
        let st = SqliteRegistry::open(&path).unwrap();
        let got = st.load_findings().unwrap();
        let mut want1 = finding(1, false, 6_000);
        want1.symptom = "flapping".into();
        assert_eq!(got, vec![want1, finding(2, false, 5_000)]);
        let (open, resolved): (i64, i64) = st
            .conn
            .query_row(
                "SELECT open, resolved_unix_ns FROM findings WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((open, resolved), (0, 6_000), "the columns follow the body");
    }

    #[test]
    fn analyzer_state_round_trips_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.db");
        {
            let mut st = SqliteRegistry::open(&path).unwrap();
            assert_eq!(st.load_state("baseline").unwrap(), None);
            st.save_state("baseline", b"one").unwrap();
            st.save_state("baseline", b"two").unwrap();
        }
        let st = SqliteRegistry::open(&path).unwrap();
        assert_eq!(
            st.load_state("baseline").unwrap().as_deref(),
            Some(&b"two"[..])
        );
    }

    #[test]
    fn only_the_newest_resolved_findings_are_kept() {
        let mut st = SqliteRegistry::open_in_memory().unwrap();
        st.set_resolved_findings_kept(3);
        // Open ones are never pruned, however many.
        let open: Vec<Finding> = (100..110).map(|i| finding(i, true, 0)).collect();
        st.save_findings(&open).unwrap();
        // Resolved out of id order: the resolution time decides which are newest.
        for (id, at) in [(1, 50), (2, 10), (3, 40), (4, 30), (5, 20)] {
            st.save_findings(&[finding(id, false, at)]).unwrap();
        }
        let got = st.load_findings().unwrap();
        let resolved: Vec<u64> = got.iter().filter(|f| !f.open).map(|f| f.id).collect();
        assert_eq!(resolved, vec![1, 3, 4], "resolved at 50, 40 and 30");
        assert_eq!(got.iter().filter(|f| f.open).count(), 10);
        // The shipped bound.
        let mut st = SqliteRegistry::open_in_memory().unwrap();
        let many: Vec<Finding> = (1..=RESOLVED_FINDINGS_KEPT as u64 + 5)
            .map(|i| finding(i, false, i))
            .collect();
        st.save_findings(&many).unwrap();
        let got = st.load_findings().unwrap();
        assert_eq!(got.len(), RESOLVED_FINDINGS_KEPT);
        assert_eq!(got[0].id, 6, "the five oldest went");
    }

    #[test]
    fn an_unreadable_row_is_skipped_not_fatal() {
        let mut st = SqliteRegistry::open_in_memory().unwrap();
        st.save_findings(&[finding(1, true, 0), finding(3, false, 9)])
            .unwrap();
        st.conn
            .execute(
                "INSERT INTO findings VALUES (2, 'rnic', 'x', 1, 0, 0, x'ffffffff0f')",
                [],
            )
            .unwrap();
        // A body that decodes but under another id is not trusted either.
        st.conn
            .execute(
                "INSERT INTO findings VALUES (4, 'rnic', 'x', 1, 0, 0, ?1)",
                params![finding(5, true, 0).encode_to_vec()],
            )
            .unwrap();
        // Nor a body of the wrong SQL type.
        st.conn
            .execute(
                "INSERT INTO findings VALUES (6, 'rnic', 'x', 1, 0, 0, 42)",
                [],
            )
            .unwrap();
        let ids: Vec<u64> = st.load_findings().unwrap().iter().map(|f| f.id).collect();
        assert_eq!(ids, vec![1, 3]);
    }

    #[test]
    fn a_store_from_before_findings_gets_the_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        {
            // The schema as it was: registry tables only, with a registration.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE agents (agent_id TEXT PRIMARY KEY, agent_ip TEXT NOT NULL,
                   hostname TEXT NOT NULL, tor_id TEXT NOT NULL,
                   last_updated_epoch INTEGER NOT NULL);
                 CREATE TABLE rnics (gid TEXT PRIMARY KEY, agent_id TEXT NOT NULL,
                   qpn INTEGER NOT NULL, ip_address TEXT NOT NULL, host_name TEXT NOT NULL,
                   tor_id TEXT NOT NULL, device_name TEXT NOT NULL,
                   last_updated_epoch INTEGER NOT NULL);
                 INSERT INTO agents VALUES ('a1', '10.0.0.1', 'h', 't1', 100);
                 INSERT INTO rnics VALUES ('fd00:0000:0000:0000:0000:0000:0000:0001', 'a1',
                   7, '10.0.0.1', 'h', 't1', 'mlx5_0', 100);",
            )
            .unwrap();
        }
        let mut st = SqliteRegistry::open(&path).unwrap();
        assert_eq!(st.list_rnics().unwrap().len(), 1, "registrations kept");
        assert!(st.load_findings().unwrap().is_empty());
        st.save_findings(&[finding(1, true, 0)]).unwrap();
        drop(st);
        let st = SqliteRegistry::open(&path).unwrap();
        assert_eq!(st.load_findings().unwrap(), vec![finding(1, true, 0)]);
    }

    #[test]
    fn the_audit_trail_keeps_the_newest_lines_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.db");
        let mut st = SqliteRegistry::open(&path).unwrap();
        st.set_audit_kept(3);
        let lines = |r: std::ops::Range<u32>| r.map(|i| format!("l{i}")).collect::<Vec<_>>();
        st.append_audit(&lines(0..2)).unwrap();
        st.append_audit(&lines(2..5)).unwrap();
        assert_eq!(st.recent_audit(10).unwrap(), ["l4", "l3", "l2"]);
        assert_eq!(st.recent_audit(1).unwrap(), ["l4"]);
        drop(st);
        let mut st = SqliteRegistry::open(&path).unwrap();
        st.set_audit_kept(3);
        st.append_audit(&lines(5..6)).unwrap();
        assert_eq!(st.recent_audit(10).unwrap(), ["l5", "l4", "l3"]);
    }
}
