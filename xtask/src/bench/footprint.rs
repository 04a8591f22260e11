//! The agent footprint bench: CPU and RSS of one agent probing 64 targets at 10/s each
//! over udp, with the probes it really sent, and in the same run the CPU of probe-floor
//! sending the same datagrams through the same transport with no agent around them (what
//! the kernel charges for the traffic itself: the agent's part is the ratio).

use super::*;

/// How long after its start the measured agent is sampled: start-up is over (it releases
/// start-up's pages after 10 s), so the RSS read is the one it keeps.
const STARTUP: Duration = Duration::from_secs(20);

#[derive(Debug, Clone)]
pub struct Footprint {
    pub(super) cpu_pct: f64,
    pub(super) rss_mib: f64,
    pub(super) probes_per_sec: f64,
    pub(super) targets_probed: usize,
    pub(super) sleep_rss_mib: f64,
    /// probe-floor's CPU over the same responder, right after the agent's sample.
    pub(super) floor_cpu_pct: f64,
}

/// CPU (% of one core) of `pid` over `SAMPLE`, and its VmRSS (KiB) sampled each second.
fn sample_cpu(pid: u32) -> Result<(f64, Vec<u64>)> {
    let t0 = Instant::now();
    let c0 = cpu_ticks(pid)?;
    let mut rss = Vec::new();
    while t0.elapsed() < SAMPLE {
        std::thread::sleep(Duration::from_secs(1));
        rss.push(rss_kib(pid)?);
    }
    let c1 = cpu_ticks(pid)?;
    let hz = procfs::ticks_per_second() as f64;
    Ok((
        (c1 - c0) as f64 / hz / t0.elapsed().as_secs_f64() * 100.0,
        rss,
    ))
}

/// The last `floor sent=N acks=M` line probe-floor printed.
pub(super) fn floor_counts(log: &str) -> Option<(u64, u64)> {
    let l = log.lines().rev().find(|l| l.starts_with("floor sent="))?;
    let mut it = l
        .split_whitespace()
        .skip(1)
        .map(|kv| kv.split_once('=').map(|(_, v)| v));
    let sent = it.next()??.parse().ok()?;
    let acks = it.next()??.parse().ok()?;
    Some((sent, acks))
}

/// probe-floor in place of the measured agent (same address, same targets, same round):
/// its CPU over `SAMPLE`, checked to have had every probe answered by both ACKs.
fn floor_run(dir: &Path, responders: &[String], all: &mut Vec<Proc>) -> Result<f64> {
    let mut args = vec!["127.0.3.1:18515".to_string(), "100".to_string()];
    args.extend(responders.iter().map(|a| format!("{a}:18515")));
    all.push(Proc::spawn(
        dir,
        "probe-floor",
        None,
        &procs::release_bin("probe-floor")?,
        &args,
    )?);
    let i = all.len() - 1;
    std::thread::sleep(Duration::from_secs(3));
    check_alive(all)?;
    let before = floor_counts(&all[i].stderr()).with_context(|| {
        format!(
            "probe-floor printed no counts:\n{}",
            procs::log_tail(&all[i], 10)
        )
    })?;
    let (cpu, _) = sample_cpu(all[i].pid())?;
    check_alive(all)?;
    let after = floor_counts(&all[i].stderr()).context("probe-floor stopped counting")?;
    let (sent, acks) = (after.0 - before.0, after.1 - before.1);
    if sent == 0 || (acks as f64) < 1.9 * sent as f64 {
        bail!("probe-floor: {acks} ACKs for {sent} probes (two per probe expected)");
    }
    all[i].stop();
    Ok(cpu)
}

/// utime + stime of a process, in clock ticks.
pub(super) fn cpu_ticks(pid: u32) -> Result<u64> {
    let st = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .with_context(|| format!("/proc/{pid}/stat"))?;
    Ok(st.utime + st.stime)
}

