//! Scenarios service_kprobe and service_uprobe: real RC QPs of a Slurm-shaped job, traced by
//! the agents' kprobes or uprobes, listed by the controller as service paths.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rpingmesh_e2e::vm::*;
use rpingmesh_e2e::*;
use rpingmesh_proto::controller_agent::{PinglistRequest, PinglistType};
use rpingmesh_proto::operator::{ListServicePathsRequest, ServicePath};
use serde_json::{json, Value};

use crate::bridge_net::*;
use crate::harness::*;

pub(crate) async fn service_paths(endpoint: &str) -> Vec<ServicePath> {
    let Ok(mut op) = operator(endpoint).await else {
        return Vec::new();
    };
    op.list_service_paths(ListServicePathsRequest::default())
        .await
        .map(|r| r.into_inner().paths)
        .unwrap_or_default()
}

/// Samples the controller's service paths every 100 ms until `done(paths)` or `timeout`;
/// returns the matching sample and when it was taken.
pub(crate) async fn watch_paths(
    endpoint: &str,
    timeout: Duration,
    done: impl Fn(&[ServicePath]) -> bool,
) -> Option<(u64, Vec<ServicePath>)> {
    wait_for(timeout, Duration::from_millis(100), || async {
        let p = service_paths(endpoint).await;
        done(&p).then(|| (unix_ns_now(), p))
    })
    .await
}

/// Paths carrying a QP of one of `pids`.
pub(crate) fn of_service<'a>(paths: &'a [ServicePath], pids: &[u32]) -> Vec<&'a ServicePath> {
    paths
        .iter()
        .filter(|p| p.qps.iter().any(|q| pids.contains(&q.pid)))
        .collect()
}

/// The SERVICE pinglist the controller hands `agent` for `gid` right now.
pub(crate) async fn service_pinglist(endpoint: &str, agent: &str, tor: &str, gid: &str) -> Value {
    let Ok(mut c) = controller_client(endpoint).await else {
        return Value::Null;
    };
    match c
        .get_pinglist(PinglistRequest {
            agent_id: agent.into(),
            tor_id: tor.into(),
            requester_gid: gid.into(),
            r#type: PinglistType::Service as i32,
        })
        .await
    {
        Ok(r) => json!(r
            .into_inner()
            .targets
            .iter()
            .map(
                |t| json!({"target_gid": t.target_gid, "flow_label": t.flow_label,
                             "flow_label_count": t.flow_label_count, "service": t.service})
            )
            .collect::<Vec<_>>()),
        Err(e) => json!({ "error": e.message() }),
    }
}

/// One service program's life, as the controller shows it: learned, probed, gone.
pub(crate) struct ServiceRun<'a> {
    endpoint: &'a str,
    comm: &'static str,
    /// The program's processes (the owners of its QPs).
    pids: Vec<u32>,
    /// Service paths expected (one per QP side).
    paths: usize,
}

impl<'a> ServiceRun<'a> {
    fn paths_json(&self, paths: &[ServicePath]) -> Value {
        json!(of_service(paths, &self.pids)
            .into_iter()
            .map(service_path_json)
            .collect::<Vec<_>>())
    }

    /// Waits (up to `timeout`) for the listing, then takes the ground truth and waits for
    /// successful SERVICE probes on every path; returns the observations.
    async fn observe(&self, started_unix_ns: u64, timeout: Duration) -> Value {
        let mut v =
            json!({ "started_unix_ns": started_unix_ns, "comm": self.comm, "pids": self.pids });
        let want = self.paths;
        let pids = &self.pids;
        let listed = watch_paths(self.endpoint, timeout, |p| {
            let ps = of_service(p, pids);
            ps.len() >= want && ps.iter().all(|p| p.monitored)
        })
        .await;
        let Some((at, paths)) = listed else {
            v["error"] = json!(format!(
                "{want} service paths of {} not listed within {timeout:?}; last: {}",
                self.comm,
                json!(service_paths(self.endpoint)
                    .await
                    .iter()
                    .map(service_path_json)
                    .collect::<Vec<_>>())
            ));
            return v;
        };
        v["listed_unix_ns"] = json!(at);
        v["paths"] = self.paths_json(&paths);
        v["res_qp"] = res_qp();
        let probed = watch_paths(self.endpoint, Duration::from_secs(60), |p| {
            let ps = of_service(p, pids);
            ps.len() >= want
                && ps.iter().all(|p| {
                    p.latest
                        .as_ref()
                        .is_some_and(|s| s.probe_total > 0 && s.probe_success > 0)
                })
        })
        .await;
        match probed {
            Some((at, paths)) => {
                v["probed_unix_ns"] = json!(at);
                v["probed_paths"] = self.paths_json(&paths);
            }
            None => {
                v["probe_error"] = json!("SERVICE probes of every path did not succeed within 60 s")
            }
        }
        v
    }

