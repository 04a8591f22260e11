//! One RNIC endpoint: a UD QP with pre-posted receive buffers, a poller thread feeding the
//! SPSC ring, and the async face the agent drives (same shape as `UdpEndpoint`).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::ah_cache::{AhCache, AhKey};
use super::completion::{translate, WcOutcome, WcRecord, WrKind};
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

/// State shared by the endpoint and its poller thread. Field order = drop order: the QP
/// goes before the buffers it references.
struct Shared {
    qp: Qp,
    recv_mr: Mr,
    send_mr: Mr,
    cq: Arc<Cq>,
    channel: Arc<CompChannel>,
    ctx: Arc<Context>,
    port: u8,
    sysfs_dir: std::path::PathBuf,
    notify: Notify,
    stop: AtomicBool,
    /// Written by `Drop` to wake the poller out of poll(2).
    wake: OwnedFd,
    failure: Mutex<Option<RdmaError>>,
    failed: AtomicBool,
    sends_completed: AtomicU64,
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
        tracing::error!("{e}");
        let mut f = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
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
}

/// Send-side state under one lock: AH cache, AHs waiting for their sends to complete.
struct SendState {
    ahs: AhCache<Ah>,
    /// (sends posted when evicted, handle): destroyed once that many sends completed.
    retired: Vec<(u64, Ah)>,
    posted: u64,
}

