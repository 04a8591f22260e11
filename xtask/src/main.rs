//! Project automation: `cargo xtask <deps|test|demo|bench|soak|...>`.

mod bench;
mod build_ebpf;
mod demo;
mod fuzz;
mod house;
mod package;
mod procs;
mod sim;
mod soak;
mod stages;
mod vm;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "rpingmesh project automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install missing system packages (apt-get, when root) needed by tests and demo.
    Deps,
    /// deps, then build every target and run the whole test suite (e2e included).
    Test,
    /// Start a controller and N agents over udp on loopback and print a live ToR-pair table.
    Demo(demo::DemoArgs),
    /// Run the benchmarks (release) and write BENCHMARKS.md.
    Bench(bench::BenchArgs),
    /// Build the eBPF programs (agent-ebpf), installing nightly pieces and bpf-linker when missing.
    BuildEbpf,
    /// On an RDMA host (or soft-RoCE): open every device, print GID tables, timestamp
    /// support and a loopback probe RTT. Fails with one clear line where there is no RDMA.
    HwCheck,
    /// The soft-RoCE VM tier alone: install qemu, a Debian kernel and virtme-ng, build,
    /// and run e2e/tests/vm_rdma.rs (one guest, every scenario). Part of `test` too.
    VmTest,
    /// The restart-and-fault soak (root): controller restarts and outages, agent
    /// restarts, kills and cut-offs, time-compressed; prints windows lost, convergence
    /// and RSS, and fails on a missed target.
    Soak(soak::SoakArgs),
    /// Run a fault scenario on the simulated fabric (release build of rpingmesh-sim).
    Sim(sim::SimArgs),
    /// Run every libFuzzer target (fuzz/, cargo-fuzz, nightly) for N seconds each on its
    /// corpus; report executions and coverage, fail on a crash.
    Fuzz(fuzz::FuzzArgs),
    /// Build the .deb packages of the agent and the controller (release, rdma, eBPF
    /// embedded) into target/debian. Part of `test` too (the package install test).
    Package(package::PackageArgs),
    /// Check the house rules: no source file past 800 lines outside tests, benches and
    /// fixtures, no module cycle inside a crate, no logic copied to the letter (also a test
    /// of the suite).
    House,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Deps => deps(),
        Cmd::Test => test(),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::BuildEbpf => build_ebpf::build_ebpf(&root()).map(|obj| println!("{}", obj.display())),
        Cmd::HwCheck => hw_check(),
        Cmd::VmTest => vm::vm_test(),
        Cmd::Soak(a) => soak::run(a),
        Cmd::Sim(a) => sim::run(a),
        Cmd::Fuzz(a) => fuzz::run(a),
        Cmd::Package(a) => package::run(a),
        Cmd::House => house(),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn house() -> Result<()> {
    let problems = house::problems(&root())?;
    for p in &problems {
        eprintln!("{p}");
    }
    if !problems.is_empty() {
        bail!("{} house rule(s) broken", problems.len());
    }
    println!(
        "house rules kept: no file past {} lines, no module cycle, no copied logic",
        house::MAX_LINES
    );
    Ok(())
}

/// The workspace root (xtask lives one level below it).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_path_buf()
}

/// Cargo's target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let p = PathBuf::from(d);
            if p.is_absolute() {
                p
            } else {
                root().join(p)
            }
        }
        None => root().join("target"),
    }
}

pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    // `cargo xtask` is `cargo run`: what cargo set for xtask itself (CARGO_MANIFEST_DIR,
    // CARGO_PKG_*...) must not reach the cargo it starts, or build scripts that watch
    // those variables (ring's) see them change between `cargo xtask ...` and a plain
    // `cargo build` and rebuild, with everything above them.
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(inherited_from_cargo_run) {
            c.env_remove(&k);
        }
    }
    c
}

/// Variables `cargo run` sets for the program it runs (not the user's own settings).
fn inherited_from_cargo_run(k: &str) -> bool {
    matches!(
        k,
        "CARGO_MANIFEST_DIR"
            | "CARGO_MANIFEST_PATH"
            | "CARGO_CRATE_NAME"
            | "CARGO_BIN_NAME"
            | "CARGO_PRIMARY_PACKAGE"
    ) || k.starts_with("CARGO_PKG_")
}

