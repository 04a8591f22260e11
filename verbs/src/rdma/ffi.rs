//! The only code that touches libibverbs pointers: RAII owners for context, PD, CQ, QP,
//! MR and AH. Each child holds an `Arc` of its parent so destruction order is always
//! right; no raw pointer leaves this module (callers get safe methods).
//!
//! libibverbs objects are thread-safe (the library and providers lock internally), so the
//! owners are `Send + Sync`; the poller thread polls the CQ and posts receives while the
//! agent posts sends.

// bindgen's enum integer types differ across libibverbs versions: keep explicit casts.
#![allow(clippy::unnecessary_cast)]

use std::ffi::CStr;
use std::io;
use std::net::Ipv6Addr;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_sys::*;

use super::completion::WcRecord;
use super::error::{device_list_null_reason, RdmaError};
use super::loopback::NodeMask;

pub mod cm;

fn verbs_err(device: &str, call: &'static str, source: io::Error) -> RdmaError {
    RdmaError::Verbs {
        device: device.to_string(),
        call,
        source,
    }
}

/// An errno-returning call (0 = ok, else the errno itself; some providers return -1 and
/// set errno).
fn rc(device: &str, call: &'static str, r: i32) -> Result<(), RdmaError> {
    match r {
        0 => Ok(()),
        r if r > 0 => Err(verbs_err(device, call, io::Error::from_raw_os_error(r))),
        _ => Err(verbs_err(device, call, io::Error::last_os_error())),
    }
}

/// Names of all RDMA devices. NULL (ENOSYS etc.) or an empty list is `NoDevices`.
pub fn device_names() -> Result<Vec<String>, RdmaError> {
    let mut n: i32 = 0;
    // SAFETY: plain call; the list is freed below before returning.
    let list = unsafe { ibv_get_device_list(&mut n) };
    if list.is_null() {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        return Err(RdmaError::NoDevices {
            reason: device_list_null_reason(errno),
        });
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: `list` has `n` valid entries; names are NUL-terminated C strings owned
        // by the device (copied out before the list is freed).
        unsafe {
            let dev = *list.add(i);
            if dev.is_null() {
                break;
            }
            let name = ibv_get_device_name(dev);
            if !name.is_null() {
                names.push(CStr::from_ptr(name).to_string_lossy().into_owned());
            }
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { ibv_free_device_list(list) };
    if names.is_empty() {
        return Err(RdmaError::NoDevices {
            reason: "ibv_get_device_list returned an empty list".into(),
        });
    }
    Ok(names)
}

/// An open device.
pub struct Context {
    ctx: NonNull<ibv_context>,
    name: String,
    /// False for librdmacm's contexts (`cm`), which the library closes itself.
    owned: bool,
}

// SAFETY: see the module doc (libibverbs contexts are thread-safe).
unsafe impl Send for Context {}
unsafe impl Sync for Context {}

impl Drop for Context {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: every child holds an Arc of this context, so none is left.
            unsafe { ibv_close_device(self.ctx.as_ptr()) };
        }
    }
}

/// Device capabilities the backend needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceCaps {
    /// kHz; 0 = no clock.
    pub hca_core_clock: u64,
    /// 0 = no completion timestamps.
    pub completion_timestamp_mask: u64,
    pub phys_port_cnt: u8,
    pub max_qp_wr: u32,
    pub max_cqe: u32,
}

