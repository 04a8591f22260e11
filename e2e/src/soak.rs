//! The restart-and-fault soak (root): a controller and agents, each in its own network
//! namespace on one bridge, probing the ToR mesh for `duration` while a repeating
//! schedule of faults hits them, time-compressed by short thresholds (active 4 s, stale
//! 8 s, pinglist refresh and analysis window 2 s):
//! controller restarted (SQLite file kept), controller down for longer than the active
//! threshold, an agent restarted, the controller frozen (SIGSTOP: its RPCs hang, the
//! agents' reports back up), an agent's host unreachable (nftables drops everything in
//! its namespace), and once, an agent killed with -9 and not restarted.
//!
//! It reports what a long-running monitor must keep: probes sent and answered, windows
//! reported against those expected (and which were lost), pinglist convergence after
//! each restart, and the RSS of every process at its start and end. `cargo xtask soak`
//! runs it at any length; the test suite runs one cycle; `cargo xtask bench` a long one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rpingmesh_proto::controller_agent::PathSummary;

use crate::netns::BridgeNet;
use crate::*;

mod analyze;
use analyze::analyze;

pub const ACTIVE_SEC: u64 = 4;
pub const STALE_SEC: u64 = 8;
pub const REFRESH_SEC: u64 = 2;
pub const WINDOW_SEC: u64 = 2;
/// One round of the fault schedule.
pub const CYCLE: Duration = Duration::from_secs(60);
pub const AGENTS: usize = 4;
/// Runs at least this long are "long": the RSS growth target applies.
pub const LONG_RUN: Duration = Duration::from_secs(300);
pub const RSS_GROWTH_TARGET_PCT: f64 = 5.0;
const TOR: &str = "tor-soak";
const W: u64 = WINDOW_SEC * 1_000_000_000;

/// What happens, at which second of each cycle. `KillAgent` only in the first cycle; the
/// controller restarts (`ControllerRestart`, `ControllerDown`) in the first and the last,
/// so that in a long soak one controller process lives through the middle and its RSS
/// growth is measured over most of the run (agents restart and faults hit every cycle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    ControllerRestart,
    /// Down for this many seconds (longer than the active threshold).
    ControllerDown(u64),
    AgentRestart(usize),
    /// SIGSTOP for this many seconds: RPCs hang, reports back up.
    ControllerFrozen(u64),
    /// All traffic of the agent's namespace dropped for this many seconds.
    AgentUnreachable(usize, u64),
    /// SIGKILL, never restarted.
    KillAgent(usize),
}

pub const SCHEDULE: [(u64, Fault); 6] = [
    (8, Fault::ControllerRestart),
    (16, Fault::ControllerDown(ACTIVE_SEC + 2)),
    (28, Fault::AgentRestart(1)),
    (36, Fault::ControllerFrozen(5)),
    (44, Fault::AgentUnreachable(2, 6)),
    (55, Fault::KillAgent(3)),
];

/// One fault as it happened, and how long the fleet took to converge after it.
#[derive(Debug, Clone)]
pub struct EventReport {
    pub at_sec: f64,
    pub fault: Fault,
    /// Seconds from the end of the fault (process back, network back) until every live
    /// agent had applied a pinglist fetched since, holding exactly the other live agents;
    /// None if that never happened.
    pub convergence_sec: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct RssReport {
    pub process: String,
    pub start_kib: u64,
    /// One fault cycle after start, when the controller's analyzer retention (20
    /// windows per path) and every cache are full; 0 if the process ended before.
    pub warm_kib: u64,
    pub end_kib: u64,
    pub lived_sec: f64,
}

#[derive(Debug, Clone, Default)]
pub struct SoakReport {
    pub duration_sec: f64,
    pub events: Vec<EventReport>,
    pub probes_sent: u64,
    pub probes_answered: u64,
    pub windows_expected: usize,
    pub windows_reported: usize,
    /// Expected windows the controller never got: (source, target, window start).
    pub windows_lost: Vec<(String, String, u64)>,
    pub rss: Vec<RssReport>,
    /// Warnings of agents about dropped reports (must be none).
    pub report_drops: Vec<String>,
    /// The largest report backlog an agent delivered after an outage (summaries that
    /// waited in its outbox: the back-pressure the faults put on reporting).
    pub max_report_backlog: u64,
}

impl SoakReport {
    /// Convergence times of the restarts (controller and agent), the target of which is
    /// one pinglist refresh.
    pub fn restart_convergence(&self) -> Vec<(Fault, Option<f64>)> {
        self.events
            .iter()
            .filter(|e| !matches!(e.fault, Fault::KillAgent(_) | Fault::AgentUnreachable(..)))
            .map(|e| (e.fault, e.convergence_sec))
            .collect()
    }