/// Runs a command with inherited stdio; a failure names the command and its status.
pub fn run_streamed(mut cmd: Command, what: &str) -> Result<()> {
    eprintln!("xtask: {what}");
    let st = cmd.status().with_context(|| format!("starting: {what}"))?;
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(())
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// What the tests, demo and the rdma build need: (what, present?, Debian package, why).
pub(crate) struct Need {
    what: &'static str,
    present: fn() -> bool,
    package: &'static str,
    why: &'static str,
}

const NEEDED: &[Need] = &[
    Need {
        what: "ip",
        present: || have_tool("ip"),
        package: "iproute2",
        why: "network namespaces, veth and bridges for the e2e mesh test",
    },
    Need {
        what: "nft",
        present: || have_tool("nft"),
        package: "nftables",
        why: "packet-loss injection in the e2e mesh test",
    },
    Need {
        what: "ps",
        present: || have_tool("ps"),
        package: "procps",
        why: "process inspection for demo and bench",
    },
    Need {
        what: "pkg-config",
        present: || have_tool("pkg-config"),
        package: "pkg-config",
        why: "locating libibverbs for the rdma backend (rdma-sys)",
    },
    Need {
        what: "infiniband/verbs.h",
        present: || Path::new("/usr/include/infiniband/verbs.h").is_file(),
        package: "libibverbs-dev",
        why: "the rdma backend's verbs bindings and the eBPF uprobe ABI checks",
    },
    Need {
        what: "rdma/rdma_cma.h",
        present: || Path::new("/usr/include/rdma/rdma_cma.h").is_file(),
        package: "librdmacm-dev",
        why: "rdma-sys binds rdma_cma.h too",
    },
    Need {
        what: "libclang",
        present: have_libclang,
        package: "libclang-dev",
        why: "bindgen, which generates the verbs bindings",
    },
    Need {
        what: "clang",
        present: || have_tool("clang"),
        package: "clang",
        why: "bindgen's C headers (stddef.h) for the verbs bindings",
    },
    Need {
        what: "chromium",
        present: || have_tool("chromium"),
        package: "chromium",
        why: "the web page test (headless Chromium against the demo)",
    },
    Need {
        what: "prometheus",
        present: || have_tool("prometheus") && have_tool("promtool"),
        package: "prometheus",
        why: "scraping /metrics and evaluating every Grafana panel's query in a test",
    },
    Need {
        what: "etcd",
        present: || have_tool("etcd"),
        package: "etcd-server",
        why: "the etcd registry's tests start a real etcd on loopback",
    },
    Need {
        what: "openssl",
        present: || have_tool("openssl"),
        package: "openssl",
        why: "the TLS and agent-identity tests make their certificates with the openssl CLI",
    },
    Need {
        what: "curl",
        present: || have_tool("curl"),
        package: "curl",
        why: "the runbook's operator commands (docs/operations.md) are run as written",
    },
    Need {
        what: "cc",
        present: || have_tool("cc"),
        package: "gcc",
        why: "C checks of the libibverbs struct layouts",
    },
];

pub(crate) fn have_tool(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .any(|d| d.join(tool).is_file())
}

fn have_libclang() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/llvm-14/lib",
        "/usr/lib/llvm-15/lib",
        "/usr/lib/llvm-16/lib",
        "/usr/lib",
    ]
    .iter()
    .filter_map(|d| std::fs::read_dir(d).ok())
    .flat_map(|rd| rd.filter_map(|e| e.ok()))
    .any(|e| e.file_name().to_string_lossy().starts_with("libclang"))
}

/// Installs what the tests and demo need and is missing (root) or says how to (not root).
pub fn deps() -> Result<()> {
    install_needs("deps", NEEDED)
}

/// Installs every missing package of `needs` with apt-get (root), or prints the command.
pub(crate) fn install_needs(what: &str, needs: &[Need]) -> Result<()> {
    let missing: Vec<&Need> = needs.iter().filter(|n| !(n.present)()).collect();
    if missing.is_empty() {
        eprintln!(
            "xtask {what}: all system packages present ({})",
            needs
                .iter()
                .map(|n| n.package)
                .collect::<Vec<_>>()
                .join(", ")
        );
        return Ok(());
    }
    let mut pkgs: Vec<&str> = missing.iter().map(|n| n.package).collect();
    pkgs.dedup();
    for n in &missing {
        eprintln!(
            "xtask {what}: `{}` is missing: installing package {} ({})",
            n.what, n.package, n.why
        );
    }
    if !is_root() {
        eprintln!(
            "xtask {what}: not root, installing nothing; run `sudo apt-get install -y {}` \
             (root-only tests are skipped meanwhile)",
            pkgs.join(" ")
        );
        return Ok(());
    }
    if !have_tool("apt-get") {
        bail!(
            "missing packages {} and no apt-get on this system: install them with your package manager",
            pkgs.join(" ")
        );
    }
    let mut update = Command::new("apt-get");
    update
        .arg("update")
        .env("DEBIAN_FRONTEND", "noninteractive");
    run_streamed(update, "apt-get update")?;
    let mut install = Command::new("apt-get");
    install
        .args(["install", "-y", "--no-install-recommends"])
        .args(&pkgs)
        .env("DEBIAN_FRONTEND", "noninteractive");
    run_streamed(install, &format!("apt-get install -y {}", pkgs.join(" ")))?;
    for n in &missing {
        if !(n.present)() {
            bail!("`{}` still missing after installing {}", n.what, n.package);
        }
    }
    Ok(())
}

