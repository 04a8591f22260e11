//! `cargo xtask bench`: controller-bench and agent-bench (JSON lines), the agent footprint
//! bench (CPU and RSS of an agent probing 64 targets at 10/s each), written to BENCHMARKS.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use rpingmesh_e2e::soak::{self, SoakReport};
use rpingmesh_proto::operator::{ListPathsRequest, ListRnicsRequest};
use serde_json::{Map, Value};

use crate::is_root;
use crate::procs::{self, Proc};

#[derive(Args)]
pub struct BenchArgs {
    /// One short run of everything (smoke test of the benches) instead of repeated runs.
    #[arg(long)]
    quick: bool,
    /// Length of the restart-and-fault soak, in seconds (quick mode: one cycle).
    #[arg(long, default_value_t = 600)]
    soak_sec: u64,
    /// Re-measure one JSON bench binary (e.g. sim-eval), or the soft-RoCE guest's benches
    /// (vm-rdma), and replace its section and its rows of the summary in the existing
    /// BENCHMARKS.md, leaving the rest as measured.
    #[arg(long)]
    section: Option<String>,
    /// With --section: more arguments for the bench binary (e.g. smaller sizes:
    /// `--bench-args "--gray-scenarios 96 --day-hours 2"`), named in the section's footer.
    #[arg(long, allow_hyphen_values = true)]
    bench_args: Option<String>,
    /// With --section: splice the JSON lines a run of the bench already printed (a file)
    /// instead of running it; --bench-args then names the arguments that run had.
    #[arg(long)]
    lines_from: Option<PathBuf>,
}

/// A section's binary and the arguments that select its part (sim-eval's two suites
/// are two sections).
fn section_command(section: &str) -> (&str, &'static [&'static str]) {
    match section {
        "sim-eval" => ("sim-eval", &["--suite", "black"]),
        "sim-eval-gray" => ("sim-eval", &["--suite", "gray"]),
        other => (other, &[]),
    }
}

const TARGETS: usize = 64;
const RATE_PER_TARGET: f64 = 10.0;
const CPU_TARGET_PCT: f64 = 1.0;
const RSS_TARGET_MIB: f64 = 20.0;
const SAMPLE: Duration = Duration::from_secs(20);

/// The release build every bench binary comes from.
fn release_build() -> Result<()> {
    let mut build = crate::cargo();
    // The rdma features too: the VM bench runs these binaries against soft-RoCE.
    build.args([
        "build",
        "--release",
        "-p",
        "rpingmesh-controller",
        "-p",
        "rpingmesh-agent",
        "-p",
        "rpingmesh-verbs",
        "-p",
        "rpingmesh-e2e",
        "-p",
        "rdma-qp-churn",
        "-p",
        "rpingmesh-sim",
        "-p",
        "rpingmesh-rc-ring",
        "--features",
        crate::TEST_FEATURES,
    ]);
    crate::run_streamed(build, "cargo build --release (controller, agent, benches)")?;
    Ok(())
}

/// `--section BIN`: runs one JSON bench and splices its section and summary rows into
/// BENCHMARKS.md (the rows of the summary it produces replace the rows it produced).
fn run_section(
    bin: &str,
    quick: bool,
    extra: Option<&str>,
    lines_from: Option<&Path>,
) -> Result<()> {
    let path = crate::root().join("BENCHMARKS.md");
    let md =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let heading = format!("## `{bin}`\n");
    // A bench new since the last whole run gets its section at the end.
    let md = if md.contains(&heading) {
        md
    } else {
        format!("{}\n{heading}\n{}.\n\n", md.trim_end(), section_intro(bin))
    };
    let start = md.find(&heading).expect("added above");
    let end = md[start + heading.len()..]
        .find("\n## ")
        .map_or(md.len(), |i| start + heading.len() + i + 1);
    let (exe, base) = section_command(bin);
    let mut args: Vec<&str> = base.to_vec();
    if quick {
        args.push("--quick");
    }
    args.extend(extra.unwrap_or("").split_whitespace());
    let lines = match lines_from {
        Some(f) => recorded_lines(f)?,
        None if bin == "vm-rdma" => {
            release_build()?;
            crate::vm::bench_lines()?
        }
        None if bin == "fuzz" => fuzz_lines(quick)?,
        None => {
            release_build()?;
            json_bench(exe, &args, 1)?
        }
    };
    let how = match extra {
        Some(e) if !e.trim().is_empty() => format!(" --bench-args \"{}\"", e.trim()),
        _ => String::new(),
    };
    // The section: its description as the code has it now (else the old one), new tables.
    let old = &md[start..end];
    let intro = match section_intro(bin) {
        "" => {
            let intro_end = old.find("\n\n").map_or(old.len(), |i| {
                old[i + 2..]
                    .find("\n\n")
                    .map_or(old.len(), |j| i + 2 + j + 2)
            });
            old[..intro_end].to_string()
        }
        what => format!("{heading}\n{what}.\n\n"),
    };
    let footer = match lines_from {
        Some(_) => format!(
            "Measured by `{exe} {}` and spliced in with `--lines-from`",
            args.join(" ")
        ),
        None => format!("Re-measured alone with `cargo xtask bench --section {bin}{how}`"),
    };
    let section = format!(
        "{intro}{}\n_{footer} on {}._\n\n",
        grouped_tables(&lines),
        today()
    );
    let spliced = format!("{}{}{}", &md[..start], section, &md[end..]);
    // Summary rows: the ones this bench's lines produce are replaced (same "what").
    let rows = target_checks(&lines);
    let mut out: Vec<String> = Vec::new();
    let (mut in_summary, mut inserted) = (false, false);
    for l in spliced.lines() {
        if l.starts_with("## Summary against the targets") {
            in_summary = true;
        } else if in_summary
            && !inserted
            && !l.starts_with('|')
            && out.last().is_some_and(|p| p.starts_with('|'))
        {
            for (what, m, t, r, ok) in &rows {
                out.push(format!(
                    "| {what} | {m} | {t} | {r:.2} | {} |",
                    verdict(*ok)
                ));
            }
            inserted = true;
        }
        if rows
            .iter()
            .any(|(what, ..)| l.starts_with(&format!("| {what} |")))
        {
            continue;
        }
        out.push(l.to_string());
    }
    if !inserted {
        bail!("no summary table in BENCHMARKS.md: run the whole bench");
    }
    let out = out.join("\n") + "\n";
    std::fs::write(&path, &out).with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "xtask bench: replaced the {bin} section and its summary rows in {}",
        path.display()
    );
    let missed: Vec<&String> = rows.iter().filter(|r| !r.4).map(|r| &r.0).collect();
    if !missed.is_empty() {
        bail!("{} target(s) missed: {missed:?}", missed.len());
    }
    Ok(())
}

