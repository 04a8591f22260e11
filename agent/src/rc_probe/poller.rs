//! The RC ring threads: the poller owns every ring and runs the echo probes; an accept
//! thread takes peers' connections; each outbound connect runs on a short-lived thread
//! of its own (a dead peer's RDMA-CM timeouts stall nothing else).
//!
//! CPU: the poller sleeps (on its command channel, with a timeout) except in hot windows:
//! from a probe's write until its echo (at most `hot_wait`), and around each probe a peer
//! announced (`lead` before to `grace` after). Between them every ring gets one cold check
//! per `cold_interval`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rpingmesh_rc_ring::echo::{EchoMsg, EchoProber, EchoResponder, Outcome, PollPlan};
use rpingmesh_rc_ring::MAX_PAYLOAD;
use rpingmesh_verbs::rdma::rc_ring::{self, Listener, RcRing, RingOpts};
use tokio::sync::watch;

use super::{RcPath, RcProbeParams, RcWindows};
use crate::report::{PathKey, ReportSink};
use crate::targets::Pinglists;
use crate::telemetry::Metrics;

/// Connect attempts in flight at once.
const MAX_CONNECTING: usize = 8;
/// A failed connect is retried after this, doubling up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_secs(2);
const MAX_BACKOFF: Duration = Duration::from_secs(120);
/// An inbound ring without a probe for this long is closed.
const INBOUND_IDLE: Duration = Duration::from_secs(120);

/// One local RNIC as the rings see it.
#[derive(Debug, Clone)]
pub struct LocalRnic {
    pub ip: IpAddr,
    pub gid: String,
    pub tor: String,
}

/// A ring the agent wants: from local RNIC `rnic` to the RNIC at `dst`. One ring per peer
/// RNIC serves every path to it (each service's SERVICE entry, a ToR list's entry): its
/// outcomes count for each of them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct RingKey {
    rnic: usize,
    dst: SocketAddr,
}

#[derive(Debug, Clone)]
struct Wanted {
    key: RingKey,
    paths: Vec<PathKey>,
}

enum ToPoller {
    Targets(Vec<Wanted>),
    Connected(RingKey, Box<RcRing>),
    ConnectFailed(RingKey, String),
    Accepted(Box<RcRing>),
    Stop,
}

struct OutRing {
    ring: Box<RcRing>,
    prober: EchoProber,
    /// Every path this ring measures (kept current with the pinglists).
    paths: Vec<RcPath>,
    /// The ring's discarded credit reads already counted in the metric.
    discards_exported: u64,
}

struct InRing {
    ring: Box<RcRing>,
    responder: EchoResponder,
    last_probe: Instant,
}

struct Backoff {
    next: Instant,
    delay: Duration,
}

pub struct RcProber {
    to_poller: Sender<ToPoller>,
    stop_fd: Arc<OwnedFd>,
    threads: Vec<JoinHandle<()>>,
    forwarder: tokio::task::JoinHandle<()>,
}

