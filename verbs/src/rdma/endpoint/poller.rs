//! The poller thread: sleeps on the completion channel and the device's async events,
//! drains the CQ (receive timestamps first), re-posts receive buffers, and feeds the SPSC
//! ring the async face reads. Never spins.

use super::*;

pub(super) struct Poller {
    pub(super) shared: Arc<Shared>,
    pub(super) out: Producer<TransportEvent>,
    pub(super) ts_source: TimestampSource,
    pub(super) nic_clock: Option<NicClock>,
    pub(super) recv_slots: u32,
    /// The port state last logged (one line per change).
    pub(super) port_up_logged: bool,
    /// Error completions logged so far (the first, then at powers of two).
    pub(super) error_completions_logged: u64,
    /// Why the QP fell into the error state, until it is reset (end of this drain).
    pub(super) qp_broken: Option<String>,
    pub(super) recovery: RecoveryBudget,
}

/// Which of the poller's descriptors poll(2) found readable.
#[derive(Default)]
pub(super) struct Ready {
    pub(super) cq: bool,
    pub(super) async_event: bool,
}

impl Poller {
    /// Sleeps on the completion channel, never spins. On each wake-up it first drains
    /// the CQ, so a receive's software timestamp is taken before anything else (the
    /// channel's event is read and acknowledged afterwards); then it re-arms the CQ and
    /// drains once more, since a completion that lands before the arm raises no event.
    /// poll(2) also watches the async-event fd and the stop eventfd.
    pub(super) fn run(mut self) {
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
    pub(super) fn rearm(
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
    pub(super) fn wait(&self, timeout: Duration) -> io::Result<Ready> {
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
    pub(super) fn drain(
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
        if let Some(reason) = self.qp_broken.take() {
            self.recover(&reason);
        }
        if delivered {
            self.shared.notify.notify_one();
        }
        if self.shared.failed.load(Ordering::Acquire) {
            return Err(());
        }
        Ok(total)
    }

    pub(super) fn timestamp(&mut self, kind: WrKind, raw: Option<u64>, sw_ts: u64) -> u64 {
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

    pub(super) fn repost(&self, slot: Option<u32>) {
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

    /// An error completion. Either way it costs one send (reported failed) or one
    /// receive. A QP in the error state (flush errors only come from there) is reset at
    /// the end of this drain, which posts every receive slot anew; otherwise the receive
    /// buffer goes back at once. True when an event was queued.
    pub(super) fn on_error_completion(&mut self, kind: WrKind, status: u32, reason: &str) -> bool {
        let n = self
            .shared
            .error_completions
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        let qp_in_error = self.qp_broken.is_some()
            || status == WC_WR_FLUSH_ERR
            || self.shared.qp.in_error().unwrap_or(true);
        if qp_in_error {
            // The first error says why; the flushes that follow only repeat it.
            self.qp_broken.get_or_insert_with(|| reason.to_string());
            return match kind {
                WrKind::Send { id, .. } => {
                    self.shared.sends_failed.fetch_add(1, Ordering::Relaxed);
                    let _ = self.out.push(TransportEvent::SendFailed { id });
                    true
                }
                WrKind::Recv(_) => false,
            };
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

    pub(super) fn health_check(&mut self) {
        let dev = self.shared.device().to_string();
        while let Some(ev) = self.shared.ctx.poll_async_event() {
            if ev.port.is_some_and(|p| p != self.shared.port) {
                continue; // another port of this device
            }
            if qp_recovery::async_event_breaks_qp_only(ev.ty) {
                // Already mended by a drain that saw the flushes: nothing to do.
                if self.shared.qp.in_error().unwrap_or(true) {
                    self.recover(&format!("async event {}", ev.name));
                }
                continue;
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
        if self.shared.failed.load(Ordering::Acquire) {
            return;
        }
        match self.shared.qp.in_error() {
            Ok(true) => {
                self.recover("ibv_query_qp reports IBV_QPS_ERR");
            }
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

    /// Resets the QP that fell into the error state back to RTS in place (same QPN),
    /// within the recovery budget; past it, or if the reset fails, the endpoint fails and
    /// the agent re-opens it with back-off. Sends still in the CQ or the send queue are
    /// lost (reported failed where the CQ names them, and the agent woken for them);
    /// every receive slot is posted anew.
    pub(super) fn recover(&mut self, reason: &str) {
        let (dev, qpn) = (self.shared.device().to_string(), self.shared.qp.qpn());
        let fail = |why: String| RdmaError::QpError {
            device: dev.clone(),
            qpn,
            reason: why,
        };
        if !self.recovery.try_take(Instant::now()) {
            let budget = self.recovery.describe();
            self.shared.fail(fail(format!(
                "{reason}; in the error state again after {budget} in-place resets"
            )));
            return;
        }
        let mut lost = 0u64;
        {
            // No send is posted meanwhile: the queue being emptied is the one counted.
            let send = self.shared.lock_send();
            if let Err(e) = self.shared.qp.reset_to_rts_ud(self.shared.port, QKEY) {
                drop(send);
                self.shared
                    .fail(fail(format!("{reason}; reset in place failed: {e}")));
                return;
            }
            // What the CQ still holds predates the reset.
            let mut batch = Vec::with_capacity(POLL_BATCH);
            loop {
                batch.clear();
                let n = match self.shared.cq.poll(POLL_BATCH, &mut batch) {
                    Ok(n) => n,
                    Err(e) => {
                        drop(send);
                        self.shared.fail(e);
                        return;
                    }
                };
                for (rec, _) in batch.drain(..) {
                    if let WrKind::Send { id, .. } = WrKind::from_wr_id(rec.wr_id) {
                        let _ = self.out.push(TransportEvent::SendFailed { id });
                        lost += 1;
                    }
                }
                if n < POLL_BATCH {
                    break;
                }
            }
            // RESET dropped the send queue: nothing posted is in flight any more.
            self.shared
                .sends_completed
                .store(send.posted, Ordering::Release);
        }
        self.shared.sends_failed.fetch_add(lost, Ordering::Relaxed);
        if lost > 0 {
            self.shared.notify.notify_one();
        }
        for slot in 0..self.recv_slots {
            self.repost(Some(slot));
        }
        if self.shared.failed.load(Ordering::Acquire) {
            return;
        }
        self.shared.qp_recoveries.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            "rdma device {dev}: QP {qpn} fell into the error state ({reason}); reset in place, same QPN, probing goes on ({} in-place resets so far)",
            self.recovery.total()
        );
    }

    /// Port down: the QP stays (it is not in error), sends fail at once with "port is
    /// down" until the port is ACTIVE again; then every address handle is made anew,
    /// since the neighbours may have changed meanwhile.
    pub(super) fn set_port_active(&mut self, up: bool) {
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
    pub(super) fn check_gid(&self) {
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
