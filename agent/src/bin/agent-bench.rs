//! agent-bench: probe round trips/s of the agent's real per-RNIC driver against a minimal
//! timestamped UDP ping-pong, both over the same `udp` transport on 127.0.0.1, each on a
//! current-thread runtime. One JSON object per line on stdout; about 18 s in total.
//!
//! Usage: agent-bench [--seconds-per-run S] [--runs N] [--only baseline|agent]
//!        [--rdma DEV:GID_INDEX,DEV:GID_INDEX]
//! (`--only` runs one side alone, for profiling it with perf or strace. `--rdma` runs
//! the agent's drivers over the rdma transport between the two GIDs instead, with no
//! baseline: on an RDMA host or in the soft-RoCE VM, where `ibv_ud_pingpong` between the
//! same GIDs is the reference; one JSON line per run.)

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use rpingmesh_agent::rnic::{DriverParams, RnicDriver, StaticDriver};
use rpingmesh_agent::targets::{Pinglists, ProbeTarget};
use rpingmesh_agent::telemetry::Metrics;
use rpingmesh_protocol::wire::ProbePacket;
use rpingmesh_protocol::PinglistKind;
use rpingmesh_verbs::clock::monotonic_ns;
use rpingmesh_verbs::udp::UdpEndpoint;
use rpingmesh_verbs::{SendParams, Transport, TransportEvent};
use serde_json::json;

fn bind() -> UdpEndpoint {
    UdpEndpoint::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), "bench").expect("bind 127.0.0.1")
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Baseline: one datagram in flight between two endpoints; the echo side answers each
/// datagram at once; the timestamps (kernel TX/RX, T1 in the payload) are read but unused.
fn pingpong(dur: Duration) -> f64 {
    rt().block_on(async move {
        let a = bind();
        let b = bind();
        let a_ep = a.local();
        let b_ep = b.local();
        let params = SendParams::default();
        let echo = tokio::spawn(async move {
            let mut ev = Vec::with_capacity(64);
            loop {
                if b.wait_events(&mut ev).await.is_err() {
                    return;
                }
                for e in ev.drain(..) {
                    if let TransportEvent::Received {
                        from, len, data, ..
                    } = e
                    {
                        let _ = b.send(&from, &params, &data[..len.min(64)]);
                    }
                }
            }
        });
        let mut ev = Vec::with_capacity(64);
        let mut rtt_sum = 0u64;
        let mut done = 0u64;
        let start = Instant::now();
        let mut seq = 0u64;
        a.send(
            &b_ep,
            &params,
            &ProbePacket::probe(seq, monotonic_ns()).encode(),
        )
        .expect("send");
        while start.elapsed() < dur {
            if a.wait_events(&mut ev).await.is_err() {
                break;
            }
            for e in ev.drain(..) {
                if let TransportEvent::Received {
                    len,
                    data,
                    rx_ts_ns,
                    ..
                } = e
                {
                    if let Ok(p) = ProbePacket::decode(&data[..len.min(64)]) {
                        rtt_sum = rtt_sum.wrapping_add(monotonic_ns().saturating_sub(p.t1));
                        let _ = rx_ts_ns;
                        done += 1;
                        seq += 1;
                        a.send(
                            &b_ep,
                            &params,
                            &ProbePacket::probe(seq, monotonic_ns()).encode(),
                        )
                        .expect("send");
                    }
                }
            }
        }
        let secs = start.elapsed().as_secs_f64();
        echo.abort();
        let _ = (a_ep, rtt_sum);
        done as f64 / secs
    })
}

/// The two endpoints the agent drivers run on.
#[derive(Clone)]
enum Link {
    Udp,
    /// (device, GID index) of each side.
    Rdma([(String, u32); 2]),
}

impl Link {
    fn open(&self, side: usize) -> Transport {
        match self {
            Link::Udp => bind().into(),
            Link::Rdma(sides) => {
                let (dev, gid) = &sides[side];
                let mut o = rpingmesh_verbs::rdma::RdmaOptions::new(dev);
                o.gid_index = *gid;
                match rpingmesh_verbs::rdma::open_rdma_with(&o) {
                    Ok(ep) => ep.into(),
                    Err(e) => {
                        eprintln!("agent-bench: {e}");
                        std::process::exit(1);
                    }
                }
            }
        }
    }
}

/// The agent: driver A probes driver B (B answers), one target, the limiter far above
/// what the protocol can do; `in_flight` probes may be outstanding at once.
fn agent(dur: Duration, in_flight: usize) -> (f64, u64) {
    agent_on(&Link::Udp, dur, in_flight)
}

