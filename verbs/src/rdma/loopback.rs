//! Hostping loopback tests, verbs side (Hostping, TNET 2024): an RNIC writes from a read
//! region to a write region through an RC QP connected to itself (destination QPN = its
//! own, destination GID = its own). The time from `ibv_post_send` (a signalled RDMA WRITE)
//! until its completion is polled is `Lat = T_proc + Lat_host + Size / BW_host` (Eq. 1):
//! 1-byte writes give `T_proc + Lat_host` (Eq. 2), 256 KiB writes give the bandwidth from
//! the difference (Eq. 3). Setting the test up also times the verbs themselves ("verb
//! health": `ibv_reg_mr`, QP creation, each state transition).
//!
//! The results are raw nanoseconds per sample; [`SizeSummary`] and [`bandwidth_gbps`]
//! are the small helpers `rpingmesh-hw-check --loopback` prints with (the hostping crate
//! owns the diagnosis). Everything here but [`run_loopback`] is pure and always compiled.

use std::net::Ipv6Addr;
use std::time::Duration;

use super::error::RdmaError;
#[cfg(feature = "rdma")]
use super::numa::NodeMask;

/// The paper's two sizes: 1 byte (Eq. 2) and 256 KiB (enough for a 200 Gb/s RNIC).
pub const DEFAULT_SIZES: [usize; 2] = [1, 256 * 1024];
/// Largest message accepted (an SGE length is a u32; RNICs allow up to 1-2 GiB).
pub const MAX_SIZE: usize = 1 << 30;
/// Highest NUMA node a mask can name (x86 kernels: MAX_NUMNODES = 1 << NODES_SHIFT <= 1024).
pub const MAX_NUMA_NODE: u32 = 1023;

/// What to test on one RNIC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopbackOptions {
    pub device: String,
    /// Physical port (1-based).
    pub port: u8,
    /// GID table index the QP routes with (1 on rxe: the first RoCE v2 IPv4 GID).
    pub gid_index: u32,
    /// Message sizes in bytes, tested in this order.
    pub sizes: Vec<usize>,
    /// Writes per size.
    pub samples: u32,
    /// Place both regions on this NUMA node (mbind MPOL_BIND); None = default policy.
    pub numa_node: Option<u32>,
    /// The write region in this GPU's memory instead (PCI address, `0000:3b:00.0`): the
    /// RNIC-to-GPU path. The read region stays in host memory (`numa_node`).
    pub gpu: Option<String>,
    /// Bound on each write's completion (busy polling stops there with an error).
    pub timeout: Duration,
}

impl LoopbackOptions {
    pub fn new(device: &str) -> LoopbackOptions {
        LoopbackOptions {
            device: device.to_string(),
            port: 1,
            gid_index: 1,
            sizes: DEFAULT_SIZES.to_vec(),
            samples: 20,
            numa_node: None,
            gpu: None,
            timeout: Duration::from_secs(2),
        }
    }

    /// Rejects values the test cannot run with, naming the key.
    pub fn validate(&self) -> Result<(), RdmaError> {
        let bad = |m: String| Err(RdmaError::Config(format!("loopback: {m}")));
        super::check_port_address(&self.device, self.port, self.gid_index).or_else(bad)?;
        if self.sizes.is_empty() {
            return bad("no message sizes".into());
        }
        if let Some(s) = self.sizes.iter().find(|&&s| s == 0 || s > MAX_SIZE) {
            return bad(format!("size {s} is out of range 1-{MAX_SIZE}"));
        }
        if self.samples == 0 {
            return bad("samples=0 must be at least 1".into());
        }
        if let Some(n) = self.numa_node.filter(|&n| n > MAX_NUMA_NODE) {
            return bad(format!("numa_node={n} is out of range 0-{MAX_NUMA_NODE}"));
        }
        if self.timeout.is_zero() {
            return bad("timeout=0 must be positive".into());
        }
        if let Some(g) = &self.gpu {
            super::gpu::check_bus_id(g).or_else(bad)?;
        }
        Ok(())
    }

    /// Bytes of each region: the largest message.
    pub fn region_len(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(1)
    }
}