pub struct RdmaEndpoint {
    // Dropped first: joins the poller (see Drop), then AHs, then the shared verbs objects.
    poller: Option<JoinHandle<()>>,
    send: Mutex<SendState>,
    events: Mutex<Consumer<TransportEvent>>,
    shared: Arc<Shared>,
    pd: Arc<Pd>,
    local: Endpoint,
    device_name: String,
    sgid_index: u8,
    send_depth: u64,
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
        let recv_mr = Mr::register(&pd, recv_n as usize * RECV_SLOT_LEN)?;
        let send_mr = Mr::register(&pd, send_depth as usize * MAX_PAYLOAD)?;
        for slot in 0..recv_n {
            qp.post_recv(
                &recv_mr,
                slot as usize * RECV_SLOT_LEN,
                RECV_SLOT_LEN,
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
            ctx,
            port: o.port,
            sysfs_dir: o.sysfs_dir.clone(),
            notify: Notify::new(),
            stop: AtomicBool::new(false),
            wake,
            sw_post_ts: (0..send_depth).map(|_| AtomicU64::new(0)).collect(),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            sends_completed: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            error_completions: AtomicU64::new(0),
        });
        let (producer, consumer) = ring::channel(o.event_ring_capacity);
        let poller = Poller {
            shared: shared.clone(),
            out: producer,
            ts_source,
            nic_clock,
            recv_slots: recv_n,
            send_depth: send_depth as u64,
        };
        let handle = std::thread::Builder::new()
            .name(format!("rdma-poll-{}", o.device_name))
            .spawn(move || poller.run())
            .map_err(|e| RdmaError::Verbs {
                device: o.device_name.clone(),
                call: "spawn poller thread",
                source: e,
            })?;
        tracing::info!(
            "rdma device {} port {}: gid[{}] {} qpn {} timestamps {:?}",
            o.device_name,
            o.port,
            o.gid_index,
            entry.gid,
            local.qpn,
            ts_source
        );
        Ok(RdmaEndpoint {
            poller: Some(handle),
            send: Mutex::new(SendState {
                ahs: AhCache::new(o.ah_cache_capacity),
                retired: Vec::new(),
                posted: 0,
            }),
            events: Mutex::new(consumer),
            shared,
            pd,
            local,
            device_name: o.device_name.clone(),
            sgid_index: o.gid_index as u8,
            send_depth: send_depth as u64,
            ts_source,
            gid_warning,
        })
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
        let s = self.send.lock().unwrap_or_else(|p| p.into_inner());
        let ah = s.ahs.stats();
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
            sends_posted: s.posted,
            sends_completed: self.shared.sends_completed.load(Ordering::Relaxed),
            ah_hits: ah.hits,
            ah_misses: ah.misses,
            ah_evictions: ah.evictions,
        }
    }

    /// Sends one probe packet to `to` (GID + QPN) on the path given by `params`
    /// (flow label, traffic class, SL: the agent fills them from config or the target).
    /// Returns the id its `TransportEvent::Sent` will carry.
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
        let mut st = self.send.lock().unwrap_or_else(|p| p.into_inner());
        let completed = self.shared.sends_completed.load(Ordering::Acquire);
        // Send completions arrive in order, so retired AHs of completed sends can go.
        st.retired.retain(|(posted_at, _)| *posted_at > completed);
        if st.posted - completed >= self.send_depth {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "rdma device {}: send queue full ({} sends in flight)",
                    self.device_name, self.send_depth
                ),
            ));
        }
        let key = AhKey::new(
            to.gid,
            params.flow_label,
            params.service_level,
            params.traffic_class,
        );
        let spec = AhSpec {
            dgid: to.gid,
            flow_label: key.flow_label,
            sgid_index: self.sgid_index,
            hop_limit: HOP_LIMIT,
            traffic_class: key.traffic_class,
            service_level: key.service_level,
            port: self.shared.port,
        };
        let posted = st.posted;
        let SendState { ahs, retired, .. } = &mut *st;
        let (ah, evicted) = ahs
            .get_or_try_insert_with(key, |_| Ah::create(&self.pd, &spec))
            .map_err(io::Error::from)?;
        // Slot `posted % depth` was last used by send posted-depth, which has completed.
        let slot = (posted % self.send_depth) as usize;
        let off = slot * MAX_PAYLOAD;
        self.shared.send_mr.write(off, payload);
        let id = posted as SendId;
        if self.ts_source == TimestampSource::Software {
            // Read after the AH lookup (which may block), right before the post.
            self.shared.sw_post_ts[slot].store(clock::monotonic_ns(), Ordering::Release);
        }
        let r = self.shared.qp.post_send_ud(
            ah,
            to.qpn,
            QKEY,
            &self.shared.send_mr,
            off,
            payload.len(),
            WrKind::Send(id).to_wr_id(),
        );
        if let Some(old) = evicted {
            // Earlier sends may still reference it: destroy after they completed.
            retired.push((posted, old));
        }
        r.map_err(io::Error::from)?;
        st.posted += 1;
        Ok(id)
    }

    /// Non-blocking: appends every queued event. Err once the endpoint failed and all
    /// events before the failure were delivered.
    pub fn poll_events(&self, out: &mut Vec<TransportEvent>) -> io::Result<()> {
        let n = self
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain_into(out);
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

struct Poller {
    shared: Arc<Shared>,
    out: Producer<TransportEvent>,
    ts_source: TimestampSource,
    nic_clock: Option<NicClock>,
    recv_slots: u32,
    send_depth: u64,
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
                let slot = match kind {
                    WrKind::Recv(s) if s < self.recv_slots => {
                        self.shared
                            .recv_mr
                            .read(s as usize * RECV_SLOT_LEN, slot_buf);
                        Some(s)
                    }
                    _ => None,
                };
                if matches!(kind, WrKind::Send(_)) {
                    self.shared.sends_completed.fetch_add(1, Ordering::Release);
                }
                let buf: &[u8] = if slot.is_some() { slot_buf } else { &[] };
                match translate(&rec, buf) {
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
                    WcOutcome::Failed { reason, .. } => {
                        self.shared
                            .error_completions
                            .fetch_add(1, Ordering::Relaxed);
                        self.shared.fail(RdmaError::QpError {
                            device: self.shared.ctx.name().to_string(),
                            qpn: self.shared.qp.qpn(),
                            reason,
                        });
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
                WrKind::Send(id) => {
                    let slot = (id as u64 % self.send_depth) as usize;
                    let posted = self.shared.sw_post_ts[slot].load(Ordering::Acquire);
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
            let r = self.shared.qp.post_recv(
                &self.shared.recv_mr,
                s as usize * RECV_SLOT_LEN,
                RECV_SLOT_LEN,
                WrKind::Recv(s).to_wr_id(),
            );
            if let Err(e) = r {
                self.shared.fail(e);
            }
        }
    }

    fn health_check(&self) {
        let dev = self.shared.ctx.name().to_string();
        while let Some((ty, name)) = self.shared.ctx.poll_async_event() {
            if ffi::async_event_is_fatal(ty) {
                let e = if ty == 8 {
                    RdmaError::DeviceLost {
                        device: dev.clone(),
                        reason: name.to_string(),
                    }
                } else {
                    RdmaError::QpError {
                        device: dev.clone(),
                        qpn: self.shared.qp.qpn(),
                        reason: format!("async event {name}"),
                    }
                };
                self.shared.fail(e);
                return;
            }
            tracing::info!("rdma device {dev}: async event {name}");
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
