//! Keeps the agent's resident set to what it uses (BENCHMARKS.md, footprint).
//!
//! - The heap: glibc keeps freed memory mapped for reuse; after start-up (the kernel BTF
//!   parse, the first pinglists) that is a few hundred KiB the agent never touches again.
//!   It is trimmed every `TRIM_INTERVAL`.
//! - Start-up code: every page of code and read-only data that start-up ran (argument and
//!   config parsing, the eBPF loader, gRPC setup) stays mapped, 64 KiB around each page it
//!   touched (the kernel's fault-around). Once, after the first interval, the page-table
//!   entries of every clean read-only file mapping are dropped: the pages stay in the page
//!   cache, and what the agent still runs faults back in on its next use (about 2 MiB of
//!   the 12 stayed gone in the bench).

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

/// A mapping whose pages can leave the page table with nothing lost: private, never
/// writable, backed by a file, and holding no private copy of a page (`Anonymous: 0`;
/// RELRO, relocated at start, has them, and so does a page a debugger patched).
fn clean_file_mappings(smaps: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-') {
            // A mapping's header: range, perms, offset, device, inode, path.
            let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) else {
                current = None;
                continue;
            };
            let perms = words.next().unwrap_or("");
            let path = words.nth(3).unwrap_or("");
            let read_only_private =
                perms.len() == 4 && !perms.contains('w') && perms.ends_with('p');
            current = (read_only_private && path.starts_with('/')).then_some((start, end));
        } else if first == "Anonymous:" {
            if let Some(range) = current.take() {
                if words.next() == Some("0") {
                    out.push(range);
                }
            }
        }
    }
    out
}

/// The file-backed part of the resident set (`RssFile`), in bytes.
fn rss_file_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("RssFile:"))?;
    kib.trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()
        .map(|k| k * 1024)
}

/// Drops the page-table entries of every clean read-only file mapping (see the module
/// comment); the number of bytes the file-backed resident set shrank by.
pub fn release_clean_file_pages() -> u64 {
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return 0;
    };
    let before = rss_file_bytes().unwrap_or(0);
    for (start, end) in clean_file_mappings(&smaps) {
        // SAFETY: a read-only private file mapping with no private pages: MADV_DONTNEED
        // only unmaps page-cache pages, which the next access maps again unchanged. A
        // failure (a locked range) leaves the range as it was.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
    let after = rss_file_bytes().unwrap_or(before);
    before.saturating_sub(after)
}

/// After one `TRIM_INTERVAL` (start-up is over) releases start-up's pages, then trims
/// the heap every `TRIM_INTERVAL`, until the runtime stops.
pub async fn trim_periodically() {
    let first = tokio::time::Instant::now() + TRIM_INTERVAL;
    let mut tick = tokio::time::interval_at(first, TRIM_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let released = release_clean_file_pages();
    tracing::debug!(released_bytes = released, "start-up pages released");
    loop {
        let freed = trim();
        tracing::debug!(freed_bytes = freed, "heap trimmed");
        tick.tick().await;
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

    #[test]
    fn only_clean_read_only_file_mappings_are_released() {
        let smaps = "\
55d0a0000000-55d0a0100000 r--p 00000000 08:01 12 /usr/bin/rpingmesh-agent
Rss:                1024 kB
Anonymous:             0 kB
55d0a0100000-55d0a0900000 r-xp 00100000 08:01 12 /usr/bin/rpingmesh-agent
Anonymous:             0 kB
55d0a0900000-55d0a0a00000 r--p 00900000 08:01 12 /usr/bin/rpingmesh-agent
Anonymous:           312 kB
55d0a0a00000-55d0a0a10000 rw-p 00a00000 08:01 12 /usr/bin/rpingmesh-agent
Anonymous:            24 kB
55d0a1000000-55d0a2000000 rw-p 00000000 00:00 0 [heap]
Anonymous:          1432 kB
7f0000000000-7f0000100000 r--s 00000000 00:0e 99 anon_inode:bpf-map
Anonymous:             0 kB
7f0000200000-7f0000300000 r--s 00000000 08:01 77 /dev/shm/ring
Anonymous:             0 kB
7f0000400000-7f0000500000 r-xp 00028000 08:01 40 /usr/lib/x86_64-linux-gnu/libc.so.6
Anonymous:             0 kB
7f0000600000-7f0000601000 r-xp 00000000 00:00 0 [vdso]
Anonymous:             0 kB
";
        assert_eq!(
            clean_file_mappings(smaps),
            vec![
                (0x55d0a0000000, 0x55d0a0100000),
                (0x55d0a0100000, 0x55d0a0900000),
                (0x7f0000400000, 0x7f0000500000),
            ]
        );
    }

    #[test]
    fn released_code_still_runs_and_relocated_data_still_reads() {
        // This test binary's own mappings: its code and read-only data leave the resident
        // set, and code that ran before (formatting, a table of relocated pointers) runs
        // the same after.
        static NAMES: [&str; 3] = ["tor-mesh", "inter-tor", "service"];
        let before = format!("{NAMES:?} {}", 6.5f64.sqrt());
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        assert!(
            !clean_file_mappings(&smaps).is_empty(),
            "no clean mapping in:\n{smaps}"
        );
        let released = release_clean_file_pages();
        assert!(released > 0, "released nothing");
        assert_eq!(format!("{NAMES:?} {}", 6.5f64.sqrt()), before);
    }
}