    /// After the QPs went away at `ended_unix_ns`: when the paths disappeared.
    async fn gone(&self, v: &mut Value, ended_unix_ns: u64) {
        v["ended_unix_ns"] = json!(ended_unix_ns);
        let pids = &self.pids;
        match watch_paths(self.endpoint, Duration::from_secs(30), |p| {
            of_service(p, pids).is_empty()
        })
        .await
        {
            Some((at, _)) => v["gone_unix_ns"] = json!(at),
            None => v["gone_error"] = json!("paths still listed 30 s after the QPs went away"),
        }
    }

    /// A server and its client (two service paths) from start to end: observed, then
    /// killed with -9 and watched go.
    async fn pair_lifetime(
        endpoint: &'a str,
        comm: &'static str,
        started_unix_ns: u64,
        wait: Duration,
        (server, client): (&mut Proc, &mut Proc),
    ) -> Value {
        let run = ServiceRun {
            endpoint,
            comm,
            pids: vec![server.pid(), client.pid()],
            paths: 2,
        };
        let mut r = run.observe(started_unix_ns, wait).await;
        run.kill(&mut r, &mut [server, client]).await;
        r
    }

    /// Kills `procs` with -9 and records when their paths disappeared.
    async fn kill(&self, v: &mut Value, procs: &mut [&mut Proc]) {
        let ended = unix_ns_now();
        for p in procs.iter_mut() {
            p.signal(libc::SIGKILL);
        }
        for p in procs.iter_mut() {
            p.wait_exit(Duration::from_secs(5));
        }
        self.gone(v, ended).await;
        v["stderr"] = json!(procs
            .iter()
            .map(|p| tail_lines(&p.stderr(), 5))
            .collect::<Vec<_>>());
    }
}

/// The Slurm job the guest's ibv_rc_pingpong pair runs in (kprobe and uprobe modes).
pub(crate) const SLURM_JOB: u32 = 4343;