impl Context {
    pub fn open(name: &str) -> Result<Arc<Context>, RdmaError> {
        let mut n: i32 = 0;
        // SAFETY: as in device_names; the list is freed on every path below.
        let list = unsafe { ibv_get_device_list(&mut n) };
        if list.is_null() {
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(RdmaError::NoDevices {
                reason: device_list_null_reason(errno),
            });
        }
        let mut found = Vec::new();
        let mut ctx = ptr::null_mut();
        let mut open_err = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: `list` has `n` entries, valid until freed.
            unsafe {
                let dev = *list.add(i);
                if dev.is_null() {
                    break;
                }
                let dn = ibv_get_device_name(dev);
                if dn.is_null() {
                    continue; // a device without a name cannot be the one asked for
                }
                let dn = CStr::from_ptr(dn).to_string_lossy().into_owned();
                if dn == name {
                    ctx = ibv_open_device(dev);
                    if ctx.is_null() {
                        open_err = Some(io::Error::last_os_error());
                    }
                    break;
                }
                found.push(dn);
            }
        }
        // SAFETY: freed once; an opened context stays valid after the list is freed.
        unsafe { ibv_free_device_list(list) };
        if let Some(e) = open_err {
            return Err(verbs_err(name, "ibv_open_device", e));
        }
        match NonNull::new(ctx) {
            Some(ctx) => Ok(Arc::new(Context {
                ctx,
                name: name.to_string(),
                owned: true,
            })),
            None if found.is_empty() => Err(RdmaError::NoDevices {
                reason: "ibv_get_device_list returned an empty list".into(),
            }),
            None => Err(RdmaError::NoAllowedDevice {
                allowed: vec![name.to_string()],
                found,
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn caps(&self) -> Result<DeviceCaps, RdmaError> {
        // SAFETY: zeroed is valid for these plain C structs; the call writes `attr`.
        let mut attr: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        let r = unsafe { ibv_query_device_ex(self.ctx.as_ptr(), ptr::null(), &mut attr) };
        rc(&self.name, "ibv_query_device_ex", r)?;
        Ok(DeviceCaps {
            hca_core_clock: attr.hca_core_clock,
            completion_timestamp_mask: attr.completion_timestamp_mask,
            phys_port_cnt: attr.orig_attr.phys_port_cnt,
            max_qp_wr: attr.orig_attr.max_qp_wr.max(0) as u32,
            max_cqe: attr.orig_attr.max_cqe.max(0) as u32,
        })
    }

    /// The NIC clock now, in raw ticks (`ibv_query_rt_values_ex`); None if unsupported.
    pub fn raw_clock(&self) -> Option<u64> {
        // SAFETY: zeroed plain struct; the call fills raw_clock when it returns 0.
        let mut v: ibv_values_ex = unsafe { std::mem::zeroed() };
        v.comp_mask = ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK.0;
        let r = unsafe { ibv_query_rt_values_ex(self.ctx.as_ptr(), &mut v) };
        if r != 0 {
            return None;
        }
        // mlx5 puts the cycle count in tv_nsec with tv_sec = 0; others use both fields.
        Some(
            (v.raw_clock.tv_sec as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(v.raw_clock.tv_nsec as u64),
        )
    }

    /// The GID at `index` as libibverbs sees it (cross-check of the sysfs table).
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Ipv6Addr, RdmaError> {
        // SAFETY: ibv_gid is 16 plain bytes; the call fills it.
        let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
        let r = unsafe { ibv_query_gid(self.ctx.as_ptr(), port, index as i32, &mut gid) };
        rc(&self.name, "ibv_query_gid", r)?;
        // SAFETY: every bit pattern is a valid `raw`.
        Ok(Ipv6Addr::from(unsafe { gid.raw }))
    }

    /// The port's active MTU in bytes (the largest UD payload it can carry).
    pub fn active_mtu_bytes(&self, port: u8) -> Result<usize, RdmaError> {
        // SAFETY: zeroed plain struct the call fills.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context; `attr` outlives the call.
        let r = unsafe { ___ibv_query_port(self.ctx.as_ptr(), port, &mut attr) };
        rc(&self.name, "ibv_query_port", r)?;
        // enum ibv_mtu: 1 = 256 ... 5 = 4096.
        let code = attr.active_mtu as u32;
        Ok(128usize << code.clamp(1, 5))
    }

    /// The async-event fd (readable when an async event is pending).
    pub fn async_fd(&self) -> i32 {
        // SAFETY: valid context.
        unsafe { (*self.ctx.as_ptr()).async_fd }
    }

    /// Non-blocking read of one async event. Sets the async fd to O_NONBLOCK on first use.
    pub fn poll_async_event(&self) -> Option<AsyncEvent> {
        // SAFETY: async_fd is a descriptor owned by the context; fcntl on it is harmless.
        unsafe {
            let fd = self.async_fd();
            let fl = libc::fcntl(fd, libc::F_GETFL);
            if fl >= 0 && fl & libc::O_NONBLOCK == 0 {
                libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            }
            let mut ev: ibv_async_event = std::mem::zeroed();
            if ibv_get_async_event(self.ctx.as_ptr(), &mut ev) != 0 {
                return None;
            }
            // Read the type as an integer: a newer kernel may send a value the bound
            // Rust enum does not list.
            let ty = ptr::read(ptr::addr_of!(ev.event_type) as *const u32);
            // The element union holds a port number for port events (an int at offset 0).
            let port = async_event_has_port(ty)
                .then(|| ptr::read(ptr::addr_of!(ev.element) as *const i32))
                .and_then(|p| u8::try_from(p).ok());
            ibv_ack_async_event(&mut ev);
            Some(AsyncEvent {
                ty,
                name: async_event_name(ty),
                port,
            })
        }
    }
}

/// One asynchronous event of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEvent {
    pub ty: u32,
    pub name: &'static str,
    /// The port, for port events (PORT_ACTIVE, PORT_ERR, GID_CHANGE, ...).
    pub port: Option<u8>,
}

/// Names of `enum ibv_event_type`.
pub fn async_event_name(ty: u32) -> &'static str {
    match ty {
        0 => "IBV_EVENT_CQ_ERR",
        1 => "IBV_EVENT_QP_FATAL",
        2 => "IBV_EVENT_QP_REQ_ERR",
        3 => "IBV_EVENT_QP_ACCESS_ERR",
        4 => "IBV_EVENT_COMM_EST",
        5 => "IBV_EVENT_SQ_DRAINED",
        6 => "IBV_EVENT_PATH_MIG",
        7 => "IBV_EVENT_PATH_MIG_ERR",
        8 => "IBV_EVENT_DEVICE_FATAL",
        9 => "IBV_EVENT_PORT_ACTIVE",
        10 => "IBV_EVENT_PORT_ERR",
        11 => "IBV_EVENT_LID_CHANGE",
        12 => "IBV_EVENT_PKEY_CHANGE",
        13 => "IBV_EVENT_SM_CHANGE",
        14 => "IBV_EVENT_SRQ_ERR",
        15 => "IBV_EVENT_SRQ_LIMIT_REACHED",
        16 => "IBV_EVENT_QP_LAST_WQE_REACHED",
        17 => "IBV_EVENT_CLIENT_REREGISTER",
        18 => "IBV_EVENT_GID_CHANGE",
        19 => "IBV_EVENT_WQ_FATAL",
        _ => "IBV_EVENT_UNKNOWN",
    }
}

/// Async events after which the endpoint must be re-opened: the CQ, the QP or the device
/// is gone. A port going down is not one of them (the QP survives it; see the endpoint).
pub fn async_event_is_fatal(ty: u32) -> bool {
    matches!(ty, 0 | 1 | 2 | 3 | 8 | 19)
}

pub const EVENT_DEVICE_FATAL: u32 = 8;
pub const EVENT_PORT_ACTIVE: u32 = 9;
pub const EVENT_PORT_ERR: u32 = 10;
pub const EVENT_GID_CHANGE: u32 = 18;

/// Events whose element is a port number.
fn async_event_has_port(ty: u32) -> bool {
    matches!(ty, 9..=13 | 17 | 18)
}

pub struct Pd {
    pd: NonNull<ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: see the module doc.
unsafe impl Send for Pd {}
unsafe impl Sync for Pd {}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: children (QP, MR, AH) hold an Arc of this PD, so none is left.
        unsafe { ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

impl Pd {
    pub fn alloc(ctx: &Arc<Context>) -> Result<Arc<Pd>, RdmaError> {
        // SAFETY: valid context.
        let pd = unsafe { ibv_alloc_pd(ctx.ctx.as_ptr()) };
        let pd = NonNull::new(pd)
            .ok_or_else(|| verbs_err(&ctx.name, "ibv_alloc_pd", io::Error::last_os_error()))?;
        Ok(Arc::new(Pd {
            pd,
            ctx: ctx.clone(),
        }))
    }
}

/// A completion channel: the fd the poller thread sleeps on until the CQ has work, so an
/// idle endpoint costs no CPU and a completion is seen the moment the kernel signals it.
pub struct CompChannel {
    ch: NonNull<ibv_comp_channel>,
    ctx: Arc<Context>,
}

// SAFETY: see the module doc; only the poller thread reads events from it.
unsafe impl Send for CompChannel {}
unsafe impl Sync for CompChannel {}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: the CQ bound to it holds an Arc of it, so the CQ is destroyed already.
        unsafe { ibv_destroy_comp_channel(self.ch.as_ptr()) };
    }
}

impl CompChannel {
    /// Creates a channel whose fd is non-blocking (the poller waits with poll(2)).
    pub fn create(ctx: &Arc<Context>) -> Result<Arc<CompChannel>, RdmaError> {
        // SAFETY: valid context.
        let ch = unsafe { ibv_create_comp_channel(ctx.ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(|| {
            verbs_err(
                &ctx.name,
                "ibv_create_comp_channel",
                io::Error::last_os_error(),
            )
        })?;
        let me = CompChannel {
            ch,
            ctx: ctx.clone(),
        };
        set_nonblocking(me.fd())
            .map_err(|e| verbs_err(&ctx.name, "fcntl(comp channel, O_NONBLOCK)", e))?;
        Ok(Arc::new(me))
    }

    pub fn fd(&self) -> i32 {
        // SAFETY: valid channel.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// Reads every pending CQ event and acknowledges it. Returns how many there were
    /// (0 when the fd had nothing: the read would block).
    pub fn drain_events(&self) -> Result<u32, RdmaError> {
        let mut n = 0;
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            // SAFETY: valid channel; out-pointers are locals.
            let r = unsafe { ibv_get_cq_event(self.ch.as_ptr(), &mut cq, &mut cq_ctx) };
            if r != 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::EINTR) {
                    return Ok(n);
                }
                return Err(verbs_err(&self.ctx.name, "ibv_get_cq_event", e));
            }
            // SAFETY: `cq` is the CQ the event was for; acknowledged once per event, as
            // ibv_destroy_cq requires.
            unsafe { ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }
}

fn set_nonblocking(fd: i32) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

enum CqPtr {
    Ex(NonNull<ibv_cq_ex>),
    Plain(NonNull<ibv_cq>),
}

/// A completion queue: extended (NIC timestamps) or plain (software timestamps).
pub struct Cq {
    cq: CqPtr,
    ctx: Arc<Context>,
    _channel: Option<Arc<CompChannel>>,
}

// SAFETY: see the module doc; polling happens from the one poller thread.
unsafe impl Send for Cq {}
unsafe impl Sync for Cq {}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: the QP using this CQ holds an Arc of it, so it is gone.
        unsafe {
            match self.cq {
                CqPtr::Ex(p) => ibv_destroy_cq(ibv_cq_ex_to_cq(p.as_ptr())),
                CqPtr::Plain(p) => ibv_destroy_cq(p.as_ptr()),
            }
        };
    }
}

impl Cq {
    /// An extended CQ reporting completion timestamps, signalling `channel` when armed.
    pub fn create_ex(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<&Arc<CompChannel>>,
    ) -> Result<Arc<Cq>, io::Error> {
        // SAFETY: zeroed plain struct, filled below; the call copies it.
        let mut attr: ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.cqe = cqe;
        attr.channel = channel.map_or(ptr::null_mut(), |c| c.ch.as_ptr());
        attr.wc_flags = (ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN
            | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_SRC_QP
            | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP)
            .0 as u64;
        let p = unsafe { ibv_create_cq_ex(ctx.ctx.as_ptr(), &mut attr) }.unwrap_or(ptr::null_mut());
        match NonNull::new(p) {
            Some(p) => Ok(Arc::new(Cq {
                cq: CqPtr::Ex(p),
                ctx: ctx.clone(),
                _channel: channel.cloned(),
            })),
            None => {
                let e = io::Error::last_os_error();
                // The wrapper sets errno to EOPNOTSUPP when the provider lacks the op.
                Err(if e.raw_os_error() == Some(0) {
                    io::Error::from_raw_os_error(libc::EOPNOTSUPP)
                } else {
                    e
                })
            }
        }
    }

    pub fn create_plain(
        ctx: &Arc<Context>,
        cqe: u32,
        channel: Option<&Arc<CompChannel>>,
    ) -> Result<Arc<Cq>, RdmaError> {
        // SAFETY: valid context and channel (kept alive by the Arc the CQ holds).
        let p = unsafe {
            ibv_create_cq(
                ctx.ctx.as_ptr(),
                cqe as i32,
                ptr::null_mut(),
                channel.map_or(ptr::null_mut(), |c| c.ch.as_ptr()),
                0,
            )
        };
        let p = NonNull::new(p)
            .ok_or_else(|| verbs_err(&ctx.name, "ibv_create_cq", io::Error::last_os_error()))?;
        Ok(Arc::new(Cq {
            cq: CqPtr::Plain(p),
            ctx: ctx.clone(),
            _channel: channel.cloned(),
        }))
    }

    /// Arms the CQ: the next completion signals its channel once.
    pub fn arm(&self) -> Result<(), RdmaError> {
        // SAFETY: valid CQ (an extended CQ is armed through its ibv_cq view).
        let r = unsafe { ibv_req_notify_cq(self.as_cq(), 0) };
        rc(&self.ctx.name, "ibv_req_notify_cq", r)
    }

    fn as_cq(&self) -> *mut ibv_cq {
        match self.cq {
            // SAFETY: the documented cast of libibverbs.
            CqPtr::Ex(p) => unsafe { ibv_cq_ex_to_cq(p.as_ptr()) },
            CqPtr::Plain(p) => p.as_ptr(),
        }
    }

    /// Polls up to `max` completions into `out` as (record, raw timestamp). The raw
    /// timestamp is NIC ticks for an extended CQ, None for a plain one.
    /// Err = the CQ itself failed (device lost).
    pub fn poll(
        &self,
        max: usize,
        out: &mut Vec<(WcRecord, Option<u64>)>,
    ) -> Result<usize, RdmaError> {
        match self.cq {
            CqPtr::Ex(p) => {
                let cq = p.as_ptr();
                // SAFETY: zeroed attr (comp_mask 0); reads happen only between a successful
                // start_poll and end_poll, as the extended-CQ API requires.
                unsafe {
                    let mut attr: ibv_poll_cq_attr = std::mem::zeroed();
                    let r = ibv_start_poll(cq, &mut attr);
                    if r == libc::ENOENT {
                        return Ok(0);
                    }
                    if r != 0 {
                        return Err(RdmaError::DeviceLost {
                            device: self.ctx.name.clone(),
                            reason: format!(
                                "ibv_start_poll failed: {}",
                                io::Error::from_raw_os_error(r.abs())
                            ),
                        });
                    }
                    let mut n = 0;
                    loop {
                        let status = (*cq).status as u32;
                        let ok = status == 0;
                        let rec = WcRecord {
                            wr_id: (*cq).wr_id,
                            status,
                            // Only wr_id and status are valid for error completions.
                            opcode: if ok { ibv_wc_read_opcode(cq) as u32 } else { 0 },
                            byte_len: if ok { ibv_wc_read_byte_len(cq) } else { 0 },
                            src_qp: if ok { ibv_wc_read_src_qp(cq) } else { 0 },
                            wc_flags: if ok { ibv_wc_read_wc_flags(cq) } else { 0 },
                            ts_ns: 0,
                        };
                        let ts = if ok {
                            Some(ibv_wc_read_completion_ts(cq))
                        } else {
                            None
                        };
                        out.push((rec, ts));
                        n += 1;
                        if n >= max {
                            break;
                        }
                        let r = ibv_next_poll(cq);
                        if r == libc::ENOENT {
                            break;
                        }
                        if r != 0 {
                            ibv_end_poll(cq);
                            return Err(RdmaError::DeviceLost {
                                device: self.ctx.name.clone(),
                                reason: format!(
                                    "ibv_next_poll failed: {}",
                                    io::Error::from_raw_os_error(r.abs())
                                ),
                            });
                        }
                    }
                    ibv_end_poll(cq);
                    Ok(n)
                }
            }
            CqPtr::Plain(p) => {
                // SAFETY: ibv_wc is plain data; the call writes up to `max` entries.
                let mut wcs: [ibv_wc; 32] = unsafe { std::mem::zeroed() };
                let want = max.min(wcs.len()) as i32;
                let r = unsafe { ibv_poll_cq(p.as_ptr(), want, wcs.as_mut_ptr()) };
                if r < 0 {
                    return Err(RdmaError::DeviceLost {
                        device: self.ctx.name.clone(),
                        reason: format!("ibv_poll_cq returned {r}"),
                    });
                }
                for wc in &wcs[..r as usize] {
                    out.push((
                        WcRecord {
                            wr_id: wc.wr_id,
                            status: wc.status as u32,
                            opcode: wc.opcode as u32,
                            byte_len: wc.byte_len,
                            src_qp: wc.src_qp,
                            wc_flags: wc.wc_flags,
                            ts_ns: 0,
                        },
                        None,
                    ));
                }
                Ok(r as usize)
            }
        }
    }
}

/// Where a registered buffer came from (and how it is freed after deregistration).
enum MrBuf {
    /// A `Vec` leaked in `register`, reclaimed on drop.
    Heap,
    /// Caller-provided mapped memory (`register_host`), unmapped when the Mr drops it.
    Host { _mem: HostMem },
}

/// Registered memory owning its buffer (never moved or freed while registered).
pub struct Mr {
    mr: NonNull<ibv_mr>,
    buf: NonNull<u8>,
    len: usize,
    kind: MrBuf,
    _pd: Arc<Pd>,
}

// SAFETY: see the module doc; byte access goes through &mut self or explicit copies.
unsafe impl Send for Mr {}
unsafe impl Sync for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: deregister first, then free the buffer (allocated in `register`, or the
        // HostMem given to `register_host`, which unmaps itself when dropped with `self`).
        unsafe {
            ibv_dereg_mr(self.mr.as_ptr());
            if let MrBuf::Heap = self.kind {
                drop(Vec::from_raw_parts(self.buf.as_ptr(), self.len, self.len));
            }
        }
    }
}

impl Mr {
    /// Allocates `len` zeroed bytes and registers them for local write.
    pub fn register(pd: &Arc<Pd>, len: usize) -> Result<Mr, RdmaError> {
        let mut v = vec![0u8; len.max(1)];
        let len = v.len();
        let buf = v.as_mut_ptr();
        std::mem::forget(v);
        // SAFETY: `buf` is a live allocation of `len` bytes owned by the Mr from here on.
        let mr = unsafe {
            ibv_reg_mr(
                pd.pd.as_ptr(),
                buf as *mut libc::c_void,
                len,
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32,
            )
        };
        let buf = NonNull::new(buf).expect("Vec pointer is never null");
        match NonNull::new(mr) {
            Some(mr) => Ok(Mr {
                mr,
                buf,
                len,
                kind: MrBuf::Heap,
                _pd: pd.clone(),
            }),
            None => {
                let e = io::Error::last_os_error();
                // SAFETY: not registered; reclaim the allocation.
                unsafe { drop(Vec::from_raw_parts(buf.as_ptr(), len, len)) };
                Err(verbs_err(&pd.ctx.name, "ibv_reg_mr", e))
            }
        }
    }

