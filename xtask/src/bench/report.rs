//! BENCHMARKS.md: the machine, the sections' tables, and each number checked against its
//! target.

use super::*;

pub(super) fn machine() -> String {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpu}, nproc {nproc}, kernel {kernel}")
}

pub(super) fn today() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| format!("unix time {}", unix_ns() / 1_000_000_000))
}

pub(super) fn render_markdown(
    quick: bool,
    runs: usize,
    sections: &[(&str, Result<Vec<Line>>)],
    footprint: &Result<Vec<Footprint>>,
    soak: &Result<SoakReport>,
) -> String {
    let mut s = String::from("# Benchmarks\n\n");
    let _ = writeln!(
        s,
        "Written by `cargo xtask bench{}` on {} — machine: {}.\n\
         Footprint numbers are medians of {runs} run(s); controller-bench and agent-bench \
         repeat internally and report their own medians{}.\n",
        if quick { " --quick" } else { "" },
        today(),
        machine(),
        if quick {
            " (quick mode: a smoke test, not a measurement)"
        } else {
            ""
        }
    );

    s += &summary_table(sections, footprint, soak);
    s += &footprint_section(footprint);

    for (bin, res) in sections {
        let what = section_intro(bin);
        let _ = writeln!(s, "## `{bin}`\n\n{what}.\n");
        match res {
            Ok(lines) => s += &grouped_tables(lines),
            Err(e) => {
                let _ = writeln!(s, "**Failed:** {e:#}");
            }
        }
        s += "\n";
    }
    s += "## Restart-and-fault soak (`cargo xtask soak`)\n\n";
    s += "A controller (SQLite file) and 4 agents over udp, each in its own network namespace \
          on one bridge, probing their ToR mesh at 10 probes/s per path, time-compressed \
          (active threshold 4 s, stale 8 s, pinglist refresh and analysis window 2 s). A 60 s \
          fault cycle repeats: controller restarted (s 8), controller down 6 s, past the \
          active threshold (s 16), an agent restarted (s 28), the controller frozen 5 s with \
          SIGSTOP, its RPCs hanging and the agents' reports backing up (s 36), an agent's \
          namespace cut off 6 s by an nftables drop (s 44), and in the first cycle an agent \
          killed with -9 for good (s 55). The controller restarts happen in the first and the \
          last cycle, so one controller process lives through the middle. Windows expected: \
          every ordered pair of agents both running a window before and through it, neither \
          cut off near it, the killed agent's last windows aside; convergence: from the \
          fault's end until every live agent's latest successful pinglist refresh holds \
          exactly the other live agents. RSS 5 s and 60 s after each process's start and \
          just before its end; the growth target (< 5%) is from 60 s (warm: the analyzer \
          holds its 20 windows per path, caches are filled) to the end, for the processes \
          that ran at least half the soak.\n\n";
    match soak {
        Ok(r) => s += &r.markdown(),
        Err(e) => {
            let _ = writeln!(s, "**Not run:** {e:#}");
        }
    }
    s += "\n";
    s
}

/// One target check: (what, measured, target, ratio measured/target, met).
pub(super) type Check = (String, String, String, f64, bool);

/// Precision and recall (>= 0.98) of one accuracy line, and its detection p95 against
/// `p95_windows` when given.
pub(super) fn accuracy_checks(
    out: &mut Vec<Check>,
    what: &str,
    kind: &str,
    l: &Line,
    p95_windows: Option<f64>,
) {
    let num = |k: &str| l.get(k).and_then(|v| v.as_f64());
    for k in ["precision", "recall"] {
        if let Some(v) = num(k) {
            out.push((
                format!("{what} {k}, {kind}"),
                format!("{v:.3}"),
                ">= 0.98".into(),
                v / 0.98,
                v >= 0.98,
            ));
        }
    }
    if let (Some(d), Some(max)) = (num("detection_windows_p95"), p95_windows) {
        out.push((
            format!("{what} detection p95, {kind}"),
            format!("{d:.2} windows"),
            format!("<= {max:.0} windows"),
            d / max,
            d <= max,
        ));
    }
}

