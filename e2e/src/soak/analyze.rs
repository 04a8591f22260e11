//! What a soak run kept and lost: expected windows from each agent's lifetimes and cuts,
//! the windows collected, losses, convergence after each restart, report backlog.

use super::*;

/// Expected windows, losses, convergence: from lifetimes, cuts and the collected windows.
pub(super) fn analyze(
    fleet: &Fleet,
    t0: u64,
    end_ns: u64,
    events: &[(f64, Fault, u64)],
    rss: Vec<RssReport>,
) -> SoakReport {
    let gid = |i: usize| gid_of(fleet.agents[i].ip);
    // A window [w, w+W) of s towards t is expected when both ran from one window before
    // it to its end (s had its pinglist, t was in it), and neither was cut off from two
    // windows before to four after (t dropped from lists while inactive, re-added at a
    // refresh after its next heartbeat).
    let mut expected = BTreeSet::new();
    let first = (t0 / W + 2) * W;
    for s in 0..AGENTS {
        for t in 0..AGENTS {
            if s == t {
                continue;
            }
            let (a, b) = (&fleet.agents[s], &fleet.agents[t]);
            let mut w = first;
            while w + W <= end_ns {
                let ok = a.alive_over(w - W, w + W)
                    && b.alive_over(w - W, w + W)
                    && !a.cut_near(w - 2 * W, w + 4 * W)
                    && !b.cut_near(w - 2 * W, w + 4 * W)
                    && !a.died_holding(w);
                if ok {
                    expected.insert((gid(s), gid(t), w));
                }
                w += W;
            }
        }
    }
    let lost: Vec<(String, String, u64)> = expected
        .iter()
        .filter(|k| !fleet.windows.contains_key(*k))
        .cloned()
        .collect();
    let (mut sent, mut answered) = (0u64, 0u64);
    for w in fleet.windows.values() {
        sent += w.probe_total as u64;
        answered += w.probe_success as u64;
    }

    // Convergence: after each fault's end, the first instant at which every live agent
    // has refreshed its pinglists successfully since the end (its running process logged
    // "pinglists refreshed", ok) and the latest such list holds every other live agent.
    let logs: Vec<Vec<Vec<(u64, u64)>>> = fleet
        .agents
        .iter()
        .map(|a| {
            a.lives
                .iter()
                .map(|l| target_counts(&l.proc.stderr()))
                .collect()
        })
        .collect();
    let mut reports = Vec::new();
    for &(at_sec, fault, end) in events {
        let live: Vec<(usize, usize)> = (0..AGENTS)
            .filter_map(|i| {
                let a = &fleet.agents[i];
                let k = a.lives.iter().position(|l| l.covers(end, end + 1))?;
                Some((i, k))
            })
            .collect();
        let want = live.len().saturating_sub(1) as u64;
        let mut instants: Vec<u64> = live
            .iter()
            .flat_map(|&(i, k)| logs[i][k].iter().map(|(t, _)| *t))
            .filter(|t| *t >= end)
            .collect();
        instants.sort_unstable();
        let converged = instants.into_iter().find(|&t| {
            live.iter().all(|&(i, k)| {
                logs[i][k]
                    .iter()
                    .rfind(|(ts, _)| *ts >= end && *ts <= t)
                    .is_some_and(|(_, n)| *n == want)
            })
        });
        reports.push(EventReport {
            at_sec,
            fault,
            convergence_sec: converged.map(|c| c.saturating_sub(end) as f64 / 1e9),
        });
    }
    let report_drops: Vec<String> = fleet
        .agents
        .iter()
        .flat_map(|a| {
            a.log()
                .lines()
                .filter(|l| l.contains("report channel full") || l.contains("report outbox full"))
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    let max_report_backlog = fleet
        .agents
        .iter()
        .flat_map(|a| {
            a.log()
                .lines()
                .filter(|l| l.contains("PathSummary reports accepted again"))
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter_map(|v| v["fields"]["queued"].as_u64())
                .collect::<Vec<_>>()
        })
        .max()
        .unwrap_or(0);
    SoakReport {
        duration_sec: (end_ns - t0) as f64 / 1e9,
        events: reports,
        probes_sent: sent,
        probes_answered: answered,
        windows_expected: expected.len(),
        windows_reported: fleet.windows.len(),
        windows_lost: lost,
        rss,
        report_drops,
        max_report_backlog,
    }
}
