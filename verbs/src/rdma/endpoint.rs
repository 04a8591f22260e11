//! One RNIC endpoint: a UD QP with pre-posted receive buffers, a poller thread feeding the
//! SPSC ring, and the async face the agent drives (same shape as `UdpEndpoint`).

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
use super::ring::{self, Consumer, Producer};
use super::sysfs::{self, PortInfo};
use super::{RdmaOptions, RdmaStats, TimestampSource, MAX_PAYLOAD, QKEY, RECV_SLOT_LEN};
use crate::{clock, Endpoint, SendId, SendParams, TransportEvent, VerbsError};

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
        if *posted - completed >= self.send_depth {
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

/// The AH resolver thread: makes each requested address handle (this is where a dead
/// peer's one-second neighbour timeout is spent, on nobody's send path), then posts the
/// sends parked for it or fails them.
fn run_resolver(shared: Arc<Shared>, mut next: impl FnMut() -> Option<AhRequest>) {
    while let Some(req) = next() {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let made = Ah::create(&shared.pd, &req.spec).map_err(|e| match e {
            RdmaError::Verbs { source, .. } => format!("ibv_create_ah: {source}"),
            other => other.to_string(),
        });
        let now = clock::monotonic_ns();
        let mut failed = Vec::new();
        {
            let mut guard = shared.lock_send();
            let SendState {
                ahs,
                parked,
                parked_total,
                retired,
                posted,
                ..
            } = &mut *guard;
            let waiting = parked.remove(&req.key).unwrap_or_default();
            *parked_total -= waiting.len();
            let error = made.as_ref().err().cloned();
            let usable = match ahs.resolved(req.key, made, now) {
                Resolved::Ready { retire } => {
                    if let Some(old) = retire {
                        // Sends posted so far may still reference it.
                        retired.push((*posted, old));
                    }
                    true
                }
                Resolved::KeptOld => true,
                Resolved::Failed { first } => {
                    if first {
                        tracing::warn!(
                            "rdma device {}: no address handle for {} ({}); its probes fail until a retry succeeds",
                            shared.device(),
                            req.key.gid,
                            error.unwrap_or_default()
                        );
                    }
                    false
                }
            };
            match ahs.peek(&req.key) {
                Some(ah) if usable && !shared.stop.load(Ordering::Acquire) => {
                    for p in waiting {
                        if shared
                            .post(ah, posted, p.qpn, &p.payload[..p.len], p.id)
                            .is_err()
                        {
                            failed.push(p.id);
                        }
                    }
                }
                _ => failed.extend(waiting.iter().map(|p| p.id)),
            }
        }
        shared.sends_failed(failed);
    }
}

struct Poller {
    shared: Arc<Shared>,
    out: Producer<TransportEvent>,
    ts_source: TimestampSource,
    nic_clock: Option<NicClock>,
    recv_slots: u32,
    /// The port state last logged (one line per change).
    port_up_logged: bool,
    /// Error completions logged so far (the first, then at powers of two).
    error_completions_logged: u64,
}

/// Which of the poller's descriptors poll(2) found readable.
#[derive(Default)]
struct Ready {
    cq: bool,
    async_event: bool,
}

impl Poller {
    /// Sleeps on the completion channel, never spins. On each wake-up it first drains
    /// the CQ, so a receive's software timestamp is taken before anything else (the
    /// channel's event is read and acknowledged afterwards); then it re-arms the CQ and
    /// drains once more, since a completion that lands before the arm raises no event.
    /// poll(2) also watches the async-event fd and the stop eventfd.
    fn run(mut self) {
        let mut batch: Vec<(WcRecord, Option<u64>)> = Vec::with_capacity(POLL_BATCH);
        let mut slot_buf = vec![0u8; RECV_SLOT_LEN];
        let mut next_health = Instant::now() + HEALTH_INTERVAL;
        if self.rearm(&mut batch, &mut slot_buf).is_err() {
            return;
        }
        loop {
            if self.shared.stop.load(Ordering::Acquire)
                || self.shared.failed.load(Ordering::Acquire)
            {
                break;
            }
            let timeout = next_health.saturating_duration_since(Instant::now());
            let ready = match self.wait(timeout) {
                Ok(r) => r,
                Err(e) => {
                    self.shared.fail(RdmaError::Verbs {
                        device: self.shared.ctx.name().to_string(),
                        call: "poll(completion channel)",
                        source: e,
                    });
                    break;
                }
            };
            if ready.cq {
                if self.drain(&mut batch, &mut slot_buf).is_err() {
                    break;
                }
                if let Err(e) = self.shared.channel.drain_events() {
                    self.shared.fail(e);
                    break;
                }
                if self.rearm(&mut batch, &mut slot_buf).is_err() {
                    break;
                }
            }
            if ready.async_event || Instant::now() >= next_health {
                next_health = Instant::now() + HEALTH_INTERVAL;
                self.health_check();
            }
        }
    }

    /// Arms the CQ, then drains what arrived before the arm took effect.
    fn rearm(
        &mut self,
        batch: &mut Vec<(WcRecord, Option<u64>)>,
        slot_buf: &mut [u8],
    ) -> Result<(), ()> {
        if let Err(e) = self.shared.cq.arm() {
            self.shared.fail(e);
            return Err(());
        }
        self.drain(batch, slot_buf).map(drop)
    }

    /// Waits up to `timeout` for the CQ channel, async events or the stop eventfd.
    fn wait(&self, timeout: Duration) -> io::Result<Ready> {
        let mut fds = [
            libc::pollfd {
                fd: self.shared.channel.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.shared.ctx.async_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: self.shared.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a live array of 3 pollfds.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(Ready::default());
            }
            return Err(e);
        }
        Ok(Ready {
            cq: fds[0].revents != 0,
            async_event: fds[1].revents != 0,
        })
    }

    /// Polls the CQ until it is empty, delivering every completion. A receive's software
    /// time is read right after the poll that returned it, never earlier: the wake-up
    /// time would precede a completion that came in while the poller was already awake
    /// for another one (and made T5 < T4). Err after a failure (already recorded in
    /// `shared`).
    fn drain(
        &mut self,
        batch: &mut Vec<(WcRecord, Option<u64>)>,
        slot_buf: &mut [u8],
    ) -> Result<usize, ()> {
        let mut total = 0;
        let mut delivered = false;
        loop {
            batch.clear();
            let n = match self.shared.cq.poll(POLL_BATCH, batch) {
                Ok(n) => n,
                Err(e) => {
                    self.shared.fail(e);
                    return Err(());
                }
            };
            let sw_ts = clock::monotonic_ns();
            for (mut rec, raw) in batch.drain(..) {
                let kind = WrKind::from_wr_id(rec.wr_id);
                rec.ts_ns = self.timestamp(kind, raw, sw_ts);
                // Only the head of a receive: the GRH and what a probe can hold.
                let head = (rec.byte_len as usize).min(slot_buf.len());
                let slot = match kind {
                    WrKind::Recv(s) if s < self.recv_slots && rec.status == 0 => {
                        let off = s as usize * self.shared.recv_slot_len;
                        self.shared.recv_mr.read(off, &mut slot_buf[..head]);
                        Some(s)
                    }
                    _ => None,
                };
                if matches!(kind, WrKind::Send { .. }) {
                    self.shared.sends_completed.fetch_add(1, Ordering::Release);
                }
                let buf: &[u8] = if slot.is_some() {
                    &slot_buf[..head]
                } else {
                    &[]
                };
                match translate(&rec, buf, self.shared.recv_slot_len) {
                    WcOutcome::Event { event, repost } => {
                        // A full ring drops (and counts) rather than stall the CQ.
                        let _ = self.out.push(event);
                        delivered = true;
                        self.repost(repost);
                    }
                    WcOutcome::Malformed { reason, repost } => {
                        self.shared.malformed.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!("rdma device {}: {reason}", self.shared.ctx.name());
                        self.repost(repost);
                    }
                    WcOutcome::Failed {
                        kind,
                        status,
                        reason,
                    } => {
                        if self.on_error_completion(kind, status, &reason) {
                            delivered = true;
                        }
                    }
                }
            }
            total += n;
            if n < POLL_BATCH {
                break;
            }
        }
        if delivered {
            self.shared.notify.notify_one();
        }
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(());
        }
        Ok(total)
    }

    fn timestamp(&mut self, kind: WrKind, raw: Option<u64>, sw_ts: u64) -> u64 {
        match (self.ts_source, raw) {
            (TimestampSource::Nic { khz, mask }, Some(ticks)) => {
                let c = self.nic_clock.get_or_insert_with(|| {
                    NicClock::new(khz, mask, ticks, sw_ts).expect("khz checked non-zero at open")
                });
                c.convert_tracking(ticks)
            }
            _ => match kind {
                WrKind::Send { slot, .. } => {
                    let posted = self
                        .shared
                        .sw_post_ts
                        .get(slot as usize)
                        .map_or(0, |t| t.load(Ordering::Acquire));
                    if posted != 0 && posted <= sw_ts {
                        posted
                    } else {
                        sw_ts
                    }
                }
                WrKind::Recv(_) => sw_ts,
            },
        }
    }

    fn repost(&self, slot: Option<u32>) {
        if let Some(s) = slot {
            let len = self.shared.recv_slot_len;
            let r = self.shared.qp.post_recv(
                &self.shared.recv_mr,
                s as usize * len,
                len,
                WrKind::Recv(s).to_wr_id(),
            );
            if let Err(e) = r {
                self.shared.fail(e);
            }
        }
    }

    /// An error completion. The QP in the error state fails the endpoint (flush errors
    /// only come from there); anything else costs one send or one receive: the send is
    /// reported failed, the receive buffer goes back. True when an event was queued.
    fn on_error_completion(&mut self, kind: WrKind, status: u32, reason: &str) -> bool {
        let n = self
            .shared
            .error_completions
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        let qp_in_error = status == WC_WR_FLUSH_ERR || self.shared.qp.in_error().unwrap_or(true);
        if qp_in_error {
            self.shared.fail(RdmaError::QpError {
                device: self.shared.device().to_string(),
                qpn: self.shared.qp.qpn(),
                reason: reason.to_string(),
            });
            return false;
        }
        if n.is_power_of_two() && n > self.error_completions_logged {
            self.error_completions_logged = n;
            tracing::warn!(
                "rdma device {}: {reason}; the QP is fine, carrying on ({n} error completions so far)",
                self.shared.device()
            );
        }
        match kind {
            WrKind::Send { id, .. } => {
                self.shared.sends_failed.fetch_add(1, Ordering::Relaxed);
                let _ = self.out.push(TransportEvent::SendFailed { id });
                true
            }
            WrKind::Recv(s) => {
                self.repost((s < self.recv_slots).then_some(s));
                false
            }
        }
    }

    fn health_check(&mut self) {
        let dev = self.shared.device().to_string();
        while let Some(ev) = self.shared.ctx.poll_async_event() {
            if ev.port.is_some_and(|p| p != self.shared.port) {
                continue; // another port of this device
            }
            if ffi::async_event_is_fatal(ev.ty) {
                let e = if ev.ty == ffi::EVENT_DEVICE_FATAL {
                    RdmaError::DeviceLost {
                        device: dev.clone(),
                        reason: ev.name.to_string(),
                    }
                } else {
                    RdmaError::QpError {
                        device: dev.clone(),
                        qpn: self.shared.qp.qpn(),
                        reason: format!("async event {}", ev.name),
                    }
                };
                self.shared.fail(e);
                return;
            }
            match ev.ty {
                ffi::EVENT_PORT_ERR => self.set_port_active(false),
                ffi::EVENT_PORT_ACTIVE => self.set_port_active(true),
                ffi::EVENT_GID_CHANGE => self.check_gid(),
                _ => tracing::info!("rdma device {dev}: async event {}", ev.name),
            }
        }
        match self.shared.qp.in_error() {
            Ok(true) => self.shared.fail(RdmaError::QpError {
                device: dev.clone(),
                qpn: self.shared.qp.qpn(),
                reason: "ibv_query_qp reports IBV_QPS_ERR".into(),
            }),
            Ok(false) => {}
            Err(e) => self.shared.fail(RdmaError::DeviceLost {
                device: dev.clone(),
                reason: e.to_string(),
            }),
        }
        // The device vanishing from sysfs (driver unbound, rxe link deleted).
        if !self.shared.sysfs_dir.join(&dev).exists() {
            self.shared.fail(RdmaError::DeviceLost {
                device: dev,
                reason: "gone from sysfs".into(),
            });
        }
    }

    /// Port down: the QP stays (it is not in error), sends fail at once with "port is
    /// down" until the port is ACTIVE again; then every address handle is made anew,
    /// since the neighbours may have changed meanwhile.
    fn set_port_active(&mut self, up: bool) {
        self.shared.port_active.store(up, Ordering::Release);
        if up == self.port_up_logged {
            return;
        }
        self.port_up_logged = up;
        let (dev, port) = (self.shared.device(), self.shared.port);
        if up {
            self.shared.lock_send().ahs.refresh_all();
            tracing::info!("rdma device {dev} port {port}: ACTIVE again; probing resumes");
        } else {
            tracing::warn!(
                "rdma device {dev} port {port}: link down (IBV_EVENT_PORT_ERR); probes through it fail until the port is ACTIVE again, the QP stays open"
            );
        }
    }

    /// A GID table change that took our GID away fails the endpoint: the agent re-opens
    /// it (and re-registers) once a GID is back at the configured index.
    fn check_gid(&self) {
        match self
            .shared
            .ctx
            .query_gid(self.shared.port, self.shared.sgid_index as u32)
        {
            Ok(g) if g == self.shared.gid => {}
            Ok(g) => self.shared.fail(RdmaError::DeviceLost {
                device: self.shared.device().to_string(),
                reason: format!(
                    "GID index {} changed from {} to {g}",
                    self.shared.sgid_index, self.shared.gid
                ),
            }),
            Err(e) => self.shared.fail(RdmaError::DeviceLost {
                device: self.shared.device().to_string(),
                reason: format!("GID index {} unreadable: {e}", self.shared.sgid_index),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No RDMA device here: opening fails with the clear line (on an RDMA host without
    /// a device of this name, with the allowed-names line).
    #[test]
    fn open_fails_with_the_clear_line() {
        let e = crate::rdma::open_rdma("mlx5_0").unwrap_err().to_string();
        assert!(
            e.starts_with("no RDMA devices: ") && e.ends_with("; use transport: udp"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        let e = list_devices(&["nosuch".into()]).unwrap_err().to_string();
        assert!(e.starts_with("no RDMA devices: "), "{e}");
    }

    #[test]
    fn send_depth_rounds_down_to_a_power_of_two() {
        assert_eq!(pow2_floor(1), 1);
        assert_eq!(pow2_floor(256), 256);
        assert_eq!(pow2_floor(300), 256);
        assert_eq!(pow2_floor(u32::MAX), 1 << 31);
        assert_eq!(pow2_floor(0), 1);
    }

    #[test]
    fn invalid_options_fail_before_touching_the_device() {
        let mut o = RdmaOptions::new("mlx5_0");
        o.gid_index = 300;
        let e = crate::rdma::open_rdma_with(&o).unwrap_err().to_string();
        assert_eq!(e, "rdma config: gid_index=300 is out of range 0-255");
    }
}