pub fn run(a: BenchArgs) -> Result<()> {
    if let Some(bin) = &a.section {
        return run_section(
            bin,
            a.quick,
            a.bench_args.as_deref(),
            a.lines_from.as_deref(),
        );
    }
    let runs = if a.quick { 1 } else { 3 };
    let mut failures = Vec::new();
    release_build()?;
    // Before the footprint runs, which must not share the CPUs with anything.
    let vm = crate::vm::bench_lines();
    if let Err(e) = &vm {
        eprintln!("xtask bench: rdma benches in the VM: {e:#}");
        if is_root() {
            failures.push(format!("vm-rdma: {e:#}"));
        }
    }

    let mut sections = Vec::new();
    for bin in [
        "controller-bench",
        "etcd-bench",
        "agent-bench",
        "tracer-bench",
        "verbs-bench",
        "sim-eval",
        "sim-eval-gray",
        "hostping-bench",
        "rc-ring-bench",
    ] {
        // The benches repeat internally and print medians: one invocation each.
        let args: &[&str] = match (bin, a.quick) {
            ("controller-bench", true) => &["--quick"],
            ("etcd-bench", true) => &["--quick"],
            ("agent-bench", true) => &["--runs", "1", "--seconds-per-run", "2"],
            ("tracer-bench", true) => &["--runs", "1", "--seconds-per-run", "1"],
            ("verbs-bench", true) => &["--runs", "1"],
            ("sim-eval", true) => &["--suite", "black", "--quick"],
            ("sim-eval", false) => &["--suite", "black"],
            ("sim-eval-gray", true) => &["--suite", "gray", "--quick"],
            ("sim-eval-gray", false) => &["--suite", "gray"],
            ("hostping-bench", true) => &["--quick"],
            ("rc-ring-bench", true) => {
                &["--runs", "1", "--samples", "20000", "--messages", "100000"]
            }
            _ => &[],
        };
        let res = json_bench(section_command(bin).0, args, 1);
        if let Err(e) = &res {
            eprintln!("xtask bench: {bin} failed: {e:#}");
            failures.push(format!("{bin}: {e:#}"));
        }
        sections.push((bin, res));
    }
    sections.push(("vm-rdma", vm));
    let fuzz = fuzz_lines(a.quick);
    if let Err(e) = &fuzz {
        eprintln!("xtask bench: fuzz: {e:#}");
        failures.push(format!("fuzz: {e:#}"));
    }
    sections.push(("fuzz", fuzz));
    let footprint = (0..runs)
        .map(|i| {
            eprintln!("xtask bench: agent footprint, run {}/{runs}", i + 1);
            footprint_run()
        })
        .collect::<Result<Vec<_>>>();
    if let Err(e) = &footprint {
        eprintln!("xtask bench: footprint failed: {e:#}");
        failures.push(format!("footprint: {e:#}"));
    }

    // Last: the soak runs processes in namespaces for minutes.
    let soak_len = if a.quick { 64 } else { a.soak_sec };
    let soak = crate::soak::measure(Duration::from_secs(soak_len));
    match &soak {
        Ok(r) => {
            let missed = r.target_failures();
            if !missed.is_empty() {
                failures.push(format!("soak: {}", missed.join("; ")));
            }
        }
        Err(e) => {
            eprintln!("xtask bench: soak: {e:#}");
            if is_root() {
                failures.push(format!("soak: {e:#}"));
            }
        }
    }

    let md = render_markdown(a.quick, runs, &sections, &footprint, &soak);
    let path = crate::root().join("BENCHMARKS.md");
    std::fs::write(&path, &md).with_context(|| format!("writing {}", path.display()))?;
    println!("{md}");
    eprintln!("xtask bench: wrote {}", path.display());
    if !failures.is_empty() {
        bail!(
            "{} bench(es) failed: {}",
            failures.len(),
            failures.join("; ")
        );
    }
    Ok(())
}

