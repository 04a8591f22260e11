//! The fuzz smoke run of the test suite: every target over every checked-in corpus file
//! (`fuzz/corpus/<target>/`, crash regressions included) and a fixed number of
//! deterministic mutations of them (bit flips, interesting values, truncations,
//! insertions, splices). Nothing may panic. The real fuzzing is `cargo xtask fuzz`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use rpingmesh_fuzz_targets::{seeds, TARGETS};

const MUTATIONS_PER_TARGET: usize = 2_000;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = fuzz_dir().join("corpus").join(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            let bytes = std::fs::read(&p).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), bytes)
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const INTERESTING: [u64; 10] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    u64::MAX,
];

fn mutate(rng: &mut Rng, base: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len());
        match rng.below(7) {
            0 if !v.is_empty() => v[at] ^= 1 << rng.below(8),
            1 if !v.is_empty() => v[at] = INTERESTING[rng.below(5)] as u8,
            2 => v.truncate(rng.below(v.len() + 1)),
            3 => {
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                v.splice(at..at, bytes);
            }
            4 => {
                let from = rng.below(other.len());
                v.truncate(at);
                v.extend_from_slice(&other[from..]);
            }
            5 if v.len() >= 8 => {
                let at = rng.below(v.len() - 7);
                let x = INTERESTING[rng.below(INTERESTING.len())];
                let bytes = if rng.below(2) == 0 {
                    x.to_le_bytes()
                } else {
                    x.to_be_bytes()
                };
                let n = if rng.below(2) == 0 { 4 } else { 8 };
                v[at..at + n].copy_from_slice(&bytes[..n]);
            }
            _ if v.len() > 1 => {
                // Duplicate or drop a chunk.
                let end = at + 1 + rng.below((v.len() - at).min(64));
                let chunk = v[at..end.min(v.len())].to_vec();
                if rng.below(2) == 0 {
                    v.splice(at..at, chunk);
                } else {
                    v.drain(at..end.min(v.len()));
                }
            }
            _ => v.push(rng.next() as u8),
        }
    }
    v
}

/// Runs `f` on `input`; a panic saves the input next to the test's scratch files and
/// fails naming it.
fn run_one(target: &str, what: &str, f: fn(&[u8]), input: &[u8]) {
    if catch_unwind(AssertUnwindSafe(|| f(input))).is_err() {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-smoke");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("crash-{target}-{what}"));
        std::fs::write(&path, input).unwrap();
        panic!(
            "{target} panicked on {what}; input saved to {} (reproduce: cargo +nightly fuzz run {target} {})",
            path.display(),
            path.display()
        );
    }
}

fn smoke(target: &str) {
    let f = TARGETS
        .iter()
        .find(|(n, _)| *n == target)
        .unwrap_or_else(|| panic!("no target {target}"))
        .1;
    let files = corpus(target);
    for (name, bytes) in &files {
        run_one(target, name, f, bytes);
    }
    // One fixed seed per target, so a failure names a reproducible mutation.
    let mut rng =
        Rng(0x9E37_79B9_7F4A_7C15 ^ target.len() as u64 ^ (target.as_bytes()[0] as u64) << 32);
    for i in 0..MUTATIONS_PER_TARGET {
        let base = &files[rng.below(files.len())].1;
        let other = &files[rng.below(files.len())].1;
        let input = mutate(&mut rng, base, other);
        run_one(target, &format!("mutation-{i}"), f, &input);
    }
}

macro_rules! smoke_tests {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { smoke(stringify!($name)); })*

        #[test]
        fn every_target_has_a_smoke_test_a_fuzz_target_and_a_corpus() {
            let tested = [$(stringify!($name)),*];
            for (name, _) in TARGETS {
                assert!(tested.contains(name), "{name} has no smoke test");
                let src = fuzz_dir().join("fuzz_targets").join(format!("{name}.rs"));
                let text = std::fs::read_to_string(&src)
                    .unwrap_or_else(|e| panic!("{}: {e}", src.display()));
                assert!(text.contains(&format!("rpingmesh_fuzz_targets::{name}(")), "{}", src.display());
                assert!(!corpus(name).is_empty());
            }
            assert_eq!(tested.len(), TARGETS.len());
        }
    };
}

smoke_tests!(
    probe_wire,
    ebpf_event,
    btf,
    rc_ring,
    agent_config,
    controller_config,
    scenario_yaml,
    cert_names,
    agent_rpc,
    host_text,
);

