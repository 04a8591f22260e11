//! One RNIC endpoint: a UD QP with pre-posted receive buffers, a poller thread feeding the
//! SPSC ring, and the async face the agent drives (same shape as `UdpEndpoint`).
//!
//! This file holds the endpoint's shared state and its async face; `poller` is the
//! poller thread, `resolver` the address-handle threads.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::ah_cache::AhKey;
use super::ah_table::{AhTable, Lookup, Resolved};
use super::completion::{translate, WcOutcome, WcRecord, WrKind, GRH_LEN, WC_WR_FLUSH_ERR};
use super::error::RdmaError;
use super::ffi::{self, Ah, AhSpec, CompChannel, Context, Cq, DeviceCaps, Mr, Pd, Qp};
use super::nic_clock::NicClock;
use super::qp_recovery::{self, RecoveryBudget};
use super::ring::{self, Consumer, Producer};
use super::sysfs::{self, PortInfo};
use super::{RdmaOptions, RdmaStats, TimestampSource, MAX_PAYLOAD, QKEY, RECV_SLOT_LEN};
use crate::{clock, Endpoint, SendId, SendParams, TransportEvent, VerbsError};

mod poller;
mod resolver;

use poller::Poller;
use resolver::run_resolver;

/// Hop limit of every probe's GRH.
const HOP_LIMIT: u8 = 64;
/// How often the poller checks the QP state and sysfs (async events wake it at once).
const HEALTH_INTERVAL: Duration = Duration::from_millis(500);
const POLL_BATCH: usize = 32;
/// Sends parked per path while its address handle is being made.
const PARKED_PER_PATH: usize = 16;
/// Resolver threads for GIDs not known to work (new peers, retries, refreshes): each may
/// sit a second in a dead neighbour's ARP timeout, so several serve side by side. One
/// more thread makes handles for known GIDs (a new flow label), which never block.
const SLOW_RESOLVERS: usize = 3;

/// The largest power of two <= n (n >= 1).
fn pow2_floor(n: u32) -> u32 {
    1 << (31 - n.max(1).leading_zeros())
}

/// The devices to open: every RDMA device, filtered by `allowed_device_names`.
pub fn list_devices(allowed: &[String]) -> Result<Vec<String>, VerbsError> {
    let found = ffi::device_names()?;
    Ok(super::select_devices(&found, allowed)?)
}

/// What `rpingmesh-hw-check` prints per device.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub name: String,
    pub ports: Vec<Result<PortInfo, String>>,
    pub hca_core_clock_khz: u64,
    pub completion_timestamp_mask: u64,
    pub extended_cq_timestamps: Result<(), String>,
    pub raw_clock: Option<u64>,
}

/// Opens `name` and collects its facts (GID tables from sysfs, clock and timestamp support).
pub fn device_info(name: &str, sysfs_dir: &std::path::Path) -> Result<DeviceInfo, VerbsError> {
    let ctx = Context::open(name)?;
    let caps = ctx.caps()?;
    let ports = (1..=caps.phys_port_cnt.max(1) as u32)
        .map(|p| sysfs::read_port(sysfs_dir, name, p).map_err(|e| e.to_string()))
        .collect();
    let extended_cq_timestamps = if caps.completion_timestamp_mask == 0 {
        Err("device reports completion_timestamp_mask 0".to_string())
    } else {
        Cq::create_ex(&ctx, 16, None)
            .map(drop)
            .map_err(|e| e.to_string())
    };
    Ok(DeviceInfo {
        name: name.to_string(),
        ports,
        hca_core_clock_khz: caps.hca_core_clock,
        completion_timestamp_mask: caps.completion_timestamp_mask,
        extended_cq_timestamps,
        raw_clock: ctx.raw_clock(),
    })
}

