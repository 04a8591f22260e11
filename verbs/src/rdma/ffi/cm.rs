//! RDMA-CM for the RC rings: an event channel, a listener, and `CmConn`, one established
//! RC connection with its PD, CQ, registered ring region and QP (created by
//! `rdma_create_qp`, so the CM moves it through INIT/RTR/RTS). Like the rest of `ffi`,
//! the only place with raw pointers; callers get safe methods.
//!
//! The device context comes from librdmacm (`id->verbs`), which opens every device once
//! and keeps it open for the life of the process, so `Context::borrowed` never closes it.

use std::ffi::CStr;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::rdma_core::*;

use super::{rc, verbs_err, Context, Cq, HostMem, Mr, Pd};
use crate::rdma::completion::WcRecord;
use crate::rdma::error::RdmaError;
use crate::rdma::numa::NodeMask;

fn cm_err(call: &'static str, source: io::Error) -> RdmaError {
    verbs_err("rdma_cm", call, source)
}

fn cm_rc(call: &'static str, r: i32) -> Result<(), RdmaError> {
    rc("rdma_cm", call, r)
}

/// `sockaddr_storage` of a socket address (RDMA-CM takes `struct sockaddr *`).
fn sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
    crate::sockaddr::to_sockaddr(&a, 0).0
}

/// A CM event channel (its fd is non-blocking; waits use poll(2) with a deadline).
pub struct EventChannel {
    ch: NonNull<rdma_event_channel>,
}

// SAFETY: Send + Sync: librdmacm channels may be used from any thread; we use each from one
// at a time. Drop: every id on the channel holds an Arc of it, so all are destroyed.
owns_verbs_object!(EventChannel, ch, rdma_destroy_event_channel);

/// One CM event, copied out and acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    pub kind: u32,
    pub status: i32,
    /// The id the event is about (for CONNECT_REQUEST: a new id, now ours to own).
    id: *mut rdma_cm_id,
    pub private_data: Vec<u8>,
}

impl CmEvent {
    pub fn name(&self) -> String {
        event_name(self.kind)
    }
}

pub fn event_name(kind: u32) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    unsafe { CStr::from_ptr(rdma_event_str(kind as _)) }
        .to_string_lossy()
        .into_owned()
}

pub const EV_ADDR_RESOLVED: u32 = rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED as u32;
pub const EV_ROUTE_RESOLVED: u32 = rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED as u32;
pub const EV_CONNECT_REQUEST: u32 = rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST as u32;
pub const EV_ESTABLISHED: u32 = rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED as u32;
pub const EV_DISCONNECTED: u32 = rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED as u32;

impl EventChannel {
    pub fn create() -> Result<Arc<EventChannel>, RdmaError> {
        load_rdmacm()?;
        // SAFETY: no preconditions.
        let ch = unsafe { rdma_create_event_channel() };
        let ch = NonNull::new(ch)
            .ok_or_else(|| cm_err("rdma_create_event_channel", io::Error::last_os_error()))?;
        let me = EventChannel { ch };
        let fd = me.fd();
        // SAFETY: our channel's fd; only its flags change.
        let r = unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK)
        };
        if r < 0 {
            return Err(cm_err("fcntl(O_NONBLOCK)", io::Error::last_os_error()));
        }
        Ok(Arc::new(me))
    }

    pub fn fd(&self) -> RawFd {
        // SAFETY: valid channel.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// The next event, waiting up to `timeout` (sleeping in poll(2), not spinning).
    pub fn next(&self, timeout: Duration) -> Result<CmEvent, RdmaError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ev) = self.try_next()? {
                return Ok(ev);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(cm_err(
                    "rdma_get_cm_event",
                    io::Error::new(io::ErrorKind::TimedOut, "no CM event in time"),
                ));
            }
            let mut pfd = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe {
                libc::poll(
                    &mut pfd,
                    1,
                    left.as_millis().clamp(1, i32::MAX as u128) as i32,
                )
            };
        }
    }

    /// The event queued now, if any (never blocks).
    pub fn try_next(&self) -> Result<Option<CmEvent>, RdmaError> {
        {
            let mut ev: *mut rdma_cm_event = ptr::null_mut();
            // SAFETY: valid channel; non-blocking fd, so EAGAIN when nothing is queued.
            let r = unsafe { rdma_get_cm_event(self.ch.as_ptr(), &mut ev) };
            if r == 0 {
                // SAFETY: a valid event until acked; everything needed is copied first.
                unsafe {
                    let e = &*ev;
                    let conn = e.param.conn;
                    let private_data = if conn.private_data.is_null() || conn.private_data_len == 0
                    {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(
                            conn.private_data as *const u8,
                            conn.private_data_len as usize,
                        )
                        .to_vec()
                    };
                    let out = CmEvent {
                        kind: e.event as u32,
                        status: e.status,
                        id: e.id,
                        private_data,
                    };
                    rdma_ack_cm_event(ev);
                    return Ok(Some(out));
                }
            }
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EAGAIN) {
                return Err(cm_err("rdma_get_cm_event", err));
            }
            Ok(None)
        }
    }

    /// Waits for `kind` on any id; any other event first is an error naming it.
    pub fn expect(&self, kind: u32, timeout: Duration) -> Result<CmEvent, RdmaError> {
        let ev = self.next(timeout).map_err(|e| match e {
            RdmaError::Verbs { source, .. } if source.kind() == io::ErrorKind::TimedOut => cm_err(
                "rdma_get_cm_event",
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no {} within {timeout:?}", event_name(kind)),
                ),
            ),
            e => e,
        })?;
        if ev.kind != kind || ev.status != 0 {
            return Err(cm_err(
                "rdma_get_cm_event",
                io::Error::other(format!(
                    "expected {}, got {} (status {})",
                    event_name(kind),
                    ev.name(),
                    ev.status
                )),
            ));
        }
        Ok(ev)
    }
}