/// The first paragraph of a bench's section: what it measures and how.
fn section_intro(bin: &str) -> &'static str {
    match bin {
            "controller-bench" => "Controller: GetPinglist latency with 10,000 / 100,000 RNICs (target p99 < 2 ms at 100,000); the web page's JSON endpoints at 100,000 RNICs and 200,000 paths (HTTP/1.1, a connection per request) next to GetPinglist on the same server; registration throughput, PathSummary ingest (target 200,000/s on one core); analyzer_localize: 30 s windows of a 100,000-RNIC fabric (1.2 million summaries, a dead RNIC and a dead link among them, a fifth of the inter-ToR paths with per-label detail from the background) ingested and localized on one core, six in a row, as a share of the window: the worse of the first (cold) and the median once the gray detector's history is full (target < 0.3); identity_check: GetPinglist p99 and ReportProbeAnalysis ingest of a controller binding agents to their certificates (mtls) against the same calls without client identities (tls), interleaved (targets p99 <= 1.2x, ingest >= 0.9x)",
            "fuzz" => "libFuzzer (`cargo xtask fuzz`, cargo-fuzz on nightly with AddressSanitizer) over every untrusted input: each target of `fuzz/fuzz_targets/` for a minute from its checked-in corpus (a fresh copy each run, so coverage does not build up between runs): executions, executions per second, coverage (edges, features) and the corpus it ended with; any crash fails the run",
            "etcd-bench" => "The controller on etcd (Debian's etcd-server on loopback, one member) next to SQLite (a file): \
                GetPinglist p50/p99 with 100,000 RNICs (25,000 hosts of 4 RNICs, 10 RNICs per ToR), each store's server against ListViolations(limit=0) on itself; \
                registry_fill: hosts registered per second through the registry API, sequential (etcd: a lease grant or keepalive, a transaction, and the wait for the replica's own watch to apply it); \
                register_agent: sequential RegisterAgent RPCs per second; \
                replica_convergence: a second replica started on the filled etcd until its index holds every RNIC, next to the controller restarted on its SQLite file",
            "agent-bench" => "Agent over udp: probe round trips per second on one core vs a minimal timestamped UDP ping-pong in the same run (target ratio >= 0.7); a Prometheus /metrics scrape (collection + OpenMetrics encoding) of an agent with 64 targets in 64 ToRs, against one without targets",
            "tracer-bench" => "Service tracer: QP events per second from ring-buffer records to the flow table on one core (target > 1,000,000/s) vs copying the same bytes; per-call cost of the libibverbs uprobe vs the untraced call, same run. \
                The untraced function is an empty stand-in (about 2 ns), so the ratio is large; what matters is the absolute cost per traced call \
                (two traps, the eBPF program and a ring-buffer wake-up of the reader on this VM), paid once per QP create/modify/destroy: \
                a real ibv_modify_qp is itself a command to the NIC that takes tens of microseconds, and data-path verbs (post_send, poll_cq) are not traced. \
                probing_under_qp_storm: two real drivers probing at 4,000 probes/s offered, quiet vs while a thread hammers the traced create/modify/destroy as fast as it can (ratio = storm/quiet, target >= 0.9)",
            "vm-rdma" => "rdma over soft-RoCE, in the qemu guest of the VM tests (TCG: absolute numbers are several times slower than hardware, the ratios are what counts), release build. \
                rxe_probe_round_trips: the agent's two real drivers probing each other between two rxe devices behind a bridge (agent-bench --rdma, one probe in flight, and 16), \
                against libibverbs' own ibv_ud_pingpong between the same two GIDs, busy-polling and sleeping on completion events (-e); rounds alternated, medians. \
                A probe is three datagrams (probe, two ACKs) where a ping-pong round trip is two, and the agent sleeps on completion channels where the busy ping-pong spins. \
                service_path_latency: from each QP's ibv_modify_qp to RTR (stamped by rdma-qp-churn) until the controller lists its service path, agents in kprobe mode, \
                sampled every 20 ms; bounded by the agent's service_flow_report_interval_ms. \
                agent_cpu_rdma_vs_udp: a prober agent (200 probes/s offered to one target; 640/s, the packet rate of 64 targets x 10/s, saturates the guest's two TCG vCPUs on either transport) and a responder-only agent, \
                real processes between the same two addresses, on rdma (rxe) and then on udp in the same guest; CPU is utime+stime from /proc over 10 s; \
                under TCG the kernel's rxe work runs in softirq and is billed partly to whoever is on the CPU. \
                dead_peer_cost: the same rdma pair, the live target's probes/s alone vs with a registered dead GID (ibv_create_ah times out after about a second) on the prober's pinglist at the same rate. \
                rc_ring_echo_rtt_rxe: the polled RC write ring's depth-one echo (rpingmesh-rc-ring, 32-byte messages, 5,000 round trips) against ib_write_lat's round trip (twice its typical one-way latency, 32 bytes, 5,000 iterations) between the same two GIDs, rounds alternated; \
                rc_ring_throughput_rxe: 100,000 32-byte messages streamed through a 64 KiB ring (exact credits) against ib_write_bw's message rate at 32 bytes. \
                The ring's echo server spins between polls (--busy-poll) as ib_write_lat does. \
                rc_ring_poller_cpu_rxe: two agents probing each other (UD at 10/s), each agent's CPU over 20 s with no RC ring and then with one ring each way \
                at the defaults (a ring probe a second, 200 us lead, 1 ms hot wait): the cost of the ring poller's windows and its 100 ms cold checks"
            ,
"sim-eval" => "Fault localization accuracy on the simulated fabric (`sim/`: the real probing core, aggregation and analyzer in virtual time; see `sim/src/eval.rs`). \
                A suite of randomized, seeded scenarios (600 s each, 30 s windows) on four 512-RNIC fabric shapes (64 ToRs x 4 spines x 4 hosts x 2 RNICs; 32 x 8 x 4 x 4; 64 x 8 x 2 x 4; 256 x 4 x 1 x 2, ToRs of two RNICs), \
                every 8th fault-free, the others with one or two simultaneous faults on different ToRs, kinds cycling through all seven, parameters drawn from: flap period 10-40 s and down 20-50% of it, host stall 2-20 ms, link loss 2-20% in a random direction, link latency +100-500 us. \
                A finding is true when its kind and location match a fault whose time overlaps it; a false finding counts against the fault kind its symptom names. \
                Detection time is from the fault's start to the finding's opening, in windows (a finding opens when the first blaming window has settled, 5 s after it ends). \
                localization_fault_free: one-hour fault-free runs of the four fabrics (plus the suite's fault-free scenarios), every finding counted. \
                localization_impact: which jobs each fault's finding names against the jobs the fault hurts (as gray_impact). \
                The suite's own cost is in localization_suite",
"sim-eval-gray" => "Gray failures on the simulated fabric (`sim-eval --suite gray`). \
                The gray suite (`sim/src/gray.rs`, default 192 scenarios of 600 s, faults from 150 s on: the controller starts cold and learns its baseline) runs on four 1,024-RNIC fabrics (64 x 8 x 4 x 4; 64 x 8 x 16 x 8 rail-optimized; 128 x 4 x 2 x 4; 128 x 8 x 8 x 8 rail-optimized) \
                over a realistic background (loss 1e-5 per link traversal, spread 3x between links, queueing of mean 3 us on 0.2% of traversals, 0.3 us link jitter on 2 us), \
                faults cycling through link loss 0.5/1/2% (one direction or both), link latency +10/20/50 us, host stalls of mean 0.5/1/2 ms and RNIC loss 0.5/1/2%; of every 8 scenarios one is fault-free, three have one fault of 5-10 windows, two a short one of 2-5 windows, two three faults of different kinds at once. \
                gray_localization: per kind and magnitude, for faults of 3 windows and more; gray_short_faults: recall of the shorter ones; gray_focus_ablation: the first scenarios again with adaptive probing off (detection with and without); \
                gray_before_after: the first scenarios again with the rules alone (phase 1's thresholds, the localizer before the gray detector): recall, precision and p95 before and after; \
                gray_suite: its cost and the extra FOCUS probes; gray_impact: which jobs each fault's finding names (48 ring jobs of 32 RNICs x 4 QPs per fabric, sim/src/workloads.rs) against the jobs the fault hurts by the fabric's own routing, precision and recall per fault kind; fault_free_day: fault-free hours (24 by default; the footer names the sizes of this run) of a 2,048-RNIC fabric (64 x 8 x 4 x 8) on the same background, every finding counted, and the strongest evidence short of a finding (max_score_nats, against the naming bar bar_nats: ln(tests a day / 0.01))",
            "verbs-bench" => "rdma backend without hardware: the address-handle lookup every send pays (AhTable: LRU hit plus the age and loss checks) vs a plain HashMap lookup, and completion -> event (translate + SPSC ring push/pop) vs a plain VecDeque push/pop, same run. \
                The Go/Zig version calls ibv_create_ah for every probe it sends (a verbs call into the provider, on most NICs a kernel or firmware command); \
                ours creates one AH per (GID, flow label, SL, TC) path off the send path and reuses it, so the per-send cost is the lookup below. \
                ah_hit_rate: 4 probe rounds over 256 targets x 64 flow labels, with the cache at its default 4096 entries (every round evicts what the next needs) vs sized to the pinglist as the agent does",
            "hostping-bench" => "Hostping (intra-host diagnosis, `hostping/`). hostping_inference: Algorithm 1 (link-state inference over the host tree) on a randomized suite of hosts \
                (one or two sockets, two or three root ports each, PCIe switches with an RNIC and one to three GPUs, or a lone device under a port), each built as a sysfs tree and discovered like a live host, \
                with one fault of the paper's Figure 8/10 patterns (RNIC or GPU PCIe link, memory channel, UPI, CPU root port transit, ACS misconfiguration, a flapping memory channel; \
                on a busy host a GPU link, an overloaded UPI or memory channel, told from failures by the bus-utilization input) or none (every 11th), taking 25-75% of what crosses the link, 2% timing noise, 20 rounds of loopback tests each. \
                A finding is true when it names the faulty link with the right cause (failure, congestion, flapping). A draw whose faulty link no set of path verdicts can tell apart from another is drawn again and counted (redrawn_unidentifiable). \
                hostping_cpu: what Hostping adds to a running 4-RNIC agent: R2R probing between its four RNICs on the agent's own drivers (Host targets; udp over loopback, a probe per RNIC per 100 ms, 500 ms timeout) \
                plus the Hostping monitor (R2R windows, four ports' counters once a second from files), the process's CPU time as a share of one core (target < 0.002) \
                minus the same four drivers running with nothing to probe for as long (the baseline, same run). The user/system split shows where it goes: \
                system time is the kernel's UDP/IP path over loopback and the wake-ups (an RNIC does that path in hardware on the rdma transport), user time is the agent's own work",
            "rc-ring-bench" => "Polled RC write rings (seed 001), shared-memory backend (`rc-ring/src/shm.rs`: the same sans-IO sender and receiver over a file two processes map). \
                ring_round_trip_shm: depth-one echo of 32-byte messages between two processes (ring write, poll, echo write, poll), against two threads bouncing one cache line (the floor of any cross-core handoff). \
                ring_throughput_shm: one million echoed messages pipelined through a 64 KiB ring (256 slots, exact credits) against the same messages, built and checked alike, through a pair of std bounded channels (256 deep) between two threads. \
                Over RC on soft-RoCE, against ib_write_lat and ib_write_bw, see the vm-rdma section (rc_ring_*)",
            _ => "",
        }
}