    /// The soak's targets, as failures (empty: all met). Nothing lost (a killed agent's
    /// last windows aside); every restart converged within one pinglist refresh (plus a
    /// second of margin: registration retry back-off, a loaded machine); no report
    /// dropped; and over a long run (at least [`LONG_RUN`]), RSS growth under
    /// [`RSS_GROWTH_TARGET_PCT`] for every process that lived through half of it.
    pub fn target_failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.windows_lost.is_empty() {
            out.push(format!(
                "{} expected window(s) never reached the controller, e.g. {:?}",
                self.windows_lost.len(),
                &self.windows_lost[..self.windows_lost.len().min(5)]
            ));
        }
        let bound = (REFRESH_SEC + 1) as f64;
        for (fault, conv) in self.restart_convergence() {
            match conv {
                None => out.push(format!("{fault:?}: the pinglists never converged")),
                Some(c) if c > bound => out.push(format!(
                    "{fault:?}: pinglists converged after {c:.2} s (bound {bound} s)"
                )),
                Some(_) => {}
            }
        }
        if !self.report_drops.is_empty() {
            out.push(format!(
                "agents dropped reports: {:?}",
                &self.report_drops[..self.report_drops.len().min(3)]
            ));
        }
        if self.duration_sec >= LONG_RUN.as_secs_f64() {
            if let Some(g) = self.max_rss_growth_pct(self.duration_sec / 2.0) {
                if g >= RSS_GROWTH_TARGET_PCT {
                    out.push(format!(
                        "RSS grew {g:.1}% (target < {RSS_GROWTH_TARGET_PCT}%)"
                    ));
                }
            }
        }
        out
    }

    /// Largest RSS growth from warm to end, in percent, of processes that lived at
    /// least `min_sec` (what a leak shows as; warm-up is the start-to-warm column).
    pub fn max_rss_growth_pct(&self, min_sec: f64) -> Option<f64> {
        self.rss
            .iter()
            .filter(|r| r.lived_sec >= min_sec && r.warm_kib > 0)
            .map(|r| (r.end_kib as f64 - r.warm_kib as f64) * 100.0 / r.warm_kib as f64)
            .max_by(|a, b| a.total_cmp(b))
    }

