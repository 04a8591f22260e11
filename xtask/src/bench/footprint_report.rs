//! The footprint's part of BENCHMARKS.md: its section and its rows of the summary.

use super::report::{verdict, Check};
use super::*;

pub(super) const FOOTPRINT_HEADING: &str =
    "## Agent footprint: 64 targets at 10 probes/s each over udp (loopback)\n";

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
          of them. CPU is utime+stime from /proc/<pid>/stat over 20 s after warm-up, RSS \
          is VmRSS (median of 1 s samples). Then, in the same run and against the same \
          responder, `probe-floor` takes the agent's address and sends the same datagrams \
          (each target once per 100 ms round, the round in one burst, as the agent's \
          scheduler does) through the same udp transport on one thread, reading every ACK \
          and TX timestamp back and nothing else: its CPU is what the kernel and the \
          transport charge for the traffic itself, and `agent / floor` is the agent's own \
          share.\n\n";
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
