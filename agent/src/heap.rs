//! Hands the heap's free pages back to the OS. glibc keeps freed memory mapped for
//! reuse; after start-up (the kernel BTF parse, the first pinglists) that is a few hundred
//! KiB of RSS the agent never touches again (BENCHMARKS.md, footprint).

use std::time::Duration;

/// How often the heap is trimmed: registration, pinglist and workload changes free
/// memory at times of their own, and a trim of a heap this small costs microseconds.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(10);

/// Returns every arena's free pages to the OS; the number of bytes RSS shrank by
/// (0 where the C library has no malloc_trim).
pub fn trim() -> u64 {
    let before = rpingmesh_metrics_export::process::rss_bytes().unwrap_or(0);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks glibc's own arenas; 0 keeps no top padding.
    unsafe {
        libc::malloc_trim(0);
    }
    let after = rpingmesh_metrics_export::process::rss_bytes().unwrap_or(before);
    before.saturating_sub(after)
}

/// Trims every `TRIM_INTERVAL`, until the runtime stops.
pub async fn trim_periodically() {
    let first = tokio::time::Instant::now() + TRIM_INTERVAL;
    let mut tick = tokio::time::interval_at(first, TRIM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let freed = trim();
        tracing::debug!(freed_bytes = freed, "heap trimmed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_leaves_the_resident_set() {
        // 8 MiB in 4 KiB blocks (under the mmap threshold, so in the heap), touched, then
        // freed except the last block, which pins the heap's top and keeps glibc from
        // shrinking it on its own: only a trim can hand the pages back.
        let mut blocks: Vec<Vec<u8>> = (0..2048).map(|_| vec![1u8; 4096]).collect();
        let pin = blocks.pop();
        drop(blocks);
        let freed = trim();
        drop(pin);
        // Half: other tests of this binary allocate on their own threads meanwhile.
        assert!(freed >= 4 << 20, "trim freed only {freed} bytes of 8 MiB");
    }
}