/// VmRSS in KiB.
pub(super) fn rss_kib(pid: u32) -> Result<u64> {
    let st = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.status())
        .with_context(|| format!("/proc/{pid}/status"))?;
    st.vmrss.context("no VmRSS in /proc/<pid>/status")
}

pub(super) fn footprint_run() -> Result<Footprint> {
    let controller_bin = procs::release_bin("rpingmesh-controller")?;
    let agent_bin = procs::release_bin("rpingmesh-agent")?;
    let tmp = tempfile::Builder::new()
        .prefix("rpingmesh-bench-")
        .tempdir()?;
    let dir = tmp.path();
    let mut all: Vec<Proc> = Vec::new();
    all.push(Proc::spawn(
        dir,
        "controller",
        None,
        &controller_bin,
        &[
            "--listen-addr",
            "127.0.0.1:0",
            "--database-uri",
            "sqlite::memory:",
            "--metrics-enabled",
            "false",
            "--log-level",
            "info",
        ]
        .map(String::from),
    )?);
    let addr = procs::wait_listening(&mut all[0], Duration::from_secs(20))?;
    let caddr = addr.to_string();
    let responders: Vec<String> = (1..=TARGETS)
        .map(|i| Ipv4Addr::new(127, 0, 2, i as u8).to_string())
        .collect();
    let mut resp_args: Vec<String> = [
        "--agent-id",
        "responder",
        "--tor-id",
        "t1",
        "--controller-addr",
        &caddr,
        "--udp-port",
        "18515",
        "--transport",
        "udp",
        "--metrics-enabled",
        "false",
        "--log-level",
        "warn",
        "--responder-only",
        "true",
    ]
    .map(String::from)
    .to_vec();
    resp_args.push("--udp-addresses".into());
    resp_args.push(responders.join(","));
    all.push(Proc::spawn(dir, "responder", None, &agent_bin, &resp_args)?);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let res = (|| -> Result<Footprint> {
        let mut op = rt.block_on(procs::operator(addr))?;
        rt.block_on(wait_count(
            TARGETS,
            Duration::from_secs(30),
            Duration::from_millis(300),
            &mut all,
            "responder RNICs registered",
            async || registered_rnics(&mut op).await,
        ))?;
        let measured_args = [
            "--agent-id",
            "measured",
            "--tor-id",
            "t1",
            "--controller-addr",
            &caddr,
            "--udp-addresses",
            "127.0.3.1",
            "--udp-port",
            "18515",
            "--transport",
            "udp",
            "--tor-mesh-probe-rate-per-second",
            "10",
            "--probe-interval-ms",
            "100",
            "--analysis-window-sec",
            "5",
            "--metrics-enabled",
            "false",
            "--log-level",
            "warn",
        ]
        .map(String::from);
        let spawned = Instant::now();
        all.push(Proc::spawn(
            dir,
            "measured",
            None,
            &agent_bin,
            &measured_args,
        )?);
        let pid = all[2].pid();
        // Warm-up: until the measured agent reports successful paths to every target.
        rt.block_on(wait_count(
            TARGETS,
            Duration::from_secs(45),
            Duration::from_millis(500),
            &mut all,
            "targets reached by the measured agent",
            async || reached_targets(&mut op).await,
        ))?;
        std::thread::sleep(Duration::from_secs(2));
        // Start-up over: the agent releases start-up's pages after its first 10 s, and
        // what it still runs has faulted back in by then.
        std::thread::sleep(STARTUP.saturating_sub(spawned.elapsed()));

        let mut sleeper = Command::new("sleep")
            .arg("120")
            .stdin(Stdio::null())
            .spawn()
            .context("starting the `sleep` baseline")?;
        let start_unix = unix_ns();
        let (cpu_pct, rss) = sample_cpu(pid)?;
        let sleep_rss = rss_kib(sleeper.id()).unwrap_or(0);
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        let rss_max = rss.iter().copied().max().unwrap_or(0);
        let (rate, targets) = rt.block_on(probe_rate(addr, start_unix))?;
        for p in all.iter_mut() {
            if let Some(st) = p.poll_exit() {
                bail!(
                    "{} exited ({st}) during the bench:\n{}",
                    p.name,
                    procs::log_tail(p, 20)
                );
            }
        }
        // The floor takes the measured agent's address: the agent goes first.
        all.remove(2).stop();
        let floor_cpu_pct = floor_run(dir, &responders, &mut all)?;
        let f = Footprint {
            cpu_pct,
            rss_mib: rss_max as f64 / 1024.0,
            probes_per_sec: rate,
            targets_probed: targets,
            sleep_rss_mib: sleep_rss as f64 / 1024.0,
            floor_cpu_pct,
        };
        eprintln!("  {f:?}");
        Ok(f)
    })();
    procs::stop_all(&mut all);
    res
}

