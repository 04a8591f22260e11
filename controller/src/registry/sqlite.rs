//! Embedded SQLite store (bundled SQLite; no server to run).

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::{AgentRecord, Registry, RegistryError, RnicRecord};

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
";

const RNIC_COLUMNS: &str =
    "gid, qpn, ip_address, host_name, tor_id, device_name, agent_id, last_updated_epoch";

pub struct SqliteRegistry {
    conn: Connection,
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
        Ok(Self { conn })
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
