//! `cargo xtask fuzz --seconds N [--target NAME]`: builds the libFuzzer targets of
//! `fuzz/` (cargo-fuzz, nightly, AddressSanitizer, debug assertions), runs each for N
//! seconds on a scratch copy of its checked-in corpus (`target/fuzz/run/<target>/`, so
//! runs never grow the repository), prints executions and coverage per target, and fails
//! naming the saved input of any crash. Installs cargo-fuzz into `.tools` when missing.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

const CARGO_FUZZ_VERSION: &str = "0.13.2";
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

#[derive(Args)]
pub struct FuzzArgs {
    /// Seconds of fuzzing per target.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// One target (a file name of fuzz/fuzz_targets without .rs); default: all.
    #[arg(long)]
    pub target: Option<String>,
}

/// Where the last run's per-target results go, one JSON line each (`cargo xtask bench`'s
/// `fuzz` section reads them).
pub fn results_path() -> std::path::PathBuf {
    crate::target_dir()
        .join("fuzz")
        .join("run")
        .join("results.jsonl")
}

/// What one libFuzzer run reported.
#[derive(Debug, Default, PartialEq)]
struct RunStats {
    execs: u64,
    execs_per_sec: u64,
    cov: u64,
    features: u64,
    corpus: u64,
    /// The input libFuzzer saved ("Test unit written to ...") when the target failed.
    crash: Option<String>,
    /// The first line saying why (panic message, sanitizer or libFuzzer error).
    reason: Option<String>,
}

pub fn run(a: FuzzArgs) -> Result<()> {
    let root = crate::root();
    let fuzz_dir = root.join("fuzz");
    let mut targets = list_targets(&fuzz_dir)?;
    if let Some(t) = &a.target {
        if !targets.contains(t) {
            bail!("no fuzz target {t:?} (have: {})", targets.join(", "));
        }
        targets = vec![t.clone()];
    }
    let tools = root.join(".tools");
    crate::build_ebpf::ensure_nightly()?;
    ensure_cargo_fuzz(&tools)?;
    // The same dependency versions as the main workspace (fuzz/Cargo.lock is not kept).
    std::fs::copy(root.join("Cargo.lock"), fuzz_dir.join("Cargo.lock"))
        .context("seeding fuzz/Cargo.lock")?;

    let target_dir = crate::target_dir().join("fuzz");
    let started = Instant::now();
    let mut build = nightly_cargo(&tools);
    build
        .args(["+nightly", "fuzz", "build", "--fuzz-dir"])
        .arg(&fuzz_dir)
        .arg("--target-dir")
        .arg(&target_dir)
        .args(a.target.as_deref());
    crate::run_streamed(build, "cargo +nightly fuzz build")?;
    eprintln!(
        "xtask fuzz: built in {:.0} s",
        started.elapsed().as_secs_f64()
    );

    let bin_dir = target_dir.join(TRIPLE).join("release");
    let mut report = String::new();
    let _ = writeln!(
        report,
        "| target | execs | execs/s | cov | ft | corpus | result |\n|---|---:|---:|---:|---:|---:|---|"
    );
    let mut crashes = Vec::new();
    let mut results = String::new();
    for t in &targets {
        let stats = run_target(
            &bin_dir.join(t),
            &fuzz_dir.join("corpus").join(t),
            &target_dir.join("run").join(t),
            a.seconds,
        )?;
        let result = match &stats.crash {
            None if stats.reason.is_none() => "ok".to_string(),
            Some(p) => format!("CRASH {p}"),
            None => "FAILED (no input saved)".to_string(),
        };
        let _ = writeln!(
            report,
            "| {t} | {} | {} | {} | {} | {} | {result} |",
            stats.execs, stats.execs_per_sec, stats.cov, stats.features, stats.corpus
        );
        let _ = writeln!(
            results,
            "{}",
            serde_json::json!({
                "bench": "fuzz",
                "target": t,
                "seconds": a.seconds,
                "execs": stats.execs,
                "execs_per_sec": stats.execs_per_sec,
                "cov": stats.cov,
                "ft": stats.features,
                "corpus": stats.corpus,
                "result": result,
            })
        );
        if stats.crash.is_some() || stats.reason.is_some() {
            crashes.push(format!(
                "{t}: {} ({})",
                stats.crash.as_deref().unwrap_or("no input saved"),
                stats.reason.as_deref().unwrap_or("see the log")
            ));
        }
    }
    println!("{report}");
    std::fs::write(results_path(), results).context("writing the fuzz results")?;
    if !crashes.is_empty() {
        bail!(
            "fuzz targets failed (logs in {}):\n{}",
            target_dir.join("run").display(),
            crashes.join("\n")
        );
    }
    Ok(())
}

fn list_targets(fuzz_dir: &Path) -> Result<Vec<String>> {
    let dir = fuzz_dir.join("fuzz_targets");
    let mut v: Vec<String> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".rs"))
                .map(str::to_string)
        })
        .collect();
    v.sort();
    Ok(v)
}

/// `cargo` (the rustup proxy, so `+nightly` works) with `.tools/bin` on PATH for
/// cargo-fuzz and without what the stable parent cargo leaks into children.
fn nightly_cargo(tools: &Path) -> Command {
    let mut c = Command::new(crate::build_ebpf::rustup_cargo());
    let mut path = vec![tools.join("bin")];
    if let Some(p) = std::env::var_os("PATH") {
        path.extend(std::env::split_paths(&p));
    }
    crate::build_ebpf::without_parent_cargo_env(&mut c)
        .env("PATH", std::env::join_paths(path).unwrap_or_default())
        .current_dir(crate::root());
    c
}

