//! Tests against this machine's kernel: verifier loads, uprobes end to end on the
//! fake-ibverbs fixture, BTF resolution, user ABI offsets. They skip (with a printed
//! reason) only when not root or when the eBPF object is not built.

use rpingmesh_agent_common::event::ibv;
use rpingmesh_service_tracer::*;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The object, or None after printing why the test is skipped.
fn object_or_skip(test: &str) -> Option<Vec<u8>> {
    if !is_root() {
        eprintln!("SKIP {test}: not root (loading eBPF needs CAP_BPF/CAP_PERFMON)");
        return None;
    }
    match object_bytes(None) {
        Ok(b) => Some(b.into_owned()),
        Err(e) => {
            eprintln!("SKIP {test}: {e}");
            None
        }
    }
}

#[test]
fn every_program_passes_the_verifier() {
    let Some(obj) = object_or_skip("every_program_passes_the_verifier") else {
        return;
    };
    let names = load_all_programs(&obj).expect("all programs load");
    let mut want: Vec<&str> = KPROBE_PROGRAMS
        .iter()
        .chain(&KPROBE_QUERY_PROGRAMS)
        .map(|p| p.0)
        .chain(UPROBE_PROGRAMS.iter().map(|p| p.0))
        .chain([EXIT_PROGRAM.0])
        .collect();
    let mut got: Vec<&str> = names.iter().map(String::as_str).collect();
    want.sort();
    got.sort();
    assert_eq!(got, want);
}

#[test]
fn kprobe_programs_load_with_resolved_offsets() {
    // The kprobe programs must also verify with non-zero offsets (the path they take
    // when BTF resolved): load with a plausible offset set.
    let Some(obj) = object_or_skip("kprobe_programs_load_with_resolved_offsets") else {
        return;
    };
    let mut offs = [8u32; rpingmesh_agent_common::event::KOFF_COUNT];
    offs[rpingmesh_agent_common::event::KOFF_VALID] = 1;
    let mut ebpf = aya::EbpfLoader::new()
        .override_global(rpingmesh_agent_common::event::KOFFSETS_GLOBAL, &offs, true)
        .load(&obj)
        .expect("object loads");
    for &(name, _) in KPROBE_PROGRAMS.iter().chain(&KPROBE_QUERY_PROGRAMS) {
        let p: &mut aya::programs::KProbe = ebpf.program_mut(name).unwrap().try_into().unwrap();
        p.load().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn btf_resolves_known_vmlinux_structs() {
    let p = Path::new("/sys/kernel/btf/vmlinux");
    if !p.exists() {
        eprintln!(
            "SKIP btf_resolves_known_vmlinux_structs: no {}",
            p.display()
        );
        return;
    }
    let b = btf::Btf::from_file(p, None).expect("vmlinux BTF parses");
    assert_eq!(b.member_offset("list_head", "next"), Ok(0));
    assert_eq!(b.member_offset("list_head", "prev"), Ok(8));
    let pid = b.member_offset("task_struct", "pid").unwrap();
    let tgid = b.member_offset("task_struct", "tgid").unwrap();
    assert!(pid > 0 && tgid == pid + 4, "pid {pid} tgid {tgid}");
    // sk_buff.len sits after anonymous unions: exercises the anonymous-member walk.
    assert!(b.member_offset("sk_buff", "len").unwrap() > 0);
    // This kernel has no RDMA: the kprobe offsets fail with a clear error naming ib_qp.
    if !Path::new("/sys/kernel/btf/ib_core").exists() && !b.has_struct("ib_qp") {
        let e = btf::resolve_kernel_offsets(Path::new("/sys/kernel/btf")).unwrap_err();
        assert!(e.to_string().contains("struct ib_qp not found"), "{e}");
    }
}

#[test]
fn malformed_btf_is_a_clear_error_and_tracing_goes_off() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("vmlinux"), b"\x9f\xeb\x01\x00garbage").unwrap();
    let e = btf::resolve_kernel_offsets(dir.path()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("malformed BTF ("), "{msg}");
    assert!(msg.contains("vmlinux"), "{msg}");
    assert!(!msg.contains('\n'));
    // Missing directory: an I/O error naming the path.
    let e = btf::resolve_kernel_offsets(&dir.path().join("nope")).unwrap_err();
    assert!(e.to_string().contains("nope/vmlinux"), "{e}");
}

