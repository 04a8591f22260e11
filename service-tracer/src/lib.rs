//! Service tracer: loads the QP-lifecycle eBPF programs (agent-ebpf, via aya), reads
//! their ring buffer asynchronously and keeps the service-flow table
//! ((local GID, local QPN) -> remote GID/QPN, flow label, SL/TC, process).
//!
//! The agent calls [`ServiceTracer::start`] inside a tokio runtime; it gets either a
//! running tracer or a one-line reason why tracing is off (probing goes on either way).
//! The reporter waits on [`ServiceTracer::changed`] and takes [`ServiceTracer::take_changes`]
//! (incremental, coalesced) or [`ServiceTracer::snapshot`] (full resend).

pub mod btf;
pub mod diag;
pub mod flows;
pub mod host;

pub use flows::{
    ChangeBatch, EventSource, ExcludePid, FlowChange, FlowKey, FlowStats, FlowTable,
    FlowTableConfig, Gid, GidResolver, QpFilter, ServiceFlow,
};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::UProbeScope;
use aya::programs::{KProbe, ProbeKind, RawTracePoint, UProbe};
use aya::{Ebpf, EbpfLoader};
use rpingmesh_agent_common::event::*;
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Environment variable naming the eBPF object at run time (overrides the embedded one).
pub const OBJECT_ENV: &str = "RPINGMESH_EBPF_OBJECT";
pub const NOT_BUILT: &str = "eBPF object not built: run cargo xtask build-ebpf";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TracingMode {
    #[default]
    Auto,
    Kprobe,
    Uprobe,
    Off,
}

impl FromStr for TracingMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(TracingMode::Auto),
            "kprobe" => Ok(TracingMode::Kprobe),
            "uprobe" => Ok(TracingMode::Uprobe),
            "off" => Ok(TracingMode::Off),
            _ => Err(format!(
                "service_tracing_mode {s:?}: want auto, kprobe, uprobe or off"
            )),
        }
    }
}

/// The family actually attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActiveMode {
    Kprobe,
    Uprobe,
}

#[derive(Clone, Debug)]
pub struct TracerConfig {
    pub mode: TracingMode,
    /// eBPF object file; `None` = $RPINGMESH_EBPF_OBJECT, then the embedded object.
    pub object_path: Option<PathBuf>,
    /// Look up libibverbs with `ldconfig -p` (uprobe mode).
    pub discover_libibverbs: bool,
    /// Extra uprobe targets (absolute paths of libibverbs copies or test binaries).
    pub uprobe_targets: Vec<PathBuf>,
    /// Directory with kernel BTF (vmlinux, ib_core, ib_uverbs).
    pub btf_dir: PathBuf,
    pub table: FlowTableConfig,
    /// Pending changes kept before degrading to a full resend.
    pub max_pending_changes: usize,
    /// How often exited processes are looked for in /proc and kernel counters read.
    pub liveness_interval: Duration,
    /// The same /proc check when the kernel reports exits itself (sched_process_exit):
    /// only a fallback then.
    pub exit_fallback_interval: Duration,
    /// Bytes of the QP event ring (a power of two, at least a page). All of it is
    /// resident for the agent's whole life, so it is sized for measured bursts, not for
    /// the worst case: the ring's drop counter says when a burst did not fit.
    pub ring_bytes: u32,
}

