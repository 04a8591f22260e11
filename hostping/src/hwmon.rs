//! The hardware monitor's arithmetic: RNIC port counters sampled every second turned into
//! throughput, Tx pause ratio and drops, and the host mode that picks the loopback plan.
//!
//! Counters come from `/sys/class/infiniband/<dev>/ports/<p>/counters` (the IB port
//! counters: `port_xmit_data` and `port_rcv_data` count 4-byte words) and `hw_counters`
//! (driver counters; names vary by driver). A Tx pause *duration* is read from any
//! counter named like `*pause*duration*` (microseconds); drivers that keep pause
//! durations only in ethtool statistics (mlx5's `tx_prio<N>_pause_duration`) give none
//! here, and the host's mode then rests on throughput alone.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::loopback::HostMode;
use crate::sysfs::Sysfs;

/// Counters that count dropped or corrupted packets (summed into `drops`).
pub const DROP_COUNTERS: &[&str] = &[
    "port_rcv_errors",
    "port_xmit_discards",
    "port_rcv_discards",
    "out_of_buffer",
    "rx_icrc_encapsulated",
    "packet_seq_err",
    "rcvd_seq_err",
];

/// Whether [`rates`] uses a counter (a monitor that samples every second reads only these).
pub fn is_used(name: &str) -> bool {
    matches!(name, "port_xmit_data" | "port_rcv_data" | "link_downed")
        || DROP_COUNTERS.contains(&name)
        || is_tx_pause_duration(name)
}

fn is_tx_pause_duration(name: &str) -> bool {
    let k = name.to_ascii_lowercase();
    k.contains("tx") && k.contains("pause") && k.contains("duration")
}

/// One port's counters at one instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PortCounters {
    pub device: String,
    pub port: u32,
    pub counters: BTreeMap<String, u64>,
}

/// Reads one port's counters (both directories; a missing one is simply empty, a
/// counter that is not a number is skipped: some drivers print text).
pub fn read_port(fs: &dyn Sysfs, device: &str, port: u32) -> PortCounters {
    let mut counters = BTreeMap::new();
    for sub in ["counters", "hw_counters"] {
        let dir = format!("/sys/class/infiniband/{device}/ports/{port}/{sub}");
        for name in fs.list(&dir).unwrap_or_default() {
            if let Ok(text) = fs.read(&format!("{dir}/{name}")) {
                if let Ok(v) = text.trim().parse::<u64>() {
                    counters.insert(name, v);
                }
            }
        }
    }
    PortCounters {
        device: device.to_string(),
        port,
        counters,
    }
}

/// What a port did between two samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct PortRates {
    pub tx_gbps: Option<f64>,
    pub rx_gbps: Option<f64>,
    /// Share of the interval the port was paused from sending (PFC), 0..1.
    pub tx_pause_ratio: Option<f64>,
    pub drops_per_sec: f64,
    /// The port went down in between (`link_downed` moved).
    pub link_downed: bool,
}

fn delta(prev: &PortCounters, cur: &PortCounters, name: &str) -> Option<u64> {
    // A counter that went backwards was reset (driver reload): no rate this time.
    cur.counters
        .get(name)?
        .checked_sub(*prev.counters.get(name)?)
}

/// Rates over `secs` seconds.
pub fn rates(prev: &PortCounters, cur: &PortCounters, secs: f64) -> PortRates {
    if secs <= 0.0 {
        return PortRates::default();
    }
    let words_gbps = |name: &str| delta(prev, cur, name).map(|w| w as f64 * 4.0 * 8.0 / secs / 1e9);
    let pause_key = cur.counters.keys().find(|k| is_tx_pause_duration(k));
    let tx_pause_ratio = pause_key
        .and_then(|k| delta(prev, cur, k))
        .map(|us| (us as f64 / (secs * 1e6)).min(1.0));
    let drops: u64 = DROP_COUNTERS
        .iter()
        .filter_map(|c| delta(prev, cur, c))
        .sum();
    PortRates {
        tx_gbps: words_gbps("port_xmit_data"),
        rx_gbps: words_gbps("port_rcv_data"),
        tx_pause_ratio,
        drops_per_sec: drops as f64 / secs,
        link_downed: delta(prev, cur, "link_downed").unwrap_or(0) > 0,
    }
}

/// The paper's thresholds: idle under 5% of line rate, abnormal over 3% Tx pause.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ModeThresholds {
    pub thp_low: f64,
    pub pfc_high: f64,
}

impl Default for ModeThresholds {
    fn default() -> Self {
        Self {
            thp_low: 0.05,
            pfc_high: 0.03,
        }
    }
}

