//! Polled RC write rings between two hosts (or two RNICs of one), like ibv_rc_pingpong for
//! our ring: an echo server and a client that runs seed 001's validation scenarios or a
//! depth-one latency run. Prints one JSON line; exits non-zero with one error line.
//!
//! rpingmesh-rc-ring serve --bind IP:PORT [--budget BYTES] [--connections N] [--sink] [--timeout-sec S]
//!   (--sink: check the client's one-way `stream` instead of echoing)
//!   (--ack-timeout-exp N, serve or run: the QP's ACK timeout, 4.096 us x 2^N per try, of
//!    which a silent peer gets 7; 0, the default: the CM's)
//!   (--busy-poll, serve or run: never sleep between empty polls, as perftest's latency
//!    tools do; for latency runs against ib_write_lat)
//! rpingmesh-rc-ring run --dst IP:PORT [--src IP] [--budget BYTES] [--timeout-sec S] SCENARIO..
//!   SCENARIO: pipeline N | stream N | batches N BATCH | fragmented N SIZE | rtt WARMUP N
//!             | reconnect CYCLES N   (each cycle: connect, N echoed messages, disconnect)

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use rpingmesh_rc_ring::stress;
use rpingmesh_verbs::rdma::rc_ring::{self, RcRing, RingOpts};

struct Args {
    mode: String,
    bind: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    src: Option<IpAddr>,
    budget: usize,
    connections: u64,
    timeout: Duration,
    /// serve: check a one-way stream instead of echoing.
    sink: bool,
    busy_poll: bool,
    ack_timeout_exp: Option<u8>,
    scenario: Vec<String>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mode = it.next().ok_or("usage: rpingmesh-rc-ring serve|run ...")?;
    let mut a = Args {
        mode,
        bind: None,
        dst: None,
        src: None,
        budget: 64 * 1024,
        connections: 1,
        timeout: Duration::from_secs(60),
        sink: false,
        busy_poll: false,
        ack_timeout_exp: None,
        scenario: Vec::new(),
    };
    while let Some(k) = it.next() {
        let mut val = |what: &str| it.next().ok_or(format!("{what} needs a value"));
        match k.as_str() {
            "--bind" => a.bind = Some(val("--bind")?.parse().map_err(|e| format!("--bind: {e}"))?),
            "--dst" => a.dst = Some(val("--dst")?.parse().map_err(|e| format!("--dst: {e}"))?),
            "--src" => a.src = Some(val("--src")?.parse().map_err(|e| format!("--src: {e}"))?),
            "--budget" => {
                a.budget = val("--budget")?
                    .parse()
                    .map_err(|e| format!("--budget: {e}"))?
            }
            "--sink" => a.sink = true,
            "--busy-poll" => a.busy_poll = true,
            "--ack-timeout-exp" => {
                let v: u8 = val("--ack-timeout-exp")?
                    .parse()
                    .map_err(|e| format!("--ack-timeout-exp: {e}"))?;
                if v > 31 {
                    return Err(format!("--ack-timeout-exp must be in 0..=31, got {v}"));
                }
                a.ack_timeout_exp = (v > 0).then_some(v);
            }
            "--connections" => {
                a.connections = val("--connections")?
                    .parse()
                    .map_err(|e| format!("--connections: {e}"))?
            }
            "--timeout-sec" => {
                a.timeout = Duration::from_secs(
                    val("--timeout-sec")?
                        .parse()
                        .map_err(|e| format!("--timeout-sec: {e}"))?,
                )
            }
            _ => {
                a.scenario.push(k);
                a.scenario.extend(it.by_ref());
            }
        }
    }
    Ok(a)
}

fn opts(a: &Args) -> RingOpts {
    RingOpts {
        budget: a.budget,
        cm_timeout: a.timeout.min(Duration::from_secs(10)),
        ack_timeout_exp: a.ack_timeout_exp,
        ..RingOpts::default()
    }
}

/// Connects, retrying while the overall timeout allows: the first connection on a fresh
/// network can outlast one CM step's timeout while neighbours resolve.
fn connect(a: &Args, src: Option<SocketAddr>, dst: SocketAddr) -> Result<(RcRing, u32), String> {
    let deadline = std::time::Instant::now() + a.timeout;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match RcRing::connect(src, dst, &opts(a)) {
            Ok(r) => return Ok((r, attempts)),
            Err(e) if std::time::Instant::now() < deadline && attempts < 10 => {
                eprintln!("rpingmesh-rc-ring: connect attempt {attempts}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(format!("connect ({attempts} attempts): {e}")),
        }
    }
}

fn serve(a: &Args) -> Result<String, String> {
    let bind = a.bind.ok_or("serve needs --bind IP:PORT")?;
    let listener = rc_ring::listen(bind).map_err(|e| e.to_string())?;
    let (mut echoed, mut credit_reads) = (0u64, 0u64);
    for _ in 0..a.connections {
        let mut ring = RcRing::accept(&listener, a.timeout, &opts(a)).map_err(|e| e.to_string())?;
        ring.set_busy_poll(a.busy_poll);
        echoed += if a.sink {
            stress::serve_sink(&mut ring, a.timeout)?
        } else {
            stress::serve_echo(&mut ring, a.timeout)?
        };
        credit_reads += ring.credit_reads();
        ring.wait_disconnected(a.timeout)
            .map_err(|e| e.to_string())?;
    }
    Ok(format!(
        "{{\"connections\":{},\"echoed\":{echoed},\"credit_reads\":{credit_reads}}}",
        a.connections
    ))
}

fn run(a: &Args) -> Result<String, String> {
    let dst = a.dst.ok_or("run needs --dst IP:PORT")?;
    let src = a.src.map(|ip| SocketAddr::new(ip, 0));
    if a.scenario.first().map(String::as_str) == Some("reconnect") {
        let num = |i: usize| -> Result<u64, String> {
            a.scenario
                .get(i)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| "reconnect CYCLES N".to_string())
        };
        let (cycles, n) = (num(1)?, num(2)?);
        let t0 = std::time::Instant::now();
        let mut echoed = 0;
        for cycle in 0..cycles {
            let (mut ring, _) = connect(a, src, dst).map_err(|e| format!("cycle {cycle}: {e}"))?;
            echoed += stress::run_client(&mut ring, n, None, a.timeout)
                .map_err(|e| format!("cycle {cycle}: {e}"))?
                .echoed;
            ring.disconnect(a.timeout)
                .map_err(|e| format!("cycle {cycle}: {e}"))?;
        }
        return Ok(format!(
            "{{\"cycles\":{cycles},\"echoed\":{echoed},\"secs\":{:.3}}}",
            t0.elapsed().as_secs_f64()
        ));
    }
    let (mut ring, attempts) = connect(a, src, dst)?;
    ring.set_busy_poll(a.busy_poll);
    let line = stress::client_scenario(&mut ring, &a.scenario, a.timeout)?;
    let credit_reads = ring.credit_reads();
    let device = ring.device().to_string();
    ring.disconnect(a.timeout).map_err(|e| e.to_string())?;
    Ok(format!(
        "{{{line},\"credit_reads\":{credit_reads},\"device\":\"{device}\",\"connect_attempts\":{attempts}}}"
    ))
}

fn main() -> ExitCode {
    let r = parse(std::env::args().skip(1)).and_then(|a| match a.mode.as_str() {
        "serve" => serve(&a),
        "run" => run(&a),
        m => Err(format!("unknown mode {m:?}: serve or run")),
    });
    match r {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rpingmesh-rc-ring: {e}");
            ExitCode::FAILURE
        }
    }
}