impl Default for TracerConfig {
    fn default() -> Self {
        TracerConfig {
            mode: TracingMode::Auto,
            object_path: None,
            discover_libibverbs: true,
            uprobe_targets: Vec::new(),
            btf_dir: PathBuf::from("/sys/kernel/btf"),
            table: FlowTableConfig::default(),
            max_pending_changes: 65_536,
            liveness_interval: Duration::from_secs(2),
            exit_fallback_interval: Duration::from_secs(10),
            ring_bytes: DEFAULT_RING_BYTES,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TracerError {
    #[error("{NOT_BUILT}")]
    NotBuilt,
    #[error("reading eBPF object {path}: {err}")]
    ObjectRead { path: String, err: String },
    #[error("loading eBPF object: {0}")]
    Load(String),
    #[error("eBPF program {prog}: {err}")]
    Program { prog: String, err: String },
    #[error("kernel BTF: {0}")]
    Btf(#[from] btf::BtfError),
    #[error("{0}")]
    Privileges(String),
    #[error("{0}")]
    Unavailable(String),
}

#[cfg(rpingmesh_ebpf_embedded)]
static EMBEDDED: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/agent.bpf.o"));

/// The object embedded at build time, when `cargo xtask build-ebpf` ran before the build.
pub fn embedded_object() -> Option<&'static [u8]> {
    #[cfg(rpingmesh_ebpf_embedded)]
    return Some(EMBEDDED);
    #[cfg(not(rpingmesh_ebpf_embedded))]
    None
}

/// The object bytes: explicit path, else $RPINGMESH_EBPF_OBJECT, else embedded.
pub fn object_bytes(explicit: Option<&Path>) -> Result<Cow<'static, [u8]>, TracerError> {
    let path = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(OBJECT_ENV).map(PathBuf::from));
    if let Some(p) = path {
        return std::fs::read(&p)
            .map(Cow::Owned)
            .map_err(|e| TracerError::ObjectRead {
                path: p.display().to_string(),
                err: e.to_string(),
            });
    }
    embedded_object()
        .map(Cow::Borrowed)
        .ok_or(TracerError::NotBuilt)
}

/// (program name, target function, kind) of every program in the object.
pub const KPROBE_PROGRAMS: [(&str, &str); 3] = [
    ("ib_create_qp_user_ret", "ib_create_qp_user"),
    ("ib_modify_qp_with_udata", "ib_modify_qp_with_udata"),
    ("ib_destroy_qp_user", "ib_destroy_qp_user"),
];
/// Optional kprobes (entry + return on `ib_query_qp`): whenever the kernel is asked
/// about a QP (the tracer asks for every QP at start, through `rdma res show qp`), they
/// report its state and path, so QPs connected before tracing began are learned too.
pub const KPROBE_QUERY_PROGRAMS: [(&str, &str); 2] = [
    ("ib_query_qp_entry", "ib_query_qp"),
    ("ib_query_qp_ret", "ib_query_qp"),
];
/// The raw tracepoint that reports exits of processes owning traced QPs.
pub const EXIT_PROGRAM: (&str, &str) = ("sched_process_exit", "sched_process_exit");
/// (program, symbol, required): `ibv_create_qp_ex` is a static inline in most
/// rdma-core versions, so it is attached only where a library exports it.
pub const UPROBE_PROGRAMS: [(&str, &str, bool); 4] = [
    ("ibv_create_qp_ret", "ibv_create_qp", true),
    ("ibv_create_qp_ex_ret", "ibv_create_qp_ex", false),
    ("ibv_modify_qp", "ibv_modify_qp", true),
    ("ibv_destroy_qp", "ibv_destroy_qp", true),
];

/// The QP event ring's default size: 1,800 events. tracer-bench's storm (62,000-66,000
/// QP calls a second on two cores, uprobe mode) dropped none at this size, nor at 16 KiB.
pub const DEFAULT_RING_BYTES: u32 = 256 << 10;
/// The programs' diagnostics ring (aya-log; its crate's default is 128 KiB): a record
/// is 64-256 bytes and a diagnostic is counted per distinct message, so a few hundred
/// records of room are plenty.
const LOG_RING_BYTES: u32 = 32 << 10;

fn load_object(
    object: &[u8],
    offsets: &[u32; KOFF_COUNT],
    ring_bytes: u32,
) -> Result<Ebpf, TracerError> {
    let page = 4096;
    if !ring_bytes.is_power_of_two() || ring_bytes < page {
        return Err(TracerError::Load(format!(
            "QP event ring of {ring_bytes} bytes: it must be a power of two of at least {page}"
        )));
    }
    EbpfLoader::new()
        .override_global(KOFFSETS_GLOBAL, offsets, true)
        .map_max_entries("QP_EVENTS", ring_bytes)
        .map_max_entries("AYA_LOGS", LOG_RING_BYTES)
        .load(object)
        .map_err(|e| TracerError::Load(one_line(&e)))
}

/// What a failed load or attach of program `prog` becomes.
fn program_err(prog: &str) -> impl FnOnce(aya::programs::ProgramError) -> TracerError + '_ {
    move |e| TracerError::Program {
        prog: prog.into(),
        err: one_line(&e),
    }
}

