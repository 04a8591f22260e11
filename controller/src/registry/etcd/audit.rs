//! The audit trail in etcd, so every replica reads every replica's lines:
//! `audit/<time_unix_ns, 20 digits>-<writer, 16 hex>-<seq, 10 digits>` -> the JSON line.
//! Keys sort by the entry's time; the writer (random per process) and its sequence keep
//! two replicas' lines of the same nanosecond apart. Every [`TRIM_EVERY`] lines the
//! oldest past [`TRAIL_KEPT`] are deleted in one range.

use etcd_client::{DeleteOptions, GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::{etcd_err, EtcdRegistry, RegistryError};
use crate::audit::{AuditRecord, TRAIL_KEPT};

const AUDIT: &str = "/rpingmesh/audit/";
/// Lines appended between two trims.
const TRIM_EVERY: u64 = 256;
/// etcd refuses a transaction of more than 128 operations (its default --max-txn-ops).
const OPS_PER_TXN: usize = 100;

/// This process's part of the trail's keys.
pub(super) struct AuditKeys {
    writer: u64,
    seq: u64,
    since_trim: u64,
}

impl AuditKeys {
    pub(super) fn new() -> Self {
        // Unique enough per process: the start time's nanoseconds mixed with the pid.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let writer = (t ^ ((std::process::id() as u64) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        AuditKeys {
            writer,
            seq: 0,
            since_trim: 0,
        }
    }

    fn key(&mut self, line: &str) -> String {
        self.seq += 1;
        let t = AuditRecord::parse(line).time_unix_ns;
        format!("{AUDIT}{t:020}-{:016x}-{:010}", self.writer, self.seq)
    }
}

impl EtcdRegistry {
    pub(super) fn append_audit_lines(&mut self, lines: &[String]) -> Result<(), RegistryError> {
        for chunk in lines.chunks(OPS_PER_TXN) {
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|l| TxnOp::put(self.audit_keys.key(l), l.as_bytes(), None))
                .collect();
            self.call("append audit lines", move |mut c| async move {
                c.txn(Txn::new().and_then(ops)).await.map_err(etcd_err)?;
                Ok(())
            })?;
        }
        self.audit_keys.since_trim += lines.len() as u64;
        if self.audit_keys.since_trim >= TRIM_EVERY {
            self.audit_keys.since_trim = 0;
            self.trim_audit(TRAIL_KEPT)?;
        }
        Ok(())
    }

    /// Deletes the oldest lines past `kept`.
    pub(super) fn trim_audit(&self, kept: usize) -> Result<(), RegistryError> {
        self.call("trim audit lines", move |mut c| async move {
            let n = c
                .get(
                    AUDIT,
                    Some(GetOptions::new().with_prefix().with_count_only()),
                )
                .await
                .map_err(etcd_err)?
                .count();
            let over = n - kept as i64;
            if over <= 0 {
                return Ok(());
            }
            let oldest = c
                .get(
                    AUDIT,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_keys_only()
                            .with_limit(over),
                    ),
                )
                .await
                .map_err(etcd_err)?;
            if let Some(last) = oldest.kvs().last() {
                let mut end = last.key().to_vec();
                end.push(0);
                c.delete(AUDIT, Some(DeleteOptions::new().with_range(end)))
                    .await
                    .map_err(etcd_err)?;
            }
            Ok(())
        })
    }

    pub(super) fn recent_audit_lines(&self, limit: usize) -> Result<Vec<String>, RegistryError> {
        let limit = limit.min(i64::MAX as usize) as i64;
        self.call("read audit lines", move |mut c| async move {
            let r = c
                .get(
                    AUDIT,
                    Some(
                        GetOptions::new()
                            .with_prefix()
                            .with_sort(SortTarget::Key, SortOrder::Descend)
                            .with_limit(limit),
                    ),
                )
                .await
                .map_err(etcd_err)?;
            Ok(r.kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
                .collect())
        })
    }
}