/// Checks of the targets against the known fields of the bench lines.
pub fn target_checks(lines: &[Line]) -> Vec<Check> {
    let num = |l: &Line, k: &str| l.get(k).and_then(|v| v.as_f64());
    let text = |l: &Line, k: &str| l.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
    let mut out = Vec::new();
    for l in lines {
        let bench = text(l, "bench");
        match bench.as_str() {
            "get_pinglist" => {
                if let (Some(n), Some(p99)) = (num(l, "rnics"), num(l, "p99_ns")) {
                    if n >= 100_000.0 {
                        let store = match text(l, "store") {
                            s if s.is_empty() => String::new(),
                            s => format!(", {s}"),
                        };
                        let what = format!(
                            "GetPinglist p99, {n:.0} RNICs, {}{store}",
                            text(l, "pinglist_type")
                        );
                        out.push((
                            what,
                            format!("{:.3} ms", p99 / 1e6),
                            "< 2 ms".into(),
                            p99 / 2e6,
                            p99 < 2e6,
                        ));
                    }
                }
            }
            "tracer_pipeline" | "tracer_pipeline_with_workloads" => {
                if let (Some(r), Some(t)) = (num(l, "median"), num(l, "target")) {
                    out.push((
                        if bench == "tracer_pipeline" {
                            "QP events through the tracer pipeline, one core".into()
                        } else {
                            "QP events through the tracer pipeline with each flow's workload resolved, one core".into()
                        },
                        format!("{r:.0}/s"),
                        format!("> {t:.0}/s"),
                        r / t,
                        r > t,
                    ));
                }
            }
            "localization" => {
                accuracy_checks(
                    &mut out,
                    "localization",
                    &text(l, "fault_kind"),
                    l,
                    Some(2.0),
                );
            }
            "hostping_inference" => {
                let kind = text(l, "fault_kind");
                accuracy_checks(&mut out, "hostping link inference", &kind, l, None);
            }
            "finding_impact" => {
                if let (Some(r), Some(n)) = (num(l, "ratio_to_window"), num(l, "rnics")) {
                    out.push((
                        format!(
                            "impact of 8 findings over {:.0} service paths per 30 s window, {n:.0} RNICs, one core",
                            num(l, "service_paths").unwrap_or(0.0)
                        ),
                        format!("{:.4} of the window", r),
                        "< 0.05".into(),
                        r / 0.05,
                        r < 0.05,
                    ));
                }
            }
            // Which jobs a finding says it hurts, over every fault kind at once.
            "localization_impact" | "gray_impact" if text(l, "fault_kind") == "all" => {
                for k in ["precision", "recall"] {
                    if let Some(v) = num(l, &format!("impact_{k}")) {
                        out.push((
                            format!("{bench} {k} (jobs a finding names), all kinds"),
                            format!("{v:.3}"),
                            ">= 0.98".into(),
                            v / 0.98,
                            v >= 0.98,
                        ));
                    }
                }
            }
            "hostping_cpu" => {
                if let (Some(c), Some(t)) = (num(l, "cpu_share_of_core"), num(l, "target")) {
                    out.push((
                        "hostping R2R + hardware monitor CPU, 4 RNICs".into(),
                        format!("{:.3}% of a core", c * 100.0),
                        format!("< {:.1}%", t * 100.0),
                        c / t,
                        c < t,
                    ));
                }
                if let (Some(u), Some(t)) = (num(l, "user_share_of_core"), num(l, "target")) {
                    out.push((
                        "hostping R2R + hardware monitor CPU, agent user space only".into(),
                        format!("{:.3}% of a core", u * 100.0),
                        format!("< {:.1}%", t * 100.0),
                        u / t,
                        u < t,
                    ));
                }
            }
            "gray_localization" if l.get("magnitude").is_none() => {
                let kind = text(l, "fault_kind");
                accuracy_checks(&mut out, "gray localization", &kind, l, Some(3.0));
            }
            "fault_free_day" => {
                if let (Some(h), Some(n), Some(r)) =
                    (num(l, "hours"), num(l, "findings"), num(l, "rnics"))
                {
                    out.push((
                        format!("findings over {h:.0} fault-free hours, {r:.0} RNICs, realistic background"),
                        format!("{n:.0}"),
                        "0".into(),
                        n,
                        n == 0.0,
                    ));
                }
            }
            "localization_fault_free" => {
                if let (Some(h), Some(n)) = (num(l, "hours"), num(l, "findings")) {
                    out.push((
                        format!("findings over {h:.0} fault-free hours, 512 RNICs"),
                        format!("{n:.0}"),
                        "0".into(),
                        n,
                        n == 0.0,
                    ));
                }
            }
            "analyzer_localize" => {
                if let Some(r) = num(l, "ratio_to_window") {
                    let cold = num(l, "cold_ratio_to_window").unwrap_or(r);
                    out.push((
                        format!(
                            "analyzer ingest + localization of one 30 s window, {:.0} RNICs, one core (the worse of the first window and a running controller's)",
                            num(l, "rnics").unwrap_or(0.0)
                        ),
                        format!(
                            "{r:.3} of the window (first {cold:.3}, running {:.3})",
                            num(l, "steady_ratio_to_window").unwrap_or(r)
                        ),
                        "< 0.3".into(),
                        r / 0.3,
                        r < 0.3,
                    ));
                }
            }
            "identity_check" => {
                let n = num(l, "rnics").unwrap_or(0.0);
                if let (Some(p), Some(i)) = (num(l, "ratio_pinglist_p99"), num(l, "ratio_ingest")) {
                    out.push((
                        format!("GetPinglist p99 with agent identities bound (mtls) vs none (tls), {n:.0} RNICs"),
                        format!("{p:.3}x"),
                        "<= 1.2x".into(),
                        p / 1.2,
                        p <= 1.2,
                    ));
                    out.push((
                        format!("ReportProbeAnalysis ingest with identities bound vs none, {n:.0} RNICs"),
                        format!("{i:.3}x"),
                        ">= 0.9x".into(),
                        i / 0.9,
                        i >= 0.9,
                    ));
                }
            }
            "analyzer_ingest" => {
                if let Some(r) = num(l, "per_sec") {
                    out.push((
                        "PathSummary ingest, one core".into(),
                        format!("{r:.0}/s"),
                        ">= 200000/s".into(),
                        r / 2e5,
                        r >= 2e5,
                    ));
                }
            }
            _ => {
                // Lines that state their own target and ratio (ratio >= target wanted).
                if let (Some(r), Some(t)) = (num(l, "ratio"), num(l, "target")) {
                    let what = match bench.as_str() {
                        "agent_vs_baseline" => {
                            "agent probe round trips / timestamped UDP ping-pong".to_string()
                        }
                        _ => bench.clone(),
                    };
                    out.push((what, format!("{r:.3}"), format!(">= {t}"), r / t, r >= t));
                }
            }
        }
    }
    out
}