fn one_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Loads every program of the object into the kernel (verifier check), attaching none.
/// Returns the names of the programs loaded.
pub fn load_all_programs(object: &[u8]) -> Result<Vec<String>, TracerError> {
    let mut ebpf = load_object(object, &[0; KOFF_COUNT], DEFAULT_RING_BYTES)?;
    let mut names = Vec::new();
    for &(name, _) in KPROBE_PROGRAMS.iter().chain(&KPROBE_QUERY_PROGRAMS) {
        let p: &mut KProbe = prog_mut(&mut ebpf, name)?;
        p.load().map_err(program_err(name))?;
        names.push(name.to_string());
    }
    for (name, _, _) in UPROBE_PROGRAMS {
        let p: &mut UProbe = prog_mut(&mut ebpf, name)?;
        p.load().map_err(program_err(name))?;
        names.push(name.to_string());
    }
    let p: &mut RawTracePoint = prog_mut(&mut ebpf, EXIT_PROGRAM.0)?;
    p.load().map_err(program_err(EXIT_PROGRAM.0))?;
    names.push(EXIT_PROGRAM.0.to_string());
    Ok(names)
}

/// Attaches the exit program (optional: without it, exits of processes whose QPs only
/// libibverbs uprobes saw are found by polling /proc). Returns whether it runs.
fn attach_exit(ebpf: &mut Ebpf, att: &mut Vec<String>) -> bool {
    let r = prog_mut::<RawTracePoint>(ebpf, EXIT_PROGRAM.0).and_then(|p| {
        p.load().map_err(program_err(EXIT_PROGRAM.0))?;
        p.attach(EXIT_PROGRAM.1)
            .map_err(program_err(EXIT_PROGRAM.0))
    });
    match r {
        Ok(_) => {
            att.push(format!(
                "{} -> raw tracepoint {}",
                EXIT_PROGRAM.0, EXIT_PROGRAM.1
            ));
            true
        }
        Err(e) => {
            tracing::warn!("service tracing: {e}; process exits are found by polling /proc");
            false
        }
    }
}

fn prog_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, TracerError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let p = ebpf.program_mut(name).ok_or_else(|| TracerError::Program {
        prog: name.into(),
        err: "not in the object".into(),
    })?;
    p.try_into().map_err(program_err(name))
}

struct Inner {
    table: FlowTable,
    log: flows::ChangeLog,
}

struct Shared {
    inner: Mutex<Inner>,
    notify: tokio::sync::Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves a consistent table (no await inside).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Result of [`ServiceTracer::start`].
pub enum Started {
    Running(ServiceTracer),
    /// Tracing is off; the one-line reason (probing continues without service paths).
    Off(String),
}

pub struct ServiceTracer {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    mode: ActiveMode,
    attachments: Vec<String>,
    /// The `ib_query_qp` probes are attached: existing QPs can be learned.
    queries: bool,
    /// The kernel reports traced processes' exits (no /proc polling needed).
    exits: bool,
    diagnostics: diag::Diagnostics,
    // Dropping it detaches every program.
    _ebpf: Ebpf,
}

impl Drop for ServiceTracer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ServiceTracer {
    /// Start tracing; never fails, but may return `Started::Off(reason)`.
    /// Must be called from within a tokio runtime.
    pub fn start(
        cfg: TracerConfig,
        resolver: Arc<dyn GidResolver>,
        filter: Arc<dyn QpFilter>,
    ) -> Started {
        match Self::try_start(cfg, resolver, filter) {
            Ok(t) => Started::Running(t),
            Err(e) => Started::Off(format!("service tracing off: {e}")),
        }
    }