/// How long one verb took (microseconds, CLOCK_MONOTONIC around the call).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VerbTiming {
    /// The call, as named in errors: "ibv_open_device", "ibv_alloc_pd", "ibv_create_cq",
    /// "ibv_reg_mr (read region)", "ibv_reg_mr (write region)", "ibv_create_qp",
    /// "ibv_modify_qp(INIT)", "ibv_modify_qp(RTR)", "ibv_modify_qp(RTS)".
    pub verb: &'static str,
    pub micros: f64,
}

/// What one loopback run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopbackResult {
    pub device: String,
    /// The node both regions were bound to (checked with get_mempolicy), if asked.
    pub numa_node: Option<u32>,
    /// The GPU the write region was on, if asked.
    pub gpu: Option<String>,
    /// The GID the QP is connected to (its own) and its QPN (its own destination).
    pub gid: Ipv6Addr,
    pub qpn: u32,
    /// Per size, in `sizes` order: post-to-completion times (ns), one per sample.
    pub per_size: Vec<(usize, Vec<u64>)>,
    /// Setup verbs in call order.
    pub verbs: Vec<VerbTiming>,
}

impl LoopbackResult {
    /// Min/median/max per size, in `per_size` order.
    pub fn summaries(&self) -> Vec<SizeSummary> {
        self.per_size
            .iter()
            .filter_map(|(size, ns)| SizeSummary::of(*size, ns))
            .collect()
    }

    /// Eq. 3 between the smallest and the largest size (medians), Gb/s.
    pub fn bandwidth_gbps(&self) -> Option<f64> {
        let s = self.summaries();
        let small = s.iter().min_by_key(|x| x.size)?;
        let large = s.iter().max_by_key(|x| x.size)?;
        bandwidth_gbps(small, large)
    }
}

/// Completion times of one size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SizeSummary {
    pub size: usize,
    pub samples: usize,
    pub min_ns: u64,
    /// The middle sample (the mean of the two middle ones for an even count).
    pub median_ns: f64,
    pub max_ns: u64,
}

impl SizeSummary {
    /// None for no samples.
    pub fn of(size: usize, samples_ns: &[u64]) -> Option<SizeSummary> {
        let mut v = samples_ns.to_vec();
        v.sort_unstable();
        let n = v.len();
        let median_ns = match n {
            0 => return None,
            n if n % 2 == 1 => v[n / 2] as f64,
            n => (v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0,
        };
        Some(SizeSummary {
            size,
            samples: n,
            min_ns: v[0],
            median_ns,
            max_ns: v[n - 1],
        })
    }
}

/// Eq. 3: `BW_host = 8 * (large - small) bits / (t_large - t_small) ns`, in Gb/s (bits per
/// ns). None when the sizes are not increasing or the larger write was not slower (a
/// timing that says nothing about bandwidth).
pub fn bandwidth_gbps(small: &SizeSummary, large: &SizeSummary) -> Option<f64> {
    let bytes = large.size.checked_sub(small.size).filter(|&b| b > 0)?;
    let dt = large.median_ns - small.median_ns;
    (dt > 0.0).then(|| bytes as f64 * 8.0 / dt)
}

/// The bytes written for the `seed`-th size: never zero (the write region is zeroed
/// before), and different for each seed, so stale data from a previous size or a write
/// that never happened cannot pass the check.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (((i as u64).wrapping_mul(31) + seed as u64 * 7) % 255) as u8 + 1)
        .collect()
}

/// The first byte where `got` differs from `want` (or where one ends before the other).
pub fn first_mismatch(want: &[u8], got: &[u8]) -> Option<usize> {
    want.iter()
        .zip(got)
        .position(|(a, b)| a != b)
        .or_else(|| (want.len() != got.len()).then(|| want.len().min(got.len())))
}