fn ensure_cargo_fuzz(tools: &Path) -> Result<()> {
    let bin = tools.join("bin").join("cargo-fuzz");
    let version = Command::new(&bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if version.contains(CARGO_FUZZ_VERSION) {
        return Ok(());
    }
    let mut c = nightly_cargo(tools);
    c.args([
        "install",
        &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}"),
        "--locked",
        "--root",
    ])
    .arg(tools)
    .current_dir(tools.parent().unwrap_or(tools));
    std::fs::create_dir_all(tools)?;
    crate::run_streamed(
        c,
        &format!("cargo install cargo-fuzz@{CARGO_FUZZ_VERSION} (about a minute, once)"),
    )
}

/// Runs one target binary for `seconds` on a fresh copy of `seeds`; its log goes to
/// `<run>/log`, crash inputs to `<run>/artifacts/`.
fn run_target(bin: &Path, seeds: &Path, run: &Path, seconds: u64) -> Result<RunStats> {
    if !bin.is_file() {
        bail!("{} was not built", bin.display());
    }
    let corpus = run.join("corpus");
    let artifacts = run.join("artifacts");
    let _ = std::fs::remove_dir_all(run);
    std::fs::create_dir_all(&corpus)?;
    std::fs::create_dir_all(&artifacts)?;
    for e in std::fs::read_dir(seeds).with_context(|| format!("reading {}", seeds.display()))? {
        let p = e?.path();
        if p.is_file() {
            std::fs::copy(&p, corpus.join(p.file_name().expect("a file name")))?;
        }
    }
    let log_path = run.join("log");
    let log = std::fs::File::create(&log_path)?;
    let name = bin.file_name().unwrap_or_default().to_string_lossy();
    eprintln!(
        "xtask fuzz: {name} for {seconds} s (log {})",
        log_path.display()
    );
    let mut child = Command::new(bin)
        .arg(&corpus)
        .arg(format!("-max_total_time={seconds}"))
        // One input running this long is a hang: libFuzzer saves it as a timeout.
        .arg("-timeout=10")
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .current_dir(run)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    // libFuzzer stops itself; this only guards against a wedged process.
    let deadline = Instant::now() + Duration::from_secs(seconds + 120);
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "{name} did not stop after {seconds} s (log {})",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut stats = parse_log(&text);
    if !status.success() && stats.reason.is_none() {
        stats.reason = Some(format!("exited with {status}"));
    }
    Ok(stats)
}

fn parse_log(text: &str) -> RunStats {
    let mut s = RunStats::default();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("stat::number_of_executed_units:") {
            s.execs = v.trim().parse().unwrap_or(0);
        } else if let Some(v) = line.strip_prefix("stat::average_exec_per_sec:") {
            s.execs_per_sec = v.trim().parse().unwrap_or(0);
        } else if let Some(i) = line.find("Test unit written to ") {
            s.crash = Some(line[i + "Test unit written to ".len()..].trim().to_string());
        } else if line.starts_with('#') && line.contains(" cov: ") {
            // "#123 DONE cov: 456 ft: 789 corp: 12/3456b ...": the last one is the final count.
            let mut words = line.split_whitespace();
            while let Some(w) = words.next() {
                let v = words.clone().next().unwrap_or("");
                let n = |x: &str| x.split('/').next().unwrap_or("").parse().unwrap_or(0);
                match w {
                    "cov:" => s.cov = n(v),
                    "ft:" => s.features = n(v),
                    "corp:" => s.corpus = n(v),
                    _ => {}
                }
            }
        } else if s.reason.is_none() && line.contains("panicked at") {
            // The panic message is on the next line.
            let msg = lines.peek().map(|m| m.trim()).unwrap_or("");
            s.reason = Some(format!("{line} {msg}"));
        } else if s.reason.is_none() && line.starts_with("==") && line.contains("ERROR:") {
            s.reason = Some(line.to_string());
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_libfuzzer_output() {
        let ok = "INFO: Seed: 1\n#2\tINITED cov: 10 ft: 11 corp: 2/80b exec/s: 0 rss: 30Mb\n\
                  #9000\tNEW    cov: 55 ft: 70 corp: 9/1Kb lim: 4 exec/s: 3000 rss: 40Mb L: 3/40 MS: 1 ChangeBit-\n\
                  #12000\tDONE   cov: 56 ft: 72 corp: 10/1Kb lim: 4 exec/s: 4000 rss: 41Mb\n\
                  Done 12000 runs in 3 second(s)\nstat::number_of_executed_units: 12000\n\
                  stat::average_exec_per_sec:     4000\nstat::new_units_added:          8\n";
        assert_eq!(
            parse_log(ok),
            RunStats {
                execs: 12000,
                execs_per_sec: 4000,
                cov: 56,
                features: 72,
                corpus: 10,
                crash: None,
                reason: None
            }
        );
        let crash = "#5\tNEW    cov: 5 ft: 5 corp: 2/2b\nthread '<unnamed>' panicked at a/b.rs:1:2:\nboom\n\
                     ==77== ERROR: libFuzzer: deadly signal\n\
                     artifact_prefix='/x/'; Test unit written to /x/crash-abc\nBase64: AA==\n";
        let s = parse_log(crash);
        assert_eq!(s.crash.as_deref(), Some("/x/crash-abc"));
        assert_eq!(
            s.reason.as_deref(),
            Some("thread '<unnamed>' panicked at a/b.rs:1:2: boom")
        );
    }
}
