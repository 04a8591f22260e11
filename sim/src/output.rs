//! Findings as the runner writes them: one JSON object per finding the analyzer opened.
//!
//! ```json
//! {"kind": "link", "location": "tor2-spine3", "opened_sec": 335.0, "resolved_sec": 965.0,
//!  "confidence": 0.9, "evidence": {"id": 3, "symptom": "loss", "windows": 21,
//!  "paths": [...], "paths_total": 12, "probe_total": 4000, "probe_failed": 180,
//!  "flow_labels": [...], "direction": "up", "excess_ns": 0, "detail": "..."}}
//! ```
//!
//! Seconds are virtual seconds since the scenario start; the evidence is the finding's
//! as last seen (its latest blaming window, `windows` counting all of them).

use rpingmesh_proto::operator::{Finding, FindingEvidence};
use serde_json::{json, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct FindingRecord {
    pub id: u64,
    /// "rnic" | "host" | "tor" | "link"
    pub kind: String,
    pub location: String,
    pub symptom: String,
    /// "down" | "degraded"
    pub severity: String,
    pub opened_sec: f64,
    /// None while open at the end of the run.
    pub resolved_sec: Option<f64>,
    pub confidence: f64,
    pub evidence: FindingEvidence,
}

fn sec(unix_ns: u64, base: u64) -> f64 {
    unix_ns.saturating_sub(base) as f64 / 1e9
}

impl FindingRecord {
    pub(crate) fn from_finding(f: &Finding, base_unix_ns: u64) -> Self {
        let mut r = FindingRecord {
            id: f.id,
            kind: f.kind.clone(),
            location: f.location.clone(),
            symptom: String::new(),
            severity: String::new(),
            opened_sec: sec(f.opened_unix_ns, base_unix_ns),
            resolved_sec: None,
            confidence: 0.0,
            evidence: FindingEvidence::default(),
        };
        r.update(f, base_unix_ns);
        r
    }

    pub(crate) fn update(&mut self, f: &Finding, base_unix_ns: u64) {
        self.symptom = f.symptom.clone();
        self.severity = f.severity.clone();
        self.confidence = f.confidence;
        if let Some(e) = &f.evidence {
            self.evidence = e.clone();
        }
        if !f.open && f.resolved_unix_ns != 0 {
            self.resolved_sec = Some(sec(f.resolved_unix_ns, base_unix_ns));
        }
    }

    pub fn to_json(&self) -> Value {
        let mut evidence = rpingmesh_proto::json::finding_evidence(&self.evidence);
        evidence["symptom"] = json!(self.symptom);
        evidence["id"] = json!(self.id);
        json!({
            "kind": self.kind,
            "location": self.location,
            "severity": self.severity,
            "opened_sec": self.opened_sec,
            "resolved_sec": self.resolved_sec,
            "confidence": self.confidence,
            "evidence": evidence,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpingmesh_proto::operator::FindingPath;

    #[test]
    fn a_finding_renders_with_virtual_seconds_and_its_evidence() {
        let base = 1_000_000_000_000;
        let mut f = Finding {
            id: 4,
            kind: "link".into(),
            location: "tor2-spine3".into(),
            symptom: "loss".into(),
            severity: "degraded".into(),
            confidence: 0.5,
            opened_unix_ns: base + 335_000_000_000,
            last_seen_unix_ns: base + 335_000_000_000,
            resolved_unix_ns: 0,
            open: true,
            evidence: Some(FindingEvidence {
                windows: 1,
                paths: vec![FindingPath {
                    source_gid: "a".into(),
                    target_gid: "b".into(),
                    probe_total: 60,
                    probe_failed: 3,
                    network_rtt_p50_ns: 17_000,
                }],
                paths_total: 1,
                probe_total: 60,
                probe_failed: 3,
                flow_labels: vec![7, 9],
                direction: "up".into(),
                excess_ns: 0,
                detail: "d".into(),
                loss_ratio: 0.05,
                loss_ratio_stderr: 0.01,
                score: 0.0,
            }),
            impact: Vec::new(),
            suppressed: String::new(),
            suppressed_by: 0,
        };
        let mut r = FindingRecord::from_finding(&f, base);
        let j = r.to_json();
        assert_eq!(j["opened_sec"], 335.0);
        assert!(j["resolved_sec"].is_null());
        assert_eq!(j["evidence"]["paths"][0]["probe_failed"], 3);
        assert_eq!(j["evidence"]["flow_labels"], json!([7, 9]));
        assert_eq!(j["evidence"]["symptom"], "loss");
        assert_eq!(j["evidence"]["id"], 4);
        assert_eq!(j["severity"], "degraded");
        assert_eq!(j["evidence"]["loss_ratio"], 0.05);
        f.open = false;
        f.resolved_unix_ns = base + 965_500_000_000;
        f.confidence = 0.9;
        r.update(&f, base);
        let j = r.to_json();
        assert_eq!(j["resolved_sec"], 965.5);
        assert_eq!(j["confidence"], 0.9);
        assert_eq!(j["kind"], "link");
        assert_eq!(j["location"], "tor2-spine3");
    }
}