fn agent_on(link: &Link, dur: Duration, in_flight: usize) -> (f64, u64) {
    rt().block_on(async move {
        let params = |tor: &str| DriverParams {
            focus_rate: 0.0,
            source_tor: tor.into(),
            round_interval_ns: 1_000,
            tor_mesh_rate: 1e9,
            inter_tor_rate: 1e9,
            service_rate: 1e9,
            host_rate: 0.0,
            host_round_ns: 1_000_000_000,
            probe_timeout_ns: 1_000_000_000,
            max_in_flight: in_flight,
            flow_label_rotation_period_sec: 3600,
            service_level: 0,
            traffic_class: 0,
            analysis_window_ns: Some(30_000_000_000),
            responder_only: false,
            seq_epoch: rand::random(),
            service_names: Default::default(),
            rate_multiplier: None,
        };
        let a = RnicDriver::new(link.open(0), params("tor-a"), Metrics::disabled());
        let b = RnicDriver::new(link.open(1), params("tor-b"), Metrics::disabled());
        let target = ProbeTarget::new(b.local().gid, b.local().qpn, "tor-b", PinglistKind::TorMesh);
        let (hb, tb) = StaticDriver::spawn(b, Pinglists::default(), None, None);
        let (ha, ta) = StaticDriver::spawn(
            a,
            Pinglists {
                focus: Vec::new(),
                tor_mesh: vec![target],
                inter_tor: vec![],
                service: vec![],
                host: vec![],
            },
            None,
            None,
        );
        // Warm-up, then measure completed probes over the window.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let s0 = ha.stats.snapshot();
        let start = Instant::now();
        tokio::time::sleep(dur).await;
        let s1 = ha.stats.snapshot();
        let secs = start.elapsed().as_secs_f64();
        ha.stop();
        hb.stop();
        let _ = ta.await;
        let _ = tb.await;
        let ok = s1.probe_success - s0.probe_success;
        let bad = (s1.probe_failed + s1.probe_invalid) - (s0.probe_failed + s0.probe_invalid);
        (ok as f64 / secs, bad)
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let mut secs = 1.5f64;
    let mut runs = 5usize;
    let mut only: Option<String> = None;
    let mut rdma: Option<Link> = None;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let val = args.get(i + 1);
        match (args[i].as_str(), val) {
            ("--seconds-per-run", Some(v)) => secs = v.parse().unwrap_or_else(|_| usage(&args[i])),
            ("--runs", Some(v)) => runs = v.parse().unwrap_or_else(|_| usage(&args[i])),
            ("--only", Some(v)) if v == "baseline" || v == "agent" => only = Some(v.clone()),
            ("--rdma", Some(v)) => rdma = Some(parse_rdma(v).unwrap_or_else(|| usage(v))),
            (other, _) => usage(other),
        }
        i += 2;
    }
    let dur = Duration::from_secs_f64(secs.max(0.1));
    let runs = runs.max(1);
    if let Some(link) = rdma {
        for _ in 0..runs {
            let (r, bad) = agent_on(&link, dur, 1);
            let (piped, piped_bad) = agent_on(&link, dur, 16);
            println!(
                "{}",
                json!({"bench": "agent_rdma_probe_round_trips", "unit": "probes/s", "value": r,
                       "pipelined_16": piped, "seconds": dur.as_secs_f64(),
                       "failed_or_invalid": bad + piped_bad})
            );
        }
        return;
    }
    let mut base = Vec::new();
    let mut ours = Vec::new();
    let mut failures = 0;
    match only.as_deref() {
        Some("baseline") => {
            let r = pingpong(dur);
            println!(
                "{}",
                json!({"bench": "udp_pingpong_baseline", "unit": "round_trips/s", "value": r, "seconds": dur.as_secs_f64()})
            );
            return;
        }
        Some(_) => {
            let (r, bad) = agent(dur, 1);
            println!(
                "{}",
                json!({"bench": "agent_probe_round_trips", "unit": "probes/s", "value": r, "seconds": dur.as_secs_f64(), "failed_or_invalid": bad})
            );
            return;
        }
        None => {}
    }
    // Interleaved so that machine noise hits both alike.
    for _ in 0..runs {
        base.push(pingpong(dur));
        let (r, bad) = agent(dur, 1);
        ours.push(r);
        failures += bad;
    }
    let (piped, piped_bad) = agent(dur, 16);
    let b = median(base.clone());
    let a = median(ours.clone());
    // Numbers only besides the constant labels: `cargo xtask bench` matches lines across
    // its runs by their non-numeric fields and takes medians of the numeric ones.
    let (bmin, bmax) = min_max(&base);
    let (amin, amax) = min_max(&ours);
    println!(
        "{}",
        json!({"bench": "udp_pingpong_baseline", "unit": "round_trips/s", "median": b, "min": bmin, "max": bmax, "runs": base.len(), "in_flight": 1})
    );
    println!(
        "{}",
        json!({"bench": "agent_probe_round_trips", "unit": "probes/s", "median": a, "min": amin, "max": amax, "runs": ours.len(), "in_flight": 1, "failed_or_invalid": failures})
    );
    println!(
        "{}",
        json!({"bench": "agent_probe_round_trips_pipelined", "unit": "probes/s", "value": piped, "in_flight": 16, "failed_or_invalid": piped_bad})
    );
    // Each agent run against the baseline run just before it: load from elsewhere on the
    // machine drifts slowly, so paired ratios are steadier than a ratio of medians.
    let paired: Vec<f64> = base
        .iter()
        .zip(&ours)
        .map(|(b, a)| if *b > 0.0 { a / b } else { 0.0 })
        .collect();
    let (rmin, rmax) = min_max(&paired);
    println!(
        "{}",
        json!({"bench": "agent_vs_baseline", "ratio": median(paired), "ratio_min": rmin, "ratio_max": rmax,
               "ratio_of_medians": if b > 0.0 { a / b } else { 0.0 }, "target": 0.7})
    );
    scrape_bench(64, 200);
}

/// A Prometheus scrape (collection + OpenMetrics encoding) of an agent whose 64 targets
/// each sit in their own ToR (the most series ToR-level attributes allow), every path
/// with probes recorded, against the scrape of an agent without targets in the same run.
fn scrape_bench(targets: usize, samples: usize) {
    use rpingmesh_agent::telemetry::{FailReason, PathAttrs, Telemetry};
    use rpingmesh_metrics_export::{openmetrics, scrape, Exporter};
    let measure = |targets: usize| {
        let t = Telemetry::init(
            true,
            Exporter::Prometheus,
            "localhost:4317",
            Duration::from_secs(10),
            "bench",
        );
        for i in 0..targets {
            let attrs = PathAttrs::new("tor-0", &format!("tor-{}", i + 1));
            t.metrics.init_path(&attrs);
            for k in 0..50u64 {
                let s = rpingmesh_protocol::rtt::RttSample {
                    network_rtt_ns: 2_000 + 37 * k,
                    prober_delay_ns: 40_000 + k,
                    responder_delay_ns: 30_000 + k,
                };
                t.metrics.record_success(&attrs, &s);
            }
            t.metrics.record_failure(&attrs, FailReason::Timeout);
        }
        let reg = t.prometheus_registry().expect("prometheus registry");
        let mut lat = Vec::with_capacity(samples);
        let mut bytes = 0;
        for _ in 0..samples {
            let start = Instant::now();
            let (_, body) = scrape(&reg, openmetrics::CONTENT_TYPE);
            lat.push(start.elapsed().as_secs_f64() * 1e6);
            bytes = body.len();
        }
        lat.sort_by(|a, b| a.total_cmp(b));
        let q = |f: f64| lat[((lat.len() - 1) as f64 * f).round() as usize];
        (bytes, q(0.5), q(0.99))
    };
    let (bb, b50, b99) = measure(0);
    let (ab, a50, a99) = measure(targets);
    println!(
        "{}",
        json!({"bench": "metrics_scrape", "targets": targets, "tor_pairs": targets, "samples": samples,
               "bytes": ab, "p50_us": a50, "p99_us": a99,
               "baseline": "the same scrape of an agent without targets (process and health metrics only)",
               "baseline_bytes": bb, "baseline_p50_us": b50, "baseline_p99_us": b99,
               "ratio_p50": if b50 > 0.0 { a50 / b50 } else { 0.0 }})
    );
}

/// `DEV:GID,DEV:GID`.
fn parse_rdma(v: &str) -> Option<Link> {
    let mut sides = v.split(',').map(|side| {
        let (d, g) = side.split_once(':')?;
        Some((d.to_string(), g.parse().ok()?))
    });
    let a = sides.next()??;
    let b = sides.next()??;
    sides.next().is_none().then_some(Link::Rdma([a, b]))
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
            (lo.min(*x), hi.max(*x))
        })
}

fn usage(arg: &str) -> ! {
    eprintln!(
        "agent-bench: bad argument {arg:?}; usage: agent-bench [--seconds-per-run S] [--runs N] [--only baseline|agent] [--rdma DEV:GID,DEV:GID]"
    );
    std::process::exit(2);
}