#[tokio::test]
async fn mode_off_and_missing_object_are_one_line_reasons() {
    let cfg = TracerConfig {
        mode: TracingMode::Off,
        ..Default::default()
    };
    let Started::Off(why) =
        ServiceTracer::start(cfg, Arc::new(|_: &str, _, _| None), Arc::new(ExcludePid(0)))
    else {
        panic!("mode off must not run")
    };
    assert!(why.contains("off"), "{why}");
    if is_root() {
        let cfg = TracerConfig {
            mode: TracingMode::Uprobe,
            object_path: Some("/nonexistent/x.o".into()),
            ..Default::default()
        };
        let Started::Off(why) =
            ServiceTracer::start(cfg, Arc::new(|_: &str, _, _| None), Arc::new(ExcludePid(0)))
        else {
            panic!("missing object must not run")
        };
        assert!(
            why.contains("/nonexistent/x.o") && !why.contains('\n'),
            "{why}"
        );
    }
    assert_eq!("auto".parse(), Ok(TracingMode::Auto));
    assert!("sometimes"
        .parse::<TracingMode>()
        .unwrap_err()
        .contains("sometimes"));
}

#[test]
fn ibv_abi_constants_match_verbs_h() {
    let header = Path::new("/usr/include/infiniband/verbs.h");
    if !header.exists() || Command::new("cc").arg("--version").output().is_err() {
        eprintln!("SKIP ibv_abi_constants_match_verbs_h: no verbs.h (libibverbs-dev) or no cc");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("off.c");
    std::fs::write(
        &src,
        r#"#include <stdio.h>
#include <stddef.h>
#include <infiniband/verbs.h>
int main(void) {
  printf("%zu %zu %zu %zu %zu %zu\n", offsetof(struct ibv_qp, context), offsetof(struct ibv_qp, handle),
         offsetof(struct ibv_qp, qp_num), offsetof(struct ibv_qp, state), offsetof(struct ibv_qp, qp_type), sizeof(struct ibv_qp));
  printf("%zu %zu\n", offsetof(struct ibv_context, device), offsetof(struct ibv_device, name));
  printf("%zu %zu %zu %zu %zu\n", offsetof(struct ibv_qp_attr, qp_state), offsetof(struct ibv_qp_attr, dest_qp_num),
         offsetof(struct ibv_qp_attr, ah_attr), offsetof(struct ibv_qp_attr, port_num), sizeof(struct ibv_qp_attr));
  printf("%zu %zu %zu %zu %zu\n", offsetof(struct ibv_ah_attr, grh), offsetof(struct ibv_ah_attr, sl),
         offsetof(struct ibv_ah_attr, is_global), offsetof(struct ibv_ah_attr, port_num), sizeof(struct ibv_ah_attr));
  printf("%zu %zu %zu %zu %zu\n", offsetof(struct ibv_global_route, dgid), offsetof(struct ibv_global_route, flow_label),
         offsetof(struct ibv_global_route, sgid_index), offsetof(struct ibv_global_route, hop_limit),
         offsetof(struct ibv_global_route, traffic_class));
  return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.path().join("off");
    let st = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "cc failed");
    let out = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    let got: Vec<usize> = out.split_whitespace().map(|s| s.parse().unwrap()).collect();
    let want = vec![
        ibv::QP_CONTEXT,
        ibv::QP_HANDLE,
        ibv::QP_QP_NUM,
        ibv::QP_STATE,
        ibv::QP_QP_TYPE,
        ibv::QP_SIZE,
        ibv::CONTEXT_DEVICE,
        ibv::DEVICE_NAME,
        ibv::ATTR_QP_STATE,
        ibv::ATTR_DEST_QP_NUM,
        ibv::ATTR_AH_ATTR,
        ibv::ATTR_PORT_NUM,
        ibv::ATTR_SIZE,
        ibv::AH_GRH,
        ibv::AH_SL,
        ibv::AH_IS_GLOBAL,
        ibv::AH_PORT_NUM,
        ibv::AH_SIZE,
        ibv::GRH_DGID,
        ibv::GRH_FLOW_LABEL,
        ibv::GRH_SGID_INDEX,
        ibv::GRH_HOP_LIMIT,
        ibv::GRH_TRAFFIC_CLASS,
    ];
    assert_eq!(got, want);
}

#[test]
fn versioned_libibverbs_symbols_resolve_to_the_default_version() {
    let libs = host::discover_libibverbs();
    let Some(lib) = libs.first() else {
        eprintln!("SKIP versioned_libibverbs_symbols_resolve_to_the_default_version: no libibverbs on this host");
        return;
    };
    let Ok(nm) = Command::new("nm").arg("-D").arg(lib).output() else {
        eprintln!("SKIP versioned_libibverbs_symbols_resolve_to_the_default_version: no nm");
        return;
    };
    let nm = String::from_utf8_lossy(&nm.stdout);
    let elf = std::fs::read(lib).unwrap();
    for sym in ["ibv_create_qp", "ibv_modify_qp", "ibv_destroy_qp"] {
        let default = nm
            .lines()
            .find(|l| l.ends_with(&format!(" {sym}@@IBVERBS_1.1")))
            .map(|l| u64::from_str_radix(l.split_whitespace().next().unwrap(), 16).unwrap());
        let Some(default) = default else { continue };
        // libibverbs' text segment maps at its file offset, so address == offset.
        assert_eq!(
            host::symbol_file_offset(&elf, sym).unwrap(),
            Some(default),
            "{sym}"
        );
    }
}

// ------------------------------------------------------------------ end to end (uprobes)

const LOCAL: Gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x0a, 0, 0, 0, 0, 0, 0, 0x01];
const REMOTE_HEX: &str = "fe80000000000000020c29fffe4f5a6b";

fn build_fixture(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/fake-ibverbs/src/main.rs");
    let exe = dir.join("fake-ibverbs");
    let out = Command::new("rustc")
        .args(["--edition", "2021", "-C", "opt-level=1", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("rustc runs");
    assert!(
        out.status.success(),
        "building the fixture: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

struct Fixture {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<std::process::ChildStdout>,
}

impl Fixture {
    fn spawn(exe: &Path, args: &[&str]) -> Fixture {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        Fixture { child, stdin, out }
    }
    fn expect(&mut self, prefix: &str) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        assert!(l.starts_with(prefix), "fixture said {l:?}, want {prefix}");
        l
    }
    fn go(&mut self) {
        let s = self.stdin.as_mut().unwrap();
        s.write_all(b"go\n").unwrap();
        s.flush().unwrap();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn next_batch(t: &ServiceTracer) -> ChangeBatch {
    tokio::time::timeout(Duration::from_secs(10), t.changed())
        .await
        .expect("tracer reported within 10 s");
    t.take_changes()
}

fn start_on(exe: &Path) -> Option<ServiceTracer> {
    start_with(exe, Duration::from_millis(100))
}

/// A uprobe tracer on `exe` whose /proc liveness check runs every `poll`.
fn start_with(exe: &Path, poll: Duration) -> Option<ServiceTracer> {
    let cfg = TracerConfig {
        mode: TracingMode::Uprobe,
        discover_libibverbs: false,
        uprobe_targets: vec![exe.to_path_buf()],
        liveness_interval: poll,
        exit_fallback_interval: poll,
        ..Default::default()
    };
    let resolver = |dev: &str, port: u8, idx: u8| {
        (dev == "fake_dev0" && port == 1 && idx == 1).then_some(LOCAL)
    };
    match ServiceTracer::start(
        cfg,
        Arc::new(resolver),
        Arc::new(ExcludePid(std::process::id())),
    ) {
        Started::Running(t) => Some(t),
        Started::Off(why) => panic!("tracer did not start: {why}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uprobe_end_to_end_on_fixture() {
    if object_or_skip("uprobe_end_to_end_on_fixture").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_fixture(dir.path());
    let t = start_on(&exe).unwrap();
    assert_eq!(t.mode(), ActiveMode::Uprobe);
    // Three uprobes on the fixture, and the exit tracepoint.
    assert_eq!(t.attachments().len(), 4, "{:?}", t.attachments());

    let mut fx = Fixture::spawn(
        &exe,
        &[
            "--qpn",
            "0x345",
            "--dest-qpn",
            "0x777",
            "--dgid",
            REMOTE_HEX,
            "--flow-label",
            "0x5a5a5",
            "--sl",
            "4",
            "--tc",
            "96",
            "--sgid-index",
            "1",
            "--port",
            "1",
        ],
    );
    let pid = fx.child.id();
    fx.expect("ready");
    fx.go();
    fx.expect("connected 837");
    let b = next_batch(&t).await;
    assert!(!b.full);
    assert_eq!(b.changes.len(), 1, "{:?}", b.changes);
    let FlowChange::Upsert(f) = &b.changes[0] else {
        panic!("{:?}", b.changes)
    };
    let mut remote = [0u8; 16];
    for (i, r) in remote.iter_mut().enumerate() {
        *r = u8::from_str_radix(&REMOTE_HEX[2 * i..2 * i + 2], 16).unwrap();
    }
    assert_eq!(
        f.key,
        FlowKey {
            local_gid: LOCAL,
            local_qpn: 0x345
        }
    );
    assert_eq!(f.remote_gid, remote);
    assert_eq!(f.remote_qpn, 0x777);
    assert_eq!(f.flow_label, 0x5a5a5);
    assert_eq!(
        (f.sl, f.traffic_class, f.port, f.sgid_index, f.hop_limit),
        (4, 96, 1, 1, 64)
    );
    assert_eq!(f.qp_type, 2); // IBV_QPT_RC
    assert_eq!(f.pid, pid);
    assert_eq!(f.device, "fake_dev0");
    assert!(f.comm.starts_with("fake-ibverbs"), "{}", f.comm);
    assert!(f.cgroup_id != 0);
    assert_eq!(f.source, EventSource::Uprobe);
    assert_eq!(t.snapshot().len(), 1);

    fx.go();
    fx.expect("destroyed");
    let b = next_batch(&t).await;
    assert_eq!(
        b.changes,
        vec![FlowChange::Remove(FlowKey {
            local_gid: LOCAL,
            local_qpn: 0x345
        })]
    );
    assert!(t.snapshot().is_empty());
    let s = t.stats();
    assert_eq!((s.creates, s.modifies, s.destroys), (1, 2, 1), "{s:?}");
    assert_eq!(s.read_errors, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uprobe_flow_removed_when_process_dies() {
    if object_or_skip("uprobe_flow_removed_when_process_dies").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_fixture(dir.path());
    let t = start_on(&exe).unwrap();
    let mut fx = Fixture::spawn(
        &exe,
        &["--qpn", "0x500", "--qps", "3", "--dgid", REMOTE_HEX],
    );
    fx.expect("ready");
    fx.go();
    fx.expect("connected");
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.extend(next_batch(&t).await.changes);
    }
    assert!(seen.iter().all(|c| matches!(c, FlowChange::Upsert(_))));
    // Killed before destroying its QPs: the liveness check removes its flows.
    fx.child.kill().unwrap();
    fx.child.wait().unwrap();
    let mut removed = Vec::new();
    while removed.len() < 3 {
        removed.extend(next_batch(&t).await.changes);
    }
    let mut keys: Vec<u32> = removed
        .iter()
        .map(|c| match c {
            FlowChange::Remove(k) => k.local_qpn,
            other => panic!("{other:?}"),
        })
        .collect();
    keys.sort();
    assert_eq!(keys, vec![0x500, 0x501, 0x502]);
    assert!(t.snapshot().is_empty());
}

/// The kernel reports the exit (sched_process_exit, filtered to the owners of traced
/// QPs): with /proc polled only once a minute, the killed process's flows still go at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_of_a_traced_process_comes_from_the_kernel() {
    if object_or_skip("exit_of_a_traced_process_comes_from_the_kernel").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_fixture(dir.path());
    let t = start_with(&exe, Duration::from_secs(60)).unwrap();
    assert!(
        t.reports_exits(),
        "exit program attached: {:?}",
        t.attachments()
    );
    // A bystander, also traced, that keeps running: only the killed one goes.
    let mut other = Fixture::spawn(
        &exe,
        &["--qpn", "0x600", "--qps", "1", "--dgid", REMOTE_HEX],
    );
    other.expect("ready");
    other.go();
    other.expect("connected");
    let mut fx = Fixture::spawn(
        &exe,
        &["--qpn", "0x700", "--qps", "2", "--dgid", REMOTE_HEX],
    );
    fx.expect("ready");
    fx.go();
    fx.expect("connected");
    let mut seen = Vec::new();
    while seen.len() < 3 {
        seen.extend(next_batch(&t).await.changes);
    }
    let killed_at = std::time::Instant::now();
    fx.child.kill().unwrap();
    fx.child.wait().unwrap();
    let mut removed = Vec::new();
    while removed.len() < 2 {
        removed.extend(next_batch(&t).await.changes);
    }
    assert!(
        killed_at.elapsed() < Duration::from_secs(5),
        "removed after {:?}: not by the minute-long /proc poll",
        killed_at.elapsed()
    );
    let mut keys: Vec<u32> = removed
        .iter()
        .map(|c| match c {
            FlowChange::Remove(k) => k.local_qpn,
            other => panic!("{other:?}"),
        })
        .collect();
    keys.sort();
    assert_eq!(keys, vec![0x700, 0x701]);
    assert_eq!(t.snapshot().len(), 1, "the bystander's flow stays");
    assert!(t.stats().exits >= 1, "{:?}", t.stats());
}

/// A field the program cannot read (an unmapped attr pointer) is counted and named in
/// the program's own log record (aya-log), which the tracer turns into a log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_field_is_named_by_the_program() {
    if object_or_skip("unreadable_field_is_named_by_the_program").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = build_fixture(dir.path());
    let t = start_on(&exe).unwrap();
    let mut fx = Fixture::spawn(
        &exe,
        &[
            "--qpn",
            "0x800",
            "--qps",
            "1",
            "--dgid",
            REMOTE_HEX,
            "--bad-attr",
        ],
    );
    fx.expect("ready");
    fx.go();
    fx.expect("connected");
    // The good modifies still make the flow.
    let first = next_batch(&t).await;
    assert!(
        matches!(first.changes.as_slice(), [FlowChange::Upsert(_)]),
        "{first:?}"
    );
    let want = "rpingmesh: cannot read ibv_qp_attr.qp_state";
    let mut said = Vec::new();
    for _ in 0..50 {
        said = t.diagnostics();
        if said.iter().any(|(m, _)| m == want) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(said.iter().any(|(m, n)| m == want && *n == 1), "{said:?}");
    let stats = t.stats();
    assert!(stats.read_errors >= 1 || stats.events > 0, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uprobes_attach_to_system_libibverbs() {
    if object_or_skip("uprobes_attach_to_system_libibverbs").is_none() {
        return;
    }
    if host::discover_libibverbs().is_empty() {
        eprintln!("SKIP uprobes_attach_to_system_libibverbs: no libibverbs installed");
        return;
    }
    let cfg = TracerConfig {
        mode: TracingMode::Auto,
        ..Default::default()
    };
    match ServiceTracer::start(cfg, Arc::new(|_: &str, _, _| None), Arc::new(ExcludePid(0))) {
        Started::Running(t) => {
            // No kprobes on this kernel: auto falls back to uprobes on the real library.
            if !host::kprobe_symbols_present() {
                assert_eq!(t.mode(), ActiveMode::Uprobe);
                assert!(
                    t.attachments().iter().any(|a| a.contains("libibverbs.so")),
                    "{:?}",
                    t.attachments()
                );
            }
        }
        Started::Off(why) => panic!("{why}"),
    }
}
