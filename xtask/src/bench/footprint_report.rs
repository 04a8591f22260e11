//! The footprint's part of BENCHMARKS.md: its section and its rows of the summary.

use super::report::{verdict, Check};
use super::*;

pub(super) const FOOTPRINT_HEADING: &str =
    "## Agent footprint: 64 targets at 10 probes/s each over udp (loopback)\n";

/// Where the agent's CPU and memory went before and after issue 25's work (profiles
/// taken by hand on this machine; the tables below are what each bench run measures).
const PROFILE: &str = "Where it went (issue 25, 2026-12-06/07, this machine). CPU before: \
    perf (30 s at 4999 Hz) counted 1,920 samples in the agent and 1,351 in probe-floor; the \
    kernel's datagram path (sendmsg and the loopback delivery it runs, recvmmsg) was most \
    of both, and the agent's extra was wake-ups: scheduler switch-in and IRQ-restore \
    samples were 22% of its profile. Per 10 s the agent made 891 epoll_wait, 2,581 \
    recvmmsg and 275 eventfd writes where probe-floor made 298, 495 and 0. The causes: \
    tokio's timer wheel woke the driver once more for each deadline past 64 ms and wrote \
    an eventfd to re-arm for an earlier one; a 10 ms tick to look at the driver's watches; \
    housekeeping and report flushes on timers of their own; a token bucket of exactly one \
    round, so a round that began a hair after the last sent its last targets one wake-up \
    each; recvmmsg took 8 entries for the 192 a round brings. After (the driver's own \
    timerfd, deadlines that ride on the round's wake, a bucket of a round plus an eighth, \
    64 entries a call): 275 epoll_wait, 495 recvmmsg, no eventfd write, and agent / floor \
    went from 1.67 to 1.06. Then a round goes out in one sendmmsg (64 sendmsg before), in \
    the agent and in probe-floor alike: about 7% less CPU for both (A/B, 3 runs each), \
    less than hoped, because \
    the ACKs, no longer held back by the send loop, come back in more, smaller groups \
    (about 120 epoll_wait a second instead of 28). What is left is the traffic: on loopback the sender's \
    syscall also runs the receiving socket's delivery, so probe-floor itself costs 0.6-0.7% \
    of a core here, above the 0.5% target; an RNIC does that path in hardware. Memory \
    before (VmRSS 15.3 MiB): the QP event ring 2 MiB resident (1 MiB mapped twice), \
    aya-log's ring 0.25 MiB, the embedded eBPF object's DWARF 0.2 MiB (read whole at \
    load), 0.44 MiB of relative relocations, a regex compiled by the log filter, and \
    0.4 MiB of freed heap glibc kept. After: a 256 KiB event ring (tracer-bench's storm \
    drops nothing even at 16 KiB) and a 32 KiB log ring, the object without DWARF, packed \
    relocations (DT_RELR), a plain target filter, and the heap trimmed after the tracer's \
    start and every 10 s. That left 12.8-12.9 MiB: about 8 MiB of it the agent's code and \
    libc mapped from the page cache (shared, clean; the kernel maps 64 KiB around every \
    page start-up touched), 0.7 MiB rdma-core (libibverbs, librdmacm, libnl), linked though \
    a udp agent never calls it, and 1.7 MiB private memory. Now rdma-core is opened with \
    dlopen by the rdma transport only (12.8 -> 12.2 MiB), and 10 s after start the agent \
    drops the page-table entries of its clean read-only file mappings (code, read-only \
    data; never RELRO or a patched page): what it still runs faults back in within \
    seconds and stays at about 10 MiB (measured for 3 minutes).\n\n";

pub(super) fn footprint_checks(runs: &[Footprint]) -> Vec<Check> {
    if runs.is_empty() {
        return Vec::new();
    }
    let cpu = median_f(runs.iter().map(|r| r.cpu_pct).collect());
    let floor = median_f(runs.iter().map(|r| r.floor_cpu_pct).collect());
    let rss = median_f(runs.iter().map(|r| r.rss_mib).collect());
    vec![
        (
            "agent CPU, 64 targets x 10/s".into(),
            format!("{cpu:.3}% of a core (probe-floor {floor:.3}%)"),
            format!("< {CPU_TARGET_PCT}%"),
            cpu / CPU_TARGET_PCT,
            cpu < CPU_TARGET_PCT,
        ),
        (
            "agent RSS, 64 targets x 10/s".into(),
            format!("{rss:.1} MiB"),
            format!("< {RSS_TARGET_MIB} MiB"),
            rss / RSS_TARGET_MIB,
            rss < RSS_TARGET_MIB,
        ),
    ]
}

