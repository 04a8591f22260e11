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

mod footprint;
mod footprint_report;
mod lines;
mod report;

#[cfg(test)]
use footprint::{cpu_ticks, floor_counts, rss_kib};
use footprint::{footprint_run, median_f, unix_ns, Footprint};
use footprint_report::{footprint_checks, footprint_section, FOOTPRINT_HEADING};
#[cfg(test)]
use lines::median_lines;
use lines::{fuzz_lines, json_bench, json_table, recorded_lines, Line};
use report::{grouped_tables, render_markdown, target_checks, today, verdict};

#[derive(Args)]
pub struct BenchArgs {
    /// One short run of everything (smoke test of the benches) instead of repeated runs.
    #[arg(long)]
    quick: bool,
    /// Length of the restart-and-fault soak, in seconds (quick mode: one cycle).
    #[arg(long, default_value_t = 600)]
    soak_sec: u64,
    /// Re-measure one JSON bench binary (e.g. sim-eval), or the soft-RoCE guest's benches
    /// (vm-rdma), or the agent footprint (footprint), and replace its section and its rows
    /// of the summary in the existing
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
/// Issue 25's targets: an agent nobody notices (today's numbers miss them; the table says so).
const CPU_TARGET_PCT: f64 = 0.5;
const RSS_TARGET_MIB: f64 = 12.0;
const SAMPLE: Duration = Duration::from_secs(20);

/// The release build every bench binary comes from.
fn release_build() -> Result<()> {
    // The rdma features too: the VM bench runs these binaries against soft-RoCE.
    crate::cargo_release(
        &[
            "rpingmesh-controller",
            "rpingmesh-agent",
            "rpingmesh-verbs",
            "rpingmesh-e2e",
            "rdma-qp-churn",
            "rpingmesh-sim",
            "rpingmesh-rc-ring",
        ],
        &["--features", crate::TEST_FEATURES],
        "controller, agent, benches",
    )?;
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
    write_spliced(&path, &spliced, target_checks(&lines), bin)
}

/// Writes BENCHMARKS.md as `spliced` with the summary rows named like `rows` replaced by
/// them; fails when one of them misses its target.
fn write_spliced(path: &Path, spliced: &str, rows: Vec<report::Check>, what: &str) -> Result<()> {
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
    std::fs::write(path, &out).with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "xtask bench: replaced the {what} section and its summary rows in {}",
        path.display()
    );
    let missed: Vec<&String> = rows.iter().filter(|r| !r.4).map(|r| &r.0).collect();
    if !missed.is_empty() {
        bail!("{} target(s) missed: {missed:?}", missed.len());
    }
    Ok(())
}

/// `--section footprint`: the agent footprint runs alone, spliced in like a section.
fn run_footprint_section(runs: usize) -> Result<()> {
    let path = crate::root().join("BENCHMARKS.md");
    let md =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let start = md
        .find(FOOTPRINT_HEADING)
        .context("no footprint section in BENCHMARKS.md: run the whole bench")?;
    let end = md[start + FOOTPRINT_HEADING.len()..]
        .find("\n## ")
        .map_or(md.len(), |i| start + FOOTPRINT_HEADING.len() + i + 1);
    release_build()?;
    let footprint = measure_footprint(runs);
    let section = format!(
        "{}_Re-measured alone with `cargo xtask bench --section footprint` on {}._\n\n",
        footprint_section(&footprint),
        today()
    );
    let spliced = format!("{}{}{}", &md[..start], section, &md[end..]);
    write_spliced(&path, &spliced, footprint_checks(&footprint?), "footprint")
}

fn measure_footprint(runs: usize) -> Result<Vec<Footprint>> {
    (0..runs)
        .map(|i| {
            eprintln!("xtask bench: agent footprint, run {}/{runs}", i + 1);
            footprint_run()
        })
        .collect()
}

pub fn run(a: BenchArgs) -> Result<()> {
    let runs = if a.quick { 1 } else { 3 };
    if a.section.as_deref() == Some("footprint") {
        return run_footprint_section(runs);
    }
    if let Some(bin) = &a.section {
        return run_section(
            bin,
            a.quick,
            a.bench_args.as_deref(),
            a.lines_from.as_deref(),
        );
    }
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
    let footprint = measure_footprint(runs);
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

#[cfg(test)]
mod tests;
