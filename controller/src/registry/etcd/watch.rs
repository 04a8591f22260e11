//! Reading and following etcd: whole prefixes in pages at one revision, the watch of
//! `agents/` that feeds the in-memory index, and the watch of `service/` that feeds the
//! service-path table.

use super::*;

/// Keys read per request: a whole prefix in one answer passes gRPC's 4 MiB message limit
/// at about 20,000 agents.
pub(super) const PAGE: i64 = 1000;

/// Every key under `prefix` at one revision, read in pages; (revision, keys and values).
pub(super) async fn get_all(
    c: &mut Client,
    prefix: &str,
) -> Result<(i64, Vec<KeyValue>), RegistryError> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    let mut from = prefix.as_bytes().to_vec();
    let mut rev = 0;
    let mut out = Vec::new();
    loop {
        let mut opts = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
        if rev > 0 {
            opts = opts.with_revision(rev);
        }
        let r = c.get(from.clone(), Some(opts)).await.map_err(etcd_err)?;
        if rev == 0 {
            rev = r.header().map(|h| h.revision()).unwrap_or(0);
        }
        for kv in r.kvs() {
            out.push((kv.key().to_vec(), kv.value().to_vec()));
        }
        match r.kvs().last() {
            Some(last) if r.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => return Ok((rev, out)),
        }
    }
}

/// Loads `agents/` into `index` and returns the revision it is current at.
pub(super) async fn load_agents(
    c: &mut Client,
    index: &RwLock<RegistryIndex>,
) -> Result<i64, RegistryError> {
    let (rev, kvs) = get_all(c, AGENTS).await?;
    let mut agents = Vec::new();
    let mut rnics = Vec::new();
    for (k, v) in &kvs {
        match AgentDoc::decode(k, v) {
            Ok(d) => {
                let (a, rs) = d.records();
                agents.push(a);
                rnics.extend(rs);
            }
            Err(e) => tracing::warn!(error = %e, "skipped"),
        }
    }
    index
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .load(agents, rnics);
    Ok(rev)
}

/// A failed etcd call of the follower: logged the first time of a run of failures (the
/// log is not flooded while etcd is away), then a pause before the next try.
async fn failed(failures: &mut u32, what: &str, e: &(dyn std::fmt::Display + Sync)) {
    *failures += 1;
    if *failures == 1 {
        tracing::error!(error = %e, "etcd registry: cannot {what} the agents; retrying");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Follows `agents/` from `from` on, applying every change to `index`; on a compaction,
/// a cancel or a broken stream it loads again and follows from there. Ends when the
/// registry is dropped (its thread's runtime, and this task with it, ends).
pub(super) async fn follow(
    mut c: Client,
    index: Arc<RwLock<RegistryIndex>>,
    applied: Arc<Applied>,
    mut from: i64,
) {
    let mut failures = 0u32;
    loop {
        if from == 0 {
            match load_agents(&mut c, &index).await {
                Ok(rev) => {
                    applied.set(rev);
                    from = rev + 1;
                }
                Err(e) => {
                    failed(&mut failures, "load", &e).await;
                    continue;
                }
            }
        }
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from)
            .with_progress_notify();
        let mut stream = match c.watch(AGENTS, Some(opts)).await {
            Ok(s) => s,
            Err(e) => {
                failed(&mut failures, "watch", &e).await;
                continue;
            }
        };
        if failures > 0 {
            tracing::info!("etcd registry: watching the agents again");
            failures = 0;
        }
        loop {
            let resp = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) | Err(_) => {
                    tracing::warn!("etcd registry: the watch broke; reloading");
                    from = 0;
                    break;
                }
            };
            if resp.canceled() || resp.compact_revision() > 0 {
                tracing::warn!(
                    compacted = resp.compact_revision(),
                    "etcd registry: the watch was cancelled; reloading"
                );
                from = 0;
                break;
            }
            {
                let mut idx = index.write().unwrap_or_else(|e| e.into_inner());
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    from = from.max(kv.mod_revision() + 1);
                    match ev.event_type() {
                        EventType::Put => match AgentDoc::decode(kv.key(), kv.value()) {
                            Ok(d) => {
                                let (a, rs) = d.records();
                                idx.register_agent(&a, &rs, d.last_updated);
                            }
                            Err(e) => tracing::warn!(error = %e, "skipped"),
                        },
                        EventType::Delete => {
                            let id = String::from_utf8_lossy(&kv.key()[AGENTS.len()..]);
                            idx.remove_agent(&id);
                        }
                    }
                }
            }
            if let Some(h) = resp.header() {
                applied.set(h.revision());
            }
        }
    }
}

/// Follows `service/` from the current state on, handing every agent's flow set to `tx`
/// (deletes, an expired agent, need nothing: the table's own TTL drops its flows).
pub(super) async fn follow_service(
    mut c: Client,
    tx: tokio::sync::mpsc::UnboundedSender<ServiceFlowReport>,
) {
    let mut failures = 0u32;
    loop {
        let from = match get_all(&mut c, SERVICE).await {
            Ok((rev, kvs)) => {
                for (k, v) in &kvs {
                    send_service(&tx, k, v);
                }
                rev + 1
            }
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::error!(error = %e, "etcd registry: cannot read the service flows; retrying");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        failures = 0;
        let opts = WatchOptions::new().with_prefix().with_start_revision(from);
        let Ok(mut stream) = c.watch(SERVICE, Some(opts)).await else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled() {
                break;
            }
            for ev in resp.events() {
                if let (EventType::Put, Some(kv)) = (ev.event_type(), ev.kv()) {
                    send_service(&tx, kv.key(), kv.value());
                }
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}

pub(super) fn send_service(
    tx: &tokio::sync::mpsc::UnboundedSender<ServiceFlowReport>,
    key: &[u8],
    value: &[u8],
) {
    match ServiceFlowReport::decode(value) {
        Ok(r) if r.full_sync && key.ends_with(r.agent_id.as_bytes()) => {
            let _ = tx.send(r);
        }
        Ok(_) => {
            tracing::warn!(key = %String::from_utf8_lossy(key), "stored service flows skipped: not a full set of that agent")
        }
        Err(e) => {
            tracing::warn!(key = %String::from_utf8_lossy(key), error = %e, "stored service flows skipped")
        }
    }
}