pub(super) fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub(super) fn check_alive(all: &mut [Proc]) -> Result<()> {
    for p in all.iter_mut() {
        if let Some(st) = p.poll_exit() {
            bail!("{} exited ({st}):\n{}", p.name, procs::log_tail(p, 20));
        }
    }
    Ok(())
}

/// Polls `count` every `period` until it reaches `n`; fails when one of `all` exits or at
/// `timeout` (`what` names the count in the error).
async fn wait_count(
    n: usize,
    timeout: Duration,
    period: Duration,
    all: &mut [Proc],
    what: &str,
    mut count: impl AsyncFnMut() -> usize,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        check_alive(all)?;
        let got = count().await;
        if got >= n {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("only {got} of {n} {what} within {timeout:?}");
        }
        tokio::time::sleep(period).await;
    }
}

type Operator = rpingmesh_proto::operator::operator_service_client::OperatorServiceClient<
    tonic::transport::Channel,
>;

/// RNICs the controller has registered (0 while it does not answer).
async fn registered_rnics(op: &mut Operator) -> usize {
    op.list_rnics(ListRnicsRequest::default())
        .await
        .map(|r| r.into_inner().rnics.len())
        .unwrap_or(0)
}

pub(super) const MEASURED_GID: &str = "0000:0000:0000:0000:0000:ffff:7f00:0301"; // 127.0.3.1

/// Targets the measured agent has reached (0 while the controller does not answer).
async fn reached_targets(op: &mut Operator) -> usize {
    op.list_paths(ListPathsRequest {
        source_gid: MEASURED_GID.into(),
        ..Default::default()
    })
    .await
    .map(|r| {
        r.into_inner()
            .paths
            .iter()
            .filter(|p| p.probe_success > 0)
            .count()
    })
    .unwrap_or(0)
}

/// Achieved probe rate (all targets) and number of targets probed, from the windows that
/// started during sampling.
pub(super) async fn probe_rate(addr: SocketAddr, since_ns: u64) -> Result<(f64, usize)> {
    let mut op = procs::operator(addr).await?;
    let paths = op
        .list_paths(ListPathsRequest {
            source_gid: MEASURED_GID.into(),
            all_windows: true,
            ..Default::default()
        })
        .await?
        .into_inner()
        .paths;
    let mut per_target: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut windows = std::collections::BTreeSet::new();
    for p in paths.iter().filter(|p| p.window_start_unix_ns >= since_ns) {
        if !windows.insert((p.target_gid.clone(), p.window_start_unix_ns)) {
            continue;
        }
        let e = per_target.entry(p.target_gid.clone()).or_default();
        e.0 += p.probe_total as u64;
        e.1 += p.window_duration_ms as u64;
    }
    let rate = per_target
        .values()
        .filter(|(_, ms)| *ms > 0)
        .map(|(n, ms)| *n as f64 / (*ms as f64 / 1000.0))
        .sum();
    Ok((rate, per_target.len()))
}

pub(super) fn median_f(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