/// Runs the loopback test on `o.device`: opens it, places two regions of the largest
/// size (on `o.numa_node` when given), connects an RC QP to itself, and for each size
/// times `o.samples` signalled RDMA WRITEs from the read region to the write region. The
/// first write of each size is checked byte for byte. Any failure is one line naming the
/// call and its errno, the completion status, or what did not arrive.
#[cfg(feature = "rdma")]
pub fn run_loopback(o: &LoopbackOptions) -> Result<LoopbackResult, RdmaError> {
    use std::path::Path;
    use std::time::Instant;

    use super::completion::{wc_status_name, WcRecord, WC_OPCODE_RDMA_WRITE, WC_SUCCESS};
    use super::ffi::{self, Context, Cq, GpuMr, GpuRegistration, HostMem, Mr, Pd, Qp, RcPeer};
    use super::sysfs;

    o.validate()?;
    let dev = o.device.as_str();
    let fail = |reason: String| RdmaError::Loopback {
        device: dev.to_string(),
        reason,
    };
    // Device list first: on a host without RDMA this is the one clear line.
    let found = ffi::device_names()?;
    if !found.iter().any(|d| d == dev) {
        return Err(RdmaError::NoAllowedDevice {
            allowed: vec![dev.to_string()],
            found,
        });
    }
    let class = Path::new(sysfs::SYSFS_CLASS_DIR);
    let port = sysfs::read_port(class, dev, o.port as u32)?;
    sysfs::check_port_active(&port)?;
    let gid = sysfs::select_gid(&port, o.gid_index)?.gid;

    let mut verbs = Vec::new();
    fn timed<T>(
        verbs: &mut Vec<VerbTiming>,
        verb: &'static str,
        f: impl FnOnce() -> Result<T, RdmaError>,
    ) -> Result<T, RdmaError> {
        let t = Instant::now();
        let v = f()?;
        verbs.push(VerbTiming {
            verb,
            micros: t.elapsed().as_nanos() as f64 / 1000.0,
        });
        Ok(v)
    }

    // Memory before any verb: a placement failure is not the RNIC's.
    let mask = o.numa_node.map(NodeMask::single);
    let len = o.region_len();
    let map = |region: &str| {
        HostMem::map(len, mask.as_ref()).map_err(|r| fail(format!("{region} region: {r}")))
    };
    let read_mem = map("read")?;
    let (write_mem, gpu_mem) = match &o.gpu {
        Some(bus) => (None, Some(super::gpu::Cuda::load()?.alloc(bus, len)?)),
        None => (Some(map("write")?), None),
    };

    let ctx = timed(&mut verbs, "ibv_open_device", || Context::open(dev))?;
    let verbs_gid = ctx.query_gid(o.port, o.gid_index)?;
    if verbs_gid != gid {
        return Err(fail(format!(
            "GID {gid} at index {} in sysfs differs from ibv_query_gid's {verbs_gid}; GID table changed, retry",
            o.gid_index
        )));
    }
    let mtu = ctx.active_mtu_bytes(o.port)?;
    let pd = timed(&mut verbs, "ibv_alloc_pd", || Pd::alloc(&ctx))?;
    let cq = timed(&mut verbs, "ibv_create_cq", || {
        Cq::create_plain(&ctx, 4, None)
    })?;
    let read_mr = timed(&mut verbs, "ibv_reg_mr (read region)", || {
        Mr::register_host(&pd, read_mem, false)
    })?;
    let write_mr = match (write_mem, gpu_mem) {
        (Some(mem), _) => {
            WriteRegion::Host(timed(&mut verbs, "ibv_reg_mr (write region)", || {
                Mr::register_host(&pd, mem, true)
            })?)
        }
        (None, Some(mem)) => {
            let t = Instant::now();
            let mr = GpuMr::register(&pd, mem)?;
            verbs.push(VerbTiming {
                verb: match mr.how {
                    GpuRegistration::DmaBuf => "ibv_reg_dmabuf_mr (write region, GPU)",
                    GpuRegistration::PeerMemory => "ibv_reg_mr (write region, GPU peer memory)",
                },
                micros: t.elapsed().as_nanos() as f64 / 1000.0,
            });
            WriteRegion::Gpu(mr)
        }
        (None, None) => unreachable!("one of the two is always made above"),
    };
    // Declared after the MRs, so it is destroyed before they are deregistered.
    let qp = timed(&mut verbs, "ibv_create_qp", || Qp::create_rc(&pd, &cq, 1))?;
    let qpn = qp.qpn();
    let me = RcPeer {
        qpn,
        gid,
        sgid_index: o.gid_index as u8,
        port: o.port,
        path_mtu_bytes: mtu,
    };
    timed(&mut verbs, "ibv_modify_qp(INIT)", || {
        qp.modify_to_init_rc(o.port)
    })?;
    timed(&mut verbs, "ibv_modify_qp(RTR)", || {
        qp.modify_to_rtr_rc(&me)
    })?;
    timed(&mut verbs, "ibv_modify_qp(RTS)", || qp.modify_to_rts_rc())?;

    let (remote_addr, rkey) = write_mr.remote();
    let mut wcs: Vec<(WcRecord, Option<u64>)> = Vec::with_capacity(4);
    let mut wr_id = 0u64;
    let mut per_size = Vec::with_capacity(o.sizes.len());
    for (i, &size) in o.sizes.iter().enumerate() {
        let want = pattern(i as u8, size);
        read_mr.write(0, &want);
        write_mr.fill(&vec![0u8; size])?;
        let mut samples = Vec::with_capacity(o.samples as usize);
        for s in 0..o.samples {
            wr_id += 1;
            let what = || format!("RDMA WRITE of {size} B (sample {s})");
            let t0 = Instant::now();
            qp.post_send_rdma_write(&read_mr, 0, size, remote_addr, rkey, wr_id)?;
            // Busy polling, as the paper does: the completion is seen the moment the CQ
            // has it, with no event-channel wake-up in the measurement. Bounded by
            // `o.timeout` per write (sizes x samples writes in all), so a QP that never
            // completes costs one core for at most that long before the error.
            let deadline = t0 + o.timeout;
            let (rec, ns) = loop {
                wcs.clear();
                if cq.poll(1, &mut wcs)? == 1 {
                    break (wcs[0].0, t0.elapsed().as_nanos() as u64);
                }
                if Instant::now() >= deadline {
                    return Err(fail(format!(
                        "{} not completed within {:?} (RC QP {qpn} connected to itself over GID {gid})",
                        what(),
                        o.timeout
                    )));
                }
                std::hint::spin_loop();
            };
            if rec.status != WC_SUCCESS {
                return Err(RdmaError::QpError {
                    device: dev.to_string(),
                    qpn,
                    reason: format!(
                        "{} completed with status {} {} ({})",
                        what(),
                        rec.status,
                        wc_status_name(rec.status),
                        ffi::wc_status_str(rec.status)
                    ),
                });
            }
            if rec.wr_id != wr_id || rec.opcode != WC_OPCODE_RDMA_WRITE {
                return Err(fail(format!(
                    "{}: unexpected completion (wr_id {} opcode {}, expected wr_id {wr_id} opcode {WC_OPCODE_RDMA_WRITE})",
                    what(),
                    rec.wr_id,
                    rec.opcode
                )));
            }
            if s == 0 {
                let mut got = vec![0u8; size];
                write_mr.read_back(&mut got)?;
                if let Some(at) = first_mismatch(&want, &got) {
                    return Err(fail(format!(
                        "{} completed but the data did not arrive: write region byte {at} is {:#04x}, expected {:#04x}",
                        what(),
                        got[at],
                        want[at]
                    )));
                }
            }
            samples.push(ns);
        }
        per_size.push((size, samples));
    }
    Ok(LoopbackResult {
        device: dev.to_string(),
        numa_node: o.numa_node,
        gpu: o.gpu.clone(),
        gid,
        qpn,
        per_size,
        verbs,
    })
}

/// Where the RDMA WRITEs land: host memory, or a GPU's.
#[cfg(feature = "rdma")]
enum WriteRegion {
    Host(super::ffi::Mr),
    Gpu(super::ffi::GpuMr),
}

#[cfg(feature = "rdma")]
impl WriteRegion {
    /// (remote address, rkey) of the region's start.
    fn remote(&self) -> (u64, u32) {
        match self {
            WriteRegion::Host(m) => (m.remote_addr(0), m.rkey()),
            WriteRegion::Gpu(m) => (m.remote_addr(), m.rkey()),
        }
    }

    fn fill(&self, data: &[u8]) -> Result<(), RdmaError> {
        match self {
            WriteRegion::Host(m) => m.write(0, data),
            WriteRegion::Gpu(m) => m.mem().copy_in(data)?,
        }
        Ok(())
    }

    fn read_back(&self, out: &mut [u8]) -> Result<(), RdmaError> {
        match self {
            WriteRegion::Host(m) => m.read(0, out),
            WriteRegion::Gpu(m) => m.mem().copy_out(out)?,
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