/// State shared by the endpoint, its poller thread and its AH resolver thread. Field
/// order = drop order: the QP goes before the buffers it references.
struct Shared {
    qp: Qp,
    recv_mr: Mr,
    send_mr: Mr,
    cq: Arc<Cq>,
    channel: Arc<CompChannel>,
    /// The send side: address handles, parked sends, slots.
    send: Mutex<SendState>,
    pd: Arc<Pd>,
    ctx: Arc<Context>,
    port: u8,
    gid: Ipv6Addr,
    sgid_index: u8,
    send_depth: u64,
    software_ts: bool,
    sysfs_dir: std::path::PathBuf,
    /// Bytes per receive slot: GRH + the port's MTU, so no datagram overflows a slot.
    recv_slot_len: usize,
    notify: Notify,
    stop: AtomicBool,
    /// False between IBV_EVENT_PORT_ERR and IBV_EVENT_PORT_ACTIVE: sends fail at once.
    port_active: AtomicBool,
    /// Written by `Drop` to wake the poller out of poll(2).
    wake: OwnedFd,
    failure: Mutex<Option<RdmaError>>,
    failed: AtomicBool,
    /// Sends the resolver could not post (no AH, queue full), for `poll_events`.
    failed_sends: Mutex<Vec<TransportEvent>>,
    failed_sends_pending: AtomicBool,
    sends_completed: AtomicU64,
    sends_failed: AtomicU64,
    malformed: AtomicU64,
    error_completions: AtomicU64,
    /// QPs found in the error state and reset in place (same QPN).
    qp_recoveries: AtomicU64,
    /// Software timestamps only: CLOCK_MONOTONIC read just before each send was posted,
    /// by send slot. It is the send's T2/T4: the packet leaves after it, so the network
    /// interval (T3 - T2, T5 - T4) can only be over-, never under-estimated, whereas the
    /// time the poller happens to see the send completion may lie after the peer's
    /// receive.
    sw_post_ts: Box<[AtomicU64]>,
}

impl Shared {
    fn fail(&self, e: RdmaError) {
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        // One line per failure: the flush errors that follow a QP error repeat it.
        if f.is_none() {
            tracing::error!("{e}");
            *f = Some(e);
        }
        self.failed.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    fn failure_text(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        let f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        f.as_ref().map(|e| e.to_string())
    }

    fn device(&self) -> &str {
        self.ctx.name()
    }

    fn lock_send(&self) -> std::sync::MutexGuard<'_, SendState> {
        self.send.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Posts one send with `ah` into the next send slot. The caller holds the send lock
    /// (`posted` is its counter).
    fn post(
        &self,
        ah: &Ah,
        posted: &mut u64,
        qpn: u32,
        payload: &[u8],
        id: SendId,
    ) -> io::Result<()> {
        let completed = self.sends_completed.load(Ordering::Acquire);
        if posted.saturating_sub(completed) >= self.send_depth {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "rdma device {}: send queue full ({} sends in flight)",
                    self.device(),
                    self.send_depth
                ),
            ));
        }
        // Slot `posted % depth` was last used by send posted-depth, which has completed.
        let slot = (*posted % self.send_depth) as u32;
        let off = slot as usize * MAX_PAYLOAD;
        self.send_mr.write(off, payload);
        if self.software_ts {
            self.sw_post_ts[slot as usize].store(clock::monotonic_ns(), Ordering::Release);
        }
        self.qp
            .post_send_ud(
                ah,
                qpn,
                QKEY,
                &self.send_mr,
                off,
                payload.len(),
                WrKind::Send { id, slot }.to_wr_id(),
            )
            .map_err(io::Error::from)?;
        *posted += 1;
        Ok(())
    }

    /// Reports sends that were accepted but never posted.
    fn sends_failed(&self, ids: impl IntoIterator<Item = SendId>) {
        let mut q = self.failed_sends.lock().unwrap_or_else(|p| p.into_inner());
        let before = q.len();
        q.extend(ids.into_iter().map(|id| TransportEvent::SendFailed { id }));
        let n = (q.len() - before) as u64;
        drop(q);
        if n > 0 {
            self.sends_failed.fetch_add(n, Ordering::Relaxed);
            self.failed_sends_pending.store(true, Ordering::Release);
            self.notify.notify_one();
        }
    }
}

/// A send waiting for its path's address handle.
struct Parked {
    id: SendId,
    qpn: u32,
    len: usize,
    payload: [u8; MAX_PAYLOAD],
}

