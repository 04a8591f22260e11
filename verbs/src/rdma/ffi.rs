//! The only code that touches libibverbs pointers: RAII owners for context, PD, CQ, QP,
//! MR and AH. Each child holds an `Arc` of its parent so destruction order is always
//! right; no raw pointer leaves this module (callers get safe methods).
//!
//! libibverbs objects are thread-safe (the library and providers lock internally), so the
//! owners are `Send + Sync`; the poller thread polls the CQ and posts receives while the
//! agent posts sends.
//!
//! One module per verbs object (`context`, `pd` with address handles, `cq` with completion
//! channels, `mr`, `qp`, `cm` for RDMA-CM); this file holds the error mapping they share.

// bindgen's enum integer types differ across libibverbs versions: keep explicit casts.
#![allow(clippy::unnecessary_cast)]

use std::ffi::CStr;
use std::io;
use std::net::Ipv6Addr;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_core::*;

use super::completion::WcRecord;
use super::error::{device_list_null_reason, RdmaError};
use super::numa::NodeMask;

/// An owner of one verbs object (`$field`, a `NonNull`): `Send + Sync` (see above), and
/// freed with `$free` when dropped. The SAFETY comment at each use says why nothing uses
/// the object any more by then (mostly: its users hold an `Arc` of its owner).
macro_rules! owns_verbs_object {
    ($owner:ident, $field:ident, $free:ident) => {
        unsafe impl Send for $owner {}
        unsafe impl Sync for $owner {}

        impl Drop for $owner {
            fn drop(&mut self) {
                unsafe { $free(self.$field.as_ptr()) };
            }
        }
    };
}

pub mod cm;
mod context;
mod cq;
mod mr;
mod pd;
mod qp;
mod rdma_core;

#[cfg(test)]
use context::{async_event_has_port, async_event_name};
pub use context::{
    async_event_is_fatal, Context, DeviceCaps, EVENT_DEVICE_FATAL, EVENT_GID_CHANGE,
    EVENT_PORT_ACTIVE, EVENT_PORT_ERR,
};
pub use cq::{CompChannel, Cq};
pub use mr::{GpuMr, GpuRegistration, HostMem, Mr};
pub use pd::{Ah, AhSpec, Pd};
#[cfg(test)]
use qp::mtu_enum;
pub use qp::{Qp, RcPeer};

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

/// The RDMA device list from `ibv_get_device_list`, freed when dropped. A NULL list
/// (ENOSYS and the like) is `NoDevices` with the reason its errno gives.
pub(super) struct DeviceList {
    list: NonNull<*mut ibv_device>,
    n: usize,
}

impl DeviceList {
    pub(super) fn get() -> Result<DeviceList, RdmaError> {
        load_ibverbs()?;
        let mut n: i32 = 0;
        // SAFETY: plain call; the list is freed by Drop.
        let list = unsafe { ibv_get_device_list(&mut n) };
        let Some(list) = NonNull::new(list) else {
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(RdmaError::NoDevices {
                reason: device_list_null_reason(errno),
            });
        };
        Ok(DeviceList {
            list,
            n: n.max(0) as usize,
        })
    }

    /// Every device that has a name, with its name, in list order.
    pub(super) fn named(&self) -> impl Iterator<Item = (*mut ibv_device, String)> + '_ {
        (0..self.n)
            // SAFETY: the list has `n` entries, valid while `self` lives.
            .map_while(|i| NonNull::new(unsafe { *self.list.as_ptr().add(i) }))
            .filter_map(|dev| {
                // SAFETY: a listed device; its name is a NUL-terminated C string it owns
                // (copied out here).
                let name = unsafe { ibv_get_device_name(dev.as_ptr()) };
                (!name.is_null()).then(|| {
                    let name = unsafe { CStr::from_ptr(name) };
                    (dev.as_ptr(), name.to_string_lossy().into_owned())
                })
            })
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once; contexts
        // opened from its devices stay valid afterwards.
        unsafe { ibv_free_device_list(self.list.as_ptr()) };
    }
}

/// Names of all RDMA devices. NULL (ENOSYS etc.) or an empty list is `NoDevices`.
pub fn device_names() -> Result<Vec<String>, RdmaError> {
    let names: Vec<String> = DeviceList::get()?.named().map(|(_, n)| n).collect();
    if names.is_empty() {
        return Err(RdmaError::NoDevices {
            reason: "ibv_get_device_list returned an empty list".into(),
        });
    }
    Ok(names)
}

/// `ibv_wc_status_str`: libibverbs' text for a completion status.
pub fn wc_status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static NUL-terminated string for any value.
    unsafe { CStr::from_ptr(ibv_wc_status_str(status as _)) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests;
