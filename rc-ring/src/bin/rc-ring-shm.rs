//! Two processes over a shared-memory ring pair: `serve` is the echo server (side B),
//! `run` a client (side A) that creates the shared file and runs one of seed 001's
//! validation scenarios. Prints one JSON line of counts.
//!
//! rc-ring-shm serve PATH BUDGET TIMEOUT_SEC
//! rc-ring-shm run PATH BUDGET TIMEOUT_SEC pipeline N | batches N BATCH | fragmented N SIZE | rtt WARMUP N

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rpingmesh_rc_ring::shm::ShmLink;
use rpingmesh_rc_ring::stress;
use rpingmesh_rc_ring::Geometry;

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> Result<T, String> {
    args.get(i)
        .ok_or_else(|| format!("missing {what}"))?
        .parse()
        .map_err(|_| format!("bad {what}: {}", args[i]))
}

fn run(args: &[String]) -> Result<String, String> {
    let mode = args.get(1).map(String::as_str).unwrap_or("");
    let path = PathBuf::from(arg::<String>(args, 2, "PATH")?);
    let budget: usize = arg(args, 3, "BUDGET")?;
    let timeout = Duration::from_secs(arg(args, 4, "TIMEOUT_SEC")?);
    let geom = Geometry::for_budget(budget, page()).map_err(|e| e.to_string())?;
    match mode {
        "serve" => {
            // The client creates the file; wait for it to appear at its full size.
            let start = Instant::now();
            let mut link = loop {
                match ShmLink::open(&path, geom) {
                    Ok(l) => break l,
                    Err(e) if start.elapsed() > timeout => return Err(e.to_string()),
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            };
            let n = stress::serve_echo(&mut link, timeout)?;
            Ok(format!(
                "{{\"echoed\":{n},\"credit_reads\":{}}}",
                link.credit_reads()
            ))
        }
        "run" => {
            let mut link = ShmLink::create(&path, geom).map_err(|e| e.to_string())?;
            let line = stress::client_scenario(&mut link, &args[5..], timeout)?;
            Ok(format!(
                "{{{line},\"credit_reads\":{}}}",
                link.credit_reads()
            ))
        }
        _ => Err("usage: rc-ring-shm serve|run PATH BUDGET TIMEOUT_SEC [scenario args]".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match run(&args) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rc-ring-shm: {e}");
            ExitCode::FAILURE
        }
    }
}