/// The generated seeds are checked in as they are built; `RPINGMESH_FUZZ_BLESS=1`
/// rewrites the files.
#[test]
fn generated_seeds_match_the_corpus() {
    let bless = std::env::var_os("RPINGMESH_FUZZ_BLESS").is_some();
    for (target, name, bytes) in seeds::generated() {
        let path = fuzz_dir().join("corpus").join(target).join(name);
        if bless {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
            continue;
        }
        let on_disk = std::fs::read(&path).unwrap_or_default();
        assert!(
            on_disk == bytes,
            "{} differs from seeds.rs (RPINGMESH_FUZZ_BLESS=1 rewrites it)",
            path.display()
        );
    }
}

/// The seeds reach past the decoders' error paths (a corpus that never parses would
/// fuzz only the first checks).
#[test]
fn seeds_reach_the_success_paths() {
    use rpingmesh_agent_common::wire::ProbePacket;
    use rpingmesh_service_tracer::btf::{self, Btf};
    let file = |t: &str, n: &str| corpus(t).into_iter().find(|(f, _)| f == n).unwrap().1;
    for n in ["probe", "first_ack", "second_ack"] {
        ProbePacket::decode(&file("probe_wire", n)).unwrap();
    }
    for n in ["grh_v6_probe", "grh_v4_ack"] {
        rpingmesh_verbs::rdma::completion::grh_source_and_label(&file("probe_wire", n)).unwrap();
    }
    let b = Btf::parse("seed", &file("btf", "kernel_structs")).unwrap();
    btf::kernel_offsets_from(&b).unwrap();
    rpingmesh_rc_ring::Descriptor::decode(&file("rc_ring", "descriptor")).unwrap();
    let text = |t: &str, n: &str| String::from_utf8(file(t, n)).unwrap();
    rpingmesh_agent::config::AgentConfig::from_yaml_str(&text(
        "agent_config",
        "compact_with_tor.yaml",
    ))
    .unwrap();
    for n in ["shipped_controller.yaml", "compact.yaml"] {
        rpingmesh_controller::ControllerConfig::from_yaml_str(&text("controller_config", n))
            .unwrap();
    }
    for (n, t) in corpus("scenario_yaml") {
        rpingmesh_sim::scenario::Scenario::from_yaml(std::str::from_utf8(&t).unwrap())
            .unwrap_or_else(|e| panic!("{n}: {}", e.message()));
    }
    let names =
        rpingmesh_controller::auth::cert::cert_names(&file("cert_names", "agent_san_cn_ou.der"))
            .unwrap();
    assert_eq!(names.cn.as_deref(), Some("agent-h1"));
    assert_eq!(names.ous, ["operator", "agents"]);
    assert_eq!(names.dns, ["agent-h1.example"]);
    // In order: register, then the others as that agent.
    for (n, msg) in corpus("agent_rpc")
        .into_iter()
        .filter(|(n, _)| n.as_bytes()[0].is_ascii_digit())
    {
        let res = rpingmesh_fuzz_targets::agent_rpc_call(&msg).expect("decodes");
        res.unwrap_or_else(|s| panic!("{n}: {s:?}"));
    }
}

/// Inputs that crashed a target once (also in the corpus, so every smoke run replays them).
#[test]
fn regressions() {
    let file = |t: &str, n: &str| corpus(t).into_iter().find(|(f, _)| f == n).unwrap().1;
    // A symbol whose address lies before its section's: `symbol_file_offset` subtracted
    // with overflow (found by this smoke test's mutations).
    let elf = file("host_text", "regress-elf-symbol-outside-section");
    let e = rpingmesh_service_tracer::host::symbol_file_offset(&elf, "ibv_modify_qp").unwrap_err();
    assert!(e.contains("outside its section"), "{e}");
    // BTF whose anonymous-member offsets overflow u32: `find_member` added with overflow
    // (found by `cargo xtask fuzz`).
    use rpingmesh_service_tracer::btf::{self, Btf};
    let b = Btf::parse("t", &file("btf", "regress-nested-offset-overflow")).unwrap();
    assert!(btf::kernel_offsets_from(&b).is_err());
    // A struct nested in itself through 24 anonymous members: the member search took
    // 24^9 steps (a hang; found while fixing the overflow).
    let b = Btf::parse("t", &file("btf", "regress-anonymous-self-nesting")).unwrap();
    let started = std::time::Instant::now();
    assert!(btf::task_offsets_from(&b).is_err());
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}