/// The host's mode from each port's rates and line rate (Gb/s): abnormal when any port
/// pauses over `pfc_high`, idle when every port moves under `thp_low` of its line rate
/// (a port whose throughput is unknown counts as idle: nothing says it is busy).
pub fn host_mode(ports: &[(PortRates, Option<f64>)], t: ModeThresholds) -> HostMode {
    if ports
        .iter()
        .any(|(r, _)| r.tx_pause_ratio.is_some_and(|p| p > t.pfc_high))
    {
        return HostMode::Abnormal;
    }
    let busy = ports.iter().any(|(r, line)| {
        let moved = r.tx_gbps.unwrap_or(0.0).max(r.rx_gbps.unwrap_or(0.0));
        match line {
            Some(l) if *l > 0.0 => moved > t.thp_low * l,
            _ => false,
        }
    });
    if busy {
        HostMode::Busy
    } else {
        HostMode::Idle
    }
}

/// Utilization (0..1) of an RNIC's PCIe link from its port throughput: what the bus
/// monitor can know without vendor tools (UPI and memory channels have no sysfs counter).
pub fn pcie_utilization(r: &PortRates, pcie_gbps: f64) -> Option<f64> {
    let moved = r.tx_gbps?.max(r.rx_gbps?);
    (pcie_gbps > 0.0).then(|| (moved / pcie_gbps).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::Recording;

    fn pc(pairs: &[(&str, u64)]) -> PortCounters {
        PortCounters {
            device: "mlx5_0".into(),
            port: 1,
            counters: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    #[test]
    fn words_become_gbps_and_pause_a_ratio() {
        let a = pc(&[
            ("port_xmit_data", 0),
            ("port_rcv_data", 100),
            ("tx_prio3_pause_duration", 0),
            ("port_rcv_errors", 1),
        ]);
        // 2.5e9 words = 10 GB in one second = 80 Gb/s; 50 ms paused.
        let b = pc(&[
            ("port_xmit_data", 2_500_000_000),
            ("port_rcv_data", 100),
            ("tx_prio3_pause_duration", 50_000),
            ("port_rcv_errors", 4),
        ]);
        let r = rates(&a, &b, 1.0);
        assert!((r.tx_gbps.unwrap() - 80.0).abs() < 1e-9);
        assert_eq!(r.rx_gbps, Some(0.0));
        assert!((r.tx_pause_ratio.unwrap() - 0.05).abs() < 1e-12);
        assert_eq!(r.drops_per_sec, 3.0);
        // A reset counter gives no rate rather than a huge one.
        assert_eq!(rates(&b, &a, 1.0).tx_gbps, None);
    }

    #[test]
    fn mode_follows_the_papers_thresholds() {
        let t = ModeThresholds::default();
        let quiet = PortRates {
            tx_gbps: Some(5.0),
            rx_gbps: Some(1.0),
            ..Default::default()
        };
        let busy = PortRates {
            tx_gbps: Some(50.0),
            ..quiet
        };
        let paused = PortRates {
            tx_pause_ratio: Some(0.04),
            ..quiet
        };
        assert_eq!(host_mode(&[(quiet, Some(200.0))], t), HostMode::Idle);
        assert_eq!(
            host_mode(&[(quiet, Some(200.0)), (busy, Some(200.0))], t),
            HostMode::Busy
        );
        assert_eq!(
            host_mode(&[(busy, Some(200.0)), (paused, Some(200.0))], t),
            HostMode::Abnormal
        );
        assert_eq!(host_mode(&[(busy, None)], t), HostMode::Idle);
        assert_eq!(
            pcie_utilization(&busy, 252.0).map(|u| (u * 100.0).round()),
            Some(20.0)
        );
    }

    #[test]
    fn counters_are_read_from_both_directories() {
        let mut rec = Recording::default();
        let base = "/sys/class/infiniband/rxe0/ports/1";
        rec.dir(&format!("{base}/counters"), &["port_xmit_data"])
            .file(&format!("{base}/counters/port_xmit_data"), "42\n")
            .dir(&format!("{base}/hw_counters"), &["sent_pkts", "lifespan"])
            .file(&format!("{base}/hw_counters/sent_pkts"), "7\n")
            .file(&format!("{base}/hw_counters/lifespan"), "not a number\n");
        let c = read_port(&rec, "rxe0", 1);
        assert_eq!(c.counters.get("port_xmit_data"), Some(&42));
        assert_eq!(c.counters.get("sent_pkts"), Some(&7));
        assert_eq!(c.counters.len(), 2);
    }
}