    /// Registers mapped memory the caller placed (e.g. on a NUMA node) for local write,
    /// and for remote write too when `remote_write` (the target of an RDMA WRITE). The Mr
    /// owns `mem` from here on; on failure `mem` is unmapped.
    pub fn register_host(pd: &Arc<Pd>, mem: HostMem, remote_write: bool) -> Result<Mr, RdmaError> {
        let mut access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if remote_write {
            access |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        Self::register_host_with(pd, mem, access)
    }

    /// `register_host` with explicit access flags (the RC rings add remote read).
    fn register_host_with(
        pd: &Arc<Pd>,
        mem: HostMem,
        access: ibv_access_flags,
    ) -> Result<Mr, RdmaError> {
        // SAFETY: `mem` is a live mapping of `mem.len` bytes, kept alive by the Mr (it
        // is moved into it below) until after ibv_dereg_mr.
        let mr = unsafe {
            ibv_reg_mr(
                pd.pd.as_ptr(),
                mem.ptr.as_ptr() as *mut libc::c_void,
                mem.len,
                access.0 as i32,
            )
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(Mr {
                mr,
                buf: mem.ptr,
                len: mem.len,
                kind: MrBuf::Host { _mem: mem },
                _pd: pd.clone(),
            }),
            None => Err(verbs_err(
                &pd.ctx.name,
                "ibv_reg_mr",
                io::Error::last_os_error(),
            )),
        }
    }

    /// The key a peer (here: the QP itself) names this region with in an RDMA WRITE.
    pub fn rkey(&self) -> u32 {
        // SAFETY: valid registered MR.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// The address of byte `off`, as an RDMA WRITE's remote address.
    pub fn remote_addr(&self, off: usize) -> u64 {
        assert!(off <= self.len, "MR offset out of bounds");
        self.addr(off)
    }

    fn lkey(&self) -> u32 {
        // SAFETY: valid registered MR.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    fn addr(&self, off: usize) -> u64 {
        self.buf.as_ptr() as u64 + off as u64
    }

    /// Copies `len` bytes at `off` out. The caller guarantees no DMA is in flight there
    /// (the slot's completion has been polled and it is not re-posted yet).
    pub fn read(&self, off: usize, out: &mut [u8]) {
        assert!(off + out.len() <= self.len, "MR read out of bounds");
        // SAFETY: bounds checked; the HCA wrote before the completion we polled.
        unsafe {
            ptr::copy_nonoverlapping(self.buf.as_ptr().add(off), out.as_mut_ptr(), out.len())
        };
    }

    /// Copies `data` in at `off` (a send slot whose previous send has completed).
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len, "MR write out of bounds");
        // SAFETY: bounds checked; the caller owns the slot (see `send`).
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.buf.as_ptr().add(off), data.len()) };
    }
}