/// An owned CM id (destroyed after its QP).
struct CmId {
    id: NonNull<rdma_cm_id>,
    has_qp: bool,
    _ch: Arc<EventChannel>,
}

// SAFETY: see EventChannel.
unsafe impl Send for CmId {}
unsafe impl Sync for CmId {}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: our id; its QP (if any) is destroyed first, as librdmacm requires.
        unsafe {
            if self.has_qp {
                rdma_destroy_qp(self.id.as_ptr());
            }
            rdma_destroy_id(self.id.as_ptr());
        }
    }
}

impl CmId {
    fn create(ch: &Arc<EventChannel>) -> Result<CmId, RdmaError> {
        let mut id = ptr::null_mut();
        // SAFETY: valid channel; the id is written on success.
        let r = unsafe {
            rdma_create_id(
                ch.ch.as_ptr(),
                &mut id,
                ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        cm_rc("rdma_create_id", r)?;
        Ok(CmId {
            id: NonNull::new(id).expect("rdma_create_id succeeded"),
            has_qp: false,
            _ch: ch.clone(),
        })
    }

    fn context(&self) -> Result<Arc<Context>, RdmaError> {
        // SAFETY: valid id; verbs is set once the address is resolved or bound to a device.
        let v = unsafe { (*self.id.as_ptr()).verbs };
        let ctx = NonNull::new(v).ok_or_else(|| {
            cm_err(
                "rdma_cm_id.verbs",
                io::Error::other("the address is on no RDMA device"),
            )
        })?;
        // SAFETY: a valid context; the device is named by libibverbs.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name((*ctx.as_ptr()).device)) }
            .to_string_lossy()
            .into_owned();
        Ok(Arc::new(Context {
            ctx,
            name,
            owned: false,
        }))
    }
}

/// A bound, listening CM id.
pub struct Listener {
    id: CmId,
    ch: Arc<EventChannel>,
}

impl Listener {
    pub fn bind(addr: SocketAddr, backlog: i32) -> Result<Listener, RdmaError> {
        let ch = EventChannel::create()?;
        let id = CmId::create(&ch)?;
        let mut ss = sockaddr(addr);
        // SAFETY: valid id and address.
        cm_rc("rdma_bind_addr", unsafe {
            rdma_bind_addr(id.id.as_ptr(), &mut ss as *mut _ as *mut libc::sockaddr)
        })?;
        // SAFETY: valid bound id.
        cm_rc("rdma_listen", unsafe {
            rdma_listen(id.id.as_ptr(), backlog)
        })?;
        Ok(Listener { id, ch })
    }

    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.ch
    }

    /// The port actually bound (for port 0).
    pub fn port(&self) -> u16 {
        // SAFETY: valid id.
        u16::from_be(unsafe { rdma_get_src_port(self.id.id.as_ptr()) })
    }

    /// Waits up to `wait` for a connection request; `accept_private` sees the peer's
    /// private data and our built side, and returns the private data to answer with (Err:
    /// the request is rejected). Returns once established (each step within `timeout`).
    pub fn accept(
        &self,
        opts: &ConnOpts,
        wait: Duration,
        timeout: Duration,
        accept_private: impl FnOnce(&[u8], &CmConn) -> Result<Vec<u8>, String>,
    ) -> Result<(CmConn, Vec<u8>), RdmaError> {
        let req = self.ch.expect(EV_CONNECT_REQUEST, wait)?;
        let mut id = CmId {
            id: NonNull::new(req.id).expect("a connect request names its id"),
            has_qp: false,
            _ch: self.ch.clone(),
        };
        // Each connection gets its own channel, so its ESTABLISHED and DISCONNECTED
        // events never mix with the listener's next requests.
        let own = EventChannel::create()?;
        // SAFETY: valid id and channel; no event of this id is pending unacked.
        cm_rc("rdma_migrate_id", unsafe {
            rdma_migrate_id(id.id.as_ptr(), own.ch.as_ptr())
        })?;
        id._ch = own;
        let mut conn = CmConn::build(id, opts)?;
        let ours = match accept_private(&req.private_data, &conn) {
            Ok(p) => p,
            Err(reason) => {
                // SAFETY: valid id of a pending request.
                unsafe { rdma_reject(conn.id.id.as_ptr(), ptr::null(), 0) };
                return Err(cm_err("connect request", io::Error::other(reason)));
            }
        };
        let mut param = conn_param(&ours);
        // SAFETY: valid id with a QP; param and its private data outlive the call.
        cm_rc("rdma_accept", unsafe {
            rdma_accept(conn.id.id.as_ptr(), &mut param)
        })?;
        conn.id._ch.expect(EV_ESTABLISHED, timeout)?;
        conn.established = true;
        Ok((conn, req.private_data))
    }
}

/// How to build one side of a connection.
#[derive(Debug, Clone)]
pub struct ConnOpts {
    /// Bytes of the registered region (header + inbound ring, page-rounded).
    pub region_len: usize,
    pub send_queue: u32,
    pub max_inline: u32,
    /// Bind the region to this NUMA node (None: the device's node, if it has one).
    pub numa_node: Option<u32>,
    /// The QP's local ACK timeout, 4.096 us x 2^exp per try (None: the CM's default, from
    /// the path's packet lifetime). A silent peer fails a WRITE after 7 tries of it.
    pub ack_timeout_exp: Option<u8>,
}

/// librdmacm's `RDMA_OPTION_ID` level and its `RDMA_OPTION_ID_ACK_TIMEOUT` option (uint8_t).
const OPTION_ID: i32 = 0;
const OPTION_ID_ACK_TIMEOUT: i32 = 3;

fn conn_param(private: &[u8]) -> rdma_conn_param {
    rdma_conn_param {
        private_data: private.as_ptr() as *const libc::c_void,
        private_data_len: private.len() as u8,
        // One outstanding RDMA READ each way: the credit read.
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 0,
        // 6, not 7: soft-RoCE takes a transport retry count of 7 as "retry forever" (as
        // the RNR count's 7 is), so a WRITE to a dead peer would never fail and its ring
        // never close. 6 retries of the CM's ack timeout bound that to seconds anywhere.
        retry_count: 6,
        // No receive work requests exist, so RNR never happens; retry anyway.
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

/// Connects to `dst` (from `src` when given); `private` goes to the peer, and the peer's
/// answer is returned with the connection.
pub fn connect(
    src: Option<SocketAddr>,
    dst: SocketAddr,
    opts: &ConnOpts,
    timeout: Duration,
    private: impl FnOnce(&CmConn) -> Vec<u8>,
) -> Result<(CmConn, Vec<u8>), RdmaError> {
    let ch = EventChannel::create()?;
    let id = CmId::create(&ch)?;
    let mut s = src.map(sockaddr);
    let mut d = sockaddr(dst);
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    // SAFETY: valid id and addresses (copied by the call).
    cm_rc("rdma_resolve_addr", unsafe {
        rdma_resolve_addr(
            id.id.as_ptr(),
            s.as_mut()
                .map_or(ptr::null_mut(), |s| s as *mut _ as *mut libc::sockaddr),
            &mut d as *mut _ as *mut libc::sockaddr,
            ms,
        )
    })?;
    ch.expect(EV_ADDR_RESOLVED, timeout)?;
    // SAFETY: valid id with a resolved address.
    cm_rc("rdma_resolve_route", unsafe {
        rdma_resolve_route(id.id.as_ptr(), ms)
    })?;
    ch.expect(EV_ROUTE_RESOLVED, timeout)?;
    let mut conn = CmConn::build(id, opts)?;
    let ours = private(&conn);
    let mut param = conn_param(&ours);
    // SAFETY: valid id with a QP; param outlives the call.
    cm_rc("rdma_connect", unsafe {
        rdma_connect(conn.id.id.as_ptr(), &mut param)
    })?;
    let est = ch.next(timeout).map_err(|e| match e {
        RdmaError::Verbs { source, .. } if source.kind() == io::ErrorKind::TimedOut => cm_err(
            "rdma_connect",
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer from {dst} within {timeout:?}"),
            ),
        ),
        e => e,
    })?;
    if est.kind != EV_ESTABLISHED {
        return Err(cm_err(
            "rdma_connect",
            io::Error::other(format!(
                "peer answered {} (status {})",
                est.name(),
                est.status
            )),
        ));
    }
    conn.established = true;
    Ok((conn, est.private_data))
}

/// One established RC connection: its QP, CQ and registered ring region.
pub struct CmConn {
    // Drop order: the QP (inside the id) goes first, then the MR, the CQ, the PD.
    id: CmId,
    mr: Mr,
    cq: Arc<Cq>,
    _pd: Arc<Pd>,
    device: String,
    established: bool,
    polled: Vec<(WcRecord, Option<u64>)>,
}

impl CmConn {
    fn build(mut id: CmId, opts: &ConnOpts) -> Result<CmConn, RdmaError> {
        let ctx = id.context()?;
        let device = ctx.name().to_string();
        let pd = Pd::alloc(&ctx)?;
        let cq = Cq::create_plain(&ctx, opts.send_queue.max(2) + 2, None)?;
        let node = opts.numa_node.or_else(|| device_numa_node(&device));
        let mem = HostMem::map(opts.region_len, node.map(NodeMask::single).as_ref())
            .map_err(|reason| RdmaError::Config(format!("rc ring region on {device}: {reason}")))?;
        let mr = register_ring(&pd, mem)?;
        // SAFETY: zeroed plain struct, filled below; the call copies it.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_cq();
        init.recv_cq = cq.as_cq();
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = opts.send_queue.max(1);
        // The ring never posts a receive; one slot because some providers refuse zero.
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = opts.max_inline;
        // SAFETY: valid id bound to the device of `pd` and `cq`.
        let r = unsafe { rdma_create_qp(id.id.as_ptr(), pd.pd.as_ptr(), &mut init) };
        rc(&device, "rdma_create_qp", r)?;
        id.has_qp = true;
        if let Some(mut exp) = opts.ack_timeout_exp {
            // Applied by the CM when it moves the QP to RTS (after connect or accept).
            // SAFETY: valid id; the option is one byte, copied by the call.
            let r = unsafe {
                rdma_set_option(
                    id.id.as_ptr(),
                    OPTION_ID,
                    OPTION_ID_ACK_TIMEOUT,
                    &mut exp as *mut u8 as *mut libc::c_void,
                    1,
                )
            };
            rc(&device, "rdma_set_option(ACK_TIMEOUT)", r)?;
        }
        Ok(CmConn {
            id,
            mr,
            cq,
            _pd: pd,
            device,
            established: false,
            polled: Vec::with_capacity(32),
        })
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
    }

    /// Address of the registered region (its byte 0).
    pub fn region_addr(&self) -> u64 {
        self.mr.addr(0)
    }

    pub fn region_len(&self) -> usize {
        self.mr.len
    }

    /// The registered region's base (8-byte aligned, lives as long as `self`).
    pub fn region_ptr(&self) -> *mut u8 {
        self.mr.buf.as_ptr()
    }

    fn qp(&self) -> *mut ibv_qp {
        // SAFETY: valid id; the QP exists from `build` on.
        unsafe { (*self.id.id.as_ptr()).qp }
    }

    /// One inline RDMA WRITE of `bytes` to the peer's `remote_addr`.
    pub fn post_write_inline(
        &self,
        bytes: &[u8],
        remote_addr: u64,
        rkey: u32,
        wr_id: u64,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let mut sge = ibv_sge {
            addr: bytes.as_ptr() as u64,
            length: bytes.len() as u32,
            lkey: 0, // inline data is copied at post time; no key is used
        };
        // SAFETY: zeroed plain struct (unions included), filled below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        wr.send_flags = ibv_send_flags::IBV_SEND_INLINE.0
            | if signaled {
                ibv_send_flags::IBV_SEND_SIGNALED.0
            } else {
                0
            };
        wr.wr.rdma = rdma_t { remote_addr, rkey };
        let mut bad = ptr::null_mut();
        // SAFETY: WR, SGE and the inline bytes live across the call, which copies them.
        let r = unsafe { ibv_post_send(self.qp(), &mut wr, &mut bad) };
        rc(&self.device, "ibv_post_send(RDMA_WRITE inline)", r)
    }

    /// A signaled 8-byte RDMA READ of the peer's `remote_addr` into our region at `local_off`.
    pub fn post_read8(
        &self,
        remote_addr: u64,
        rkey: u32,
        local_off: usize,
        wr_id: u64,
    ) -> Result<(), RdmaError> {
        assert!(local_off + 8 <= self.mr.len);
        let mut sge = ibv_sge {
            addr: self.mr.addr(local_off),
            length: 8,
            lkey: self.mr.lkey(),
        };
        // SAFETY: zeroed plain struct (unions included), filled below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma = rdma_t { remote_addr, rkey };
        let mut bad = ptr::null_mut();
        // SAFETY: as above; the landing word belongs to our registered region.
        let r = unsafe { ibv_post_send(self.qp(), &mut wr, &mut bad) };
        rc(&self.device, "ibv_post_send(RDMA_READ)", r)
    }

    /// Completions ready now (never blocks).
    pub fn poll(&mut self) -> Result<&[(WcRecord, Option<u64>)], RdmaError> {
        self.polled.clear();
        self.cq.poll(32, &mut self.polled)?;
        Ok(&self.polled)
    }

    /// Disconnects and waits for the DISCONNECTED event on this connection's channel.
    pub fn disconnect(&mut self, timeout: Duration) -> Result<(), RdmaError> {
        if !self.established {
            return Ok(());
        }
        self.established = false;
        // SAFETY: valid connected id.
        cm_rc("rdma_disconnect", unsafe {
            rdma_disconnect(self.id.id.as_ptr())
        })?;
        self.wait_disconnected(timeout)
    }

    /// Whether the peer has torn the connection down (a DISCONNECTED event is queued on
    /// this connection's own channel: the kernel sends the peer's DREQ when its process
    /// exits or dies). Never blocks; other events are dropped.
    pub fn peer_disconnected(&mut self) -> Result<bool, RdmaError> {
        if !self.established {
            return Ok(true);
        }
        while let Some(ev) = self.id._ch.try_next()? {
            if ev.kind == EV_DISCONNECTED && ev.id == self.id.id.as_ptr() {
                self.established = false;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Waits for the peer's disconnect (the server side of a teardown).
    pub fn wait_disconnected(&mut self, timeout: Duration) -> Result<(), RdmaError> {
        if !self.established {
            return Ok(()); // seen already (`peer_disconnected`)
        }
        let deadline = Instant::now() + timeout;
        loop {
            let ev = self
                .id
                ._ch
                .next(deadline.saturating_duration_since(Instant::now()))?;
            if ev.kind == EV_DISCONNECTED && ev.id == self.id.id.as_ptr() {
                self.established = false;
                return Ok(());
            }
        }
    }
}

/// Registers a ring region for local write (credit landing), remote write (the peer's
/// messages) and remote read (the peer's credit reads of our consumed counter).
fn register_ring(pd: &Arc<Pd>, mem: HostMem) -> Result<Mr, RdmaError> {
    Mr::register_host_with(
        pd,
        mem,
        ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_READ,
    )
}

/// The NUMA node sysfs gives a device (None: no PCI parent, as on rxe, or -1).
pub fn device_numa_node(device: &str) -> Option<u32> {
    let s =
        std::fs::read_to_string(format!("/sys/class/infiniband/{device}/device/numa_node")).ok()?;
    s.trim()
        .parse::<i32>()
        .ok()
        .filter(|n| *n >= 0)
        .map(|n| n as u32)
}
