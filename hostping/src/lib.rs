//! Hostping (TNET 2024, seed 002): diagnosis of the inside of one RDMA host.
//!
//! Everything here is pure logic over data, except [`sysfs::RealSysfs`], the one reader of
//! the live `/sys`. Discovery reads through the [`sysfs::Sysfs`] trait, so a recorded tree
//! (this machine's, the VM's, or the hand-built hosts of the tests) is read exactly as the
//! live one.
//!
//! - [`sysfs`]: the reader trait, the live reader, recordings (capture and replay).
//! - [`topology`]: the host tree (sockets, NUMA nodes, PCIe root ports and switches,
//!   RNICs, GPUs, every PCIe link's current and maximum speed and width), PCIe links
//!   running below what both ends can do, the text tree.
//! - [`paths`]: the intra-host links a loopback test between an RNIC and an endpoint
//!   crosses.
//! - [`linkstate`]: Algorithm 1, link-state inference from path verdicts.
//! - [`loopback`]: Eq. 1-3 (latency and bandwidth from two message sizes), the test plan
//!   (full mesh when idle, affinitive endpoints when busy) and the path verdicts.
//! - [`r2r`]: RNIC-to-RNIC probe windows and their verdicts (down, sporadic, ToR,
//!   miswired partition).
//! - [`hwmon`]: RNIC counters (throughput, Tx pause, drops) and the host's mode.
//! - [`synth`]: sysfs trees of hosts described in a few lines (tests, the suite).
//! - [`scenario`]: randomized host scenarios with ground truth (the paper's Figure 8 and
//!   10 patterns) and the precision/recall of Algorithm 1 over them.

pub mod hwmon;
pub mod linkstate;
pub mod loopback;
pub mod paths;
pub mod r2r;
pub mod scenario;
pub mod synth;
pub mod sysfs;
pub mod topology;