    pub fn try_start(
        cfg: TracerConfig,
        resolver: Arc<dyn GidResolver>,
        filter: Arc<dyn QpFilter>,
    ) -> Result<ServiceTracer, TracerError> {
        if cfg.mode == TracingMode::Off {
            return Err(TracerError::Unavailable(
                "service_tracing_mode is off".into(),
            ));
        }
        host::check_privileges().map_err(TracerError::Privileges)?;
        let object = object_bytes(cfg.object_path.as_deref())?;

        let kprobe_possible = || -> Result<[u32; KOFF_COUNT], TracerError> {
            if !host::kprobe_symbols_present() {
                return Err(TracerError::Unavailable(format!(
                    "kernel has no {} in /proc/kallsyms",
                    host::KPROBE_SYMBOLS.join("/")
                )));
            }
            if !host::kprobes_attachable() {
                return Err(TracerError::Unavailable(
                    "kernel has no kprobe PMU or kprobe_events (CONFIG_KPROBES off?)".into(),
                ));
            }
            Ok(btf::resolve_kernel_offsets(&cfg.btf_dir)?)
        };
        let (mut ebpf, mode, attachments, queries) = match cfg.mode {
            TracingMode::Kprobe => {
                let offs = kprobe_possible()?;
                let (e, a, q) = attach_kprobes(&object, &offs, cfg.ring_bytes)?;
                (e, ActiveMode::Kprobe, a, q)
            }
            TracingMode::Uprobe => {
                let (e, a) = attach_uprobes(&object, &cfg)?;
                (e, ActiveMode::Uprobe, a, false)
            }
            _ => {
                match kprobe_possible().and_then(|o| attach_kprobes(&object, &o, cfg.ring_bytes)) {
                    Ok((e, a, q)) => (e, ActiveMode::Kprobe, a, q),
                    Err(why) => {
                        tracing::info!("service tracing: kprobes unavailable ({why}); using libibverbs uprobes");
                        let (e, a) = attach_uprobes(&object, &cfg)?;
                        (e, ActiveMode::Uprobe, a, false)
                    }
                }
            }
        };

        let mut attachments = attachments;
        let exits = attach_exit(&mut ebpf, &mut attachments);
        let traced: Option<BpfHashMap<MapData, u32, u8>> = if exits {
            ebpf.take_map(TRACED_TGIDS_MAP)
                .and_then(|m| BpfHashMap::try_from(m).ok())
        } else {
            None
        };
        let exits = exits && traced.is_some();
        let rb_map = ebpf
            .take_map("QP_EVENTS")
            .ok_or_else(|| TracerError::Load("map QP_EVENTS missing".into()))?;
        let rb = RingBuf::try_from(rb_map).map_err(|e| TracerError::Load(one_line(&e)))?;
        let st_map = ebpf
            .take_map("QP_EVENT_STATS")
            .ok_or_else(|| TracerError::Load("map QP_EVENT_STATS missing".into()))?;
        let counters: PerCpuArray<MapData, u64> =
            PerCpuArray::try_from(st_map).map_err(|e| TracerError::Load(one_line(&e)))?;
        // SAFETY: the ring buffer's fd stays open and unchanged while the AsyncFd owns it.
        let afd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(rb, tokio::io::Interest::READABLE)
        }
        .map_err(|e| TracerError::Load(format!("registering the ring buffer with tokio: {}", e)))?;

        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                table: FlowTable::new(cfg.table),
                log: flows::ChangeLog::new(cfg.max_pending_changes),
            }),
            notify: tokio::sync::Notify::new(),
        });
        let liveness = if exits {
            cfg.exit_fallback_interval
        } else {
            cfg.liveness_interval
        };
        let diagnostics = diag::Diagnostics::default();
        let logs = match aya_log::EbpfLogger::init_with_logger(&mut ebpf, diagnostics.clone()) {
            // SAFETY: the logger's ring-buffer fd stays open while the AsyncFd owns it.
            Ok(l) => unsafe {
                tokio::io::unix::AsyncFd::register_with_interest(l, tokio::io::Interest::READABLE)
            }
            .ok(),
            Err(e) => {
                tracing::debug!(error = %e, "eBPF diagnostics unavailable");
                None
            }
        };
        let task = tokio::spawn(reader(
            KernelSide {
                events: afd,
                counters,
                traced,
                logs,
            },
            shared.clone(),
            resolver,
            filter,
            liveness,
        ));
        Ok(ServiceTracer {
            shared,
            task,
            mode,
            attachments,
            queries,
            exits,
            diagnostics,
            _ebpf: ebpf,
        })
    }

    /// Learns the QPs that existed before tracing began: asks the kernel about every QP
    /// (`rdma res show qp`, which queries each one), and the `ib_query_qp` probes report
    /// each connected QP with its owner, path and state. Blocking (run it off the async
    /// workers); returns how many QPs the kernel answered for, or why it could not ask.
    /// Kprobe mode only: libibverbs uprobes never see a kernel-side query.
    pub fn learn_existing_qps(&self) -> Result<usize, String> {
        if !self.queries {
            return Err(match self.mode {
                ActiveMode::Uprobe => {
                    "libibverbs uprobes cannot see QPs made before tracing".into()
                }
                ActiveMode::Kprobe => "the ib_query_qp probes are not attached".into(),
            });
        }
        host::query_all_qps()
    }

    pub fn mode(&self) -> ActiveMode {
        self.mode
    }

    /// Whether the kernel reports traced processes' exits (else /proc is polled).
    pub fn reports_exits(&self) -> bool {
        self.exits
    }

    /// What the eBPF programs said (aya-log), each distinct message with its count.
    pub fn diagnostics(&self) -> Vec<(String, u64)> {
        self.diagnostics.messages()
    }

    /// "program -> target" for every attached probe.
    pub fn attachments(&self) -> &[String] {
        &self.attachments
    }

    /// Resolves when changes are pending (returns at once if some already are).
    pub async fn changed(&self) {
        loop {
            let n = self.shared.notify.notified();
            if !self.shared.lock().log.is_empty() {
                return;
            }
            n.await;
        }
    }

    /// Pending changes since the last call (coalesced per flow).
    pub fn take_changes(&self) -> ChangeBatch {
        let mut g = self.shared.lock();
        let Inner { table, log } = &mut *g;
        log.drain(table)
    }

    /// Every current flow (for a full resend after a controller restart).
    pub fn snapshot(&self) -> Vec<ServiceFlow> {
        let mut v: Vec<ServiceFlow> = self.shared.lock().table.flows().cloned().collect();
        v.sort_by_key(|f| f.key);
        v
    }

    pub fn stats(&self) -> FlowStats {
        self.shared.lock().table.stats().clone()
    }
}