// ---------------------------------------------------------------------------------------
// JSON-lines benches

type Line = Map<String, Value>;

/// Every libFuzzer target for a minute (5 s with --quick), through `cargo xtask fuzz`.
fn fuzz_lines(quick: bool) -> Result<Vec<Line>> {
    crate::fuzz::run(crate::fuzz::FuzzArgs {
        seconds: if quick { 5 } else { 60 },
        target: None,
    })?;
    recorded_lines(&crate::fuzz::results_path())
}

/// Runs a bench binary `runs` times; returns per-line medians over the runs.
/// The JSON object lines of a recorded bench run (other lines skipped).
fn recorded_lines(path: &Path) -> Result<Vec<Line>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<Line> = text
        .lines()
        .filter_map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(m)) => Some(m),
            _ => None,
        })
        .collect();
    if lines.is_empty() {
        bail!("{}: no JSON lines", path.display());
    }
    Ok(lines)
}

fn json_bench(bin: &str, args: &[&str], runs: usize) -> Result<Vec<Line>> {
    let exe = procs::release_bin(bin)?;
    let mut all_runs = Vec::new();
    for i in 0..runs {
        eprintln!("xtask bench: {bin} run {}/{runs}", i + 1);
        let mut cmd = Command::new(&exe);
        cmd.args(args);
        cmd.current_dir(crate::root())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let mut lines = Vec::new();
        for l in BufReader::new(child.stdout.take().expect("piped")).lines() {
            let l = l?;
            match serde_json::from_str::<Value>(&l) {
                Ok(Value::Object(m)) => {
                    eprintln!("  {l}");
                    lines.push(m)
                }
                _ => eprintln!("  {bin}: {l}"),
            }
        }
        let st = child.wait()?;
        if !st.success() {
            bail!("{bin} exited with {st}");
        }
        if lines.is_empty() {
            bail!("{bin} printed no JSON lines");
        }
        all_runs.push(lines);
    }
    Ok(median_lines(&all_runs))
}

/// Identity of a line across runs: its string fields, plus its rank among lines with the
/// same string fields.
fn line_keys(lines: &[Line]) -> Vec<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    lines
        .iter()
        .map(|l| {
            let base: Vec<String> = l
                .iter()
                .filter(|(_, v)| v.is_string())
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let base = base.join(",");
            let n = seen.entry(base.clone()).or_default();
            *n += 1;
            format!("{base}#{n}")
        })
        .collect()
}

/// Median of every numeric field over the runs, keeping the first run's line order.
pub fn median_lines(runs: &[Vec<Line>]) -> Vec<Line> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    let keyed: Vec<BTreeMap<String, &Line>> = runs
        .iter()
        .map(|r| line_keys(r).into_iter().zip(r.iter()).collect())
        .collect();
    let mut out = Vec::new();
    for (key, line) in line_keys(first).into_iter().zip(first.iter()) {
        let mut m = Line::new();
        for (k, v) in line {
            if v.is_number() {
                let mut xs: Vec<f64> = keyed
                    .iter()
                    .filter_map(|r| r.get(&key)?.get(k)?.as_f64())
                    .collect();
                xs.sort_by(|a, b| a.total_cmp(b));
                let med = xs[xs.len() / 2];
                let keep_int = v.is_u64() || v.is_i64();
                m.insert(
                    k.clone(),
                    if keep_int {
                        Value::from(med.round() as i64)
                    } else {
                        Value::from(med)
                    },
                );
            } else {
                m.insert(k.clone(), v.clone());
            }
        }
        out.push(m);
    }
    out
}