/// How a GPU region was registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuRegistration {
    /// `ibv_reg_dmabuf_mr` on the region's dma-buf.
    DmaBuf,
    /// `ibv_reg_mr` on the device pointer (needs the nvidia-peermem module).
    PeerMemory,
}

/// A GPU region registered as an RDMA WRITE target. It has no host address: the bytes
/// are reached through [`GpuMem::copy_in`] / [`GpuMem::copy_out`] (`mem()`).
pub struct GpuMr {
    mr: NonNull<ibv_mr>,
    mem: super::gpu::GpuMem,
    pub how: GpuRegistration,
    _pd: Arc<Pd>,
}

// SAFETY: as `Mr`: the MR handle is immutable after registration.
unsafe impl Send for GpuMr {}
unsafe impl Sync for GpuMr {}

impl Drop for GpuMr {
    fn drop(&mut self) {
        // SAFETY: deregistered once, before `mem` (a field) frees the GPU memory.
        unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

impl GpuMr {
    /// Registers `mem` for local and remote write: as a dma-buf when the driver exports
    /// one and the RNIC's provider takes it, else through peer memory. Both failing is one
    /// error naming both reasons.
    pub fn register(pd: &Arc<Pd>, mem: super::gpu::GpuMem) -> Result<GpuMr, RdmaError> {
        let access = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0 as i32;
        let dmabuf = match mem.dmabuf_fd() {
            Ok(fd) => {
                // SAFETY: `fd` is a dma-buf of exactly this allocation; the MR keeps its
                // own reference to the buffer, so the fd is closed right after.
                let mr = unsafe {
                    let mr = ibv_reg_dmabuf_mr(
                        pd.pd.as_ptr(),
                        0,
                        mem.len(),
                        mem.device_ptr(),
                        fd,
                        access,
                    );
                    let e = io::Error::last_os_error();
                    libc::close(fd);
                    NonNull::new(mr).ok_or(e)
                };
                mr.map_err(|e| format!("ibv_reg_dmabuf_mr: {e}"))
            }
            Err(e) => Err(e.reason),
        };
        let (mr, how) = match dmabuf {
            Ok(mr) => (mr, GpuRegistration::DmaBuf),
            Err(why_not) => {
                // SAFETY: the device pointer of a live allocation of `len` bytes; only the
                // peer-memory module can pin it, otherwise this fails cleanly.
                let mr = unsafe {
                    ibv_reg_mr(
                        pd.pd.as_ptr(),
                        mem.device_ptr() as *mut libc::c_void,
                        mem.len(),
                        access,
                    )
                };
                match NonNull::new(mr) {
                    Some(mr) => (mr, GpuRegistration::PeerMemory),
                    None => {
                        let e = io::Error::last_os_error();
                        return Err(RdmaError::Gpu(super::gpu::GpuError {
                            gpu: Some(mem.bus_id.clone()),
                            reason: format!(
                                "{} cannot register it: dma-buf: {why_not}; peer memory (ibv_reg_mr on the device pointer, needs nvidia-peermem): {e}",
                                pd.ctx.name
                            ),
                        }));
                    }
                }
            }
        };
        Ok(GpuMr {
            mr,
            mem,
            how,
            _pd: pd.clone(),
        })
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: valid registered MR.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// The region's start as an RDMA WRITE's remote address (its GPU virtual address).
    pub fn remote_addr(&self) -> u64 {
        self.mem.device_ptr()
    }

    pub fn mem(&self) -> &super::gpu::GpuMem {
        &self.mem
    }
}

/// Page-aligned anonymous memory from mmap, optionally bound to one NUMA node with
/// mbind(MPOL_BIND) before its pages are first touched. Unmapped on drop.
pub struct HostMem {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain memory owned by this value; access goes through `Mr`'s checked copies.
unsafe impl Send for HostMem {}
unsafe impl Sync for HostMem {}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once (a registered Mr drops its
        // HostMem only after ibv_dereg_mr).
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

/// `get_mempolicy` flags (linux/mempolicy.h; not in the libc crate): return the node
/// of the page at `addr`.
const MPOL_F_NODE: libc::c_ulong = 1;
const MPOL_F_ADDR: libc::c_ulong = 2;

impl HostMem {
    /// Maps `len` bytes (rounded up to whole pages). With `bind`, binds the range to that
    /// node (mbind MPOL_BIND) before touching it, touches every page so it is allocated
    /// there, and checks with get_mempolicy that the first and last pages landed on the
    /// node. Err is the reason, one line, naming the call and its errno.
    pub fn map(len: usize, bind: Option<&NodeMask>) -> Result<HostMem, String> {
        // SAFETY: sysconf has no preconditions.
        let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
            p if p > 0 => p as usize,
            _ => 4096,
        };
        let len = len.max(1).div_ceil(page) * page;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {len} bytes failed: {}",
                io::Error::last_os_error()
            ));
        }
        let mem = HostMem {
            ptr: NonNull::new(p as *mut u8).expect("mmap returned MAP_FAILED, not NULL"),
            len,
        };
        if let Some(b) = bind {
            // SAFETY: the range is our mapping; the mask outlives the call and holds
            // `maxnode - 1` bits (the kernel reads one bit fewer than `maxnode`).
            let r = unsafe {
                libc::syscall(
                    libc::SYS_mbind,
                    p,
                    len as libc::c_ulong,
                    libc::MPOL_BIND as libc::c_ulong,
                    b.words.as_ptr(),
                    b.maxnode,
                    0 as libc::c_ulong,
                )
            };
            if r != 0 {
                return Err(format!(
                    "mbind(MPOL_BIND, node {}) of {len} bytes failed: {} (is node {} online? see /sys/devices/system/node; a single-node kernel has node 0 only)",
                    b.node,
                    io::Error::last_os_error(),
                    b.node
                ));
            }
        }
        // Touch every page (writes zeros), so they are allocated now, under the policy.
        // SAFETY: the whole range is our writable mapping.
        unsafe { ptr::write_bytes(mem.ptr.as_ptr(), 0, len) };
        if let Some(b) = bind {
            for off in [0, len - page] {
                let mut node: libc::c_int = -1;
                // SAFETY: `node` is a local the call writes; the address is in our mapping.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_get_mempolicy,
                        &mut node as *mut libc::c_int,
                        ptr::null_mut::<libc::c_ulong>(),
                        0 as libc::c_ulong,
                        mem.ptr.as_ptr().add(off),
                        MPOL_F_NODE | MPOL_F_ADDR,
                    )
                };
                if r != 0 {
                    return Err(format!(
                        "get_mempolicy(MPOL_F_NODE|MPOL_F_ADDR) failed: {}",
                        io::Error::last_os_error()
                    ));
                }
                if node < 0 || node as u32 != b.node {
                    return Err(format!(
                        "memory bound to NUMA node {} landed on node {node} (byte {off})",
                        b.node
                    ));
                }
            }
        }
        Ok(mem)
    }
}