/// The one feature set tests build with: the rdma backend compiled in (it must build in
/// CI even though no RDMA device exists here).
pub(crate) const TEST_FEATURES: &str =
    "rpingmesh-agent/rdma,rpingmesh-verbs/rdma,rdma-qp-churn/rdma";

fn test() -> Result<()> {
    let mut stages = stages::Stages::default();
    let r = test_stages(&mut stages);
    // The budget made visible, whatever happened (nothing fails on time).
    eprintln!("{}", stages.table());
    r
}

fn test_stages(stages: &mut stages::Stages) -> Result<()> {
    stages.time("deps (apt)", deps)?;
    // The VM tier runs inside `cargo test --workspace` (e2e/tests/vm_rdma.rs).
    stages.time("VM test bed (qemu, kernel, virtme-ng)", vm::ensure_test_bed)?;
    // Before the workspace build: service-tracer embeds the object it finds at build time.
    stages.time("eBPF object (nightly, bpf-linker)", || {
        build_ebpf::build_ebpf(&root()).map(drop)
    })?;
    stages.time("build: every target, test features", build_for_tests)?;
    // The package install test (e2e/tests/package.rs) installs these.
    stages.time("build: release packages", || package::build(None))?;
    let mut t = cargo();
    t.args([
        "test",
        "--workspace",
        "--no-fail-fast",
        "--features",
        TEST_FEATURES,
    ]);
    // e2e tests find the binaries next to their own executable (target/debug).
    let what = format!("cargo test --workspace --features {TEST_FEATURES}");
    eprintln!("xtask: {what}");
    let started = std::time::Instant::now();
    let (st, totals) = stages::run_tests(t, &what, stages)?;
    stages.add("cargo test (all test binaries)", started.elapsed());
    if !is_root() {
        eprintln!(
            "xtask test: note: not root, so the root-only tests (network namespaces, eBPF) \
             were skipped (see their SKIP lines above)"
        );
    }
    // One closing line over every test binary of the workspace.
    println!(
        "summary: {} passed, {} failed, {} skipped",
        totals.passed, totals.failed, totals.ignored
    );
    if !st.success() {
        bail!("{what} failed ({st})");
    }
    Ok(())
}

/// `cargo build --release -p P...` plus `extra` (features, bins), streamed; `what` names it
/// in the log.
pub(crate) fn cargo_release(packages: &[&str], extra: &[&str], what: &str) -> Result<()> {
    let mut build = cargo();
    build.args(["build", "--release"]);
    for p in packages {
        build.args(["-p", p]);
    }
    build.args(extra);
    run_streamed(build, &format!("cargo build --release ({what})"))
}

/// Builds every target with the test features (the e2e and VM tests run the binaries).
pub(crate) fn build_for_tests() -> Result<()> {
    let mut build = cargo();
    build.args([
        "build",
        "--workspace",
        "--all-targets",
        "--features",
        TEST_FEATURES,
    ]);
    run_streamed(
        build,
        &format!("cargo build --workspace --all-targets --features {TEST_FEATURES}"),
    )
}

/// Sums libtest's `test result:` lines.
#[derive(Default, Debug, PartialEq)]
pub(crate) struct TestTotals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl TestTotals {
    pub(crate) fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(label), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match label {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

fn hw_check() -> Result<()> {
    deps()?;
    let mut c = cargo();
    c.args([
        "run",
        "--quiet",
        "-p",
        "rpingmesh-verbs",
        "--features",
        "rdma",
        "--bin",
        "rpingmesh-hw-check",
    ]);
    run_streamed(c, "rpingmesh-hw-check")
}

#[cfg(test)]
mod protoc_tests {
    /// `cargo build` needs no system protoc: .cargo/config.toml points PROTOC at
    /// tools/protoc, which runs the vendored protoc cargo fetched (with its bundled
    /// well-known .proto files), not one on PATH.
    #[test]
    fn the_build_scripts_protoc_is_the_vendored_one() {
        let root = super::root();
        let config = std::fs::read_to_string(root.join(".cargo/config.toml")).unwrap();
        assert!(config.contains("PROTOC = { value = \"tools/protoc\", relative = true }"));
        let out = std::process::Command::new("sh")
            .arg("-x")
            .arg(root.join("tools/protoc"))
            .arg("--version")
            .output()
            .unwrap();
        let trace = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{trace}");
        assert!(
            trace
                .lines()
                .any(|l| l.contains("exec ") && l.contains("protoc-bin-vendored")),
            "tools/protoc ran another protoc:\n{trace}"
        );
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("libprotoc "));
    }
}

#[cfg(test)]
mod totals_tests {
    use super::TestTotals;

    #[test]
    fn sums_libtest_result_lines() {
        let mut t = TestTotals::default();
        t.add_line("test result: ok. 44 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.02s");
        t.add_line("test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1s");
        t.add_line("running 3 tests");
        t.add_line("test foo ... ok");
        assert_eq!(
            t,
            TestTotals {
                passed: 47,
                failed: 1,
                ignored: 2
            }
        );
    }
}