/// Send-side state under one lock.
struct SendState {
    ahs: AhTable<Ah>,
    /// Sends waiting for their AH, by path; `parked_total` across paths.
    parked: HashMap<AhKey, Vec<Parked>>,
    parked_total: usize,
    /// (sends posted when evicted, handle): destroyed once that many sends completed.
    retired: Vec<(u64, Ah)>,
    posted: u64,
    next_id: SendId,
}

/// A path whose address handle the resolver thread is to create.
struct AhRequest {
    key: AhKey,
    spec: AhSpec,
}

pub struct RdmaEndpoint {
    // Dropped first: joins the poller (see Drop). The resolver thread is not joined (it
    // may sit in a one-second ibv_create_ah): closing its channel ends it, and it holds
    // its own reference to the verbs objects until then.
    poller: Option<JoinHandle<()>>,
    /// Requests for GIDs that resolved before / for the others (see SLOW_RESOLVERS).
    fast_resolver: mpsc::Sender<AhRequest>,
    slow_resolvers: mpsc::Sender<AhRequest>,
    events: Mutex<Consumer<TransportEvent>>,
    shared: Arc<Shared>,
    local: Endpoint,
    device_name: String,
    ts_source: TimestampSource,
    gid_warning: Option<String>,
}

impl std::fmt::Debug for RdmaEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaEndpoint")
            .field("device", &self.device_name)
            .field("local", &self.local)
            .field("timestamps", &self.ts_source)
            .finish()
    }
}

