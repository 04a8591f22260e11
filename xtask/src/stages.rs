//! The time table of `cargo xtask test`: each stage's wall time, and each test binary's
//! (from cargo's `Running ...` lines, merged with the binaries' output by arrival), so the
//! suite's budget is visible in every CI log. Nothing fails on time.

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::TestTotals;

/// Test binaries listed by name in the table (the slowest); the rest are summed.
const SLOWEST_SHOWN: usize = 15;

#[derive(Default)]
pub struct Stages {
    stages: Vec<(String, Duration)>,
    binaries: Vec<(String, Duration)>,
}

impl Stages {
    pub fn add(&mut self, name: &str, d: Duration) {
        self.stages.push((name.to_string(), d));
    }

    /// Runs one stage, timing it (also when it fails).
    pub fn time<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let r = f();
        self.add(name, t.elapsed());
        r
    }

    /// The table, slowest test binaries first.
    pub fn table(&self) -> String {
        let total: Duration = self.stages.iter().map(|s| s.1).sum();
        let mut out = String::from("\nxtask test: time per stage\n");
        for (name, d) in &self.stages {
            out.push_str(&format!("  {:>8.1} s  {name}\n", d.as_secs_f64()));
        }
        out.push_str(&format!("  {:>8.1} s  total\n", total.as_secs_f64()));
        if !self.binaries.is_empty() {
            let mut b = self.binaries.clone();
            b.sort_by_key(|x| std::cmp::Reverse(x.1));
            out.push_str("xtask test: the slowest test binaries\n");
            for (name, d) in b.iter().take(SLOWEST_SHOWN) {
                out.push_str(&format!("  {:>8.1} s  {name}\n", d.as_secs_f64()));
            }
            let rest: Duration = b.iter().skip(SLOWEST_SHOWN).map(|x| x.1).sum();
            if b.len() > SLOWEST_SHOWN {
                out.push_str(&format!(
                    "  {:>8.1} s  the other {} binaries\n",
                    rest.as_secs_f64(),
                    b.len() - SLOWEST_SHOWN
                ));
            }
        }
        out
    }
}

/// The binary a cargo stderr line starts: `Running tests/x.rs (target/...)` or
/// `Doc-tests crate`.
pub fn binary_of(line: &str) -> Option<String> {
    let l = line.trim();
    if let Some(r) = l.strip_prefix("Running ") {
        return Some(r.split(" (").next().unwrap_or(r).to_string());
    }
    l.strip_prefix("Doc-tests ")
        .map(|c| format!("doc-tests {c}"))
}

/// Runs `cmd` (cargo test): its stdout and stderr pass through, `test result:` lines are
/// summed, and each test binary is timed from its `Running` line to the next.
pub fn run_tests(
    mut cmd: Command,
    what: &str,
    stages: &mut Stages,
) -> Result<(ExitStatus, TestTotals)> {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("starting: {what}"))?;
    let (tx, rx) = mpsc::channel::<(bool, String)>();
    let out = child.stdout.take().expect("stdout is piped");
    let err = child.stderr.take().expect("stderr is piped");
    let pipes = [
        (true, Box::new(out) as Box<dyn std::io::Read + Send>),
        (false, Box::new(err)),
    ]
    .map(|(is_out, r)| {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines().map_while(Result::ok) {
                if tx.send((is_out, line)).is_err() {
                    return;
                }
            }
        })
    });
    drop(tx);
    let mut totals = TestTotals::default();
    let mut current: Option<(String, Instant)> = None;
    for (is_out, line) in rx {
        if is_out {
            println!("{line}");
            totals.add_line(&line);
        } else {
            eprintln!("{line}");
            if let Some(b) = binary_of(&line) {
                if let Some((name, t)) = current.replace((b, Instant::now())) {
                    stages.binaries.push((name, t.elapsed()));
                }
            }
        }
    }
    if let Some((name, t)) = current {
        stages.binaries.push((name, t.elapsed()));
    }
    for p in pipes {
        let _ = p.join();
    }
    Ok((child.wait()?, totals))
}

#[cfg(test)]
mod tests;