pub struct Ah {
    ah: NonNull<ibv_ah>,
    _pd: Arc<Pd>,
}

// SAFETY: see the module doc.
unsafe impl Send for Ah {}
unsafe impl Sync for Ah {}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: callers destroy an AH only after its sends completed (see endpoint).
        unsafe { ibv_destroy_ah(self.ah.as_ptr()) };
    }
}

/// Path attributes of an address handle.
#[derive(Debug, Clone, Copy)]
pub struct AhSpec {
    pub dgid: Ipv6Addr,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub service_level: u8,
    pub port: u8,
}

impl Ah {
    pub fn create(pd: &Arc<Pd>, s: &AhSpec) -> Result<Ah, RdmaError> {
        // SAFETY: zeroed plain struct, filled below; the call copies it.
        let mut attr: ibv_ah_attr = unsafe { std::mem::zeroed() };
        attr.is_global = 1;
        attr.grh.dgid = ibv_gid {
            raw: s.dgid.octets(),
        };
        attr.grh.flow_label = s.flow_label & 0xF_FFFF;
        attr.grh.sgid_index = s.sgid_index;
        attr.grh.hop_limit = s.hop_limit;
        attr.grh.traffic_class = s.traffic_class;
        attr.sl = s.service_level;
        attr.port_num = s.port;
        let ah = unsafe { ibv_create_ah(pd.pd.as_ptr(), &mut attr) };
        NonNull::new(ah)
            .map(|ah| Ah {
                ah,
                _pd: pd.clone(),
            })
            .ok_or_else(|| verbs_err(&pd.ctx.name, "ibv_create_ah", io::Error::last_os_error()))
    }
}

