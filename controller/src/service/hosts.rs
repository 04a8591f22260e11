//! Hostping reports: checked against their bounds, kept per host (newest), stored, and
//! counted for the host findings metric.

use super::*;

/// Hosts whose Hostping reports are kept (a report from one more is refused).
pub const MAX_HOSTS: usize = 200_000;
/// Bounds of one host report.
pub const MAX_HOST_TREE_BYTES: usize = 256 * 1024;
pub const MAX_HOST_REPORT_JSON_BYTES: usize = 2 * 1024 * 1024;
pub const MAX_HOST_FINDINGS: usize = 1024;
pub(super) const MAX_HOST_FIELD_BYTES: usize = 4096;

/// A host report's one clear error, or nothing.
pub(super) fn check_host_report(r: &HostHealthReport) -> Result<(), Status> {
    let bad = |m: String| Err(Status::invalid_argument(format!("host report: {m}")));
    if r.agent_id.trim().is_empty() {
        return bad("agent_id is empty".into());
    }
    if r.hostname.trim().is_empty() || r.hostname.len() > 255 {
        return bad(format!(
            "hostname {:?} is empty or longer than 255 bytes",
            r.hostname
        ));
    }
    if r.tree.len() > MAX_HOST_TREE_BYTES {
        return bad(format!(
            "tree of {} bytes (at most {MAX_HOST_TREE_BYTES})",
            r.tree.len()
        ));
    }
    if r.report_json.len() > MAX_HOST_REPORT_JSON_BYTES {
        return bad(format!(
            "report_json of {} bytes (at most {MAX_HOST_REPORT_JSON_BYTES})",
            r.report_json.len()
        ));
    }
    if r.findings.len() > MAX_HOST_FINDINGS {
        return bad(format!(
            "{} findings (at most {MAX_HOST_FINDINGS})",
            r.findings.len()
        ));
    }
    if !matches!(r.mode.as_str(), "" | "idle" | "busy" | "abnormal") {
        return bad(format!("mode {:?} (idle, busy or abnormal)", r.mode));
    }
    for (i, f) in r.findings.iter().enumerate() {
        if f.kind.trim().is_empty() {
            return bad(format!("finding {i} has no kind"));
        }
        if [&f.kind, &f.location, &f.detail]
            .iter()
            .any(|x| x.len() > MAX_HOST_FIELD_BYTES)
        {
            return bad(format!(
                "finding {i}: a field longer than {MAX_HOST_FIELD_BYTES} bytes"
            ));
        }
    }
    Ok(())
}

impl ControllerState {
    /// Takes a host's Hostping report: checked, kept as the host's newest, stored.
    pub fn report_host(&self, r: HostHealthReport) -> Result<(), Status> {
        check_host_report(&r)?;
        let h = HostHealth {
            hostname: r.hostname,
            agent_id: r.agent_id,
            checked_unix_ns: r.checked_unix_ns,
            received_unix_ns: self.now_ns(),
            tree: r.tree,
            mode: r.mode,
            findings: r.findings,
            report_json: r.report_json,
        };
        {
            let mut hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
            if !hosts.contains_key(&h.hostname) && hosts.len() >= MAX_HOSTS {
                return Err(Status::resource_exhausted(format!(
                    "host report: {MAX_HOSTS} hosts known already; {:?} not taken",
                    h.hostname
                )));
            }
            hosts.insert(h.hostname.clone(), h.clone());
        }
        self.registry.save_host(&h).map_err(|e| {
            tracing::error!(hostname = %h.hostname, error = %e, "storing a host report failed");
            Status::unavailable(format!("host report: the store failed: {e}"))
        })?;
        self.note_alive(&h.agent_id);
        Ok(())
    }

    /// Every host's newest report (without its JSON), by hostname.
    pub fn hosts(&self, problems_only: bool) -> Vec<HostHealth> {
        let hosts = self.hosts.lock().unwrap_or_else(|e| e.into_inner());
        hosts
            .values()
            .filter(|h| !problems_only || !h.findings.is_empty())
            .map(|h| HostHealth {
                report_json: String::new(),
                ..h.clone()
            })
            .collect()
    }

    /// One host's newest report.
    pub fn host(&self, hostname: &str) -> Option<HostHealth> {
        self.hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(hostname)
            .cloned()
    }

    /// (hostname, finding kind) -> findings, over the hosts with any (the metric).
    pub fn host_findings_by_kind(&self) -> BTreeMap<(String, String), u64> {
        let mut out = BTreeMap::new();
        for h in self
            .hosts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            for f in &h.findings {
                *out.entry((h.hostname.clone(), f.kind.clone())).or_default() += 1;
            }
        }
        out
    }
}
