//! Registered memory: heap and mapped buffers (`Mr`), GPU memory through dmabuf or
//! peer-memory (`GpuMr`), and host memory bound to a NUMA node (`HostMem`).

use super::*;

/// Where a registered buffer came from (and how it is freed after deregistration).
pub(super) enum MrBuf {
    /// A `Vec` leaked in `register`, reclaimed on drop.
    Heap,
    /// Caller-provided mapped memory (`register_host`), unmapped when the Mr drops it.
    Host { _mem: HostMem },
}

/// Registered memory owning its buffer (never moved or freed while registered).
pub struct Mr {
    pub(super) mr: NonNull<ibv_mr>,
    pub(super) buf: NonNull<u8>,
    pub(super) len: usize,
    pub(super) kind: MrBuf,
    pub(super) _pd: Arc<Pd>,
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
    pub(super) fn register_host_with(
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

    pub(super) fn lkey(&self) -> u32 {
        // SAFETY: valid registered MR.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    pub(super) fn addr(&self, off: usize) -> u64 {
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
    pub(super) mr: NonNull<ibv_mr>,
    pub(super) mem: crate::rdma::gpu::GpuMem,
    pub how: GpuRegistration,
    pub(super) _pd: Arc<Pd>,
}

// SAFETY: Send + Sync: as `Mr`: the MR handle is immutable after registration. Drop:
// deregistered once, before `mem` (a field) frees the GPU memory.
owns_verbs_object!(GpuMr, mr, ibv_dereg_mr);

impl GpuMr {
    /// Registers `mem` for local and remote write: as a dma-buf when the driver exports
    /// one and the RNIC's provider takes it, else through peer memory. Both failing is one
    /// error naming both reasons.
    pub fn register(pd: &Arc<Pd>, mem: crate::rdma::gpu::GpuMem) -> Result<GpuMr, RdmaError> {
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
                        return Err(RdmaError::Gpu(crate::rdma::gpu::GpuError {
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

    pub fn mem(&self) -> &crate::rdma::gpu::GpuMem {
        &self.mem
    }
}

/// Page-aligned anonymous memory from mmap, optionally bound to one NUMA node with
/// mbind(MPOL_BIND) before its pages are first touched. Unmapped on drop.
pub struct HostMem {
    pub(super) ptr: NonNull<u8>,
    pub(super) len: usize,
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
pub(super) const MPOL_F_NODE: libc::c_ulong = 1;
pub(super) const MPOL_F_ADDR: libc::c_ulong = 2;

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
