//! The watchdog's I/O side: samples this process's CPU time and RSS (procfs:
//! /proc/self/stat and statm) every watchdog_interval_sec, feeds `watchdog::Throttle`, publishes
//! the multiplier to the drivers and the rpingmesh.agent.self_throttle gauge.

use std::time::{Duration, Instant};

use opentelemetry::metrics::Gauge;

use crate::config::AgentConfig;
use crate::watchdog::{Sample, SharedMultiplier, Thresholds, Throttle, Transition};

/// Cores the process may use: `max_procs` when set, else what the OS grants.
pub fn available_cores(max_procs: u64) -> f64 {
    if max_procs > 0 {
        return max_procs as f64;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

use rpingmesh_metrics_export::process::{cpu_time, rss_bytes};

/// CPU fraction of `cores` over an interval: CPU time delta / (wall delta x cores).
pub fn cpu_fraction(cpu_delta: Duration, wall_delta: Duration, cores: f64) -> f64 {
    let capacity = wall_delta.as_secs_f64() * cores;
    if capacity <= 0.0 {
        return f64::NAN; // no time passed: no reading (the throttle holds)
    }
    cpu_delta.as_secs_f64() / capacity
}

/// Turns successive readings into samples.
struct Sampler {
    cores: f64,
    last: Option<(Instant, Duration)>,
}

impl Sampler {
    /// None on the first call (no delta yet) or when a reading failed.
    fn sample(&mut self) -> std::io::Result<Option<Sample>> {
        let now = Instant::now();
        let cpu = cpu_time()?;
        let rss = rss_bytes()?;
        let prev = self.last.replace((now, cpu));
        Ok(prev.map(|(t0, c0)| Sample {
            cpu_fraction: cpu_fraction(cpu.saturating_sub(c0), now - t0, self.cores),
            rss_bytes: rss,
        }))
    }
}

/// Runs the watchdog until the task is aborted. `gauge` receives the live multiplier.
pub async fn run_watchdog(cfg: &AgentConfig, multiplier: SharedMultiplier, gauge: Gauge<f64>) {
    let interval = Duration::from_secs(cfg.watchdog_interval_sec.max(1));
    let thresholds = Thresholds::new(
        cfg.throttle_cpu_percent,
        cfg.max_memory_mb,
        cfg.throttle_memory_ratio,
    );
    let mut throttle = Throttle::new(thresholds);
    let mut sampler = Sampler {
        cores: available_cores(cfg.max_procs),
        last: None,
    };
    tracing::info!(
        interval_sec = interval.as_secs(),
        cpu_threshold = thresholds.cpu_fraction,
        memory_threshold_bytes = thresholds.memory_bytes,
        cores = sampler.cores,
        "self-protection watchdog started"
    );
    multiplier.set(throttle.multiplier());
    gauge.record(throttle.multiplier(), &[]);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = false;
    loop {
        tick.tick().await;
        let s = match sampler.sample() {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(e) => {
                // Without a reading the multiplier holds; say so once.
                if !warned {
                    tracing::warn!(error = %e, "watchdog cannot read resource usage; throttle holds");
                    warned = true;
                }
                sampler.last = None;
                continue;
            }
        };
        let step = throttle.observe(s);
        if step.changed {
            multiplier.set(step.multiplier);
        }
        gauge.record(step.multiplier, &[]);
        let cpu_percent = s.cpu_fraction * 100.0;
        match step.transition {
            Some(Transition::Engaged) => tracing::warn!(
                multiplier = step.multiplier,
                cpu_percent,
                rss_bytes = s.rss_bytes,
                "self-protection throttle engaged: probe rates reduced"
            ),
            Some(Transition::Released) => tracing::warn!(
                cpu_percent,
                rss_bytes = s.rss_bytes,
                "self-protection throttle released: probe rates restored"
            ),
            None if step.changed => tracing::info!(
                multiplier = step.multiplier,
                cpu_percent,
                rss_bytes = s.rss_bytes,
                "self-protection throttle stepped"
            ),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_of_this_process_are_live() {
        let rss = rss_bytes().unwrap();
        assert!(rss > 1 << 20, "{rss}");
        let t0 = cpu_time().unwrap();
        let start = std::time::Instant::now();
        // Burn ~50 ms of CPU: the clock-tick counters must move.
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(cpu_time().unwrap() > t0);
    }

    #[test]
    fn cpu_fraction_is_per_available_core() {
        let f = cpu_fraction(Duration::from_secs(1), Duration::from_secs(2), 2.0);
        assert!((f - 0.25).abs() < 1e-12);
        assert!(cpu_fraction(Duration::from_secs(1), Duration::ZERO, 2.0).is_nan());
    }

    #[test]
    fn cores_follow_max_procs() {
        assert_eq!(available_cores(3), 3.0);
        assert!(available_cores(0) >= 1.0);
    }

    #[test]
    fn real_readings_are_sane() {
        let mut s = Sampler {
            cores: 1.0,
            last: None,
        };
        assert_eq!(s.sample().unwrap(), None);
        // Burn a little CPU so the delta is positive.
        let mut x = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let got = s.sample().unwrap().unwrap();
        assert!(got.rss_bytes > 0);
        assert!(
            got.cpu_fraction > 0.0 && got.cpu_fraction.is_finite(),
            "{got:?}"
        );
    }
}
