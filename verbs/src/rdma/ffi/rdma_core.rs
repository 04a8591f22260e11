//! rdma-core's two libraries, opened with `dlopen` when the rdma backend is first used
//! rather than linked: a udp agent then never maps libibverbs, librdmacm and libnl (about
//! 0.7 MiB of its resident set), and it starts on a host without rdma-core at all.
//!
//! Each exported function we call is declared once below, with the signature of its C
//! prototype; a wrapper of the same name calls through the pointer `dlsym` found. The
//! inline helpers of verbs.h (post/poll through the provider's ops table) stay in rdma-sys:
//! they reference no library symbol. `ibv_query_device_ex`, `ibv_create_cq_ex`,
//! `ibv_query_rt_values_ex` and the port query are written here because rdma-sys's versions never find the
//! extended context on 64-bit (they compare `abi_compat` with `u32::MAX`, not
//! `UINTPTR_MAX`) and so never reach a provider's timestamp support.
//!
//! Invariant: every path into the backend passes [`load_ibverbs`] (the device list) or
//! [`load_rdmacm`] (a CM event channel) first and turns a missing library into one
//! `RdmaError` line; a wrapper called before that loads on the spot (unit tests) and panics
//! only if the library is missing, which the gate has already reported.

#![allow(clippy::too_many_arguments)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::mem::offset_of;
use std::sync::OnceLock;

use libc::sockaddr;
/// The bindings' types and verbs.h's inline helpers; the library functions below shadow
/// rdma-sys's linked declarations of the same names.
pub(crate) use rdma_sys::*;

use crate::rdma::error::RdmaError;

/// A library handle from `dlopen`; never closed (the pointers it hands out live as long).
struct Handle(*mut c_void);

fn open(soname: &str) -> Result<Handle, String> {
    let c = CString::new(soname).expect("sonames have no NUL");
    // SAFETY: a NUL-terminated name; RTLD_GLOBAL so the providers libibverbs loads later
    // resolve its symbols as they would in a linked program.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        return Err(dl_error(soname));
    }
    Ok(Handle(h))
}

fn symbol(lib: &Handle, soname: &str, name: &str) -> Result<*mut c_void, String> {
    let c = CString::new(name).expect("symbol names have no NUL");
    // SAFETY: a live handle and a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib.0, c.as_ptr()) };
    if p.is_null() {
        return Err(format!(
            "{soname} has no symbol {name} ({})",
            dl_error(soname)
        ));
    }
    Ok(p)
}

fn dl_error(soname: &str) -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        format!("{soname}: unknown dlopen error")
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Declares one library: a table of its functions' pointers, the loader that fills it,
/// and a wrapper per function with the C name and signature.
macro_rules! library {
    ($table:ident, $cell:ident, $get:ident, $load:ident, $soname:literal, $package:literal {
        $( fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)?; )*
    }) => {
        #[allow(non_snake_case)]
        struct $table {
            $( $name: unsafe extern "C" fn($($ty),*) $(-> $ret)?, )*
        }

        static $cell: OnceLock<Result<$table, String>> = OnceLock::new();

        fn $get() -> Result<&'static $table, &'static str> {
            $cell
                .get_or_init(|| {
                    let lib = open($soname)?;
                    Ok($table {
                        // SAFETY: the symbol is the C function declared with this signature.
                        $( $name: unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) $(-> $ret)?>(
                                symbol(&lib, $soname, stringify!($name))?,
                            )
                        }, )*
                    })
                })
                .as_ref()
                .map_err(String::as_str)
        }

        /// Opens the library (once); a missing or unusable one is one clear error.
        pub(crate) fn $load() -> Result<(), RdmaError> {
            $get().map(drop).map_err(|reason| RdmaError::Library {
                soname: $soname,
                package: $package,
                reason: reason.to_string(),
            })
        }

        $(
            /// # Safety
            /// As the C function of this name.
            pub(crate) unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
                let table = $get().unwrap_or_else(|e| panic!("rdma-core used without its gate: {e}"));
                // SAFETY: the caller keeps the C function's contract.
                unsafe { (table.$name)($($arg),*) }
            }
        )*
    };
}

library!(Ibverbs, IBVERBS, ibverbs, load_ibverbs, "libibverbs.so.1", "libibverbs1" {
    fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    fn ibv_free_device_list(list: *mut *mut ibv_device);
    fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char;
    fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    fn ibv_close_device(context: *mut ibv_context) -> c_int;
    fn ibv_query_device(context: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int;
    fn ibv_query_port(context: *mut ibv_context, port: u8, attr: *mut _compat_ibv_port_attr) -> c_int;
    fn ibv_query_gid(context: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int;
    fn ibv_get_async_event(context: *mut ibv_context, event: *mut ibv_async_event) -> c_int;
    fn ibv_ack_async_event(event: *mut ibv_async_event);
    fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah;
    fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int;
    fn ibv_reg_mr(pd: *mut ibv_pd, addr: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr;
    fn ibv_reg_dmabuf_mr(pd: *mut ibv_pd, offset: u64, length: usize, iova: u64, fd: c_int, access: c_int) -> *mut ibv_mr;
    fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel;
    fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int;
    fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int;
    fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: c_uint);
    fn ibv_create_cq(context: *mut ibv_context, cqe: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, comp_vector: c_int) -> *mut ibv_cq;
    fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int) -> c_int;
    fn ibv_query_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, attr_mask: c_int, init_attr: *mut ibv_qp_init_attr) -> c_int;
    fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
    fn ibv_wc_status_str(status: ibv_wc_status::Type) -> *const c_char;
});