/// Attaches the required kprobes (an error if any fails) and the optional query pair
/// (a warning if it fails: tracing works, only QPs made before it are missed). Returns
/// whether the query pair is attached.
fn attach_kprobes(
    object: &[u8],
    offs: &[u32; KOFF_COUNT],
    ring_bytes: u32,
) -> Result<(Ebpf, Vec<String>, bool), TracerError> {
    let mut ebpf = load_object(object, offs, ring_bytes)?;
    let mut att = Vec::new();
    let mut attach = |ebpf: &mut Ebpf, name: &str, func: &str| -> Result<(), TracerError> {
        let p: &mut KProbe = prog_mut(ebpf, name)?;
        p.load().map_err(program_err(name))?;
        p.attach(func, 0).map_err(program_err(name))?;
        att.push(format!("{name} -> {func}"));
        Ok(())
    };
    for (name, func) in KPROBE_PROGRAMS {
        attach(&mut ebpf, name, func)?;
    }
    let mut queries = true;
    for (name, func) in KPROBE_QUERY_PROGRAMS {
        if let Err(e) = attach(&mut ebpf, name, func) {
            tracing::warn!("service tracing: {e}; QPs connected before tracing are learned only when they reconnect");
            queries = false;
            break;
        }
    }
    Ok((ebpf, att, queries))
}