fn cell(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => {
                if f.abs() >= 100.0 {
                    format!("{f:.0}")
                } else if f.abs() >= 1.0 {
                    format!("{f:.2}")
                } else {
                    format!("{f:.4}")
                }
            }
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

/// A markdown table whose columns are the union of the lines' keys in first-seen order.
pub fn json_table(lines: &[Line]) -> String {
    let mut cols: Vec<&str> = Vec::new();
    for l in lines {
        for k in l.keys() {
            if !cols.contains(&k.as_str()) {
                cols.push(k);
            }
        }
    }
    let mut s = format!("| {} |\n|{}\n", cols.join(" | "), "---|".repeat(cols.len()));
    for l in lines {
        let row: Vec<String> = cols
            .iter()
            .map(|c| l.get(*c).map(cell).unwrap_or_default().replace('|', "\\|"))
            .collect();
        let _ = writeln!(s, "| {} |", row.join(" | "));
    }
    s
}

// ---------------------------------------------------------------------------------------
// Agent footprint

#[derive(Debug, Clone)]
pub struct Footprint {
    cpu_pct: f64,
    rss_mib: f64,
    probes_per_sec: f64,
    targets_probed: usize,
    sleep_rss_mib: f64,
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let st = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .with_context(|| format!("/proc/{pid}/stat"))?;
    Ok(st.utime + st.stime)
}

/// VmRSS in KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let st = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.status())
        .with_context(|| format!("/proc/{pid}/status"))?;
    st.vmrss.context("no VmRSS in /proc/<pid>/status")
}

