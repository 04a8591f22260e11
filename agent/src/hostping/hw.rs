//! The hardware monitor's sampling: each port's counter files opened once and re-read in
//! place, sampled a second apart.

use super::*;

/// One port's counters that [`hwmon::rates`] uses, opened once and re-read in place
/// (sysfs makes an attribute's text anew on each read at offset 0): a sample is one
/// pread per counter, not an open, a read and a close.
pub struct PortCounterFiles {
    pub(super) device: String,
    pub(super) port: u32,
    pub(super) files: Vec<(String, std::fs::File)>,
}

impl PortCounterFiles {
    /// Opens what exists of the used counters (none: an empty sample, not an error).
    pub fn open(fs: &RealSysfs, device: &str, port: u32) -> Self {
        let mut files = Vec::new();
        for sub in ["counters", "hw_counters"] {
            let dir = format!("/sys/class/infiniband/{device}/ports/{port}/{sub}");
            for name in fs.list(&dir).unwrap_or_default() {
                if hwmon::is_used(&name) {
                    if let Ok(f) = std::fs::File::open(fs.map(&format!("{dir}/{name}"))) {
                        files.push((name, f));
                    }
                }
            }
        }
        Self {
            device: device.to_string(),
            port,
            files,
        }
    }

    pub fn sample(&self) -> PortCounters {
        use std::os::unix::fs::FileExt;
        let mut counters = std::collections::BTreeMap::new();
        let mut buf = [0u8; 32];
        for (name, f) in &self.files {
            if let Ok(n) = f.read_at(&mut buf, 0) {
                if let Some(v) = std::str::from_utf8(&buf[..n])
                    .ok()
                    .and_then(|t| t.trim().parse::<u64>().ok())
                {
                    counters.insert(name.clone(), v);
                }
            }
        }
        PortCounters {
            device: self.device.clone(),
            port: self.port,
            counters,
        }
    }
}

/// Samples every port's counters once per `period` until `stop` says so; returns the
/// last rates of each port.
pub async fn hw_monitor(
    fs: &RealSysfs,
    ports: &[(String, u32)],
    period: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<PortRates> {
    let files: Vec<PortCounterFiles> = ports
        .iter()
        .map(|(d, p)| PortCounterFiles::open(fs, d, *p))
        .collect();
    let mut prev: Vec<PortCounters> = files.iter().map(PortCounterFiles::sample).collect();
    let mut at = std::time::Instant::now();
    let mut last = vec![PortRates::default(); ports.len()];
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        let cur: Vec<PortCounters> = files.iter().map(PortCounterFiles::sample).collect();
        let secs = at.elapsed().as_secs_f64();
        at = std::time::Instant::now();
        last = prev
            .iter()
            .zip(&cur)
            .map(|(a, b)| hwmon::rates(a, b, secs))
            .collect();
        prev = cur;
    }
    last
}