fn attach_uprobes(object: &[u8], cfg: &TracerConfig) -> Result<(Ebpf, Vec<String>), TracerError> {
    let mut targets: Vec<PathBuf> = cfg.uprobe_targets.clone();
    if cfg.discover_libibverbs {
        targets.extend(host::discover_libibverbs());
    }
    if targets.is_empty() {
        return Err(TracerError::Unavailable(
            "no libibverbs found (ldconfig -p, /usr/lib*/) and no uprobe target configured".into(),
        ));
    }
    // Only the exit program reads kernel memory in this mode: the task offsets, when
    // vmlinux BTF has them (else it falls back to the group leader's exit).
    let offs = btf::resolve_task_offsets(&cfg.btf_dir).unwrap_or([0; KOFF_COUNT]);
    let mut ebpf = load_object(object, &offs, cfg.ring_bytes)?;
    for (name, _, _) in UPROBE_PROGRAMS {
        let p: &mut UProbe = prog_mut(&mut ebpf, name)?;
        p.load().map_err(program_err(name))?;
    }
    let mut att = Vec::new();
    let mut skipped = Vec::new();
    for t in &targets {
        let abs = std::fs::canonicalize(t).unwrap_or_else(|_| t.clone());
        let elf = match std::fs::read(&abs) {
            Ok(b) => b,
            Err(e) => {
                skipped.push(format!("{}: {e}", t.display()));
                continue;
            }
        };
        // Resolve every symbol first so a target is attached completely or not at all.
        let mut plan = Vec::new();
        let mut missing = None;
        for (name, sym, required) in UPROBE_PROGRAMS {
            match host::symbol_file_offset(&elf, sym) {
                Ok(Some(off)) => plan.push((name, sym, off)),
                Ok(None) if !required => {}
                Ok(None) => missing = Some(format!("{}: no symbol {sym}", abs.display())),
                Err(e) => missing = Some(format!("{}: {e}", abs.display())),
            }
        }
        if let Some(m) = missing {
            skipped.push(m);
            continue;
        }
        for (name, sym, off) in plan {
            let p: &mut UProbe = prog_mut(&mut ebpf, name)?;
            debug_assert!(matches!(p.kind(), ProbeKind::Entry | ProbeKind::Return));
            p.attach(off, &abs, UProbeScope::AllProcesses)
                .map_err(|e| TracerError::Program {
                    prog: name.into(),
                    err: format!("attaching to {}:{sym}: {}", abs.display(), one_line(&e)),
                })?;
            att.push(format!("{name} -> {}:{sym}", abs.display()));
        }
    }
    if att.is_empty() {
        return Err(TracerError::Unavailable(format!(
            "no uprobe target usable: {}",
            skipped.join("; ")
        )));
    }
    for s in skipped {
        tracing::warn!("service tracing: skipped uprobe target {s}");
    }
    Ok((ebpf, att))
}

const BATCH: usize = 4096;

/// Keeps the exit program's filter to the owners of tracked QPs (syscalls: outside the
/// table lock). A failed update only means an exit found later, by polling.
fn sync_traced(map: &mut Option<BpfHashMap<MapData, u32, u8>>, changes: Vec<(u32, bool)>) {
    let Some(m) = map else { return };
    for (tgid, present) in changes {
        let r = if present {
            m.insert(tgid, 1, 0)
        } else {
            m.remove(&tgid)
        };
        if let Err(e) = r {
            tracing::debug!(tgid, present, error = %e, "TRACED_TGIDS update failed");
        }
    }
}

type EbpfLogs = tokio::io::unix::AsyncFd<aya_log::EbpfLogger<diag::Diagnostics>>;

