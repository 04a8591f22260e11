//! GPU memory for Hostping's loopback tests: a region in a GPU's memory that an RNIC
//! writes into over PCIe peer to peer, the RNIC-to-GPU path of the paper's Figure 2.
//!
//! The CUDA driver API (`libcuda.so.1`, shipped with the NVIDIA driver) is loaded at run
//! time with dlopen, so the agent neither links nor needs it: on a host without it the
//! GPU endpoints are skipped with one line saying so. The region is exported as a dma-buf
//! (`cuMemGetHandleForAddressRange`) for `ibv_reg_dmabuf_mr`; where that is not supported
//! (older drivers or kernels) registration falls back to `ibv_reg_mr` on the device
//! pointer, which works when the nvidia-peermem module is loaded.
//!
//! Not run here (this machine and its VM have no GPU); everything but the calls into
//! libcuda is unit-tested: loading, error text, sizes, bus-id checks.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::Arc;

/// CUDA's result code (0 = CUDA_SUCCESS).
type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuDevicePtr = u64;

const CUDA_SUCCESS: CuResult = 0;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const DMA_BUF_FD: c_int = 1;
/// dma-buf export and peer-memory registration work on whole GPU pages (64 KiB).
pub const GPU_PAGE: usize = 64 * 1024;

/// The library the NVIDIA driver installs (the unversioned name is a -dev symlink).
pub const LIBCUDA: &str = "libcuda.so.1";

/// Why GPU memory cannot be used: one line, naming the GPU when there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU memory{}: {reason}", gpu.as_ref().map(|g| format!(" on {g}")).unwrap_or_default())]
pub struct GpuError {
    pub gpu: Option<String>,
    pub reason: String,
}

fn gpu_err(gpu: Option<&str>, reason: impl Into<String>) -> GpuError {
    GpuError {
        gpu: gpu.map(str::to_string),
        reason: reason.into(),
    }
}

/// Checks a PCI address as sysfs spells it (`0000:3b:00.0`).
pub fn check_bus_id(b: &str) -> Result<(), String> {
    let ok = b.len() == 12
        && b.char_indices().all(|(i, c)| match i {
            4 | 7 => c == ':',
            10 => c == '.',
            11 => ('0'..='7').contains(&c),
            _ => c.is_ascii_hexdigit(),
        });
    if ok {
        Ok(())
    } else {
        Err(format!("GPU {b:?} is not a PCI address like 0000:3b:00.0"))
    }
}

/// `len` rounded up to whole GPU pages (at least one).
pub fn gpu_region_len(len: usize) -> usize {
    len.max(1).div_ceil(GPU_PAGE) * GPU_PAGE
}

struct Api {
    lib: *mut c_void,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_by_bus_id: unsafe extern "C" fn(*mut CuDevice, *const c_char) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
    /// Absent before CUDA 11.7: then only peer memory is tried.
    handle_for_range:
        Option<unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, u64) -> CuResult>,
    error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

// SAFETY: the driver API is thread-safe; the handle and function pointers are immutable.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

impl Drop for Api {
    fn drop(&mut self) {
        // SAFETY: the handle dlopen returned, closed once; nothing of it is used after.
        unsafe { libc::dlclose(self.lib) };
    }
}

/// The loaded CUDA driver API.
#[derive(Clone)]
pub struct Cuda {
    api: Arc<Api>,
}

impl Cuda {
    /// Loads `libcuda.so.1` and initializes the driver.
    pub fn load() -> Result<Cuda, GpuError> {
        Self::load_from(LIBCUDA)
    }