pub(super) fn footprint_section(footprint: &Result<Vec<Footprint>>) -> String {
    let mut s = String::from(FOOTPRINT_HEADING);
    s += "\nA responder-only agent hosts 64 pseudo-RNICs (127.0.2.1-64, ToR t1); the measured \
          agent (127.0.3.1, ToR t1, probe interval 100 ms, ToR-mesh rate 10/s) probes all \
          of them. CPU is utime+stime from /proc/<pid>/stat over 20 s after warm-up (at \
          least 20 s after the agent's start: start-up is over), RSS is VmRSS (the \
          highest of 1 s samples). Then, in the same run and against the same \
          responder, `probe-floor` takes the agent's address and sends the same datagrams \
          (each target once per 100 ms round, the round in one sendmmsg batch when a \
          timerfd fires, as the agent's driver does) through the same udp transport on one thread, reading every ACK \
          and TX timestamp back and nothing else: its CPU is what the kernel and the \
          transport charge for the traffic itself, and `agent / floor` is the agent's own \
          share.\n\n";
    s += PROFILE;
    let runs = match footprint {
        Ok(runs) if !runs.is_empty() => runs,
        Ok(_) => return s + "No runs.\n\n",
        Err(e) => return s + &format!("**Failed:** {e:#}\n\n"),
    };
    let cpu = median_f(runs.iter().map(|r| r.cpu_pct).collect());
    let floor = median_f(runs.iter().map(|r| r.floor_cpu_pct).collect());
    let ratio = median_f(runs.iter().map(|r| r.cpu_pct / r.floor_cpu_pct).collect());
    let rss = median_f(runs.iter().map(|r| r.rss_mib).collect());
    let rate = median_f(runs.iter().map(|r| r.probes_per_sec).collect());
    let sleep = median_f(runs.iter().map(|r| r.sleep_rss_mib).collect());
    let targets = runs.iter().map(|r| r.targets_probed).min().unwrap_or(0);
    let want_rate = TARGETS as f64 * RATE_PER_TARGET;
    s += "| metric | measured | target | ratio to target |\n|---|---|---|---|\n";
    let _ = writeln!(
        s,
        "| CPU, % of one core | {cpu:.3} | < {CPU_TARGET_PCT} | {:.2} ({}) |",
        cpu / CPU_TARGET_PCT,
        verdict(cpu < CPU_TARGET_PCT)
    );
    let _ = writeln!(
        s,
        "| baseline: probe-floor's CPU, the same datagrams alone | {floor:.3} | | {:.2} |",
        floor / CPU_TARGET_PCT
    );
    let _ = writeln!(
        s,
        "| agent CPU / probe-floor CPU (median of the runs' ratios) | {ratio:.2} | | |"
    );
    let _ = writeln!(
        s,
        "| RSS (VmRSS) | {rss:.1} MiB | < {RSS_TARGET_MIB} MiB | {:.2} ({}) |",
        rss / RSS_TARGET_MIB,
        verdict(rss < RSS_TARGET_MIB)
    );
    let _ = writeln!(
        s,
        "| probes/s achieved (all targets) | {rate:.0} | {want_rate:.0} | {:.2} |",
        rate / want_rate
    );
    let _ = writeln!(
        s,
        "| targets probed (min over runs) | {targets} | {TARGETS} | |"
    );
    let _ = writeln!(s, "| baseline: RSS of `sleep` | {sleep:.1} MiB | | |\n");
    s += "Per run: ";
    let per: Vec<String> = runs
        .iter()
        .map(|r| {
            format!(
                "CPU {:.3}% (floor {:.3}%) / RSS {:.1} MiB / {:.0} probes/s",
                r.cpu_pct, r.floor_cpu_pct, r.rss_mib, r.probes_per_sec
            )
        })
        .collect();
    s += &per.join("; ");
    s += ".\n\n";
    s
}
