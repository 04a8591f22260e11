//! Output formatting (pure): aligned tables, units, UTC timestamps, JSON rows.

use rpingmesh_proto::controller_agent::{PathSummary, PinglistType};
use serde_json::{json, Value};

/// A table printed with columns padded to their widest cell, two spaces apart.
/// Columns whose header is in `right` are right-aligned (numbers).
pub struct Table {
    headers: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// `cols`: (header, right_aligned).
    pub fn new(cols: &[(&'static str, bool)]) -> Self {
        Self {
            headers: cols.iter().map(|c| c.0).collect(),
            right: cols.iter().map(|c| c.1).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let n = self.headers.len();
        let mut w: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        let header: Vec<String> = self.headers.iter().map(|h| h.to_string()).collect();
        for r in std::iter::once(&header).chain(self.rows.iter()) {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate().take(n) {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = w[i] - c.chars().count();
                if self.right[i] {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(c);
                } else {
                    line.push_str(c);
                    if i + 1 < n {
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// The columns naming a path: its ends, its pinglist kind and its service.
pub const PATH_COLUMNS: [(&str, bool); 6] = [
    ("SRC_TOR", false),
    ("SRC_GID", false),
    ("DST_TOR", false),
    ("DST_GID", false),
    ("TYPE", false),
    ("SERVICE", false),
];

/// A summary's [`PATH_COLUMNS`] cells.
pub fn path_cells(s: &PathSummary) -> [String; 6] {
    [
        s.source_tor_id.clone(),
        s.source_gid.clone(),
        s.target_tor_id.clone(),
        s.target_gid.clone(),
        pinglist_type_name(s.pinglist_type).into(),
        or_dash(&s.service),
    ]
}

/// The probe columns of the path and ToR-pair tables: probes, loss, network RTT and the
/// two endpoints' delays.
pub const PROBE_COLUMNS: [(&str, bool); 6] = [
    ("PROBES", true),
    ("LOSS%", true),
    ("RTT_P50_US", true),
    ("RTT_P99_US", true),
    ("PROBER_P50_US", true),
    ("RESP_P50_US", true),
];

/// [`PROBE_COLUMNS`] cells of anything with a path summary's probe fields (a summary, a
/// ToR pair's aggregate).
macro_rules! probe_cells {
    ($s:expr) => {{
        let s = $s;
        let (total, failed) = (s.probe_total as u64, s.probe_failed as u64);
        [
            total.to_string(),
            $crate::format::loss_pct(failed, total),
            $crate::format::us(s.network_rtt_p50_ns),
            $crate::format::us(s.network_rtt_p99_ns),
            $crate::format::us(s.prober_delay_p50_ns),
            $crate::format::us(s.responder_delay_p50_ns),
        ]
    }};
}
pub(crate) use probe_cells;

/// Nanoseconds as microseconds with one decimal ("12.3").
pub fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1000.0)
}

/// failed/total as a percentage with two decimals; "-" without probes.
pub fn loss_pct(failed: u64, total: u64) -> String {
    if total == 0 {
        "-".into()
    } else {
        format!("{:.2}", failed as f64 * 100.0 / total as f64)
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Unix seconds as "YYYY-MM-DDTHH:MM:SSZ"; "-" for 0 (unset).
pub fn utc(unix_sec: u64) -> String {
    if unix_sec == 0 {
        return "-".into();
    }
    let days = (unix_sec / 86_400) as i64;
    let rem = unix_sec % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

pub fn pinglist_type_name(t: i32) -> &'static str {
    match PinglistType::try_from(t) {
        Ok(PinglistType::TorMesh) => "tor_mesh",
        Ok(PinglistType::InterTor) => "inter_tor",
        Ok(PinglistType::Service) => "service",
        Ok(PinglistType::Focus) => "focus",
        Err(_) => "unknown",
    }
}

/// Every field of a PathSummary, raw units (ns, counts) plus the loss ratio.
pub fn summary_json(s: &PathSummary) -> Value {
    json!({
        "source_gid": s.source_gid,
        "source_tor_id": s.source_tor_id,
        "target_gid": s.target_gid,
        "target_tor_id": s.target_tor_id,
        "target_qpn": s.target_qpn,
        "pinglist_type": pinglist_type_name(s.pinglist_type),
        "service": s.service,
        "window_start_unix_ns": s.window_start_unix_ns,
        "window_duration_ms": s.window_duration_ms,
        "probe_total": s.probe_total,
        "probe_success": s.probe_success,
        "probe_failed": s.probe_failed,
        "loss_ratio": if s.probe_total > 0 { s.probe_failed as f64 / s.probe_total as f64 } else { 0.0 },
        "network_rtt_min_ns": s.network_rtt_min_ns,
        "network_rtt_max_ns": s.network_rtt_max_ns,
        "network_rtt_p50_ns": s.network_rtt_p50_ns,
        "network_rtt_p99_ns": s.network_rtt_p99_ns,
        "invalid_rtt_count": s.invalid_rtt_count,
        "prober_delay_p50_ns": s.prober_delay_p50_ns,
        "prober_delay_p99_ns": s.prober_delay_p99_ns,
        "responder_delay_p50_ns": s.responder_delay_p50_ns,
        "responder_delay_p99_ns": s.responder_delay_p99_ns,
        "rc_ring": s.rc_ring.map(|r| json!({
            "probe_total": r.probe_total,
            "probe_lost": r.probe_lost,
            "probe_late": r.probe_late,
            "network_rtt_min_ns": r.network_rtt_min_ns,
            "network_rtt_p50_ns": r.network_rtt_p50_ns,
            "network_rtt_p99_ns": r.network_rtt_p99_ns,
            "network_rtt_max_ns": r.network_rtt_max_ns,
            "responder_delay_p50_ns": r.responder_delay_p50_ns,
        })),
    })
}

/// Text of `v`, or "-" when empty (missing ToR of an unmonitored path, etc.).
pub fn or_dash(v: &str) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let mut t = Table::new(&[("NAME", false), ("RTT_US", true), ("NOTE", false)]);
        t.row(vec!["a".into(), "1.5".into(), "x".into()]);
        t.row(vec!["longer".into(), "123.0".into(), "".into()]);
        assert_eq!(
            t.render(),
            "NAME    RTT_US  NOTE\n\
             a          1.5  x\n\
             longer   123.0\n"
        );
    }

    #[test]
    fn units() {
        assert_eq!(us(12_345), "12.3");
        assert_eq!(us(0), "0.0");
        assert_eq!(loss_pct(7, 100), "7.00");
        assert_eq!(loss_pct(1, 3), "33.33");
        assert_eq!(loss_pct(0, 0), "-");
    }

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "-");
        assert_eq!(utc(1), "1970-01-01T00:00:01Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(utc(4_102_444_799), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn summary_json_has_loss_ratio() {
        let s = PathSummary {
            probe_total: 200,
            probe_failed: 5,
            pinglist_type: PinglistType::Service as i32,
            ..Default::default()
        };
        let v = summary_json(&s);
        assert_eq!(v["loss_ratio"], 0.025);
        assert_eq!(v["pinglist_type"], "service");
    }
}
