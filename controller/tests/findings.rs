//! Localized findings with real processes: the controller binary on a SQLite file in a
//! temp dir, agents simulated over real gRPC (RegisterAgent, ReportProbeAnalysis), read
//! back through ListFindings / WatchFindings and the Prometheus /metrics endpoint, across
//! a SIGKILL and a restart on the same file; and the one-line startup errors of a bad
//! `analyzer_topology_file`.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rpingmesh_controller::registry::{Registry, SqliteRegistry};
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::{
    AgentRegistrationRequest, PathSummary, PinglistType, ProbeAnalysisReport, RnicInfo,
};
use rpingmesh_proto::operator::operator_service_client::OperatorServiceClient;
use rpingmesh_proto::operator::{Finding, FindingEvent, ListFindingsRequest, WatchFindingsRequest};
use tonic::transport::Channel;
use tonic::{Code, Streaming};

const BIN: &str = env!("CARGO_BIN_EXE_rpingmesh-controller");

/// One simulated RNIC: (agent, host, ToR, device, GID).
#[derive(Debug, Clone)]
struct Nic {
    agent: &'static str,
    host: &'static str,
    tor: &'static str,
    device: &'static str,
    gid: String,
}

impl Nic {
    fn location(&self) -> String {
        format!("{}/{}", self.host, self.device)
    }
}

/// tor-a: three hosts with one RNIC each; tor-b: one host with three RNICs.
fn fabric() -> Vec<Nic> {
    let mut v = Vec::new();
    for (i, (agent, host)) in [
        ("agent-a1", "host-a1"),
        ("agent-a2", "host-a2"),
        ("agent-a3", "host-a3"),
    ]
    .into_iter()
    .enumerate()
    {
        v.push(Nic {
            agent,
            host,
            tor: "tor-a",
            device: "mlx5_0",
            gid: rpingmesh_proto::gid::normalize_gid(&format!("fd00::a:{}", i + 1)).unwrap(),
        });
    }
    for (i, device) in ["mlx5_0", "mlx5_1", "mlx5_2"].into_iter().enumerate() {
        v.push(Nic {
            agent: "agent-b1",
            host: "host-b1",
            tor: "tor-b",
            device,
            gid: rpingmesh_proto::gid::normalize_gid(&format!("fd00::b:{}", i + 1)).unwrap(),
        });
    }
    v
}

fn registrations(nics: &[Nic]) -> Vec<AgentRegistrationRequest> {
    let mut out: Vec<AgentRegistrationRequest> = Vec::new();
    for n in nics {
        let rnic = RnicInfo {
            gid: n.gid.clone(),
            qpn: 7,
            ip_address: "10.0.0.1".into(),
            device_name: n.device.into(),
            ..Default::default()
        };
        match out.iter_mut().find(|r| r.agent_id == n.agent) {
            Some(r) => r.rnics.push(rnic),
            None => out.push(AgentRegistrationRequest {
                agent_id: n.agent.into(),
                agent_ip: "10.0.0.1".into(),
                hostname: n.host.into(),
                tor_id: n.tor.into(),
                rnics: vec![rnic],
                ..Default::default()
            }),
        }
    }
    out
}