/// Reads the programs' log records; false once reading them failed (malformed record:
/// the diagnostics stop, tracing goes on).
fn drain_logs(logs: &mut aya_log::EbpfLogger<diag::Diagnostics>) -> bool {
    // aya-log unwraps inside flush: a malformed record must not take the tracer down.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| logs.flush())).is_ok()
}

/// The kernel side the reader works with: the event ring, the programs' counters, the
/// exit filter and the programs' log records.
struct KernelSide {
    events: tokio::io::unix::AsyncFd<RingBuf<MapData>>,
    counters: PerCpuArray<MapData, u64>,
    traced: Option<BpfHashMap<MapData, u32, u8>>,
    logs: Option<EbpfLogs>,
}

async fn reader(
    kernel: KernelSide,
    shared: Arc<Shared>,
    resolver: Arc<dyn GidResolver>,
    filter: Arc<dyn QpFilter>,
    liveness: Duration,
) {
    let KernelSide {
        events: mut afd,
        counters,
        mut traced,
        mut logs,
    } = kernel;
    // The first check one period in, not at once: the table starts empty, and a check
    // left pending from the start raced the kernel's exit report of a process that died
    // later (its flows went by /proc, the exit record still unread).
    let period = liveness.max(Duration::from_millis(10));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    loop {
        tokio::select! {
            guard = afd.readable_mut() => {
                let mut guard = match guard {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::error!("service tracing stopped: ring buffer poll failed: {e}");
                        return;
                    }
                };
                let rb = guard.get_inner_mut();
                loop {
                    let mut n = 0;
                    {
                        let mut g = shared.lock();
                        let Inner { table, log } = &mut *g;
                        while n < BATCH {
                            let Some(item) = rb.next() else { break };
                            table.apply_bytes(&item, &*resolver, &*filter, &mut out);
                            n += 1;
                        }
                        // The exit filter learns a QP's owner before anyone can see the
                        // QP (the lock is held): an owner that exits right after a reader
                        // of the changes saw it is still reported by the kernel.
                        sync_traced(&mut traced, table.take_tgid_changes());
                        log.record(out.drain(..));
                    }
                    if n < BATCH {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                guard.clear_ready();
                let pending = !shared.lock().log.is_empty();
                if pending {
                    shared.notify.notify_waiters();
                }
            }
            guard = async { logs.as_mut().expect("guarded").readable_mut().await }, if logs.is_some() => {
                let ok = match guard {
                    Ok(mut g) => {
                        let ok = drain_logs(g.get_inner_mut());
                        g.clear_ready();
                        ok
                    }
                    Err(_) => false,
                };
                if !ok {
                    tracing::warn!("eBPF diagnostics stopped: their ring buffer gave an unreadable record");
                    logs = None;
                }
            }
            _ = tick.tick() => {
                let sum = |i: u32| counters.get(&i, 0).map(|v| v.iter().sum::<u64>()).unwrap_or(0);
                let (drops, errs) = (sum(STAT_RINGBUF_DROPS), sum(STAT_READ_ERRORS));
                let tgids = {
                    let mut g = shared.lock();
                    g.table.note_kernel_counters(drops, errs);
                    g.table.tgids()
                };
                // /proc reads happen outside the lock.
                let verdicts: Vec<(u32, Option<u64>)> = tgids
                    .into_iter()
                    .filter_map(|p| match host::process_liveness(p) {
                        host::Liveness::Gone => Some((p, None)),
                        host::Liveness::Started(s) => Some((p, Some(s))),
                        host::Liveness::Unknown => None,
                    })
                    .collect();
                let mut g = shared.lock();
                let Inner { table, log } = &mut *g;
                for (p, s) in verdicts {
                    table.process_gone(p, s, &mut out);
                }
                let changed = !out.is_empty();
                log.record(out.drain(..));
                let tgid_changes = table.take_tgid_changes();
                drop(g);
                sync_traced(&mut traced, tgid_changes);
                if changed {
                    shared.notify.notify_waiters();
                }
            }
        }
    }
}