    /// Markdown: a summary table, the events, and the RSS per process.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let conv: Vec<f64> = self
            .restart_convergence()
            .iter()
            .filter_map(|(_, c)| *c)
            .collect();
        let p50 = |mut v: Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let max = conv.iter().copied().fold(f64::NAN, f64::max);
        s += "| metric | value |\n|---|---|\n";
        s += &format!("| duration | {:.0} s |\n", self.duration_sec);
        s += &format!("| faults | {} |\n", self.events.len());
        s += &format!(
            "| probes sent / answered | {} / {} |\n",
            self.probes_sent, self.probes_answered
        );
        s += &format!(
            "| windows reported / expected | {} / {} |\n",
            self.windows_reported, self.windows_expected
        );
        s += &format!("| windows lost | {} |\n", self.windows_lost.len());
        s += &format!(
            "| pinglist convergence after restarts, p50 / max | {:.2} s / {:.2} s (refresh {REFRESH_SEC} s) |\n",
            p50(conv.clone()),
            max
        );
        if let Some(g) = self.max_rss_growth_pct(self.duration_sec / 2.0) {
            s += &format!(
                "| RSS growth from 60 s to end, largest of the processes that ran at least half the soak | {g:+.1}% |\n"
            );
        }
        s += &format!(
            "| largest report backlog delivered after an outage | {} summaries |\n",
            self.max_report_backlog
        );
        s += &format!(
            "| report drops logged by agents | {} |\n\n",
            self.report_drops.len()
        );
        s += "| at | fault | convergence |\n|---|---|---|\n";
        for e in &self.events {
            s += &format!(
                "| {:.0} s | {:?} | {} |\n",
                e.at_sec,
                e.fault,
                e.convergence_sec
                    .map_or("-".into(), |c| format!("{c:.2} s"))
            );
        }
        s += "\n| process | lived | RSS at 5 s | RSS at 60 s | RSS at end | growth 60 s to end |\n|---|---|---|---|---|---|\n";
        let kib = |k: u64| {
            if k > 0 {
                format!("{k} KiB")
            } else {
                "-".into()
            }
        };
        for r in &self.rss {
            let growth = if r.warm_kib > 0 {
                format!(
                    "{:+.1}%",
                    (r.end_kib as f64 - r.warm_kib as f64) * 100.0 / r.warm_kib as f64
                )
            } else {
                "-".into()
            };
            s += &format!(
                "| {} | {:.0} s | {} | {} | {} | {growth} |\n",
                r.process,
                r.lived_sec,
                kib(r.start_kib),
                kib(r.warm_kib),
                kib(r.end_kib)
            );
        }
        s
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    procfs::process::Process::new(pid as i32)
        .ok()?
        .status()
        .ok()?
        .vmrss
}

/// Unix ns of an RFC 3339 UTC timestamp as the agents log it (`...Z`).
pub fn parse_utc_ns(ts: &str) -> Option<u64> {
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    // Days from the civil date (proleptic Gregorian), 1970-01-01 = 0.
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let frac_ns = {
        let f: String = frac.chars().take(9).collect();
        f.parse::<u64>().ok()? * 10u64.pow(9 - f.len() as u32)
    };
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    Some(secs as u64 * 1_000_000_000 + frac_ns)
}

/// (unix ns, ToR-mesh targets) of every successful pinglist refresh in an agent log.
fn target_counts(log: &str) -> Vec<(u64, u64)> {
    log.lines()
        .filter(|l| l.contains("pinglists refreshed"))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["ok"].as_bool() == Some(true))
        .filter_map(|v| {
            Some((
                parse_utc_ns(v["timestamp"].as_str()?)?,
                v["fields"]["tor_mesh"].as_u64()?,
            ))
        })
        .collect()
}

/// One agent slot: its address, namespace, and every process it ran (with lifetimes).
struct AgentSlot {
    id: String,
    ip: std::net::Ipv4Addr,
    ns: String,
    lives: Vec<Life>,
    /// Unreachable intervals.
    cut: Vec<(u64, u64)>,
}

/// RSS samples of one process, KiB: 5 s and one cycle after its start, just before its end.
#[derive(Default)]
struct RssSamples {
    start: Option<u64>,
    warm: Option<u64>,
    end: Option<u64>,
}

impl RssSamples {
    /// Takes the samples that are due at `age` ns after start.
    fn sample(&mut self, age: u64, pid: u32) {
        if self.start.is_none() && age > 5_000_000_000 {
            self.start = rss_kib(pid);
        }
        if self.warm.is_none() && age > CYCLE.as_nanos() as u64 {
            self.warm = rss_kib(pid);
        }
    }

    fn report(&self, process: String, lived_ns: u64) -> RssReport {
        RssReport {
            process,
            start_kib: self.start.unwrap_or(0),
            warm_kib: self.warm.unwrap_or(0),
            end_kib: self.end.unwrap_or(0),
            lived_sec: lived_ns as f64 / 1e9,
        }
    }
}

