//! The verbs backend of the polled RC write rings (`rpingmesh-rc-ring`): one RC QP per
//! peer, set up by RDMA-CM with the 40-byte descriptors in private data. Messages are
//! inline RDMA WRITEs into the peer's ring; credits are 8-byte RDMA READs of its consumed
//! counter, only when the cached view says full. No receive work request exists; the
//! completion queue is polled only to retire signaled writes, learn credit values and see
//! errors.

use std::net::SocketAddr;
use std::time::Duration;

use rpingmesh_rc_ring::descriptor::{Descriptor, DescriptorError};
use rpingmesh_rc_ring::geometry::{Geometry, GeometryError, CREDIT_LANDING_OFFSET, MAX_WRITE};
use rpingmesh_rc_ring::{ProtocolError, Receiver, Region, SendError, Sender, Step, MAX_PAYLOAD};

use super::error::RdmaError;
pub use super::ffi::cm::Listener;
use super::ffi::cm::{self, CmConn, ConnOpts};
use super::ffi::wc_status_str;

#[derive(Debug, thiserror::Error)]
pub enum RingError {
    #[error(transparent)]
    Rdma(#[from] RdmaError),
    #[error("rc ring: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("rc ring: peer's descriptor: {0}")]
    Descriptor(#[from] DescriptorError),
    #[error("rc ring: {0}")]
    Geometry(#[from] GeometryError),
    #[error("rc ring: {0}")]
    Send(SendError),
    #[error("rc ring on {device}: the peer disconnected")]
    PeerGone { device: String },
    #[error("rc ring on {device}: {what} work request {wr_id} completed with {status}")]
    Completion {
        device: String,
        what: &'static str,
        wr_id: u64,
        status: String,
    },
}

impl From<SendError> for RingError {
    fn from(e: SendError) -> RingError {
        match e {
            SendError::Protocol(p) => RingError::Protocol(p),
            e => RingError::Send(e),
        }
    }
}

/// How rings are built.
#[derive(Debug, Clone)]
pub struct RingOpts {
    /// Inbound ring budget in bytes (the seed's SIZE): floor(budget / 256) slots.
    pub budget: usize,
    pub send_queue: u32,
    /// NUMA node of the region (None: the device's own node, when sysfs names one).
    pub numa_node: Option<u32>,
    /// Bound on each CM step (address, route, connect, accept, disconnect).
    pub cm_timeout: Duration,
    /// The QP's ACK timeout exponent (4.096 us x 2^exp per try; None: the CM's default).
    /// A silent peer's ring closes after 7 tries.
    pub ack_timeout_exp: Option<u8>,
}

impl Default for RingOpts {
    fn default() -> Self {
        RingOpts {
            budget: 64 * 1024,
            send_queue: 64,
            numa_node: None,
            cm_timeout: Duration::from_secs(5),
            ack_timeout_exp: None,
        }
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => 4096,
    }
}

/// One connected ring pair: our inbound ring (the peer writes it) and the peer's.
pub struct RcRing {
    // Drop order: the region view (no drop) and state, then the connection.
    local: Region<'static>,
    sender: Sender,
    receiver: Receiver,
    peer: Descriptor,
    nonce: u64,
    credit_reads: u64,
    /// A completion error seen while idle, reported by the next send or receive.
    failed: Option<String>,
    idle_streak: u32,
    /// Spin in `idle` instead of sleeping after a streak (latency runs, like perftest's).
    busy_poll: bool,
    conn: CmConn,
}

// The region view points into `conn`'s registered memory, owned by this value.
unsafe impl Send for RcRing {}

impl RcRing {
    fn conn_opts(o: &RingOpts) -> Result<(ConnOpts, Geometry), RingError> {
        let geom = Geometry::for_budget(o.budget, page_size())?;
        Ok((
            ConnOpts {
                region_len: geom.mapped_len(),
                send_queue: o.send_queue,
                max_inline: MAX_WRITE as u32,
                numa_node: o.numa_node,
                ack_timeout_exp: o.ack_timeout_exp,
            },
            geom,
        ))
    }

    fn descriptor(conn: &CmConn, geom: Geometry, nonce: u64) -> Descriptor {
        Descriptor {
            addr: conn.region_addr(),
            rkey: conn.rkey(),
            slots: geom.slots(),
            mapped_len: geom.mapped_len() as u64,
            nonce,
        }
    }

    fn new(conn: CmConn, geom: Geometry, peer: Descriptor, nonce: u64, sq: u32) -> RcRing {
        // SAFETY: the registered region lives as long as `conn`, which this value owns
        // and drops last; the view is never handed out.
        let local = unsafe { Region::from_raw(conn.region_ptr(), conn.region_len()) };
        RcRing {
            local,
            sender: Sender::new(Geometry::from_descriptor(&peer), sq),
            receiver: Receiver::new(geom),
            peer,
            nonce,
            credit_reads: 0,
            failed: None,
            idle_streak: 0,
            busy_poll: false,
            conn,
        }
    }

    /// Makes `idle` spin on the completion queue rather than sleep 20 us after a streak
    /// of empty polls: a latency run's server, where a sleep would be measured.
    pub fn set_busy_poll(&mut self, on: bool) {
        self.busy_poll = on;
    }

    /// Connects to a ring listener at `dst` (each CM step within `o.cm_timeout`).
    pub fn connect(
        src: Option<SocketAddr>,
        dst: SocketAddr,
        o: &RingOpts,
    ) -> Result<RcRing, RingError> {
        let (copts, geom) = Self::conn_opts(o)?;
        let nonce = fresh_nonce();
        let (mut conn, answer) = cm::connect(src, dst, &copts, o.cm_timeout, |c| {
            Self::descriptor(c, geom, nonce).encode().to_vec()
        })?;
        let peer = match Descriptor::decode(&answer) {
            Ok(p) => p,
            Err(e) => {
                let _ = conn.disconnect(o.cm_timeout);
                return Err(e.into());
            }
        };
        Ok(Self::new(conn, geom, peer, nonce, o.send_queue))
    }

    /// Accepts the next connection request on `listener` (waiting up to `wait` for one);
    /// a peer whose descriptor does not decode is rejected (and the error returned).
    pub fn accept(listener: &Listener, wait: Duration, o: &RingOpts) -> Result<RcRing, RingError> {
        let (copts, geom) = Self::conn_opts(o)?;
        let nonce = fresh_nonce();
        let mut peer = None;
        let (conn, _) = listener.accept(&copts, wait, o.cm_timeout, |theirs, c| {
            let d = Descriptor::decode(theirs).map_err(|e| format!("peer's descriptor: {e}"))?;
            peer = Some(d);
            Ok(Self::descriptor(c, geom, nonce).encode().to_vec())
        })?;
        let peer = peer.expect("accepted only with a decoded descriptor");
        Ok(Self::new(conn, geom, peer, nonce, o.send_queue))
    }

    pub fn device(&self) -> &str {
        self.conn.device()
    }

    pub fn peer_nonce(&self) -> u64 {
        self.peer.nonce
    }

    pub fn nonce(&self) -> u64 {
        self.nonce
    }

    pub fn credit_reads(&self) -> u64 {
        self.credit_reads
    }

    /// Credit reads discarded as torn (an impossible count, read again), from the start.
    pub fn discarded_credit_reads(&self) -> u64 {
        self.sender.discarded_credit_reads()
    }

    /// Retires completed work requests and applies credit values; any error completion
    /// fails the ring.
    pub fn poll_completions(&mut self) -> Result<usize, RingError> {
        let credit_id = self.sender.credit_read_in_flight();
        let landing = self.local;
        let done: Vec<(u64, u32)> = self
            .conn
            .poll()?
            .iter()
            .map(|(wc, _)| (wc.wr_id, wc.status))
            .collect();
        for &(wr_id, status) in &done {
            let is_read = Some(wr_id) == credit_id;
            if status != 0 {
                return Err(RingError::Completion {
                    device: self.conn.device().to_string(),
                    what: if is_read {
                        "credit RDMA READ"
                    } else {
                        "RDMA WRITE"
                    },
                    wr_id,
                    status: wc_status_str(status),
                });
            }
            if is_read {
                let consumed = landing.load_acquire(CREDIT_LANDING_OFFSET);
                self.sender.credit_read_completed(wr_id, consumed)?;
            } else {
                self.sender.write_completed(wr_id)?;
            }
        }
        Ok(done.len())
    }

    /// Sends one message; `Ok(false)` when the peer's ring is full (exact credits) or the
    /// send queue is: poll completions (`idle`) and try again.
    pub fn try_send(&mut self, payload: &[u8]) -> Result<bool, RingError> {
        for _ in 0..2 {
            match self.sender.send(payload)? {
                Step::Write(op) => {
                    self.conn.post_write_inline(
                        op.bytes(),
                        self.peer.addr + op.remote_offset as u64,
                        self.peer.rkey,
                        op.wr_id,
                        op.signaled,
                    )?;
                    return Ok(true);
                }
                Step::ReadCredit(read) => {
                    self.conn.post_read8(
                        self.peer.addr + read.remote_offset as u64,
                        self.peer.rkey,
                        read.local_offset,
                        read.wr_id,
                    )?;
                    self.credit_reads += 1;
                    return Ok(false);
                }
                Step::Backpressured | Step::QueueFull => {
                    if self.poll_completions()? == 0 {
                        return Ok(false);
                    }
                }
            }
        }
        Ok(false)
    }

    pub fn try_recv(&mut self, out: &mut [u8; MAX_PAYLOAD]) -> Result<Option<usize>, RingError> {
        Ok(self.receiver.recv(self.local, out)?)
    }

    /// Fails once the peer has disconnected: a process that exits or dies has its
    /// connection torn down by its kernel, which tells ours at once. Never blocks. (A
    /// dead host tells nothing: then the next WRITE fails after the RC retries, in
    /// `poll_completions`.)
    pub fn check_peer(&mut self) -> Result<(), RingError> {
        if self.conn.peer_disconnected()? {
            return Err(RingError::PeerGone {
                device: self.device().to_string(),
            });
        }
        Ok(())
    }

    /// Disconnects (waits for the DISCONNECTED event).
    pub fn disconnect(mut self, timeout: Duration) -> Result<(), RingError> {
        Ok(self.conn.disconnect(timeout)?)
    }

    /// Waits for the peer to disconnect.
    pub fn wait_disconnected(mut self, timeout: Duration) -> Result<(), RingError> {
        Ok(self.conn.wait_disconnected(timeout)?)
    }
}

impl rpingmesh_rc_ring::stress::RingLink for RcRing {
    fn try_send(&mut self, payload: &[u8]) -> Result<bool, String> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let sent = RcRing::try_send(self, payload).map_err(|e| e.to_string())?;
        if sent {
            self.idle_streak = 0;
        }
        Ok(sent)
    }

    fn try_recv(&mut self, out: &mut [u8; MAX_PAYLOAD]) -> Result<Option<usize>, String> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let got = RcRing::try_recv(self, out).map_err(|e| e.to_string())?;
        if got.is_some() {
            self.idle_streak = 0;
        }
        Ok(got)
    }

    fn idle(&mut self) {
        if let Err(e) = self.poll_completions() {
            self.failed.get_or_insert(e.to_string());
        }
        // A long idle streak sleeps a little: the test tool must not starve a software
        // RNIC (soft-RoCE) that moves the bytes on these same CPUs.
        self.idle_streak += 1;
        if self.idle_streak.is_multiple_of(1024) {
            if let Err(e) = self.check_peer() {
                self.failed.get_or_insert(e.to_string());
            }
        }
        if self.idle_streak > 16 && !self.busy_poll {
            std::thread::sleep(Duration::from_micros(20));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// A listener for rings.
pub fn listen(addr: SocketAddr) -> Result<Listener, RingError> {
    Ok(Listener::bind(addr, 64)?)
}

fn fresh_nonce() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom into a local buffer of its length.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 8, 0) };
    if n == 8 {
        u64::from_ne_bytes(b)
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    }
}