fn now_unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall; the fd is owned from here on.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl RcProber {
    /// Listens on every local RNIC's address and starts the threads. `lists` are the
    /// RNICs' pinglist watches (same order as `rnics`).
    pub fn start(
        p: RcProbeParams,
        rnics: Vec<LocalRnic>,
        lists: Vec<watch::Receiver<Arc<Pinglists>>>,
        sink: Option<ReportSink>,
        metrics: Metrics,
    ) -> anyhow::Result<RcProber> {
        let opts = RingOpts {
            budget: p.budget,
            cm_timeout: Duration::from_secs(2),
            ack_timeout_exp: p.ack_timeout_exp,
            ..RingOpts::default()
        };
        let mut listeners = Vec::new();
        for r in &rnics {
            let addr = SocketAddr::new(r.ip, p.port);
            listeners.push(
                rc_ring::listen(addr)
                    .map_err(|e| anyhow::anyhow!("rc ring probing: listening on {addr}: {e}"))?,
            );
        }
        let stop_fd = Arc::new(eventfd()?);
        let (to_poller, rx) = mpsc::channel();
        let mut threads = Vec::new();
        {
            let (tx, stop, opts) = (to_poller.clone(), stop_fd.clone(), opts.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("rc-ring-accept".into())
                    .spawn(move || accept_loop(listeners, &opts, &stop, &tx))?,
            );
        }
        {
            let tx = to_poller.clone();
            let poller = Poller {
                windows: RcWindows::new(p.window),
                p: p.clone(),
                rnics,
                opts,
                tx,
                sink,
                metrics,
                start: Instant::now(),
                wanted: Vec::new(),
                out: HashMap::new(),
                inbound: Vec::new(),
                connecting: HashMap::new(),
                backoff: HashMap::new(),
                bad_messages: 0,
            };
            threads.push(
                std::thread::Builder::new()
                    .name("rc-ring-poller".into())
                    .spawn(move || poller.run(rx))?,
            );
        }
        let forwarder = tokio::spawn(forward_targets(p, lists, to_poller.clone()));
        Ok(RcProber {
            to_poller,
            stop_fd,
            threads,
            forwarder,
        })
    }

    pub fn stop(self) {
        self.forwarder.abort();
        let _ = self.to_poller.send(ToPoller::Stop);
        let one: u64 = 1;
        // SAFETY: an 8-byte write to our eventfd.
        unsafe { libc::write(self.stop_fd.as_raw_fd(), &one as *const u64 as *const _, 8) };
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Turns pinglist updates into the set of wanted rings (the chosen kinds, with an IP).
async fn forward_targets(
    p: RcProbeParams,
    mut lists: Vec<watch::Receiver<Arc<Pinglists>>>,
    tx: Sender<ToPoller>,
) {
    loop {
        let mut wanted: Vec<Wanted> = Vec::new();
        for (rnic, rx) in lists.iter_mut().enumerate() {
            let l = rx.borrow_and_update().clone();
            for kind in &p.kinds {
                for t in l.list(*kind) {
                    let Ok(ip) = t.ip.parse::<IpAddr>() else {
                        continue; // no address to reach its ring listener at
                    };
                    let key = RingKey {
                        rnic,
                        dst: SocketAddr::new(ip, p.port),
                    };
                    let path = PathKey {
                        gid: t.gid_text.as_str().into(),
                        tor: t.tor_id.as_str().into(),
                        qpn: t.qpn,
                        kind: t.kind,
                        service: t.service.as_str().into(),
                    };
                    match wanted.iter_mut().find(|w| w.key == key) {
                        Some(w) if !w.paths.contains(&path) => w.paths.push(path),
                        Some(_) => {}
                        None => wanted.push(Wanted {
                            key,
                            paths: vec![path],
                        }),
                    }
                }
            }
        }
        if tx.send(ToPoller::Targets(wanted)).is_err() {
            return;
        }
        let changes: Vec<_> = lists.iter_mut().map(|rx| Box::pin(rx.changed())).collect();
        if futures_select_any(changes).await.is_err() {
            return;
        }
    }
}

/// Resolves when any of the watches changes (Err when one closed).
async fn futures_select_any(
    mut futs: Vec<
        std::pin::Pin<Box<impl std::future::Future<Output = Result<(), watch::error::RecvError>>>>,
    >,
) -> Result<(), watch::error::RecvError> {
    std::future::poll_fn(|cx| {
        for f in futs.iter_mut() {
            if let std::task::Poll::Ready(r) = f.as_mut().poll(cx) {
                return std::task::Poll::Ready(r);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

fn accept_loop(listeners: Vec<Listener>, opts: &RingOpts, stop: &OwnedFd, tx: &Sender<ToPoller>) {
    let mut failures = 0u64;
    loop {
        let mut fds: Vec<libc::pollfd> = std::iter::once(stop.as_raw_fd())
            .chain(listeners.iter().map(|l| l.channel().fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: valid pollfds for the call; sleeps until a request or the stop signal.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
        if n < 0 {
            continue; // EINTR
        }
        if fds[0].revents != 0 {
            return;
        }
        for (l, fd) in listeners.iter().zip(&fds[1..]) {
            if fd.revents == 0 {
                continue;
            }
            match RcRing::accept(l, Duration::from_millis(100), opts) {
                Ok(ring) => {
                    if tx.send(ToPoller::Accepted(Box::new(ring))).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    failures += 1;
                    if failures.is_power_of_two() {
                        tracing::warn!(failures, "rc ring: accepting a peer's ring failed: {e}");
                    }
                }
            }
        }
    }
}

struct Poller {
    p: RcProbeParams,
    rnics: Vec<LocalRnic>,
    opts: RingOpts,
    tx: Sender<ToPoller>,
    sink: Option<ReportSink>,
    metrics: Metrics,
    start: Instant,
    wanted: Vec<Wanted>,
    out: HashMap<RingKey, OutRing>,
    inbound: Vec<InRing>,
    connecting: HashMap<RingKey, ()>,
    backoff: HashMap<RingKey, Backoff>,
    windows: RcWindows,
    bad_messages: u64,
}

impl Poller {
    fn mono_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn run(mut self, rx: Receiver<ToPoller>) {
        let mut next_cold = Instant::now();
        loop {
            // Sleep until the next thing to do, waking at once for a command.
            let wake = self.next_wake(next_cold);
            let wait = wake.saturating_duration_since(Instant::now());
            let first = if wait.is_zero() {
                rx.try_recv().map_err(|e| match e {
                    mpsc::TryRecvError::Empty => RecvTimeoutError::Timeout,
                    mpsc::TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                })
            } else {
                rx.recv_timeout(wait)
            };
            let mut msg = match first {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            while let Some(m) = msg {
                if !self.command(m) {
                    self.flush(u64::MAX);
                    return;
                }
                msg = rx.try_recv().ok();
            }
            self.reconcile();
            self.send_due_probes();
            self.hot_phase();
            if Instant::now() >= next_cold {
                self.cold_pass();
                next_cold = Instant::now() + self.p.cold_interval;
            }
            self.flush(now_unix_ns());
        }
    }

    /// False on Stop.
    fn command(&mut self, m: ToPoller) -> bool {
        match m {
            ToPoller::Stop => return false,
            ToPoller::Targets(w) => {
                let mut w = w;
                if w.len() > self.p.max_rings {
                    tracing::warn!(
                        wanted = w.len(),
                        max = self.p.max_rings,
                        "rc ring: more ring targets than rc_ring_max_rings; probing the first ones"
                    );
                    w.truncate(self.p.max_rings);
                }
                self.wanted = w;
                let current: Vec<(RingKey, Vec<RcPath>)> = self
                    .wanted
                    .iter()
                    .map(|w| (w.key.clone(), self.paths_of(w)))
                    .collect();
                for (k, paths) in current {
                    if let Some(o) = self.out.get_mut(&k) {
                        o.paths = paths;
                    }
                }
            }
            ToPoller::Connected(k, ring) => {
                self.connecting.remove(&k);
                self.backoff.remove(&k);
                if let Some(w) = self.wanted.iter().find(|w| w.key == k) {
                    let paths = self.paths_of(w);
                    // Spread the rings' probes over the interval.
                    let phase = (self.out.len() as u64 * 7919 * 1_000_000)
                        % (self.p.interval.as_nanos() as u64).max(1);
                    let prober = EchoProber::new(
                        self.p.interval.as_nanos() as u64,
                        self.p.timeout.as_nanos() as u64,
                        self.p.hot_wait.as_nanos() as u64,
                        self.mono_ns() + phase,
                    );
                    tracing::info!(target = %k.dst, device = ring.device(), "rc ring connected");
                    self.out.insert(
                        k,
                        OutRing {
                            ring,
                            prober,
                            paths,
                            discards_exported: 0,
                        },
                    );
                }
            }
            ToPoller::ConnectFailed(k, e) => {
                self.connecting.remove(&k);
                let b = self.backoff.entry(k.clone()).or_insert(Backoff {
                    next: Instant::now(),
                    delay: FIRST_BACKOFF / 2,
                });
                b.delay = (b.delay * 2).min(MAX_BACKOFF);
                b.next = Instant::now() + b.delay;
                tracing::warn!(target = %k.dst, retry_in_s = b.delay.as_secs(), "rc ring: connect failed: {e}");
            }
            ToPoller::Accepted(ring) => {
                if self.inbound.len() >= self.p.max_rings {
                    tracing::warn!(
                        max = self.p.max_rings,
                        "rc ring: a peer's ring refused: rc_ring_max_rings inbound rings open"
                    );
                } else {
                    self.inbound.push(InRing {
                        ring,
                        responder: EchoResponder::new(
                            self.p.lead.as_nanos() as u64,
                            self.p.grace.as_nanos() as u64,
                        ),
                        last_probe: Instant::now(),
                    });
                }
            }
        }
        true
    }

    fn paths_of(&self, w: &Wanted) -> Vec<RcPath> {
        let r = &self.rnics[w.key.rnic];
        w.paths
            .iter()
            .map(|k| RcPath::new(&r.gid, &r.tor, k))
            .collect()
    }

    /// Drops rings no longer wanted; starts connects for wanted ones without a ring.
    fn reconcile(&mut self) {
        let wanted = &self.wanted;
        self.out.retain(|k, _| wanted.iter().any(|w| &w.key == k));
        let now = Instant::now();
        for k in self
            .wanted
            .iter()
            .map(|w| w.key.clone())
            .collect::<Vec<_>>()
        {
            if self.out.contains_key(&k)
                || self.connecting.contains_key(&k)
                || self.connecting.len() >= MAX_CONNECTING
                || self.backoff.get(&k).is_some_and(|b| b.next > now)
            {
                continue;
            }
            self.connecting.insert(k.clone(), ());
            let (tx, opts) = (self.tx.clone(), self.opts.clone());
            let src = SocketAddr::new(self.rnics[k.rnic].ip, 0);
            let spawned = std::thread::Builder::new()
                .name("rc-ring-connect".into())
                .spawn(move || {
                    let m = match RcRing::connect(Some(src), k.dst, &opts) {
                        Ok(r) => ToPoller::Connected(k, Box::new(r)),
                        Err(e) => ToPoller::ConnectFailed(k, e.to_string()),
                    };
                    let _ = tx.send(m);
                });
            if let Err(e) = spawned {
                tracing::warn!("rc ring: cannot start a connect thread: {e}");
            }
        }
    }

    fn next_wake(&self, next_cold: Instant) -> Instant {
        let now_ns = self.mono_ns();
        let mut at_ns = u64::MAX;
        for o in self.out.values() {
            at_ns = at_ns.min(o.prober.next_event_ns());
        }
        let mut wake = next_cold;
        if at_ns != u64::MAX {
            wake = wake.min(Instant::now() + Duration::from_nanos(at_ns.saturating_sub(now_ns)));
        }
        for i in &self.inbound {
            if let Some(t) = i.responder.window_opens_ns() {
                wake = wake.min(Instant::now() + Duration::from_nanos(t.saturating_sub(now_ns)));
            }
        }
        if !self.wanted.is_empty() && self.out.len() + self.connecting.len() < self.wanted.len() {
            // A backoff may expire.
            if let Some(b) = self.backoff.values().map(|b| b.next).min() {
                wake = wake.min(b);
            }
        }
        wake
    }

    fn send_due_probes(&mut self) {
        let now = self.mono_ns();
        let mut failed = Vec::new();
        for (w, o) in self.out.iter_mut() {
            if let Some(outcome) = o.prober.expire(now) {
                record(&self.metrics, &mut self.windows, &o.paths, &outcome);
            }
            if let Some(probe) = o.prober.due(now) {
                match o.ring.try_send(&probe.encode()) {
                    Ok(true) => {}
                    Ok(false) => {} // depth one never fills the ring; the probe times out
                    Err(e) => failed.push((w.clone(), e.to_string())),
                }
            }
        }
        for (w, e) in failed {
            self.ring_failed(&w, &e);
        }
    }

    fn ring_failed(&mut self, k: &RingKey, e: &str) {
        if let Some(mut o) = self.out.remove(k) {
            if let Some(outcome) = o.prober.expire(u64::MAX) {
                record(&self.metrics, &mut self.windows, &o.paths, &outcome);
            }
            tracing::warn!(target = %k.dst, "rc ring closed: {e}");
            self.backoff.insert(
                k.clone(),
                Backoff {
                    next: Instant::now() + FIRST_BACKOFF,
                    delay: FIRST_BACKOFF,
                },
            );
        }
    }

    /// Polls only the rings inside a hot window, continuously, until every window closed.
    fn hot_phase(&mut self) {
        let mut buf = [0u8; MAX_PAYLOAD];
        loop {
            let now = self.mono_ns();
            let mut any_hot = false;
            let mut failed = Vec::new();
            for (w, o) in self.out.iter_mut() {
                if !o.prober.wants_hot(now) {
                    continue;
                }
                any_hot = true;
                let (metrics, windows) = (&self.metrics, &mut self.windows);
                if let Err(e) = take_echo(o, &mut buf, true, self.start, &mut self.bad_messages)
                    .map(|outcome| outcome.map(|x| record(metrics, windows, &o.paths, &x)))
                {
                    failed.push((w.clone(), e));
                }
            }
            for (w, e) in failed {
                self.ring_failed(&w, &e);
            }
            let mut closed = Vec::new();
            for (idx, i) in self.inbound.iter_mut().enumerate() {
                let cold = self.p.cold_interval.as_nanos() as u64;
                let PollPlan::HotUntil(_) = i.responder.plan(now, cold) else {
                    continue;
                };
                any_hot = true;
                if let Err(e) = respond(i, &mut buf, true, self.start, &mut self.bad_messages) {
                    tracing::info!("rc ring from a peer closed: {e}");
                    closed.push(idx);
                }
            }
            for idx in closed.into_iter().rev() {
                self.inbound.swap_remove(idx);
            }
            if !any_hot {
                return;
            }
            std::hint::spin_loop();
        }
    }

    /// One check of every ring: messages outside any window, completions, a peer that
    /// disconnected, idle rings.
    fn cold_pass(&mut self) {
        let mut buf = [0u8; MAX_PAYLOAD];
        let mut failed = Vec::new();
        for (w, o) in self.out.iter_mut() {
            let (metrics, windows) = (&self.metrics, &mut self.windows);
            let discards = o.ring.discarded_credit_reads();
            metrics.record_rc_ring_discarded_credit_reads(
                discards.saturating_sub(o.discards_exported),
            );
            o.discards_exported = o.discards_exported.max(discards);
            let r = o
                .ring
                .poll_completions()
                .and_then(|_| o.ring.check_peer())
                .map_err(|e| e.to_string())
                .and_then(|_| take_echo(o, &mut buf, false, self.start, &mut self.bad_messages))
                .map(|outcome| outcome.map(|x| record(metrics, windows, &o.paths, &x)));
            if let Err(e) = r {
                failed.push((w.clone(), e));
            }
        }
        for (w, e) in failed {
            self.ring_failed(&w, &e);
        }
        let mut closed = Vec::new();
        for (idx, i) in self.inbound.iter_mut().enumerate() {
            let r = i
                .ring
                .poll_completions()
                .and_then(|_| i.ring.check_peer())
                .map_err(|e| e.to_string())
                .and_then(|_| respond(i, &mut buf, false, self.start, &mut self.bad_messages));
            if let Err(e) = r {
                tracing::info!("rc ring from a peer closed: {e}");
                closed.push(idx);
            } else if i.last_probe.elapsed() > INBOUND_IDLE {
                closed.push(idx);
            }
        }
        for idx in closed.into_iter().rev() {
            self.inbound.swap_remove(idx);
        }
    }

    fn flush(&mut self, now_unix_ns: u64) {
        for s in self.windows.take_closed(now_unix_ns) {
            if let Some(sink) = &self.sink {
                sink.offer(s);
            }
        }
    }
}

/// Polls one outbound ring once: the peer's echo of our probe, if it came, and the
/// outcome it completes (`hot`: polled inside the probe's window).
fn take_echo(
    o: &mut OutRing,
    buf: &mut [u8; MAX_PAYLOAD],
    hot: bool,
    start: Instant,
    bad: &mut u64,
) -> Result<Option<Outcome>, String> {
    let Some(n) = o.ring.try_recv(buf).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let at_ns = start.elapsed().as_nanos() as u64;
    match EchoMsg::decode(&buf[..n]) {
        Ok(m) => Ok(o.prober.on_echo(m, hot, at_ns)),
        Err(e) => {
            bad_message(bad, &e.to_string());
            Ok(None)
        }
    }
}

/// Polls one inbound ring once; echoes a probe at once.
fn respond(
    i: &mut InRing,
    buf: &mut [u8; MAX_PAYLOAD],
    hot: bool,
    start: Instant,
    bad: &mut u64,
) -> Result<(), String> {
    match i.ring.try_recv(buf).map_err(|e| e.to_string())? {
        None => {
            i.responder.polled_empty(hot);
            Ok(())
        }
        Some(n) => {
            let seen = Instant::now();
            match EchoMsg::decode(&buf[..n]) {
                Ok(EchoMsg::Probe { id, next_gap_us }) => {
                    let now_ns = seen.duration_since(start).as_nanos() as u64;
                    let caught_hot = i.responder.on_probe(next_gap_us, hot, now_ns);
                    i.last_probe = seen;
                    let echo = EchoMsg::Echo {
                        id,
                        caught_hot,
                        turnaround_ns: seen.elapsed().as_nanos() as u64,
                    };
                    i.ring.try_send(&echo.encode()).map_err(|e| e.to_string())?;
                    Ok(())
                }
                Ok(other) => {
                    bad_message(bad, &format!("an echo ({other:?}) on a responder ring"));
                    Ok(())
                }
                Err(e) => {
                    bad_message(bad, &e.to_string());
                    Ok(())
                }
            }
        }
    }
}

fn bad_message(count: &mut u64, what: &str) {
    *count += 1;
    if count.is_power_of_two() {
        tracing::warn!(
            total = *count,
            "rc ring: malformed probe message dropped: {what}"
        );
    }
}

/// One outcome counts for every path the ring measures.
fn record(metrics: &Metrics, windows: &mut RcWindows, paths: &[RcPath], o: &Outcome) {
    let now = now_unix_ns();
    for path in paths {
        metrics.record_rc_ring(&path.service, o);
        windows.record(path, o, now);
    }
}