fn footprint_run() -> Result<Footprint> {
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
    all.push(Proc::spawn(dir, "responder", &agent_bin, &resp_args)?);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let res = (|| -> Result<Footprint> {
        rt.block_on(wait_rnics(addr, TARGETS, Duration::from_secs(30), &mut all))?;
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
        all.push(Proc::spawn(dir, "measured", &agent_bin, &measured_args)?);
        let pid = all[2].pid();
        // Warm-up: until the measured agent reports successful paths to every target.
        rt.block_on(wait_targets(
            addr,
            TARGETS,
            Duration::from_secs(45),
            &mut all,
        ))?;
        std::thread::sleep(Duration::from_secs(2));

        let mut sleeper = Command::new("sleep")
            .arg("120")
            .stdin(Stdio::null())
            .spawn()
            .context("starting the `sleep` baseline")?;
        let start_unix = unix_ns();
        let t0 = Instant::now();
        let c0 = cpu_ticks(pid)?;
        let mut rss = Vec::new();
        while t0.elapsed() < SAMPLE {
            std::thread::sleep(Duration::from_secs(1));
            rss.push(rss_kib(pid)?);
        }
        let c1 = cpu_ticks(pid)?;
        let wall = t0.elapsed().as_secs_f64();
        let sleep_rss = rss_kib(sleeper.id()).unwrap_or(0);
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        let hz = procfs::ticks_per_second() as f64;
        let cpu_pct = (c1 - c0) as f64 / hz / wall * 100.0;
        rss.sort_unstable();
        let rss_med = rss[rss.len() / 2];
        let (rate, targets) = rt.block_on(probe_rate(addr, start_unix))?;
        for p in all.iter_mut() {
            if let Some(st) = p.exit_status() {
                bail!(
                    "{} exited ({st}) during the bench:\n{}",
                    p.name,
                    p.log_tail(20)
                );
            }
        }
        let f = Footprint {
            cpu_pct,
            rss_mib: rss_med as f64 / 1024.0,
            probes_per_sec: rate,
            targets_probed: targets,
            sleep_rss_mib: sleep_rss as f64 / 1024.0,
        };
        eprintln!("  {f:?}");
        Ok(f)
    })();
    procs::stop_all(&mut all);
    res
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn check_alive(all: &mut [Proc]) -> Result<()> {
    for p in all.iter_mut() {
        if let Some(st) = p.exit_status() {
            bail!("{} exited ({st}):\n{}", p.name, p.log_tail(20));
        }
    }
    Ok(())
}

async fn wait_rnics(addr: SocketAddr, n: usize, timeout: Duration, all: &mut [Proc]) -> Result<()> {
    let mut op = procs::operator(addr).await?;
    let deadline = Instant::now() + timeout;
    loop {
        check_alive(all)?;
        let got = op
            .list_rnics(ListRnicsRequest::default())
            .await
            .map(|r| r.into_inner().rnics.len())
            .unwrap_or(0);
        if got >= n {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("only {got} of {n} responder RNICs registered within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

const MEASURED_GID: &str = "0000:0000:0000:0000:0000:ffff:7f00:0301"; // 127.0.3.1

async fn wait_targets(
    addr: SocketAddr,
    n: usize,
    timeout: Duration,
    all: &mut [Proc],
) -> Result<()> {
    let mut op = procs::operator(addr).await?;
    let deadline = Instant::now() + timeout;
    loop {
        check_alive(all)?;
        let got = op
            .list_paths(ListPathsRequest {
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
            .unwrap_or(0);
        if got >= n {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the measured agent reached only {got} of {n} targets within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Achieved probe rate (all targets) and number of targets probed, from the windows that
/// started during sampling.
async fn probe_rate(addr: SocketAddr, since_ns: u64) -> Result<(f64, usize)> {
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

fn median_f(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

// ---------------------------------------------------------------------------------------
// BENCHMARKS.md

fn machine() -> String {
    let nproc = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cpu}, nproc {nproc}, kernel {kernel}")
}

fn today() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| format!("unix time {}", unix_ns() / 1_000_000_000))
}

fn render_markdown(
    quick: bool,
    runs: usize,
    sections: &[(&str, Result<Vec<Line>>)],
    footprint: &Result<Vec<Footprint>>,
    soak: &Result<SoakReport>,
) -> String {
    let mut s = String::from("# Benchmarks\n\n");
    let _ = writeln!(
        s,
        "Written by `cargo xtask bench{}` on {} — machine: {}.\n\
         Footprint numbers are medians of {runs} run(s); controller-bench and agent-bench \
         repeat internally and report their own medians{}.\n",
        if quick { " --quick" } else { "" },
        today(),
        machine(),
        if quick {
            " (quick mode: a smoke test, not a measurement)"
        } else {
            ""
        }
    );

    s += &summary_table(sections, footprint, soak);
    s += "## Agent footprint: 64 targets at 10 probes/s each over udp (loopback)\n\n";
    s += "A responder-only agent hosts 64 pseudo-RNICs (127.0.2.1-64, ToR t1); the measured \
          agent (127.0.3.1, ToR t1, probe interval 100 ms, ToR-mesh rate 10/s) probes all \
          of them. CPU is utime+stime from /proc/<pid>/stat over 20 s after warm-up, RSS \
          is VmRSS (median of 1 s samples).\n\n";
    match footprint {
        Ok(runs) if !runs.is_empty() => {
            let cpu = median_f(runs.iter().map(|r| r.cpu_pct).collect());
            let rss = median_f(runs.iter().map(|r| r.rss_mib).collect());
            let rate = median_f(runs.iter().map(|r| r.probes_per_sec).collect());
            let sleep = median_f(runs.iter().map(|r| r.sleep_rss_mib).collect());
            let targets = runs.iter().map(|r| r.targets_probed).min().unwrap_or(0);
            let want_rate = TARGETS as f64 * RATE_PER_TARGET;
            s += "| metric | measured | target | ratio to target |\n|---|---|---|---|\n";
            let _ = writeln!(
                s,
                "| CPU, % of one core | {cpu:.3} | < {CPU_TARGET_PCT} | {:.2} ({}) |",
                cpu / CPU_TARGET_PCT,
                verdict(cpu < CPU_TARGET_PCT)
            );
            let _ = writeln!(
                s,
                "| RSS (VmRSS) | {rss:.1} MiB | < {RSS_TARGET_MIB} MiB | {:.2} ({}) |",
                rss / RSS_TARGET_MIB,
                verdict(rss < RSS_TARGET_MIB)
            );
            let _ = writeln!(
                s,
                "| probes/s achieved (all targets) | {rate:.0} | {want_rate:.0} | {:.2} |",
                rate / want_rate
            );
            let _ = writeln!(
                s,
                "| targets probed (min over runs) | {targets} | {TARGETS} | |"
            );
            let _ = writeln!(s, "| baseline: RSS of `sleep` | {sleep:.1} MiB | | |\n");
            s += "Per run: ";
            let per: Vec<String> = runs
                .iter()
                .map(|r| {
                    format!(
                        "CPU {:.3}% / RSS {:.1} MiB / {:.0} probes/s",
                        r.cpu_pct, r.rss_mib, r.probes_per_sec
                    )
                })
                .collect();
            s += &per.join("; ");
            s += ".\n\n";
        }
        Ok(_) => s += "No runs.\n\n",
        Err(e) => {
            let _ = writeln!(s, "**Failed:** {e:#}\n");
        }
    }

    for (bin, res) in sections {
        let what = section_intro(bin);
        let _ = writeln!(s, "## `{bin}`\n\n{what}.\n");
        match res {
            Ok(lines) => s += &grouped_tables(lines),
            Err(e) => {
                let _ = writeln!(s, "**Failed:** {e:#}");
            }
        }
        s += "\n";
    }
    s += "## Restart-and-fault soak (`cargo xtask soak`)\n\n";
    s += "A controller (SQLite file) and 4 agents over udp, each in its own network namespace \
          on one bridge, probing their ToR mesh at 10 probes/s per path, time-compressed \
          (active threshold 4 s, stale 8 s, pinglist refresh and analysis window 2 s). A 60 s \
          fault cycle repeats: controller restarted (s 8), controller down 6 s, past the \
          active threshold (s 16), an agent restarted (s 28), the controller frozen 5 s with \
          SIGSTOP, its RPCs hanging and the agents' reports backing up (s 36), an agent's \
          namespace cut off 6 s by an nftables drop (s 44), and in the first cycle an agent \
          killed with -9 for good (s 55). The controller restarts happen in the first and the \
          last cycle, so one controller process lives through the middle. Windows expected: \
          every ordered pair of agents both running a window before and through it, neither \
          cut off near it, the killed agent's last windows aside; convergence: from the \
          fault's end until every live agent's latest successful pinglist refresh holds \
          exactly the other live agents. RSS 5 s and 60 s after each process's start and \
          just before its end; the growth target (< 5%) is from 60 s (warm: the analyzer \
          holds its 20 windows per path, caches are filled) to the end, for the processes \
          that ran at least half the soak.\n\n";
    match soak {
        Ok(r) => s += &r.markdown(),
        Err(e) => {
            let _ = writeln!(s, "**Not run:** {e:#}");
        }
    }
    s += "\n";
    s
}

/// One target check: (what, measured, target, ratio measured/target, met).
type Check = (String, String, String, f64, bool);

/// Precision and recall (>= 0.98) of one accuracy line, and its detection p95 against
/// `p95_windows` when given.
fn accuracy_checks(
    out: &mut Vec<Check>,
    what: &str,
    kind: &str,
    l: &Line,
    p95_windows: Option<f64>,
) {
    let num = |k: &str| l.get(k).and_then(|v| v.as_f64());
    for k in ["precision", "recall"] {
        if let Some(v) = num(k) {
            out.push((
                format!("{what} {k}, {kind}"),
                format!("{v:.3}"),
                ">= 0.98".into(),
                v / 0.98,
                v >= 0.98,
            ));
        }
    }
    if let (Some(d), Some(max)) = (num("detection_windows_p95"), p95_windows) {
        out.push((
            format!("{what} detection p95, {kind}"),
            format!("{d:.2} windows"),
            format!("<= {max:.0} windows"),
            d / max,
            d <= max,
        ));
    }
}

/// Checks of the issue's targets against the known fields of the bench lines.
pub fn target_checks(lines: &[Line]) -> Vec<Check> {
    let num = |l: &Line, k: &str| l.get(k).and_then(|v| v.as_f64());
    let text = |l: &Line, k: &str| l.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
    let mut out = Vec::new();
    for l in lines {
        let bench = text(l, "bench");
        match bench.as_str() {
            "get_pinglist" => {
                if let (Some(n), Some(p99)) = (num(l, "rnics"), num(l, "p99_ns")) {
                    if n >= 100_000.0 {
                        let store = match text(l, "store") {
                            s if s.is_empty() => String::new(),
                            s => format!(", {s}"),
                        };
                        let what = format!(
                            "GetPinglist p99, {n:.0} RNICs, {}{store}",
                            text(l, "pinglist_type")
                        );
                        out.push((
                            what,
                            format!("{:.3} ms", p99 / 1e6),
                            "< 2 ms".into(),
                            p99 / 2e6,
                            p99 < 2e6,
                        ));
                    }
                }
            }
            "tracer_pipeline" | "tracer_pipeline_with_workloads" => {
                if let (Some(r), Some(t)) = (num(l, "median"), num(l, "target")) {
                    out.push((
                        if bench == "tracer_pipeline" {
                            "QP events through the tracer pipeline, one core".into()
                        } else {
                            "QP events through the tracer pipeline with each flow's workload resolved, one core".into()
                        },
                        format!("{r:.0}/s"),
                        format!("> {t:.0}/s"),
                        r / t,
                        r > t,
                    ));
                }
            }
            "localization" => {
                accuracy_checks(
                    &mut out,
                    "localization",
                    &text(l, "fault_kind"),
                    l,
                    Some(2.0),
                );
            }
            "hostping_inference" => {
                let kind = text(l, "fault_kind");
                accuracy_checks(&mut out, "hostping link inference", &kind, l, None);
            }
            "finding_impact" => {
                if let (Some(r), Some(n)) = (num(l, "ratio_to_window"), num(l, "rnics")) {
                    out.push((
                        format!(
                            "impact of 8 findings over {:.0} service paths per 30 s window, {n:.0} RNICs, one core",
                            num(l, "service_paths").unwrap_or(0.0)
                        ),
                        format!("{:.4} of the window", r),
                        "< 0.05".into(),
                        r / 0.05,
                        r < 0.05,
                    ));
                }
            }
            // Which jobs a finding says it hurts, over every fault kind at once.
            "localization_impact" | "gray_impact" if text(l, "fault_kind") == "all" => {
                for k in ["precision", "recall"] {
                    if let Some(v) = num(l, &format!("impact_{k}")) {
                        out.push((
                            format!("{bench} {k} (jobs a finding names), all kinds"),
                            format!("{v:.3}"),
                            ">= 0.98".into(),
                            v / 0.98,
                            v >= 0.98,
                        ));
                    }
                }
            }
            "hostping_cpu" => {
                if let (Some(c), Some(t)) = (num(l, "cpu_share_of_core"), num(l, "target")) {
                    out.push((
                        "hostping R2R + hardware monitor CPU, 4 RNICs".into(),
                        format!("{:.3}% of a core", c * 100.0),
                        format!("< {:.1}%", t * 100.0),
                        c / t,
                        c < t,
                    ));
                }
                if let (Some(u), Some(t)) = (num(l, "user_share_of_core"), num(l, "target")) {
                    out.push((
                        "hostping R2R + hardware monitor CPU, agent user space only".into(),
                        format!("{:.3}% of a core", u * 100.0),
                        format!("< {:.1}%", t * 100.0),
                        u / t,
                        u < t,
                    ));
                }
            }
            "gray_localization" if l.get("magnitude").is_none() => {
                let kind = text(l, "fault_kind");
                accuracy_checks(&mut out, "gray localization", &kind, l, Some(3.0));
            }
            "fault_free_day" => {
                if let (Some(h), Some(n), Some(r)) =
                    (num(l, "hours"), num(l, "findings"), num(l, "rnics"))
                {
                    out.push((
                        format!("findings over {h:.0} fault-free hours, {r:.0} RNICs, realistic background"),
                        format!("{n:.0}"),
                        "0".into(),
                        n,
                        n == 0.0,
                    ));
                }
            }
            "localization_fault_free" => {
                if let (Some(h), Some(n)) = (num(l, "hours"), num(l, "findings")) {
                    out.push((
                        format!("findings over {h:.0} fault-free hours, 512 RNICs"),
                        format!("{n:.0}"),
                        "0".into(),
                        n,
                        n == 0.0,
                    ));
                }
            }
            "analyzer_localize" => {
                if let Some(r) = num(l, "ratio_to_window") {
                    let cold = num(l, "cold_ratio_to_window").unwrap_or(r);
                    out.push((
                        format!(
                            "analyzer ingest + localization of one 30 s window, {:.0} RNICs, one core (the worse of the first window and a running controller's)",
                            num(l, "rnics").unwrap_or(0.0)
                        ),
                        format!(
                            "{r:.3} of the window (first {cold:.3}, running {:.3})",
                            num(l, "steady_ratio_to_window").unwrap_or(r)
                        ),
                        "< 0.3".into(),
                        r / 0.3,
                        r < 0.3,
                    ));
                }
            }
            "identity_check" => {
                let n = num(l, "rnics").unwrap_or(0.0);
                if let (Some(p), Some(i)) = (num(l, "ratio_pinglist_p99"), num(l, "ratio_ingest")) {
                    out.push((
                        format!("GetPinglist p99 with agent identities bound (mtls) vs none (tls), {n:.0} RNICs"),
                        format!("{p:.3}x"),
                        "<= 1.2x".into(),
                        p / 1.2,
                        p <= 1.2,
                    ));
                    out.push((
                        format!("ReportProbeAnalysis ingest with identities bound vs none, {n:.0} RNICs"),
                        format!("{i:.3}x"),
                        ">= 0.9x".into(),
                        i / 0.9,
                        i >= 0.9,
                    ));
                }
            }
            "analyzer_ingest" => {
                if let Some(r) = num(l, "per_sec") {
                    out.push((
                        "PathSummary ingest, one core".into(),
                        format!("{r:.0}/s"),
                        ">= 200000/s".into(),
                        r / 2e5,
                        r >= 2e5,
                    ));
                }
            }
            _ => {
                // Lines that state their own target and ratio (ratio >= target wanted).
                if let (Some(r), Some(t)) = (num(l, "ratio"), num(l, "target")) {
                    let what = match bench.as_str() {
                        "agent_vs_baseline" => {
                            "agent probe round trips / timestamped UDP ping-pong".to_string()
                        }
                        _ => bench.clone(),
                    };
                    out.push((what, format!("{r:.3}"), format!(">= {t}"), r / t, r >= t));
                }
            }
        }
    }
    out
}

fn summary_table(
    sections: &[(&str, Result<Vec<Line>>)],
    footprint: &Result<Vec<Footprint>>,
    soak: &Result<SoakReport>,
) -> String {
    let mut rows: Vec<Check> = Vec::new();
    if let Ok(runs) = footprint {
        if !runs.is_empty() {
            let cpu = median_f(runs.iter().map(|r| r.cpu_pct).collect());
            let rss = median_f(runs.iter().map(|r| r.rss_mib).collect());
            rows.push((
                "agent CPU, 64 targets x 10/s".into(),
                format!("{cpu:.3}% of a core"),
                format!("< {CPU_TARGET_PCT}%"),
                cpu / CPU_TARGET_PCT,
                cpu < CPU_TARGET_PCT,
            ));
            rows.push((
                "agent RSS, 64 targets x 10/s".into(),
                format!("{rss:.1} MiB"),
                format!("< {RSS_TARGET_MIB} MiB"),
                rss / RSS_TARGET_MIB,
                rss < RSS_TARGET_MIB,
            ));
        }
    }
    for (_, res) in sections {
        if let Ok(lines) = res {
            rows.extend(target_checks(lines));
        }
    }
    if let Ok(r) = soak {
        rows.extend(soak_checks(r));
    }
    let mut s = String::from("## Summary against the targets\n\n| what | measured | target | ratio to target | |\n|---|---|---|---|---|\n");
    for (what, m, t, r, ok) in &rows {
        let _ = writeln!(s, "| {what} | {m} | {t} | {r:.2} | {} |", verdict(*ok));
    }
    if rows.is_empty() {
        s += "| (no bench produced a comparable number) | | | | |\n";
    }
    s += "\n";
    s
}

/// One table per value of the `bench` field, in first-seen order.
pub fn grouped_tables(lines: &[Line]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<String, Vec<Line>> = BTreeMap::new();
    for l in lines {
        let b = l
            .get("bench")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_string();
        if !groups.contains_key(&b) {
            order.push(b.clone());
        }
        let mut l = l.clone();
        l.remove("bench");
        groups.entry(b).or_default().push(l);
    }
    let mut s = String::new();
    for b in order {
        if !b.is_empty() {
            let _ = writeln!(s, "### {b}\n");
        }
        s += &json_table(&groups[&b]);
        s += "\n";
    }
    s
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "meets target"
    } else {
        "MISSES target"
    }
}

/// The soak's targets as summary rows.
fn soak_checks(r: &SoakReport) -> Vec<Check> {
    let mut rows = Vec::new();
    let lost = r.windows_lost.len();
    rows.push((
        format!(
            "soak {:.0} s: windows lost of {} expected",
            r.duration_sec, r.windows_expected
        ),
        lost.to_string(),
        "0".into(),
        lost as f64,
        lost == 0,
    ));
    let bound = (soak::REFRESH_SEC + 1) as f64;
    let worst = r
        .restart_convergence()
        .iter()
        .map(|(_, c)| c.unwrap_or(f64::INFINITY))
        .fold(0.0, f64::max);
    rows.push((
        "soak: pinglist convergence after restarts, max".into(),
        format!("{worst:.2} s"),
        format!("<= {bound} s (one refresh + 1 s)"),
        worst / bound,
        worst <= bound,
    ));
    if let Some(g) = r.max_rss_growth_pct(r.duration_sec / 2.0) {
        rows.push((
            "soak: RSS growth from 60 s to end, processes that ran half the soak or more".into(),
            format!("{g:+.1}%"),
            format!("< {}%", soak::RSS_GROWTH_TARGET_PCT),
            g / soak::RSS_GROWTH_TARGET_PCT,
            g < soak::RSS_GROWTH_TARGET_PCT,
        ));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked_from_known_fields() {
        let lines: Vec<Line> = [
            r#"{"bench":"get_pinglist","rnics":100000,"p99_ns":1500000,"pinglist_type":"tor_mesh"}"#,
            r#"{"bench":"get_pinglist","rnics":10000,"p99_ns":9000000}"#,
            r#"{"bench":"analyzer_ingest","per_sec":100000.0}"#,
            r#"{"bench":"agent_vs_baseline","ratio":0.8,"target":0.7}"#,
        ]
        .iter()
        .map(|t| serde_json::from_str(t).unwrap())
        .collect();
        let c = target_checks(&lines);
        assert_eq!(c.len(), 3, "{c:?}");
        assert!(c[0].4 && (c[0].3 - 0.75).abs() < 1e-9);
        assert!(!c[1].4 && (c[1].3 - 0.5).abs() < 1e-9);
        assert!(c[2].4);
        // Gray rows: the per-kind row is checked (p95 against 3 windows), not the
        // per-magnitude ones; a fault-free day with a finding misses.
        let gray: Vec<Line> = [
            r#"{"bench":"gray_localization","fault_kind":"link_loss","precision":1.0,"recall":0.99,"detection_windows_p95":3.3}"#,
            r#"{"bench":"gray_localization","fault_kind":"link_loss","magnitude":"0.5%","recall":0.5}"#,
            r#"{"bench":"fault_free_day","hours":24,"rnics":2048,"findings":1}"#,
        ]
        .iter()
        .map(|t| serde_json::from_str(t).unwrap())
        .collect();
        let g = target_checks(&gray);
        assert_eq!(g.len(), 4, "{g:?}");
        assert!(g[0].4 && g[1].4 && !g[2].4 && (g[2].3 - 1.1).abs() < 1e-9);
        assert!(!g[3].4 && g[3].0.contains("2048 RNICs"), "{g:?}");
        let t = grouped_tables(&lines);
        assert!(
            t.contains("### get_pinglist") && t.contains("### analyzer_ingest"),
            "{t}"
        );
    }

    #[test]
    fn own_cpu_and_rss_are_read() {
        let me = std::process::id();
        assert!(rss_kib(me).unwrap() > 1024);
        cpu_ticks(me).unwrap();
        assert!(cpu_ticks(1 << 30).is_err());
    }

    #[test]
    fn medians_match_lines_by_their_string_fields() {
        let run = |a: i64, b: f64| -> Vec<Line> {
            vec![
                serde_json::from_str(&format!(r#"{{"bench":"x","n":{a}}}"#)).unwrap(),
                serde_json::from_str(&format!(r#"{{"bench":"y","v":{b:?}}}"#)).unwrap(),
            ]
        };
        let m = median_lines(&[run(5, 1.0), run(1, 3.0), run(3, 2.0)]);
        assert_eq!(m[0]["n"], Value::from(3));
        assert_eq!(m[1]["v"], Value::from(2.0));
        let t = json_table(&m);
        assert!(t.starts_with("| bench | n | v |"), "{t}");
        assert!(t.contains("| x | 3 |  |"), "{t}");
    }
}
