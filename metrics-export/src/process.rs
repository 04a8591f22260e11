//! This process's CPU time and resident memory, read from /proc: the agent's
//! self-protection watchdog samples them, and both binaries export them as metrics.

use std::time::Duration;

use opentelemetry::metrics::Meter;

/// User + system CPU time of this process (/proc/self/stat, in clock ticks).
pub fn cpu_time() -> std::io::Result<Duration> {
    let st = procfs::process::Process::myself()
        .and_then(|p| p.stat())
        .map_err(std::io::Error::other)?;
    let hz = procfs::ticks_per_second().max(1);
    Ok(Duration::from_nanos(
        (st.utime + st.stime).saturating_mul(1_000_000_000) / hz,
    ))
}

/// Resident set size (/proc/self/statm, in pages).
pub fn rss_bytes() -> std::io::Result<u64> {
    let m = procfs::process::Process::myself()
        .and_then(|p| p.statm())
        .map_err(std::io::Error::other)?;
    Ok(m.resident.saturating_mul(procfs::page_size()))
}

/// `<prefix>.cpu_seconds_total` (observable counter) and `<prefix>.rss_bytes`
/// (observable gauge), read from /proc when metrics are collected, never in between.
pub fn register(meter: &Meter, prefix: &str) {
    meter
        .f64_observable_counter(format!("{prefix}.cpu_seconds_total"))
        .with_unit("s")
        .with_description("CPU time of this process, user + system")
        .with_callback(|o| {
            if let Ok(t) = cpu_time() {
                o.observe(t.as_secs_f64(), &[]);
            }
        })
        .build();
    meter
        .u64_observable_gauge(format!("{prefix}.rss_bytes"))
        .with_unit("By")
        .with_description("Resident set size of this process")
        .with_callback(|o| {
            if let Ok(b) = rss_bytes() {
                o.observe(b, &[]);
            }
        })
        .build();
}