impl Drop for RdmaEndpoint {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: an 8-byte write to our own eventfd (a failure only delays the join).
        unsafe { libc::write(self.shared.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(h) = self.poller.take() {
            let _ = h.join();
        }
    }
}

impl RdmaEndpoint {
    pub(super) fn open(o: &RdmaOptions) -> Result<RdmaEndpoint, RdmaError> {
        o.validate()?;
        // Device list first: on a host without RDMA this is the one clear line.
        let found = ffi::device_names()?;
        if !found.contains(&o.device_name) {
            return Err(RdmaError::NoAllowedDevice {
                allowed: vec![o.device_name.clone()],
                found,
            });
        }
        let port = sysfs::read_port(&o.sysfs_dir, &o.device_name, o.port as u32)?;
        sysfs::check_port_active(&port)?;
        let entry = sysfs::select_gid(&port, o.gid_index)?.clone();
        let gid_warning = sysfs::roce_v1_warning(&port, &entry);
        if let Some(w) = &gid_warning {
            tracing::warn!("{w}");
        }

        let ctx = Context::open(&o.device_name)?;
        // sysfs and libibverbs must agree on the GID, or the GID table changed under us.
        let verbs_gid = ctx.query_gid(o.port, o.gid_index)?;
        if verbs_gid != entry.gid {
            return Err(RdmaError::Sysfs {
                path: o
                    .sysfs_dir
                    .join(&o.device_name)
                    .join(format!("ports/{}/gids/{}", o.port, o.gid_index)),
                reason: format!(
                    "GID {} differs from ibv_query_gid's {verbs_gid}; GID table changed, retry",
                    entry.gid
                ),
            });
        }
        let caps: DeviceCaps = ctx.caps()?;
        let pd = Pd::alloc(&ctx)?;
        // A power of two, so send slot = id % depth survives the u32 wrap of SendId.
        let send_depth = pow2_floor(o.send_queue_depth.min(caps.max_qp_wr.max(1)));
        let recv_n = o.recv_buffers.min(caps.max_qp_wr.max(1));
        let cqe = (send_depth + recv_n).min(caps.max_cqe.max(1));
        let channel = CompChannel::create(&ctx)?;

        let want_hw = !o.force_software_timestamps
            && caps.completion_timestamp_mask != 0
            && caps.hca_core_clock != 0;
        let (cq, ts_source) = if want_hw {
            match Cq::create_ex(&ctx, cqe, Some(&channel)) {
                Ok(cq) => (
                    cq,
                    TimestampSource::Nic {
                        khz: caps.hca_core_clock,
                        mask: caps.completion_timestamp_mask,
                    },
                ),
                Err(e) => {
                    tracing::info!(
                        "rdma device {}: extended CQ with completion timestamps unavailable ({e}); using CLOCK_MONOTONIC software timestamps",
                        o.device_name
                    );
                    (
                        Cq::create_plain(&ctx, cqe, Some(&channel))?,
                        TimestampSource::Software,
                    )
                }
            }
        } else {
            (
                Cq::create_plain(&ctx, cqe, Some(&channel))?,
                TimestampSource::Software,
            )
        };

        let qp = Qp::create_ud(&pd, &cq, o.port, QKEY, send_depth, recv_n)?;
        // A UD datagram larger than its receive buffer fails the receive, and rxe then
        // moves the whole QP to the error state: any stranger with our Q_Key could knock
        // the endpoint out. A slot of GRH + MTU holds whatever the port can deliver.
        let mtu = ctx.active_mtu_bytes(o.port).unwrap_or(4096);
        let recv_slot_len = GRH_LEN + mtu.max(MAX_PAYLOAD);
        let recv_mr = Mr::register(&pd, recv_n as usize * recv_slot_len)?;
        let send_mr = Mr::register(&pd, send_depth as usize * MAX_PAYLOAD)?;
        for slot in 0..recv_n {
            qp.post_recv(
                &recv_mr,
                slot as usize * recv_slot_len,
                recv_slot_len,
                WrKind::Recv(slot).to_wr_id(),
            )?;
        }
        let nic_clock = match ts_source {
            TimestampSource::Nic { khz, mask } => {
                // Anchor now if the device can say its clock; else at the first completion.
                ctx.raw_clock()
                    .and_then(|t| NicClock::new(khz, mask, t, clock::monotonic_ns()))
            }
            TimestampSource::Software => None,
        };
        let local = Endpoint {
            gid: entry.gid,
            qpn: qp.qpn(),
        };
        // SAFETY: plain syscall; the fd is owned by the OwnedFd from here on.
        let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if wake < 0 {
            return Err(RdmaError::Verbs {
                device: o.device_name.clone(),
                call: "eventfd",
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let shared = Arc::new(Shared {
            qp,
            recv_mr,
            send_mr,
            cq,
            channel,
            send: Mutex::new(SendState {
                ahs: AhTable::new(o.ah_cache_capacity, o.ah_max_age.as_nanos() as u64),
                parked: HashMap::new(),
                parked_total: 0,
                retired: Vec::new(),
                posted: 0,
                next_id: 0,
            }),
            pd,
            ctx,
            port: o.port,
            gid: entry.gid,
            sgid_index: o.gid_index as u8,
            send_depth: send_depth as u64,
            software_ts: ts_source == TimestampSource::Software,
            sysfs_dir: o.sysfs_dir.clone(),
            recv_slot_len,
            notify: Notify::new(),
            stop: AtomicBool::new(false),
            port_active: AtomicBool::new(true),
            wake,
            sw_post_ts: (0..send_depth).map(|_| AtomicU64::new(0)).collect(),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            failed_sends: Mutex::new(Vec::new()),
            failed_sends_pending: AtomicBool::new(false),
            sends_completed: AtomicU64::new(0),
            sends_failed: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            error_completions: AtomicU64::new(0),
            qp_recoveries: AtomicU64::new(0),
        });
        let (producer, consumer) = ring::channel(o.event_ring_capacity);
        let poller = Poller {
            shared: shared.clone(),
            out: producer,
            nic_clock,
            ts_source,
            recv_slots: recv_n,
            port_up_logged: true,
            error_completions_logged: 0,
            qp_broken: None,
            recovery: RecoveryBudget::default(),
        };
        let spawn_err = |e| RdmaError::Verbs {
            device: o.device_name.clone(),
            call: "spawn thread",
            source: e,
        };
        let handle = std::thread::Builder::new()
            .name(format!("rdma-poll-{}", o.device_name))
            .spawn(move || poller.run())
            .map_err(spawn_err)?;
        let (fast_resolver, fast_requests) = mpsc::channel::<AhRequest>();
        let (slow_resolvers, slow_requests) = mpsc::channel::<AhRequest>();
        let slow_requests = Arc::new(Mutex::new(slow_requests));
        let mut resolver_threads = Vec::new();
        let sh = shared.clone();
        resolver_threads.push(
            std::thread::Builder::new()
                .name(format!("rdma-ah-{}", o.device_name))
                .spawn(move || run_resolver(sh, || fast_requests.recv().ok())),
        );
        for i in 0..SLOW_RESOLVERS {
            let (sh, rx) = (shared.clone(), slow_requests.clone());
            resolver_threads.push(
                std::thread::Builder::new()
                    .name(format!("rdma-ah{i}-{}", o.device_name))
                    .spawn(move || {
                        run_resolver(sh, || {
                            rx.lock().unwrap_or_else(|p| p.into_inner()).recv().ok()
                        })
                    }),
            );
        }
        let endpoint = RdmaEndpoint {
            poller: Some(handle),
            fast_resolver,
            slow_resolvers,
            events: Mutex::new(consumer),
            shared,
            local,
            device_name: o.device_name.clone(),
            ts_source,
            gid_warning,
        };
        // On failure the endpoint is dropped here, which stops its poller.
        for t in resolver_threads {
            t.map_err(spawn_err)?;
        }
        tracing::info!(
            "rdma device {} port {}: gid[{}] {} qpn {} timestamps {:?}",
            o.device_name,
            o.port,
            o.gid_index,
            endpoint.local.gid,
            endpoint.local.qpn,
            ts_source
        );
        Ok(endpoint)
    }

    pub fn local(&self) -> Endpoint {
        self.local
    }

    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The GID as an address (IPv4 for v4-mapped GIDs), for RnicInfo.ip_address.
    pub fn ip_string(&self) -> String {
        match self.local.gid.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4).to_string(),
            None => IpAddr::V6(self.local.gid).to_string(),
        }
    }

    pub fn timestamp_source(&self) -> TimestampSource {
        self.ts_source
    }

    /// Set when the chosen GID is RoCE v1 (the agent logs it at start).
    pub fn gid_warning(&self) -> Option<&str> {
        self.gid_warning.as_deref()
    }

    /// The failure that stopped this endpoint (QP error, device lost), if any. The agent
    /// then drops the endpoint and re-opens it after `Backoff::next_delay()`.
    pub fn failure(&self) -> Option<String> {
        self.shared.failure_text()
    }

    pub fn stats(&self) -> RdmaStats {
        let (ah, posted) = {
            let s = self.shared.lock_send();
            (s.ahs.stats(), s.posted)
        };
        let ring = self
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stats();
        RdmaStats {
            event_ring_dropped: ring.dropped,
            events_delivered: ring.pushed,
            malformed_completions: self.shared.malformed.load(Ordering::Relaxed),
            error_completions: self.shared.error_completions.load(Ordering::Relaxed),
            qp_recoveries: self.shared.qp_recoveries.load(Ordering::Relaxed),
            sends_posted: posted,
            sends_completed: self.shared.sends_completed.load(Ordering::Relaxed),
            sends_failed: self.shared.sends_failed.load(Ordering::Relaxed),
            ah_hits: ah.cache.hits,
            ah_misses: ah.cache.misses,
            ah_evictions: ah.cache.evictions,
            ah_resolutions: ah.resolutions,
            ah_resolution_failures: ah.resolution_failures,
            ah_refreshes: ah.refreshes,
            ah_unreachable_sends: ah.unreachable_sends,
            port_active: self.shared.port_active.load(Ordering::Relaxed),
        }
    }

    fn ah_key(to: &Endpoint, params: &SendParams) -> AhKey {
        AhKey::new(
            to.gid,
            params.flow_label,
            params.service_level,
            params.traffic_class,
        )
    }

    /// Makes room for `paths` address handles (the pinglist's targets x flow labels plus
    /// the peers that probe us), so rounds of flow labels do not evict each other.
    pub fn reserve_paths(&self, paths: usize) {
        self.shared.lock_send().ahs.reserve(paths);
    }

    /// A probe on this path was lost: its address handle is made again (off the send
    /// path; the old one serves until then), in case the next hop moved.
    pub fn note_loss(&self, to: &Endpoint, params: &SendParams) {
        self.shared
            .lock_send()
            .ahs
            .note_loss(&Self::ah_key(to, params));
    }

    /// Sends one probe packet to `to` (GID + QPN) on the path given by `params`
    /// (flow label, traffic class, SL: the agent fills them from config or the target).
    /// Returns the id its `TransportEvent::Sent` (or `SendFailed`) will carry. Never
    /// blocks: a path without an address handle parks the send until the resolver
    /// thread made one.
    pub fn send(&self, to: &Endpoint, params: &SendParams, payload: &[u8]) -> io::Result<SendId> {
        if let Some(f) = self.failure() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, f));
        }
        if payload.len() > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "rdma send: payload of {} bytes exceeds {MAX_PAYLOAD}",
                    payload.len()
                ),
            ));
        }
        if !self.shared.port_active.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "rdma device {} port {} is down",
                    self.device_name, self.shared.port
                ),
            ));
        }
        let key = Self::ah_key(to, params);
        let now = clock::monotonic_ns();
        let mut guard = self.shared.lock_send();
        let SendState {
            ahs,
            parked,
            parked_total,
            retired,
            posted,
            next_id,
        } = &mut *guard;
        let completed = self.shared.sends_completed.load(Ordering::Acquire);
        // Send completions arrive in order, so retired AHs of completed sends can go.
        retired.retain(|(posted_at, _)| *posted_at > completed);
        let id = *next_id;
        let park = match ahs.lookup(&key, now) {
            Lookup::Hit { handle, refresh } => {
                if refresh {
                    // Possibly a neighbour gone bad: not on the fast lane.
                    self.request_ah(key, false);
                }
                self.shared.post(handle, posted, to.qpn, payload, id)?;
                false
            }
            Lookup::Miss => {
                let known = ahs.gid_known(&key.gid);
                self.request_ah(key, known);
                true
            }
            Lookup::Pending => true,
            Lookup::Unreachable {
                reason,
                retry_in_ns,
            } => {
                return Err(io::Error::new(
                    io::ErrorKind::HostUnreachable,
                    format!(
                        "rdma device {}: no address handle for {} ({reason}); next try in {} ms",
                        self.device_name,
                        to.gid,
                        retry_in_ns / 1_000_000
                    ),
                ))
            }
        };
        if park {
            let waiting = parked.entry(key).or_default();
            if waiting.len() >= PARKED_PER_PATH || *parked_total >= self.shared.send_depth as usize
            {
                return Err(io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!(
                        "rdma device {}: {} sends already wait for address handles",
                        self.device_name, *parked_total
                    ),
                ));
            }
            let mut p = Parked {
                id,
                qpn: to.qpn,
                len: payload.len(),
                payload: [0; MAX_PAYLOAD],
            };
            p.payload[..payload.len()].copy_from_slice(payload);
            waiting.push(p);
            *parked_total += 1;
        }
        *next_id = id.wrapping_add(1);
        Ok(id)
    }

    fn request_ah(&self, key: AhKey, fast: bool) {
        let spec = AhSpec {
            dgid: key.gid,
            flow_label: key.flow_label,
            sgid_index: self.shared.sgid_index,
            hop_limit: HOP_LIMIT,
            traffic_class: key.traffic_class,
            service_level: key.service_level,
            port: self.shared.port,
        };
        let lane = if fast {
            &self.fast_resolver
        } else {
            &self.slow_resolvers
        };
        // Fails only when the resolvers are gone, i.e. the endpoint is being dropped.
        let _ = lane.send(AhRequest { key, spec });
    }

    /// Non-blocking: appends every queued event. Err once the endpoint failed and all
    /// events before the failure were delivered.
    pub fn poll_events(&self, out: &mut Vec<TransportEvent>) -> io::Result<()> {
        let mut n = self
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain_into(out);
        if self
            .shared
            .failed_sends_pending
            .swap(false, Ordering::AcqRel)
        {
            let mut q = self
                .shared
                .failed_sends
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            n += q.len();
            out.append(&mut q);
        }
        if n == 0 {
            if let Some(f) = self.failure() {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, f));
            }
        }
        Ok(())
    }

    /// Waits until at least one event is available, then appends everything ready.
    pub async fn wait_events(&self, out: &mut Vec<TransportEvent>) -> io::Result<()> {
        loop {
            let before = out.len();
            self.poll_events(out)?;
            if out.len() > before {
                return Ok(());
            }
            // notify_one stores a permit when nobody waits, so a push between the drain
            // above and this await is not lost.
            self.shared.notify.notified().await;
        }
    }
}

#[cfg(test)]
mod tests;