/// One agent process: when it ran (unix ns), whether it was killed with -9, its RSS.
struct Life {
    proc: Proc,
    start: u64,
    end: Option<u64>,
    killed: bool,
    rss: RssSamples,
}

/// One controller process (as [`Life`]).
struct CtlLife {
    name: String,
    start: u64,
    end: Option<u64>,
    rss: RssSamples,
}

impl Life {
    fn covers(&self, from: u64, to: u64) -> bool {
        self.start <= from && self.end.is_none_or(|e| to <= e)
    }
}

/// A window that closed this shortly before a -9 may still have been in the agent's
/// memory: the driver hands closed windows to the reporter once a second
/// (REPORT_FLUSH_NS), and the send takes a moment. Those are the killed agent's "last
/// window", and not counted as lost.
const KILL_SLACK: u64 = 2_000_000_000;

impl AgentSlot {
    fn alive_over(&self, from: u64, to: u64) -> bool {
        self.lives.iter().any(|l| l.covers(from, to))
    }

    /// Window [w, w+W) of this agent may have died with it (closed just before a -9).
    fn died_holding(&self, w: u64) -> bool {
        self.lives
            .iter()
            .any(|l| l.killed && l.end.is_some_and(|e| w <= e && e < w + W + KILL_SLACK))
    }

    fn cut_near(&self, from: u64, to: u64) -> bool {
        self.cut.iter().any(|(a, b)| from < *b && *a < to)
    }