/// A Slurm-shaped cgroup (job `job`, step 0, task 0) under the guest's unified hierarchy,
/// mounted at /sys/fs/cgroup first when the guest has none: its directory.
pub(crate) fn slurm_cgroup(job: u32) -> Result<PathBuf> {
    let mounted = |mi: &str| {
        mi.lines().find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            post.starts_with("cgroup2 ")
                .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
        })
    };
    let root = match mounted(&std::fs::read_to_string("/proc/self/mountinfo")?) {
        Some(r) => r,
        None => {
            sh(&["mount", "-t", "cgroup2", "none", "/sys/fs/cgroup"])?;
            PathBuf::from("/sys/fs/cgroup")
        }
    };
    let dir = root.join(format!(
        "rpm-vm/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0"
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
    Ok(dir)
}

/// An `ibv_rc_pingpong` pair between the two service devices (server on the first),
/// running until killed, each side started inside `cgroup` when given; its QPN exchange
/// goes over TCP on loopback, its RC QPs between the two GIDs.
pub(crate) fn rc_pingpong_pair(
    dir: &Path,
    tag: &str,
    port: u16,
    gid_idx: [u32; 2],
    cgroup: Option<&Path>,
) -> Result<(Proc, Proc)> {
    let (port_s, iters) = (port.to_string(), "100000000");
    let spawn = |name: String, args: Vec<String>| match cgroup {
        // The shell joins the cgroup, then becomes the program (same pid).
        Some(cg) => {
            let mut a = vec![
                "-c".to_string(),
                "echo $$ > \"$0/cgroup.procs\" && exec \"$@\"".to_string(),
                cg.display().to_string(),
                "ibv_rc_pingpong".to_string(),
            ];
            a.extend(args);
            Proc::spawn(dir, &name, None, Path::new("sh"), &a)
        }
        None => Proc::spawn(dir, &name, None, Path::new("ibv_rc_pingpong"), &args),
    };
    // Side `i` (0 the server, 1 the client) on its own device.
    let side = |i: usize, who: &str, more: &[&str]| {
        let mut args: Vec<String> = [
            "-d",
            SVC_DEVICES[i],
            "-g",
            &gid_idx[i].to_string(),
            "-p",
            &port_s,
            "-n",
            iters,
        ]
        .map(String::from)
        .to_vec();
        args.extend(more.iter().map(|m| m.to_string()));
        spawn(format!("{tag}-{who}"), args)
    };
    let server = side(0, "server", &[])?;
    wait_listening(port, Duration::from_secs(20))?;
    let client = side(1, "client", &["127.0.0.1"])?;
    Ok((server, client))
}

/// A process driven line by line on stdin/stdout (rdma-qp-churn); killed on drop.
pub(crate) struct Driven {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
}

impl Driven {
    pub(crate) fn spawn(program: &Path, args: &[String], stderr: &Path) -> Result<Driven> {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(stderr)?);
        die_with_parent(&mut cmd);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("spawning {}", program.display()))?;
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().expect("piped"));
        Ok(Driven { child, stdin, out })
    }

    /// rdma-qp-churn between the two service devices (GID indexes `gid_idx`): `churn`
    /// pairs created and destroyed, then `pairs` held; `more` flags after those.
    pub(crate) fn qp_churn(
        dir: &Path,
        gid_idx: [u32; 2],
        churn: u32,
        pairs: u32,
        more: &[String],
    ) -> Result<Driven> {
        let mut args: Vec<String> = [
            "--dev-a",
            SVC_DEVICES[0],
            "--gid-a",
            &gid_idx[0].to_string(),
            "--dev-b",
            SVC_DEVICES[1],
            "--gid-b",
            &gid_idx[1].to_string(),
            "--churn",
            &churn.to_string(),
            "--pairs",
            &pairs.to_string(),
        ]
        .map(String::from)
        .to_vec();
        args.extend_from_slice(more);
        Driven::spawn(&bin("rdma-qp-churn"), &args, &dir.join("qp-churn.stderr"))
    }

    pub(crate) fn line(&mut self, prefix: &str) -> Result<Vec<String>> {
        let mut l = String::new();
        self.out.read_line(&mut l)?;
        if !l.starts_with(prefix) {
            bail!("expected a {prefix:?} line, got {l:?}");
        }
        Ok(l.split_whitespace().skip(1).map(String::from).collect())
    }

    pub(crate) fn say(&mut self, s: &str) -> Result<()> {
        let w = self.stdin.as_mut().context("stdin closed")?;
        writeln!(w, "{s}")?;
        w.flush()?;
        Ok(())
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Service tracing with agents in `mode` (auto = kprobes on this kernel, or uprobe) against
/// real libibverbs programs: an ibv_rc_pingpong pair connected before the agents start,
/// then ibv_rc_pingpong and rping (RDMA-CM) ended with -9, and rdma-qp-churn (hundreds of
/// QPs created and destroyed, then held pairs destroyed cleanly).
pub(crate) async fn service_tracing(dir: &Path, mode: &str) -> Result<Value> {
    svc_network()?;
    let gid_idx = [svc_gid_index(0), svc_gid_index(1)];
    let gids = [v4_gid(SVC_IPS[0]), v4_gid(SVC_IPS[1])];
    // A service connected before any agent runs (an agent restarted under a running job).
    let (mut pre_server, mut pre_client) = rc_pingpong_pair(dir, "pre", 18650, gid_idx, None)?;
    wait_for(
        Duration::from_secs(30),
        Duration::from_millis(100),
        || async {
            let pids = [pre_server.pid(), pre_client.pid()];
            let t = res_qp();
            let n = t.as_array().map_or(0, |a| {
                a.iter()
                    .filter(|q| {
                        q["state"] == "RTS"
                            && q["pid"]
                                .as_u64()
                                .is_some_and(|p| pids.contains(&(p as u32)))
                    })
                    .count()
            });
            (n >= 2).then_some(())
        },
    )
    .await
    .context("the pre-existing ibv_rc_pingpong pair never reached RTS")?;

    let ctl = guest_controller(dir, "controller")?;
    let ep = ctl.endpoint();
    let extra = [
        ("--service-tracing-mode", mode.to_string()),
        (
            "--service-flow-report-interval-ms",
            REPORT_INTERVAL_MS.to_string(),
        ),
        ("--analysis-window-sec", "2".into()),
        ("--pinglist-update-interval-sec", "5".into()),
        // RC ring probing of the SERVICE targets (on by default): TCG sleeps overshoot by
        // milliseconds, so the polling windows are wider than on a real host.
        ("--rc-ring-poll-lead-us", "20000".into()),
        ("--rc-ring-hot-wait-us", "50000".into()),
        // The services run for seconds each: probe their rings four times a second.
        ("--rc-ring-probe-interval-ms", "250".into()),
        ("--rc-ring-probe-timeout-ms", "250".into()),
    ];
    let agent_ids = ["svc-a", "svc-b"];
    let mut agents = Vec::new();
    for i in 0..2 {
        agents.push(rdma_agent(
            dir,
            agent_ids[i],
            SVC_TORS[i],
            &ctl,
            SVC_DEVICES[i],
            gid_idx[i],
            &extra,
        )?);
    }
    wait_rnics(&ep, 2, Duration::from_secs(60)).await?;
    // Tracing must be on before the scenario's services start (loading the programs
    // takes seconds under TCG).
    let mut tracing = Vec::new();
    for a in &agents {
        let line = wait_for(
            Duration::from_secs(90),
            Duration::from_millis(200),
            || async {
                let log = a.stderr();
                log_line(&log, "service tracing on").or_else(|| {
                    log.lines()
                        .find(|l| l.contains("service tracing off"))
                        .map(|l| json!({ "off": l }))
                })
            },
        )
        .await
        .with_context(|| format!("{}: no service tracing line within 90 s", a.name))?;
        tracing.push(line);
    }
    let mut v = json!({
        "mode_requested": mode,
        "tracing": tracing,
        "gids": gids,
        "report_interval_ms": REPORT_INTERVAL_MS,
    });
    if tracing.iter().any(|t| t.get("off").is_some()) {
        bail!("service tracing is off in an agent: {tracing:?}");
    }

    // 0. The pre-existing pair: learned from the kernel's answers when the agent asks it
    //    about its QPs (kprobe mode); libibverbs uprobes cannot see it before it reconnects.
    {
        let wait = Duration::from_secs(if mode == "uprobe" { 5 } else { 30 });
        let pair = (&mut pre_server, &mut pre_client);
        let r = ServiceRun::pair_lifetime(&ep, "ibv_rc_pingpong", unix_ns_now(), wait, pair).await;
        v["preexisting"] = r;
    }

    // 1. ibv_rc_pingpong between the two devices, as a step of a Slurm job (a
    //    Slurm-shaped cgroup), killed with -9.
    {
        let started = unix_ns_now();
        let cg = slurm_cgroup(SLURM_JOB)?;
        v["slurm_job"] = json!(SLURM_JOB);
        let (mut server, mut client) = rc_pingpong_pair(dir, "rc", 18600, gid_idx, Some(&cg))?;
        let pair = (&mut server, &mut client);
        v["rc_pingpong"] = ServiceRun::pair_lifetime(
            &ep,
            "ibv_rc_pingpong",
            started,
            Duration::from_secs(60),
            pair,
        )
        .await;
    }

    // 2. rping (RDMA-CM: librdmacm creates and connects the QPs), killed with -9.
    {
        let started = unix_ns_now();
        let (server_ip, client_ip) = (SVC_IPS[0].to_string(), SVC_IPS[1].to_string());
        let mut server = Proc::spawn(
            dir,
            "rping-server",
            None,
            Path::new("rping"),
            &["-s", "-a", &server_ip, "-p", "18700", "-C", "100000000"].map(String::from),
        )?;
        wait_cm_listening(18700, Duration::from_secs(20))?;
        let mut client = Proc::spawn(
            dir,
            "rping-client",
            None,
            Path::new("rping"),
            &[
                "-c",
                "-a",
                &server_ip,
                "-I",
                &client_ip,
                "-p",
                "18700",
                "-C",
                "100000000",
            ]
            .map(String::from),
        )?;
        let pair = (&mut server, &mut client);
        v["rping"] =
            ServiceRun::pair_lifetime(&ep, "rping", started, Duration::from_secs(60), pair).await;
    }

    // 3. rdma-qp-churn: CHURN_CYCLES connected pairs created and destroyed, then
    //    CHURN_PAIRS held pairs on known flow labels, destroyed cleanly on request.
    {
        let started = unix_ns_now();
        let mut p = Driven::qp_churn(
            dir,
            gid_idx,
            CHURN_CYCLES,
            CHURN_PAIRS,
            &["--flow-label".into(), CHURN_FLOW_LABEL.to_string()],
        )?;
        let pid: u32 = p.line("ready")?[0].parse()?;
        let churned = p.line("churned")?;
        let mut pairs = Vec::new();
        for _ in 0..CHURN_PAIRS {
            let f = p.line("pair")?;
            pairs.push(
                json!({"qpn_a": f[0].parse::<u32>()?, "qpn_b": f[1].parse::<u32>()?,
                              "flow_label": f[2].parse::<u32>()?,
                              "rtr_unix_ns": [f[3].parse::<u64>()?, f[4].parse::<u64>()?]}),
            );
        }
        let run = ServiceRun {
            endpoint: &ep,
            comm: "rdma-qp-churn",
            pids: vec![pid],
            paths: 2 * CHURN_PAIRS as usize,
        };
        let mut r = run.observe(started, Duration::from_secs(60)).await;
        r["churned"] =
            json!({"cycles": churned[0].parse::<u32>()?, "ms": churned[1].parse::<u64>()?});
        r["pairs"] = json!(pairs);
        r["pinglist_a"] = service_pinglist(&ep, agent_ids[0], SVC_TORS[0], &gids[0]).await;
        p.say("destroy")?;
        let ended: u64 = p.line("destroyed")?[0].parse()?;
        run.gone(&mut r, ended).await;
        let _ = p.say("exit");
        v["qp_churn"] = r;
    }

    // 4. What the agents' RC rings measured on the SERVICE paths over the whole run.
    v["rc_ring"] = rc_ring_windows(&ep).await;

    Proc::stop_all(&mut agents);
    v["agent_logs"] = json!(agents
        .iter()
        .map(|a| {
            let log = a.stderr();
            let notable: Vec<&str> = log
                .lines()
                .filter(|l| {
                    l.contains("\"level\":\"ERROR\"")
                        || l.contains("\"level\":\"WARN\"")
                        || l.contains("existing QPs")
                        || l.contains("before tracing began")
                        || l.contains("rc ring")
                })
                .take(20)
                .collect();
            (a.name.clone(), json!(notable))
        })
        .collect::<BTreeMap<_, _>>());
    Ok(v)
}

/// Every retained path window that carries RC ring stats.
pub(crate) async fn rc_ring_windows(endpoint: &str) -> Value {
    let windows = match operator(endpoint).await {
        Ok(mut op) => all_windows(&mut op).await,
        Err(e) => Err(e),
    };
    let windows = match windows {
        Ok(w) => w,
        Err(e) => return json!({ "error": format!("{e:#}") }),
    };
    json!({ "windows": windows
        .iter()
        .filter_map(|s| {
            let r = s.rc_ring?;
            Some(json!({
                "source": s.source_gid, "target": s.target_gid, "type": s.pinglist_type,
                "service": s.service, "start": s.window_start_unix_ns,
                "dur_ms": s.window_duration_ms, "ud_total": s.probe_total,
                "total": r.probe_total, "lost": r.probe_lost, "late": r.probe_late,
                "min_ns": r.network_rtt_min_ns, "p50_ns": r.network_rtt_p50_ns,
                "responder_p50_ns": r.responder_delay_p50_ns,
            }))
        })
        .collect::<Vec<_>>() })
}