/// One window of every path between RNICs of different hosts (ToR mesh within a ToR,
/// inter-ToR across), grouped per reporting agent. Paths to and from an RNIC in `broken`
/// lose every probe; the others are clean (RTT p50 ~10 us, endpoint delays ~5 us).
fn window(nics: &[Nic], start_ns: u64, broken: &[&Nic]) -> Vec<ProbeAnalysisReport> {
    let mut reports: Vec<ProbeAnalysisReport> = Vec::new();
    for s in nics {
        for t in nics {
            if s.host == t.host {
                continue;
            }
            let bad = broken.iter().any(|b| b.gid == s.gid || b.gid == t.gid);
            let (success, failed) = if bad { (0, 60) } else { (60, 0) };
            let rtt = |ns: u64| if bad { 0 } else { ns };
            let summary = PathSummary {
                source_gid: s.gid.clone(),
                source_tor_id: s.tor.into(),
                target_gid: t.gid.clone(),
                target_tor_id: t.tor.into(),
                target_qpn: 7,
                pinglist_type: if s.tor == t.tor {
                    PinglistType::TorMesh as i32
                } else {
                    PinglistType::InterTor as i32
                },
                window_start_unix_ns: start_ns,
                window_duration_ms: 1000,
                probe_total: 60,
                probe_success: success,
                probe_failed: failed,
                network_rtt_min_ns: rtt(9_000),
                network_rtt_max_ns: rtt(12_000),
                network_rtt_p50_ns: rtt(10_000),
                network_rtt_p99_ns: rtt(11_500),
                prober_delay_p50_ns: rtt(5_000),
                prober_delay_p99_ns: rtt(6_000),
                responder_delay_p50_ns: rtt(5_000),
                responder_delay_p99_ns: rtt(6_000),
                ..Default::default()
            };
            match reports.iter_mut().find(|r| r.agent_id == s.agent) {
                Some(r) => r.summaries.push(summary),
                None => reports.push(ProbeAnalysisReport {
                    agent_id: s.agent.into(),
                    summaries: vec![summary],
                    ..Default::default()
                }),
            }
        }
    }
    reports
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A running controller binary; killed (SIGKILL) when dropped.
struct Controller {
    child: Child,
    grpc: String,
    metrics: String,
    /// The controller's stderr lines (JSON logs) as they come.
    log: mpsc::Receiver<String>,
    /// What it logged before it listened.
    boot_log: String,
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(db: &Path, extra: &[&str]) -> Controller {
    let mut child = Command::new(BIN)
        .args([
            "--listen-addr",
            "127.0.0.1:0",
            "--database-uri",
            &format!("sqlite:{}", db.display()),
            "--metrics-exporter",
            "prometheus",
            "--prometheus-listen-addr",
            "127.0.0.1:0",
            "--analyzer-localize-settle-sec",
            "2",
            "--analyzer-open-after-windows",
            "1",
            "--analyzer-resolve-after-windows",
            "1",
        ])
        .args(extra)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .current_dir(db.parent().unwrap())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the controller");
    let (tx, log) = mpsc::channel();
    let err = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let (mut grpc, mut metrics) = (None, None);
    let mut boot_log = String::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while grpc.is_none() || metrics.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = log
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the controller did not come up: {:?}", child.try_wait()));
        boot_log.push_str(&line);
        boot_log.push('\n');
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let addr = v["fields"]["addr"].as_str().map(str::to_string);
        match v["fields"]["message"].as_str() {
            Some("controller listening") => grpc = addr,
            Some("Prometheus /metrics listening") => metrics = addr,
            _ => {}
        }
    }
    Controller {
        child,
        grpc: grpc.unwrap(),
        metrics: metrics.unwrap(),
        log,
        boot_log,
    }
}

impl Controller {
    async fn clients(
        &self,
    ) -> (
        ControllerServiceClient<Channel>,
        OperatorServiceClient<Channel>,
    ) {
        let url = format!("http://{}", self.grpc);
        (
            ControllerServiceClient::connect(url.clone()).await.unwrap(),
            OperatorServiceClient::connect(url).await.unwrap(),
        )
    }

    /// `GET /metrics` (plain text).
    fn scrape(&self) -> String {
        let mut s = std::net::TcpStream::connect(&self.metrics).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    /// Everything logged so far (for failure messages).
    fn drain_log(&self) -> String {
        self.log.try_iter().collect::<Vec<_>>().join("\n")
    }
}

/// Window starts: a little in the past, strictly increasing.
struct Windows(u64);

impl Windows {
    fn next(&mut self) -> u64 {
        let s = (now_ns() - 1_200_000_000).max(self.0 + 1_000_000_000);
        self.0 = s;
        s
    }
}

async fn report(ctl: &mut ControllerServiceClient<Channel>, reports: Vec<ProbeAnalysisReport>) {
    for r in reports {
        let ack = ctl.report_probe_analysis(r).await.unwrap().into_inner();
        assert!(ack.accepted);
    }
}

async fn list(op: &mut OperatorServiceClient<Channel>, kind: &str) -> Vec<Finding> {
    op.list_findings(ListFindingsRequest {
        resolved_limit: 0,
        kind: kind.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .findings
}

/// Polls ListFindings until `ok` holds (settle 2 s + 1 s ticks: a few seconds).
async fn list_until(
    c: &Controller,
    op: &mut OperatorServiceClient<Channel>,
    what: &str,
    ok: impl Fn(&[Finding]) -> bool,
) -> Vec<Finding> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let f = list(op, "").await;
        if ok(&f) {
            return f;
        }
        if Instant::now() > deadline {
            panic!(
                "{what}: ListFindings is {f:#?}\ncontroller log:\n{}",
                c.drain_log()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn next_event(w: &mut Streaming<FindingEvent>, what: &str) -> FindingEvent {
    match tokio::time::timeout(Duration::from_secs(15), w.message()).await {
        Ok(Ok(Some(e))) => e,
        other => panic!("{what}: {other:?}"),
    }
}

/// The store as a second reader sees it (the controller writes after it publishes).
fn stored_until(db: &Path, what: &str, ok: impl Fn(&[Finding]) -> bool) -> Vec<Finding> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let f = SqliteRegistry::open(db).unwrap().load_findings().unwrap();
        if ok(&f) {
            return f;
        }
        assert!(Instant::now() < deadline, "{what}: the store has {f:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The stored baseline (JSON), once the controller has written it.
fn stored_baseline_until(db: &Path) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let st = SqliteRegistry::open(db).unwrap();
        if let Some(v) = st
            .load_state(rpingmesh_controller::service::BASELINE_KEY)
            .unwrap()
        {
            return serde_json::from_slice(&v).expect("a JSON baseline");
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no baseline stored");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The controller's log so far, once it contains `what` (or after 10 s).
fn wait_log(c: &Controller, what: &str) -> String {
    let t0 = Instant::now();
    let mut log = c.boot_log.clone();
    while t0.elapsed() < Duration::from_secs(10) {
        log.push_str(&c.drain_log());
        if log.contains(what) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    log
}

fn gauge(metrics: &str, kind: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| {
            l.starts_with("rpingmesh_analyzer_findings_open{")
                && l.contains(&format!("kind=\"{kind}\""))
                && !l.contains("source_tor")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn summary(f: &[Finding]) -> Vec<(u64, String, String, bool)> {
    f.iter()
        .map(|f| (f.id, f.kind.clone(), f.location.clone(), f.open))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_rnic_is_found_watched_resolved_and_survives_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let db: PathBuf = dir.path().join("controller.db");
    let nics = fabric();
    let (x, y, z) = (&nics[0], &nics[4], &nics[2]);
    let mut windows = Windows(0);

    let c = spawn(&db, &[]);
    let (mut ctl, mut op) = c.clients().await;
    for r in registrations(&nics) {
        ctl.register_agent(r).await.unwrap();
    }
    // Subscribed before anything happens: an empty snapshot, then the changes.
    let mut watch = op
        .watch_findings(WatchFindingsRequest { kind: "".into() })
        .await
        .unwrap()
        .into_inner();
    let mut rnic_watch = op
        .watch_findings(WatchFindingsRequest {
            kind: "rnic".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut link_watch = op
        .watch_findings(WatchFindingsRequest {
            kind: "link".into(),
        })
        .await
        .unwrap()
        .into_inner();

    // Window 1: every path to and from X loses every probe.
    report(&mut ctl, window(&nics, windows.next(), &[x])).await;
    let found = list_until(&c, &mut op, "X's finding", |f| !f.is_empty()).await;
    assert_eq!(
        summary(&found),
        vec![(1, "rnic".into(), x.location(), true)],
        "one finding, at X ({})",
        x.gid
    );
    let f = &found[0];
    assert_eq!(f.symptom, "down");
    assert!(f.confidence > 0.5, "{f:?}");
    assert_eq!((f.resolved_unix_ns, f.opened_unix_ns > 0), (0, true));
    let ev = f.evidence.as_ref().unwrap();
    assert_eq!(ev.paths_total, 2 * 5, "X's paths both ways: {ev:?}");
    assert_eq!(ev.probe_failed, ev.probe_total);
    assert!(!ev.detail.is_empty());

    let e = next_event(&mut watch, "opened").await;
    assert_eq!(e.change, "opened");
    assert_eq!(e.finding.as_ref().unwrap(), f);
    let e = next_event(&mut rnic_watch, "opened (rnic)").await;
    assert_eq!((e.change.as_str(), e.finding.unwrap().id), ("opened", 1));

    // Every kind is a series; the per-path series (source_tor, target_tor) stay.
    let m = c.scrape();
    assert_eq!(gauge(&m, "rnic"), Some(1.0), "{m}");
    for k in ["host", "tor", "link"] {
        assert_eq!(gauge(&m, k), Some(0.0), "{k}: {m}");
    }
    assert!(
        m.lines()
            .any(|l| l.starts_with("rpingmesh_analyzer_findings_open{")
                && l.contains("kind=\"loss\"")
                && l.contains("source_tor=\"tor-a\"")),
        "{m}"
    );

    // Window 2 is clean: with M=1 X's finding resolves.
    report(&mut ctl, window(&nics, windows.next(), &[])).await;
    let e = next_event(&mut watch, "resolved").await;
    let g = e.finding.unwrap();
    assert_eq!((e.change.as_str(), g.id, g.open), ("resolved", 1, false));
    assert!(g.resolved_unix_ns >= g.opened_unix_ns);
    assert_eq!(
        next_event(&mut rnic_watch, "resolved (rnic)").await.change,
        "resolved"
    );

    // Window 3: Y (an RNIC of tor-b's multi-RNIC host) breaks.
    report(&mut ctl, window(&nics, windows.next(), &[y])).await;
    let e = next_event(&mut watch, "Y opened").await;
    let g = e.finding.unwrap();
    assert_eq!(
        (e.change.as_str(), g.id, g.location.as_str()),
        ("opened", 2, y.location().as_str())
    );
    let all = list(&mut op, "").await;
    assert_eq!(
        summary(&all),
        vec![
            (2, "rnic".into(), y.location(), true),
            (1, "rnic".into(), x.location(), false)
        ],
        "open first, then resolved"
    );
    assert!(list(&mut op, "tor").await.is_empty());
    let stored = stored_until(&db, "both stored", |f| {
        f.len() == 2 && f[0].resolved_unix_ns > 0 && f[1].open
    });
    assert_eq!(stored[1], all[0], "the store has what the controller lists");

    // Unknown kinds are refused, naming the known ones.
    let e = op
        .list_findings(ListFindingsRequest {
            resolved_limit: 0,
            kind: "switch".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("\"switch\"") && e.message().contains("rnic, host, tor, link"),
        "{}",
        e.message()
    );
    let e = op
        .watch_findings(WatchFindingsRequest {
            kind: "Rnic".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    // No link finding came: its watch saw nothing.
    assert!(
        tokio::time::timeout(Duration::from_millis(100), link_watch.message())
            .await
            .is_err()
    );

    // The gray detector's learned baseline is in the store by now.
    let learned = stored_baseline_until(&db);
    assert!(learned["windows"].as_u64().unwrap() >= 1, "{learned}");

    // SIGKILL, and a new controller on the same file.
    drop((watch, rnic_watch, link_watch, ctl, op));
    drop(c);
    let c = spawn(&db, &[]);
    let (mut ctl, mut op) = c.clients().await;
    assert_eq!(
        list(&mut op, "").await,
        all,
        "same ids, Y still open, X resolved"
    );
    let mut watch = op
        .watch_findings(WatchFindingsRequest { kind: "".into() })
        .await
        .unwrap()
        .into_inner();
    for want in &all {
        let e = next_event(&mut watch, "snapshot").await;
        assert_eq!(
            (e.change.as_str(), e.finding.as_ref()),
            ("snapshot", Some(want))
        );
    }
    let m = c.scrape();
    assert_eq!(gauge(&m, "rnic"), Some(1.0), "restored open finding: {m}");
    let log = wait_log(&c, "learned baseline restored");
    assert!(
        log.contains("learned baseline restored from the store"),
        "{log}"
    );

    // The restored finding goes on: a window without Y resolves it; Z's gets id 3.
    report(&mut ctl, window(&nics, windows.next(), &[z])).await;
    let mut changes = Vec::new();
    for _ in 0..2 {
        let e = next_event(&mut watch, "after the restart").await;
        let f = e.finding.unwrap();
        changes.push((e.change, f.id, f.location));
    }
    changes.sort();
    assert_eq!(
        changes,
        vec![
            ("opened".into(), 3, z.location()),
            ("resolved".into(), 2, y.location()),
        ]
    );
    stored_until(&db, "three stored", |f| f.len() == 3);

    // A graceful stop does not wait for the open watch: it ends it (UNAVAILABLE).
    let t0 = Instant::now();
    let st = Command::new("kill")
        .args(["-TERM", &c.child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    match tokio::time::timeout(Duration::from_secs(10), watch.message()).await {
        Ok(Err(s)) => assert_eq!(s.code(), Code::Unavailable, "{s:?}"),
        other => panic!("the watch on a stopping controller: {other:?}"),
    }
    let mut c = c;
    let code = loop {
        if let Some(st) = c.child.try_wait().unwrap() {
            break st.code();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the controller did not stop"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, Some(0), "{}", c.drain_log());
}

/// The binary, run to its exit; (status, stderr).
fn run_to_exit(args: &[&str], dir: &Path) -> (Option<i32>, String) {
    let o = Command::new(BIN)
        .args(args)
        .env_clear()
        .current_dir(dir)
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_bad_topology_file_stops_startup_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("topology.yaml");
    std::fs::write(&bad, "spines: [s1]\ntors:\n  tor-a: [s9]\n").unwrap();
    let missing = dir.path().join("nope.yaml");
    let db = format!("sqlite:{}", dir.path().join("c.db").display());
    for (path, why) in [(&bad, "`s9`"), (&missing, "cannot read")] {
        let p = path.display().to_string();
        let (code, err) = run_to_exit(
            &[
                "--listen-addr",
                "127.0.0.1:0",
                "--database-uri",
                &db,
                "--metrics-enabled",
                "false",
                "--analyzer-topology-file",
                &p,
            ],
            dir.path(),
        );
        assert_eq!(code, Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.starts_with("rpingmesh-controller: invalid config key `analyzer_topology_file`")
                && err.contains(&p)
                && err.contains(why),
            "{err}"
        );
    }
    // The same file in YAML config; and a good one starts.
    // (Not named controller.yaml in the working directory: the controller would find it.)
    let cfg = dir.path().join("bad-topology.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listen_addr: \"127.0.0.1:0\"\ndatabase_uri: \"{db}\"\nmetrics_enabled: false\nanalyzer_topology_file: \"{}\"\n",
            bad.display()
        ),
    )
    .unwrap();
    let (code, err) = run_to_exit(&["--config", &cfg.display().to_string()], dir.path());
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("analyzer_topology_file"), "{err}");
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "spines: [s1, s2]\ntors:\n  tor-a: [s1, s2]\n  tor-b: [s1, s2]\necmp: {model: fnv1a, seed: 3}\n",
    )
    .unwrap();
    let c = spawn(
        &dir.path().join("c.db"),
        &["--analyzer-topology-file", &good.display().to_string()],
    );
    assert!(c.grpc.starts_with("127.0.0.1:"));
}