    fn log(&self) -> String {
        self.lives
            .iter()
            .map(|l| l.proc.stderr())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

struct Fleet {
    dir: PathBuf,
    net: BridgeNet,
    ctl_ns: String,
    ctl_args: Vec<String>,
    ctl: Option<Controller>,
    ctl_lives: Vec<CtlLife>,
    ctl_n: usize,
    agents: Vec<AgentSlot>,
    windows: BTreeMap<(String, String, u64), PathSummary>,
    started: Instant,
}

impl Fleet {
    fn endpoint(&self) -> String {
        format!("http://{}:50051", self.net.ip(1))
    }

    fn start_controller(&mut self) -> Result<()> {
        self.ctl_n += 1;
        let name = format!("controller-{}", self.ctl_n);
        let args: Vec<&str> = self.ctl_args.iter().map(String::as_str).collect();
        let c = spawn_controller(
            &self.dir,
            &name,
            Some(&self.ctl_ns),
            &format!("{}:50051", self.net.ip(1)),
            &args,
        )?;
        self.ctl_lives.push(CtlLife {
            name,
            start: unix_ns_now(),
            end: None,
            rss: RssSamples::default(),
        });
        self.ctl = Some(c);
        Ok(())
    }

    fn stop_controller(&mut self) {
        if let Some(mut c) = self.ctl.take() {
            let rss = rss_kib(c.proc.pid());
            c.proc.stop();
            if let Some(l) = self.ctl_lives.last_mut() {
                l.end = Some(unix_ns_now());
                l.rss.end = rss;
            }
        }
    }

    fn start_agent(&mut self, i: usize) -> Result<()> {
        let slot = &mut self.agents[i];
        let n = slot.lives.len() + 1;
        let a = AgentArgs::new(&slot.id, TOR, &format!("{}:50051", self.net.ip(1)), slot.ip)
            .flag("--metrics-enabled", "false")
            .flag("--service-tracing-mode", "off")
            .flag("--pinglist-update-interval-sec", REFRESH_SEC)
            .flag("--analysis-window-sec", WINDOW_SEC)
            .flag("--probe-interval-ms", 100)
            .flag("--tor-mesh-probe-rate-per-second", 10);
        // The monitor's debug line of every refresh is what convergence is measured by.
        let p = Proc::spawn_env(
            &self.dir,
            &format!("{}-{n}", slot.id),
            Some(&slot.ns),
            &bin(AGENT_BIN),
            &a.to_args(),
            &[("RUST_LOG", "info,rpingmesh_agent::cluster_monitor=debug")],
        )?;
        slot.lives.push(Life {
            proc: p,
            start: unix_ns_now(),
            end: None,
            killed: false,
            rss: RssSamples::default(),
        });
        Ok(())
    }

    fn stop_agent(&mut self, i: usize, sig: libc::c_int) {
        let slot = &mut self.agents[i];
        if let Some(l) = slot.lives.last_mut() {
            if l.end.is_none() {
                l.rss.end = rss_kib(l.proc.pid());
                if sig == libc::SIGKILL {
                    l.proc.signal(libc::SIGKILL);
                    l.proc.wait_exit(Duration::from_secs(5));
                    l.killed = true;
                } else {
                    l.proc.stop();
                }
                l.end = Some(unix_ns_now());
            }
        }
    }

    /// Everything the controller holds now, merged into the collected windows (the
    /// analyzer keeps windows in memory only: collected before each controller stop).
    async fn collect(&mut self) {
        let Some(_) = &self.ctl else { return };
        let Ok(mut op) = operator(&self.endpoint()).await else {
            return;
        };
        if let Ok(ws) = all_windows(&mut op).await {
            for w in ws {
                self.windows.insert(
                    (
                        w.source_gid.clone(),
                        w.target_gid.clone(),
                        w.window_start_unix_ns,
                    ),
                    w,
                );
            }
        }
    }

    /// Takes the RSS samples that are due (5 s and one cycle after each start).
    fn sample_rss(&mut self) {
        let now = unix_ns_now();
        for slot in &mut self.agents {
            for l in &mut slot.lives {
                if l.end.is_none() {
                    l.rss.sample(now - l.start, l.proc.pid());
                }
            }
        }
        if let (Some(c), Some(l)) = (&self.ctl, self.ctl_lives.last_mut()) {
            l.rss.sample(now - l.start, c.proc.pid());
        }
    }

    fn secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// Waits `d` while collecting windows every few seconds and sampling RSS.
async fn pass(fleet: &mut Fleet, d: Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        fleet.sample_rss();
        let step = until
            .saturating_duration_since(Instant::now())
            .min(Duration::from_secs(3));
        tokio::time::sleep(step).await;
        fleet.collect().await;
    }
}

/// Runs the soak in `dir` for `duration` (at least one cycle is recommended; events
/// past the duration are not started). Needs root.
pub async fn run(dir: &Path, duration: Duration) -> Result<SoakReport> {
    if !is_root() {
        bail!("the soak needs root (network namespaces, nftables)");
    }
    let mut net = BridgeNet::new()?;
    let ctl_ns = net.add_host("ctl", 1)?;
    let mut agents = Vec::new();
    for i in 0..AGENTS {
        let ns = net.add_host(&format!("a{i}"), 10 + i as u8)?;
        agents.push(AgentSlot {
            id: format!("soak-{i}"),
            ip: net.ip(10 + i as u8),
            ns,
            lives: Vec::new(),
            cut: Vec::new(),
        });
    }
    let db = dir.join("controller.db");
    let ctl_args: Vec<String> = [
        "--database-uri".to_string(),
        format!("sqlite:{}", db.display()),
        "--active-threshold-sec".into(),
        ACTIVE_SEC.to_string(),
        "--stale-threshold-sec".into(),
        STALE_SEC.to_string(),
        "--metrics-enabled".into(),
        "false".into(),
    ]
    .into();
    let mut fleet = Fleet {
        dir: dir.to_path_buf(),
        net,
        ctl_ns,
        ctl_args,
        ctl: None,
        ctl_lives: Vec::new(),
        ctl_n: 0,
        agents,
        windows: BTreeMap::new(),
        started: Instant::now(),
    };
    fleet.start_controller()?;
    for i in 0..AGENTS {
        fleet.start_agent(i)?;
    }
    let t0 = unix_ns_now();
    let mut events: Vec<(f64, Fault, u64)> = Vec::new(); // (at, fault, end of the fault)
    let mut cycle = 0u64;
    let cycles = duration.as_secs().div_ceil(CYCLE.as_secs()).max(1);
    'run: loop {
        for (at, fault) in SCHEDULE {
            let when = Duration::from_secs(cycle * CYCLE.as_secs() + at);
            if when >= duration {
                break 'run;
            }
            let skip = match fault {
                Fault::KillAgent(_) => cycle > 0,
                Fault::ControllerRestart | Fault::ControllerDown(_) => {
                    cycle > 0 && cycle + 1 < cycles
                }
                _ => false,
            };
            if skip {
                continue;
            }
            let wait = when.saturating_sub(fleet.started.elapsed());
            pass(&mut fleet, wait).await;
            let at_sec = fleet.secs();
            let end = match fault {
                Fault::ControllerRestart => {
                    fleet.collect().await;
                    fleet.stop_controller();
                    fleet.start_controller()?;
                    unix_ns_now()
                }
                Fault::ControllerDown(secs) => {
                    fleet.collect().await;
                    fleet.stop_controller();
                    pass(&mut fleet, Duration::from_secs(secs)).await;
                    fleet.start_controller()?;
                    unix_ns_now()
                }
                Fault::AgentRestart(i) => {
                    fleet.stop_agent(i, libc::SIGTERM);
                    fleet.start_agent(i)?;
                    unix_ns_now()
                }
                Fault::ControllerFrozen(secs) => {
                    fleet.collect().await;
                    let pid = fleet
                        .ctl
                        .as_ref()
                        .map(|c| c.proc.pid())
                        .context("controller")?;
                    // SAFETY: signalling our own child.
                    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
                    tokio::time::sleep(Duration::from_secs(secs)).await;
                    unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                    unix_ns_now()
                }
                Fault::AgentUnreachable(i, secs) => {
                    let ns = fleet.agents[i].ns.clone();
                    let from = unix_ns_now();
                    fleet
                        .net
                        .host(&ns)
                        .context("agent namespace")?
                        .nft(
                            "table inet soak {\n chain i { type filter hook input priority 0; policy drop; }\n chain o { type filter hook output priority 0; policy drop; }\n}\n",
                        )?;
                    pass(&mut fleet, Duration::from_secs(secs)).await;
                    fleet
                        .net
                        .host(&ns)
                        .context("agent namespace")?
                        .nft("delete table inet soak\n")?;
                    let to = unix_ns_now();
                    fleet.agents[i].cut.push((from, to));
                    to
                }
                Fault::KillAgent(i) => {
                    fleet.stop_agent(i, libc::SIGKILL);
                    unix_ns_now()
                }
            };
            events.push((at_sec, fault, end));
        }
        cycle += 1;
    }
    let rest = duration.saturating_sub(fleet.started.elapsed());
    pass(&mut fleet, rest).await;

    // End: a graceful stop of everyone (the agents flush their open windows; RSS is
    // sampled just before each stop), the last reports collected.
    let end_ns = unix_ns_now();
    for i in 0..AGENTS {
        fleet.stop_agent(i, libc::SIGTERM);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    fleet.collect().await;
    fleet.stop_controller();

    let mut rss = Vec::new();
    for slot in &fleet.agents {
        for (k, l) in slot.lives.iter().enumerate() {
            let name = format!("{}#{}", slot.id, k + 1);
            rss.push(l.rss.report(name, l.end.unwrap_or(end_ns) - l.start));
        }
    }
    for l in &fleet.ctl_lives {
        rss.push(
            l.rss
                .report(l.name.clone(), l.end.unwrap_or(end_ns) - l.start),
        );
    }
    Ok(analyze(&fleet, t0, end_ns, &events, rss))
}

#[cfg(test)]
mod tests;
