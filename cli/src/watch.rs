//! `--watch`: re-query and reprint until Ctrl-C or `--count` refreshes.
//!
//! On a terminal each refresh clears the screen (ANSI) and prints a header line; otherwise
//! each refresh starts with one separator line, `--- <UTC time> refresh <n> ---`, so the
//! output can be split by a script (the line is never a table row nor JSON).

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;

use crate::connect::Failure;
use crate::format::utc;

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// Re-query and reprint every --interval seconds until Ctrl-C (or --count refreshes).
    ///
    /// Off a terminal each refresh starts with a "--- <UTC> refresh <n> ---" line. A failed
    /// refresh is one line on stderr and watching goes on; only a failed first query exits
    /// non-zero.
    #[arg(long, help_heading = "Watch")]
    pub watch: bool,
    /// Seconds between refreshes with --watch (fractions allowed).
    #[arg(long, help_heading = "Watch", value_name = "SECS", default_value = "2", value_parser = parse_interval, requires = "watch")]
    pub interval: Duration,
    /// Stop after this many refreshes (with --watch).
    #[arg(long, help_heading = "Watch", value_name = "N", value_parser = clap::value_parser!(u64).range(1..), requires = "watch")]
    pub count: Option<u64>,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("expected seconds (e.g. 2 or 0.5), got {s:?}"))?;
    if !v.is_finite() || !(0.1..=86_400.0).contains(&v) {
        return Err(format!("must be between 0.1 and 86400 seconds, got {s}"));
    }
    Ok(Duration::from_secs_f64(v))
}

fn now_utc() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    utc(secs)
}

/// Runs `query` once per refresh and prints what it returns. A failure of the first
/// refresh is returned (so the exit status says the controller was not reached); later
/// failures are one line on stderr each, and watching goes on.
pub async fn run<F, Fut>(w: &WatchArgs, title: &str, mut query: F) -> Result<(), Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<String, Failure>>,
{
    let tty = std::io::stdout().is_terminal();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut n: u64 = 0;
    loop {
        n += 1;
        let res = tokio::select! {
            r = query() => r,
            _ = &mut ctrl_c => return Ok(()),
        };
        if let Err(e) = &res {
            if n == 1 {
                return Err(e.clone());
            }
        }
        let mut out = std::io::stdout().lock();
        let header = if tty {
            format!(
                "\x1b[H\x1b[2JEvery {}s: rpingmeshctl {title}    {}\n\n",
                w.interval.as_secs_f64(),
                now_utc()
            )
        } else {
            format!("--- {} refresh {n} ---\n", now_utc())
        };
        match res {
            Ok(body) => {
                let _ = write!(out, "{header}{body}");
                let _ = out.flush();
            }
            Err(e) => {
                // On a terminal the last good table stays; the error goes under it.
                if !tty {
                    let _ = write!(out, "{header}");
                }
                let _ = out.flush();
                eprintln!("rpingmeshctl: refresh {n} at {}: {e}", now_utc());
            }
        }
        drop(out);
        if w.count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(w.interval) => {}
            _ = &mut ctrl_c => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_interval("0.5").unwrap(), Duration::from_millis(500));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("-1").is_err());
        assert!(parse_interval("soon").is_err());
        assert!(parse_interval("inf").is_err());
    }
}