/// A UD queue pair, brought to RTS.
pub struct Qp {
    qp: NonNull<ibv_qp>,
    qpn: u32,
    name: String,
    _cq: Arc<Cq>,
    _pd: Arc<Pd>,
}

// SAFETY: see the module doc.
unsafe impl Send for Qp {}
unsafe impl Sync for Qp {}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: nothing uses the QP once its owner drops it (the poller is joined).
        unsafe { ibv_destroy_qp(self.qp.as_ptr()) };
    }
}

impl Qp {
    pub fn create_ud(
        pd: &Arc<Pd>,
        cq: &Arc<Cq>,
        port: u8,
        qkey: u32,
        send_wr: u32,
        recv_wr: u32,
    ) -> Result<Qp, RdmaError> {
        let name = pd.ctx.name.clone();
        // SAFETY: zeroed plain struct, filled below.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_cq();
        init.recv_cq = cq.as_cq();
        init.qp_type = ibv_qp_type::IBV_QPT_UD;
        init.sq_sig_all = 1;
        init.cap.max_send_wr = send_wr;
        init.cap.max_recv_wr = recv_wr;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        let p = unsafe { ibv_create_qp(pd.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(p)
            .ok_or_else(|| verbs_err(&name, "ibv_create_qp", io::Error::last_os_error()))?;
        // SAFETY: valid QP.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        let me = Qp {
            qp,
            qpn,
            name,
            _cq: cq.clone(),
            _pd: pd.clone(),
        };

        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qkey = qkey;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_QKEY;
        me.modify(&mut a, mask, "ibv_modify_qp(INIT)")?;
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        me.modify(&mut a, ibv_qp_attr_mask::IBV_QP_STATE, "ibv_modify_qp(RTR)")?;
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = 0;
        me.modify(
            &mut a,
            ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_SQ_PSN,
            "ibv_modify_qp(RTS)",
        )?;
        Ok(me)
    }

    /// An RC QP, left in RESET, with `send_wr` send slots of one SGE each (and one
    /// receive slot: an RDMA WRITE without immediate consumes no receive). Bring it up
    /// with `modify_to_init_rc`, `modify_to_rtr_rc` and `modify_to_rts_rc`.
    pub fn create_rc(pd: &Arc<Pd>, cq: &Arc<Cq>, send_wr: u32) -> Result<Qp, RdmaError> {
        let name = pd.ctx.name.clone();
        // SAFETY: zeroed plain struct, filled below; the call copies it.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_cq();
        init.recv_cq = cq.as_cq();
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.cap.max_send_wr = send_wr.max(1);
        init.cap.max_recv_wr = 1;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: valid PD and CQ (kept alive by the Arcs the QP holds).
        let p = unsafe { ibv_create_qp(pd.pd.as_ptr(), &mut init) };
        let qp = NonNull::new(p)
            .ok_or_else(|| verbs_err(&name, "ibv_create_qp", io::Error::last_os_error()))?;
        // SAFETY: valid QP.
        let qpn = unsafe { (*qp.as_ptr()).qp_num };
        Ok(Qp {
            qp,
            qpn,
            name,
            _cq: cq.clone(),
            _pd: pd.clone(),
        })
    }

    /// RC RESET -> INIT on `port`, accepting remote writes (and local writes).
    pub fn modify_to_init_rc(&self, port: u8) -> Result<(), RdmaError> {
        // SAFETY: zeroed plain struct, filled below.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = (ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE)
            .0 as _;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut a, mask, "ibv_modify_qp(INIT)")
    }

