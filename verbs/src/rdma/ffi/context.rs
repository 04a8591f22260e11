//! An open device (`ibv_context`): its capabilities, GIDs, ports, clock and asynchronous
//! events.

use super::*;

/// An open device.
pub struct Context {
    pub(super) ctx: NonNull<ibv_context>,
    pub(super) name: String,
    /// False for librdmacm's contexts (`cm`), which the library closes itself.
    pub(super) owned: bool,
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
        let list = DeviceList::get()?;
        let mut found = Vec::new();
        for (dev, dn) in list.named() {
            if dn == name {
                // SAFETY: a listed device; the context outlives the list.
                let ctx = unsafe { ibv_open_device(dev) };
                let Some(ctx) = NonNull::new(ctx) else {
                    return Err(verbs_err(
                        name,
                        "ibv_open_device",
                        io::Error::last_os_error(),
                    ));
                };
                return Ok(Arc::new(Context {
                    ctx,
                    name: name.to_string(),
                    owned: true,
                }));
            }
            found.push(dn);
        }
        if found.is_empty() {
            return Err(RdmaError::NoDevices {
                reason: "ibv_get_device_list returned an empty list".into(),
            });
        }
        Err(RdmaError::NoAllowedDevice {
            allowed: vec![name.to_string()],
            found,
        })
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
        let r = unsafe { query_port(self.ctx.as_ptr(), port, &mut attr) };
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
pub(super) fn async_event_has_port(ty: u32) -> bool {
    matches!(ty, 9..=13 | 17 | 18)
}