    /// Loads the driver API from `lib` (tests name a library that is not there).
    pub fn load_from(lib: &str) -> Result<Cuda, GpuError> {
        let name = CString::new(lib).map_err(|_| gpu_err(None, "library name has a NUL"))?;
        // SAFETY: a plain dlopen of a NUL-terminated name.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if h.is_null() {
            return Err(gpu_err(
                None,
                format!(
                    "{lib} cannot be loaded ({}): the NVIDIA driver is not installed, so GPU endpoints are not tested",
                    dl_error()
                ),
            ));
        }
        let sym = |s: &str| -> Result<*mut c_void, GpuError> {
            let c = CString::new(s).expect("symbol names have no NUL");
            // SAFETY: `h` is a live handle; the name is NUL-terminated.
            let p = unsafe { libc::dlsym(h, c.as_ptr()) };
            if p.is_null() {
                Err(gpu_err(None, format!("{lib} has no {s} (driver too old)")))
            } else {
                Ok(p)
            }
        };
        let loaded = (|| {
            // SAFETY: each symbol is the driver API function of that name and signature
            // (CUDA driver API reference; the _v2 names are the 64-bit ones).
            unsafe {
                Ok::<Api, GpuError>(Api {
                    lib: h,
                    init: as_fn(sym("cuInit")?),
                    device_by_bus_id: as_fn(sym("cuDeviceGetByPCIBusId")?),
                    primary_ctx_retain: as_fn(sym("cuDevicePrimaryCtxRetain")?),
                    primary_ctx_release: as_fn(sym("cuDevicePrimaryCtxRelease_v2")?),
                    ctx_set_current: as_fn(sym("cuCtxSetCurrent")?),
                    mem_alloc: as_fn(sym("cuMemAlloc_v2")?),
                    mem_free: as_fn(sym("cuMemFree_v2")?),
                    memcpy_htod: as_fn(sym("cuMemcpyHtoD_v2")?),
                    memcpy_dtoh: as_fn(sym("cuMemcpyDtoH_v2")?),
                    handle_for_range: sym("cuMemGetHandleForAddressRange").ok().map(|p| as_fn(p)),
                    error_string: as_fn(sym("cuGetErrorString")?),
                })
            }
        })();
        let api = match loaded {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: the handle opened above, closed once on this path.
                unsafe { libc::dlclose(h) };
                return Err(e);
            }
        };
        let cuda = Cuda { api: Arc::new(api) };
        // SAFETY: cuInit with the only valid flags value.
        cuda.check(None, "cuInit", unsafe { (cuda.api.init)(0) })?;
        Ok(cuda)
    }

    fn check(&self, gpu: Option<&str>, call: &str, r: CuResult) -> Result<(), GpuError> {
        if r == CUDA_SUCCESS {
            return Ok(());
        }
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a static string pointer (or leaves it null).
        let text = unsafe {
            (self.api.error_string)(r, &mut s);
            if s.is_null() {
                format!("error {r}")
            } else {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            }
        };
        Err(gpu_err(gpu, format!("{call} failed: {text} ({r})")))
    }

    /// `len` bytes (rounded up to GPU pages) of the GPU at PCI address `bus_id`.
    pub fn alloc(&self, bus_id: &str, len: usize) -> Result<GpuMem, GpuError> {
        check_bus_id(bus_id).map_err(|r| gpu_err(Some(bus_id), r))?;
        let g = Some(bus_id);
        let c = CString::new(bus_id).expect("checked: no NUL");
        let mut dev: CuDevice = 0;
        // SAFETY: out-pointers to locals; the context is released in GpuMem's drop.
        unsafe {
            self.check(
                g,
                "cuDeviceGetByPCIBusId",
                (self.api.device_by_bus_id)(&mut dev, c.as_ptr()),
            )?;
            let mut ctx: CuContext = std::ptr::null_mut();
            self.check(
                g,
                "cuDevicePrimaryCtxRetain",
                (self.api.primary_ctx_retain)(&mut ctx, dev),
            )?;
            let release = || {
                (self.api.primary_ctx_release)(dev);
            };
            if let Err(e) = self.check(g, "cuCtxSetCurrent", (self.api.ctx_set_current)(ctx)) {
                release();
                return Err(e);
            }
            let len = gpu_region_len(len);
            let mut ptr: CuDevicePtr = 0;
            if let Err(e) = self.check(g, "cuMemAlloc", (self.api.mem_alloc)(&mut ptr, len)) {
                release();
                return Err(e);
            }
            Ok(GpuMem {
                cuda: self.clone(),
                bus_id: bus_id.to_string(),
                dev,
                ctx,
                ptr,
                len,
            })
        }
    }
}

/// A symbol dlsym found, as the function pointer type `F` it is declared with.
///
/// # Safety
/// `p` must be the address of a function with exactly `F`'s signature.
unsafe fn as_fn<F: Copy>(p: *mut c_void) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: same size (checked); the caller vouches for the signature.
    unsafe { std::mem::transmute_copy(&p) }
}