    /// RC INIT -> RTR, connected to `peer` (RoCE: a global route to the peer's GID).
    pub fn modify_to_rtr_rc(&self, peer: &RcPeer) -> Result<(), RdmaError> {
        // SAFETY: zeroed plain struct (the AH attribute included), filled below.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = mtu_enum(peer.path_mtu_bytes) as _;
        a.dest_qp_num = peer.qpn;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = 1;
        a.min_rnr_timer = 12;
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = ibv_gid {
            raw: peer.gid.octets(),
        };
        a.ah_attr.grh.sgid_index = peer.sgid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.sl = 0;
        a.ah_attr.port_num = peer.port;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut a, mask, "ibv_modify_qp(RTR)")
    }

    /// RC RTR -> RTS (retry counts and timeout as perftest's defaults).
    pub fn modify_to_rts_rc(&self) -> Result<(), RdmaError> {
        // SAFETY: zeroed plain struct, filled below.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = 0;
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 1;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut a, mask, "ibv_modify_qp(RTS)")
    }

    fn modify(
        &self,
        a: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        call: &'static str,
    ) -> Result<(), RdmaError> {
        // SAFETY: valid QP and attr.
        let r = unsafe { ibv_modify_qp(self.qp.as_ptr(), a, mask.0 as i32) };
        rc(&self.name, call, r)
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// True when the QP reports the error state.
    pub fn in_error(&self) -> Result<bool, RdmaError> {
        // SAFETY: zeroed plain structs written by the call.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        let mut i: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let r = unsafe {
            ibv_query_qp(
                self.qp.as_ptr(),
                &mut a,
                ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut i,
            )
        };
        rc(&self.name, "ibv_query_qp", r)?;
        Ok(a.qp_state == ibv_qp_state::IBV_QPS_ERR)
    }

    /// Posts receive slot `slot` (bytes [off, off+len) of `mr`) with `wr_id`.
    pub fn post_recv(&self, mr: &Mr, off: usize, len: usize, wr_id: u64) -> Result<(), RdmaError> {
        assert!(off + len <= mr.len, "receive slot outside its MR");
        let mut sge = ibv_sge {
            addr: mr.addr(off),
            length: len as u32,
            lkey: mr.lkey(),
        };
        let mut wr = ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the WR and SGE live across the call (the provider copies them); the
        // buffer belongs to `mr`, which outlives the QP's use of it (endpoint drop order).
        let r = unsafe { ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        rc(&self.name, "ibv_post_recv", r)
    }

    #[allow(clippy::too_many_arguments)]
    /// Posts one signalled UD send of `mr[off..off+len]` through `ah`.
    pub fn post_send_ud(
        &self,
        ah: &Ah,
        remote_qpn: u32,
        qkey: u32,
        mr: &Mr,
        off: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<(), RdmaError> {
        assert!(off + len <= mr.len, "send slot outside its MR");
        let mut sge = ibv_sge {
            addr: mr.addr(off),
            length: len as u32,
            lkey: mr.lkey(),
        };
        // SAFETY: zeroed plain struct (unions included), filled below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.ud = ud_t {
            ah: ah.ah.as_ptr(),
            remote_qpn,
            remote_qkey: qkey,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: as in post_recv; the AH stays alive until this send completed.
        let r = unsafe { ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        rc(&self.name, "ibv_post_send", r)
    }
}

impl Qp {
    #[allow(clippy::too_many_arguments)]
    /// Posts one signalled RDMA WRITE of `mr[off..off+len]` to `remote_addr` (`rkey`) on
    /// the connected peer (an RC QP).
    pub fn post_send_rdma_write(
        &self,
        mr: &Mr,
        off: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        wr_id: u64,
    ) -> Result<(), RdmaError> {
        assert!(off + len <= mr.len, "write source outside its MR");
        let mut sge = ibv_sge {
            addr: mr.addr(off),
            length: u32::try_from(len).expect("RDMA WRITE length fits in u32"),
            lkey: mr.lkey(),
        };
        // SAFETY: zeroed plain struct (unions included), filled below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma = rdma_t { remote_addr, rkey };
        let mut bad = ptr::null_mut();
        // SAFETY: the WR and SGE live across the call (the provider copies them); the
        // source buffer belongs to `mr`, which the caller keeps until the completion.
        let r = unsafe { ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        rc(&self.name, "ibv_post_send", r)
    }
}

/// The remote end of an RC connection (for a loopback: the QP itself).
#[derive(Debug, Clone, Copy)]
pub struct RcPeer {
    pub qpn: u32,
    pub gid: Ipv6Addr,
    /// Our GID index, the source of the route.
    pub sgid_index: u8,
    pub port: u8,
    pub path_mtu_bytes: usize,
}

/// `enum ibv_mtu` for a path MTU in bytes (256 -> 1 ... 4096 -> 5; others round down,
/// clamped to that range).
fn mtu_enum(bytes: usize) -> u32 {
    let mut code = 1;
    while code < 5 && (128usize << (code + 1)) <= bytes {
        code += 1;
    }
    code
}

/// `ibv_wc_status_str`: libibverbs' text for a completion status.
pub fn wc_status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static NUL-terminated string for any value.
    unsafe { CStr::from_ptr(ibv_wc_status_str(status as _)) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::completion as c;

    #[test]
    fn pure_constants_match_libibverbs() {
        assert_eq!(c::WC_SUCCESS, ibv_wc_status::IBV_WC_SUCCESS as u32);
        assert_eq!(
            c::WC_WR_FLUSH_ERR,
            ibv_wc_status::IBV_WC_WR_FLUSH_ERR as u32
        );
        assert_eq!(c::WC_OPCODE_SEND, ibv_wc_opcode::IBV_WC_SEND as u32);
        assert_eq!(
            c::WC_OPCODE_RDMA_WRITE,
            ibv_wc_opcode::IBV_WC_RDMA_WRITE as u32
        );
        assert_eq!(c::WC_OPCODE_RECV, ibv_wc_opcode::IBV_WC_RECV as u32);
        assert_eq!(c::WC_FLAG_GRH, ibv_wc_flags::IBV_WC_GRH.0);
        for s in 0..=ibv_wc_status::IBV_WC_TM_RNDV_INCOMPLETE {
            // SAFETY: ibv_wc_status_str returns a static string for any value.
            let lib = unsafe { CStr::from_ptr(ibv_wc_status_str(s)) }
                .to_string_lossy()
                .into_owned();
            assert!(
                c::wc_status_name(s as u32).starts_with("IBV_WC_"),
                "{s} {lib}"
            );
        }
        assert_eq!(
            async_event_name(ibv_event_type::IBV_EVENT_DEVICE_FATAL as u32),
            "IBV_EVENT_DEVICE_FATAL"
        );
        assert_eq!(
            async_event_name(ibv_event_type::IBV_EVENT_WQ_FATAL as u32),
            "IBV_EVENT_WQ_FATAL"
        );
        for (ours, lib) in [
            (EVENT_DEVICE_FATAL, ibv_event_type::IBV_EVENT_DEVICE_FATAL),
            (EVENT_PORT_ACTIVE, ibv_event_type::IBV_EVENT_PORT_ACTIVE),
            (EVENT_PORT_ERR, ibv_event_type::IBV_EVENT_PORT_ERR),
            (EVENT_GID_CHANGE, ibv_event_type::IBV_EVENT_GID_CHANGE),
        ] {
            assert_eq!(ours, lib as u32);
        }
        assert!(async_event_is_fatal(EVENT_DEVICE_FATAL));
        assert!(async_event_is_fatal(
            ibv_event_type::IBV_EVENT_QP_FATAL as u32
        ));
        // The QP survives a port going down: not fatal, the endpoint pauses instead.
        assert!(!async_event_is_fatal(EVENT_PORT_ERR));
        assert!(!async_event_is_fatal(EVENT_PORT_ACTIVE));
        assert!(async_event_has_port(EVENT_PORT_ERR) && async_event_has_port(EVENT_GID_CHANGE));
        assert!(!async_event_has_port(EVENT_DEVICE_FATAL));
    }

    #[test]
    fn mtu_codes_match_libibverbs() {
        assert_eq!(mtu_enum(256), ibv_mtu::IBV_MTU_256 as u32);
        assert_eq!(mtu_enum(512), ibv_mtu::IBV_MTU_512 as u32);
        assert_eq!(mtu_enum(1024), ibv_mtu::IBV_MTU_1024 as u32);
        assert_eq!(mtu_enum(2048), ibv_mtu::IBV_MTU_2048 as u32);
        assert_eq!(mtu_enum(4096), ibv_mtu::IBV_MTU_4096 as u32);
        assert_eq!(mtu_enum(1500), ibv_mtu::IBV_MTU_1024 as u32);
        assert_eq!(mtu_enum(9000), ibv_mtu::IBV_MTU_4096 as u32);
        assert_eq!(mtu_enum(0), ibv_mtu::IBV_MTU_256 as u32);
        assert_eq!(wc_status_str(0), "success");
        assert_eq!(
            wc_status_str(ibv_wc_status::IBV_WC_REM_ACCESS_ERR as u32),
            "remote access error"
        );
    }

    #[test]
    fn host_memory_maps_and_unmaps() {
        let m = HostMem::map(5000, None).unwrap();
        assert_eq!(m.len % 4096, 0);
        assert!(m.len >= 5000);
        // SAFETY: reading our own zero-filled mapping.
        assert!(unsafe { std::slice::from_raw_parts(m.ptr.as_ptr(), m.len) }
            .iter()
            .all(|&b| b == 0));
    }

    /// Node 0 binds where the kernel has NUMA (and the pages are checked to be there);
    /// a node that does not exist fails with the one line naming mbind and the node.
    #[test]
    fn host_memory_binds_or_says_why() {
        match HostMem::map(3 * 4096, Some(&NodeMask::single(0))) {
            Ok(m) => assert_eq!(m.len, 3 * 4096),
            Err(e) => assert!(
                e.starts_with("mbind(MPOL_BIND, node 0) of 12288 bytes failed: "),
                "{e}"
            ),
        }
        let e = HostMem::map(4096, Some(&NodeMask::single(1023)))
            .err()
            .unwrap();
        assert!(
            e.starts_with("mbind(MPOL_BIND, node 1023) of 4096 bytes failed: "),
            "{e}"
        );
        assert!(
            e.contains("is node 1023 online?") && !e.contains('\n'),
            "{e}"
        );
    }

    /// On this machine (no RDMA in the kernel) the device list fails with the clear line.
    /// On an RDMA host the same call lists devices; both outcomes are checked strictly.
    #[test]
    fn device_list_gives_names_or_the_clear_line() {
        match device_names() {
            Ok(names) => assert!(!names.is_empty() && names.iter().all(|n| !n.is_empty())),
            Err(e) => {
                let s = e.to_string();
                assert!(
                    s.starts_with("no RDMA devices: ") && s.ends_with("; use transport: udp"),
                    "{s}"
                );
                assert!(!s.contains('\n'));
            }
        }
    }
}