library!(Rdmacm, RDMACM, rdmacm, load_rdmacm, "librdmacm.so.1", "librdmacm1" {
    fn rdma_create_event_channel() -> *mut rdma_event_channel;
    fn rdma_destroy_event_channel(channel: *mut rdma_event_channel);
    fn rdma_get_cm_event(channel: *mut rdma_event_channel, event: *mut *mut rdma_cm_event) -> c_int;
    fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int;
    fn rdma_event_str(event: rdma_cm_event_type::Type) -> *const c_char;
    fn rdma_create_id(channel: *mut rdma_event_channel, id: *mut *mut rdma_cm_id, context: *mut c_void, ps: rdma_port_space::Type) -> c_int;
    fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int;
    fn rdma_migrate_id(id: *mut rdma_cm_id, channel: *mut rdma_event_channel) -> c_int;
    fn rdma_set_option(id: *mut rdma_cm_id, level: c_int, optname: c_int, optval: *mut c_void, optlen: usize) -> c_int;
    fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int;
    fn rdma_resolve_addr(id: *mut rdma_cm_id, src: *mut sockaddr, dst: *mut sockaddr, timeout_ms: c_int) -> c_int;
    fn rdma_resolve_route(id: *mut rdma_cm_id, timeout_ms: c_int) -> c_int;
    fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16;
    fn rdma_listen(id: *mut rdma_cm_id, backlog: c_int) -> c_int;
    fn rdma_create_qp(id: *mut rdma_cm_id, pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> c_int;
    fn rdma_destroy_qp(id: *mut rdma_cm_id);
    fn rdma_connect(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int;
    fn rdma_accept(id: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int;
    fn rdma_reject(id: *mut rdma_cm_id, private_data: *const c_void, private_data_len: u8) -> c_int;
    fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int;
});

/// verbs.h's `__VERBS_ABI_IS_EXTENDED`: a context whose `abi_compat` holds this sits inside
/// a `verbs_context` (every provider since rdma-core 13).
const ABI_IS_EXTENDED: usize = usize::MAX;

/// The extended context around `ctx` if its provider is new enough to have the op at
/// `op_offset` (verbs.h's `verbs_get_ctx_op`; the caller then takes the op, None when the
/// provider left it empty).
///
/// # Safety
/// `ctx` is an open context.
unsafe fn extended<'a>(ctx: *mut ibv_context, op_offset: usize) -> Option<&'a verbs_context> {
    // SAFETY: the caller's context; abi_compat is its first-level field.
    if unsafe { (*ctx).abi_compat } as usize != ABI_IS_EXTENDED {
        return None;
    }
    // SAFETY: an extended context is the last field of its verbs_context.
    let vctx = unsafe {
        &*(ctx.cast::<u8>().sub(offset_of!(verbs_context, context)) as *const verbs_context)
    };
    // `sz` counts the struct from the op table's older end: a provider built against an
    // older header has no room for the newer ops.
    let size = std::mem::size_of::<verbs_context>();
    (vctx.sz >= size - op_offset).then_some(vctx)
}

/// verbs.h's `ibv_query_device_ex`: the provider's extended query, else the legacy one.
///
/// # Safety
/// As the C function.
pub(crate) unsafe fn ibv_query_device_ex(
    ctx: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
) -> c_int {
    let off = offset_of!(verbs_context, query_device_ex);
    if let Some(op) = unsafe { extended(ctx, off) }.and_then(|v| v.query_device_ex) {
        let r = unsafe { op(ctx, input, attr, std::mem::size_of::<ibv_device_attr_ex>()) };
        if r != libc::EOPNOTSUPP && r != libc::ENOSYS {
            return r;
        }
    }
    // SAFETY: the caller's attr; the legacy query fills its first part.
    unsafe {
        std::ptr::write_bytes(attr, 0, 1);
        ibv_query_device(ctx, &mut (*attr).orig_attr)
    }
}

/// verbs.h's `ibv_create_cq_ex`: NULL with errno EOPNOTSUPP when the provider lacks it.
///
/// # Safety
/// As the C function.
pub(crate) unsafe fn ibv_create_cq_ex(
    ctx: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    let off = offset_of!(verbs_context, create_cq_ex);
    match unsafe { extended(ctx, off) }.and_then(|v| v.create_cq_ex) {
        Some(op) => unsafe { op(ctx, attr) },
        None => {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = libc::EOPNOTSUPP };
            std::ptr::null_mut()
        }
    }
}

/// verbs.h's `ibv_query_rt_values_ex`: EOPNOTSUPP when the provider lacks it.
///
/// # Safety
/// As the C function.
pub(crate) unsafe fn ibv_query_rt_values_ex(
    ctx: *mut ibv_context,
    values: *mut ibv_values_ex,
) -> c_int {
    let off = offset_of!(verbs_context, query_rt_values);
    match unsafe { extended(ctx, off) }.and_then(|v| v.query_rt_values) {
        Some(op) => unsafe { op(ctx, values) },
        None => libc::EOPNOTSUPP,
    }
}

/// verbs.h's `ibv_query_port` (the inline one): the provider's sized query, else the
/// exported legacy call, which fills the older, shorter struct.
///
/// # Safety
/// As the C function.
pub(crate) unsafe fn query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    let off = offset_of!(verbs_context, query_port);
    match unsafe { extended(ctx, off) }.and_then(|v| v.query_port) {
        Some(op) => unsafe { op(ctx, port, attr, std::mem::size_of::<ibv_port_attr>()) },
        // SAFETY: the caller's attr; the compat struct is its prefix.
        None => unsafe {
            std::ptr::write_bytes(attr, 0, 1);
            ibv_query_port(ctx, port, attr.cast())
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A provider's context as libibverbs lays it out: the ops table, then `sz`, then the
    /// public context.
    fn provider(sz: usize, extended_abi: bool) -> Box<verbs_context> {
        // SAFETY: zeroed is a valid verbs_context (null pointers, None ops).
        let mut v: Box<verbs_context> = Box::new(unsafe { std::mem::zeroed() });
        v.sz = sz;
        v.context.abi_compat = if extended_abi {
            usize::MAX as *mut c_void
        } else {
            std::ptr::null_mut()
        };
        v
    }

    unsafe extern "C" fn fake_query_device_ex(
        _: *mut ibv_context,
        _: *const ibv_query_device_ex_input,
        attr: *mut ibv_device_attr_ex,
        attr_size: usize,
    ) -> c_int {
        assert_eq!(attr_size, std::mem::size_of::<ibv_device_attr_ex>());
        unsafe { (*attr).completion_timestamp_mask = 0xffff_ffff };
        0
    }

    unsafe extern "C" fn fake_create_cq_ex(
        _: *mut ibv_context,
        _: *mut ibv_cq_init_attr_ex,
    ) -> *mut ibv_cq_ex {
        std::ptr::NonNull::dangling().as_ptr()
    }

    #[test]
    fn an_extended_provider_answers_the_extended_device_query() {
        // rdma-sys's helper never found this op on 64-bit, so the NIC's completion
        // timestamp mask always read 0 and hardware timestamps were never used.
        let mut v = provider(std::mem::size_of::<verbs_context>(), true);
        v.query_device_ex = Some(fake_query_device_ex);
        let mut attr: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        let r = unsafe { ibv_query_device_ex(&mut v.context, std::ptr::null(), &mut attr) };
        assert_eq!(r, 0);
        assert_eq!(attr.completion_timestamp_mask, 0xffff_ffff);
    }

    #[test]
    fn an_extended_cq_needs_a_provider_new_enough_to_have_the_op() {
        let full = std::mem::size_of::<verbs_context>();
        let off = offset_of!(verbs_context, create_cq_ex);
        let mut attr: ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
        for (sz, extended_abi, found) in [
            (full, true, true),
            (full - off, true, true),
            // A provider built before the op existed: its table ends short of it.
            (full - off - 1, true, false),
            // A legacy (non-extended) context has no op table at all.
            (full, false, false),
        ] {
            let mut v = provider(sz, extended_abi);
            v.create_cq_ex = Some(fake_create_cq_ex);
            let p = unsafe { ibv_create_cq_ex(&mut v.context, &mut attr) };
            assert_eq!(!p.is_null(), found, "sz {sz}, extended {extended_abi}");
            if !found {
                assert_eq!(
                    std::io::Error::last_os_error().raw_os_error(),
                    Some(libc::EOPNOTSUPP)
                );
            }
        }
        // Extended and large enough, but the provider left the op empty.
        let mut v = provider(full, true);
        assert!(unsafe { ibv_create_cq_ex(&mut v.context, &mut attr) }.is_null());
        assert_eq!(
            unsafe { ibv_query_rt_values_ex(&mut v.context, std::ptr::null_mut()) },
            libc::EOPNOTSUPP
        );
    }

    #[test]
    fn a_library_that_cannot_be_opened_is_one_line_naming_it() {
        let Err(e) = open("librpingmesh-no-such-library.so.1") else {
            panic!("opened a library that does not exist");
        };
        assert!(e.contains("librpingmesh-no-such-library.so.1"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let libc_handle = open("libc.so.6").unwrap();
        let e = symbol(&libc_handle, "libc.so.6", "ibv_no_such_symbol").unwrap_err();
        assert!(
            e.starts_with("libc.so.6 has no symbol ibv_no_such_symbol"),
            "{e}"
        );
    }
}