pub(super) fn summary_table(
    sections: &[(&str, Result<Vec<Line>>)],
    footprint: &Result<Vec<Footprint>>,
    soak: &Result<SoakReport>,
) -> String {
    let mut rows: Vec<Check> = Vec::new();
    if let Ok(runs) = footprint {
        rows.extend(footprint_checks(runs));
    }
    for (_, res) in sections {
        if let Ok(lines) = res {
            rows.extend(target_checks(lines));
        }
    }
    if let Ok(r) = soak {
        rows.extend(soak_checks(r));
    }
    let mut s = String::from("## Summary against the targets\n\n| what | measured | target | ratio to target | |\n|---|---|---|---|---|\n");
    for (what, m, t, r, ok) in &rows {
        let _ = writeln!(s, "| {what} | {m} | {t} | {r:.2} | {} |", verdict(*ok));
    }
    if rows.is_empty() {
        s += "| (no bench produced a comparable number) | | | | |\n";
    }
    s += "\n";
    s
}

/// One table per value of the `bench` field, in first-seen order.
pub fn grouped_tables(lines: &[Line]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<String, Vec<Line>> = BTreeMap::new();
    for l in lines {
        let b = l
            .get("bench")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        if !groups.contains_key(&b) {
            order.push(b.clone());
        }
        let mut l = l.clone();
        l.remove("bench");
        groups.entry(b).or_default().push(l);
    }
    let mut s = String::new();
    for b in order {
        if !b.is_empty() {
            let _ = writeln!(s, "### {b}\n");
        }
        s += &json_table(&groups[&b]);
        s += "\n";
    }
    s
}

pub(super) fn verdict(ok: bool) -> &'static str {
    if ok {
        "meets target"
    } else {
        "MISSES target"
    }
}

/// The soak's targets as summary rows.
pub(super) fn soak_checks(r: &SoakReport) -> Vec<Check> {
    let mut rows = Vec::new();
    let lost = r.windows_lost.len();
    rows.push((
        format!(
            "soak {:.0} s: windows lost of {} expected",
            r.duration_sec, r.windows_expected
        ),
        lost.to_string(),
        "0".into(),
        lost as f64,
        lost == 0,
    ));
    let bound = (soak::REFRESH_SEC + 1) as f64;
    let worst = r
        .restart_convergence()
        .iter()
        .map(|(_, c)| c.unwrap_or(f64::INFINITY))
        .fold(0.0, f64::max);
    rows.push((
        "soak: pinglist convergence after restarts, max".into(),
        format!("{worst:.2} s"),
        format!("<= {bound} s (one refresh + 1 s)"),
        worst / bound,
        worst <= bound,
    ));
    if let Some(g) = r.max_rss_growth_pct(r.duration_sec / 2.0) {
        rows.push((
            "soak: RSS growth from 60 s to end, processes that ran half the soak or more".into(),
            format!("{g:+.1}%"),
            format!("< {}%", soak::RSS_GROWTH_TARGET_PCT),
            g / soak::RSS_GROWTH_TARGET_PCT,
            g < soak::RSS_GROWTH_TARGET_PCT,
        ));
    }
    rows
}