fn dl_error() -> String {
    // SAFETY: dlerror returns a thread-local message or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// A region of one GPU's memory; freed (and the device's primary context released) on
/// drop.
pub struct GpuMem {
    cuda: Cuda,
    pub bus_id: String,
    dev: CuDevice,
    ctx: CuContext,
    ptr: CuDevicePtr,
    len: usize,
}

// SAFETY: a device pointer and a context handle; every call sets the context first.
unsafe impl Send for GpuMem {}
unsafe impl Sync for GpuMem {}

impl GpuMem {
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn current(&self) -> Result<(), GpuError> {
        // SAFETY: the retained primary context of this device.
        let r = unsafe { (self.cuda.api.ctx_set_current)(self.ctx) };
        self.cuda.check(Some(&self.bus_id), "cuCtxSetCurrent", r)
    }

    /// A dma-buf file descriptor for the whole region (the caller closes it), or why not.
    pub fn dmabuf_fd(&self) -> Result<c_int, GpuError> {
        let f = self.cuda.api.handle_for_range.ok_or_else(|| {
            gpu_err(
                Some(&self.bus_id),
                "the driver has no cuMemGetHandleForAddressRange (CUDA < 11.7): no dma-buf",
            )
        })?;
        self.current()?;
        let mut fd: c_int = -1;
        // SAFETY: `fd` is the int the call writes; the range is this allocation.
        let r = unsafe {
            f(
                (&mut fd as *mut c_int).cast(),
                self.ptr,
                self.len,
                DMA_BUF_FD,
                0,
            )
        };
        self.cuda
            .check(Some(&self.bus_id), "cuMemGetHandleForAddressRange", r)?;
        Ok(fd)
    }

    /// Copies `data` to the start of the region.
    pub fn copy_in(&self, data: &[u8]) -> Result<(), GpuError> {
        assert!(data.len() <= self.len, "GPU region write out of bounds");
        self.current()?;
        // SAFETY: bounds checked; `data` is a live host buffer.
        let r = unsafe { (self.cuda.api.memcpy_htod)(self.ptr, data.as_ptr().cast(), data.len()) };
        self.cuda.check(Some(&self.bus_id), "cuMemcpyHtoD", r)
    }

    /// Copies the start of the region out (after the write's completion was polled).
    pub fn copy_out(&self, out: &mut [u8]) -> Result<(), GpuError> {
        assert!(out.len() <= self.len, "GPU region read out of bounds");
        self.current()?;
        // SAFETY: bounds checked; `out` is a live host buffer.
        let r =
            unsafe { (self.cuda.api.memcpy_dtoh)(out.as_mut_ptr().cast(), self.ptr, out.len()) };
        self.cuda.check(Some(&self.bus_id), "cuMemcpyDtoH", r)
    }
}

impl Drop for GpuMem {
    fn drop(&mut self) {
        // SAFETY: the allocation and the context retained in `alloc`, each freed once
        // (a registered MR drops its GpuMem only after ibv_dereg_mr).
        unsafe {
            (self.cuda.api.ctx_set_current)(self.ctx);
            (self.cuda.api.mem_free)(self.ptr);
            (self.cuda.api.primary_ctx_release)(self.dev);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_without_the_driver_gets_one_line() {
        let e = Cuda::load_from("libcuda-not-here.so.1")
            .err()
            .expect("no such library");
        let line = e.to_string();
        assert!(
            line.starts_with("GPU memory: libcuda-not-here.so.1 cannot be loaded ("),
            "{line}"
        );
        assert!(
            line.ends_with("the NVIDIA driver is not installed, so GPU endpoints are not tested"),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
        // A library without the API (libc) names the missing function.
        let e = Cuda::load_from("libc.so.6").err().expect("libc is no CUDA");
        assert_eq!(
            e.to_string(),
            "GPU memory: libc.so.6 has no cuInit (driver too old)"
        );
    }

    #[test]
    fn this_host_has_no_libcuda_or_reports_its_driver() {
        // On a GPU host this loads; here (no NVIDIA driver) it is the one line.
        match Cuda::load() {
            Ok(_) => {}
            Err(e) => assert!(e.to_string().contains(LIBCUDA), "{e}"),
        }
    }

    #[test]
    fn bus_ids_and_sizes() {
        check_bus_id("0000:3b:00.0").unwrap();
        check_bus_id("0000:AF:1f.7").unwrap();
        for bad in [
            "3b:00.0",
            "0000:3b:00.8",
            "0000-3b:00.0",
            "0000:3b:00.0 ",
            "zzzz:3b:00.0",
        ] {
            let e = check_bus_id(bad).unwrap_err();
            assert!(e.contains("is not a PCI address like 0000:3b:00.0"), "{e}");
        }
        assert_eq!(gpu_region_len(1), GPU_PAGE);
        assert_eq!(gpu_region_len(256 * 1024), 256 * 1024);
        assert_eq!(gpu_region_len(256 * 1024 + 1), 256 * 1024 + GPU_PAGE);
        let e = GpuError {
            gpu: Some("0000:3b:00.0".into()),
            reason: "cuMemAlloc failed: out of memory (2)".into(),
        };
        assert_eq!(
            e.to_string(),
            "GPU memory on 0000:3b:00.0: cuMemAlloc failed: out of memory (2)"
        );
    }
}
