//! RDMA device facts from sysfs (`/sys/class/infiniband/<dev>/ports/<p>/...`): port state,
//! the GID table with each entry's type (RoCE v1 / v2) and net device. The parsers are pure;
//! the readers take the class directory as a parameter so fixture trees can stand in.
//!
//! Kernel formats: `state` is "4: ACTIVE"; `gids/<i>` is eight colon-separated groups of
//! four hex digits, all zero for an empty slot; `gid_attrs/types/<i>` is "IB/RoCE v1" or
//! "RoCE v2" and `gid_attrs/ndevs/<i>` a net device name (both fail to read with EINVAL
//! for empty slots). The number of files under `gids/` is the port's GID table length.

use std::fmt;
use std::fs;
use std::io;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

use super::error::RdmaError;

/// Where the kernel publishes RDMA devices.
pub const SYSFS_CLASS_DIR: &str = "/sys/class/infiniband";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    Nop,
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    Other(u32),
}

impl PortState {
    /// Numeric values of `enum ibv_port_state` (the number before the colon in sysfs).
    pub fn from_code(code: u32) -> PortState {
        match code {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            n => PortState::Other(n),
        }
    }

    pub fn is_active(self) -> bool {
        // ACTIVE_DEFER still passes traffic.
        matches!(self, PortState::Active | PortState::ActiveDefer)
    }
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortState::Nop => f.write_str("NOP"),
            PortState::Down => f.write_str("DOWN"),
            PortState::Init => f.write_str("INIT"),
            PortState::Armed => f.write_str("ARMED"),
            PortState::Active => f.write_str("ACTIVE"),
            PortState::ActiveDefer => f.write_str("ACTIVE_DEFER"),
            PortState::Other(n) => write!(f, "state {n}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GidType {
    /// "IB/RoCE v1": InfiniBand or RoCE v1 (not routable over IP).
    IbRoceV1,
    /// "RoCE v2": UDP/IP encapsulated.
    RoceV2,
    Other(String),
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidType::IbRoceV1 => f.write_str("IB/RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Other(s) => f.write_str(s),
        }
    }
}

/// One non-empty slot of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    pub index: u32,
    pub gid: Ipv6Addr,
    /// None when the type file is absent (old kernels, IB devices).
    pub gid_type: Option<GidType>,
    /// The net device the GID belongs to (RoCE), when known.
    pub ndev: Option<String>,
}

impl GidEntry {
    /// The GID as an IPv4 address when it is a v4-mapped (RoCE v2 over IPv4) GID.
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        self.gid.to_ipv4_mapped()
    }
}

/// A file of the tree that exists but could not be used (kept so the operator sees it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadFile {
    pub path: PathBuf,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    pub device: String,
    pub port: u32,
    pub state: PortState,
    /// Number of slots in the GID table (files under `gids/`).
    pub table_size: u32,
    /// Non-empty slots, by index.
    pub gids: Vec<GidEntry>,
    pub bad_files: Vec<BadFile>,
}

/// Parses a sysfs port `state` file ("4: ACTIVE").
pub fn parse_port_state(text: &str) -> Result<PortState, String> {
    let t = text.trim();
    let code = t.split(':').next().unwrap_or("").trim();
    code.parse::<u32>()
        .map(PortState::from_code)
        .map_err(|_| format!("unrecognised port state {t:?} (expected e.g. \"4: ACTIVE\")"))
}

/// Parses a sysfs GID ("fe80:0000:...:0001"). `Ok(None)` for the all-zero empty slot.
pub fn parse_gid(text: &str) -> Result<Option<Ipv6Addr>, String> {
    let t = text.trim();
    let groups: Vec<&str> = t.split(':').collect();
    // The kernel always writes the full form; reject anything else rather than guess.
    if groups.len() != 8 || groups.iter().any(|g| g.len() != 4) {
        return Err(format!(
            "malformed GID {t:?} (expected 8 groups of 4 hex digits)"
        ));
    }
    let mut seg = [0u16; 8];
    for (s, g) in seg.iter_mut().zip(&groups) {
        *s = u16::from_str_radix(g, 16)
            .map_err(|_| format!("malformed GID {t:?} (non-hex group {g:?})"))?;
    }
    let gid = Ipv6Addr::from(seg);
    Ok(if gid.is_unspecified() {
        None
    } else {
        Some(gid)
    })
}

/// Parses a `gid_attrs/types/<i>` file.
pub fn parse_gid_type(text: &str) -> Result<GidType, String> {
    match text.trim() {
        "" => Err("empty GID type".to_string()),
        "IB/RoCE v1" => Ok(GidType::IbRoceV1),
        "RoCE v2" => Ok(GidType::RoceV2),
        other => Ok(GidType::Other(other.to_string())),
    }
}

/// Picks the GID at `gid_index`: the spec's exact error when the slot is missing or empty.
pub fn select_gid(port: &PortInfo, gid_index: u32) -> Result<&GidEntry, RdmaError> {
    port.gids
        .iter()
        .find(|e| e.index == gid_index)
        .ok_or_else(|| RdmaError::InvalidGidIndex {
            gid_index,
            device: port.device.clone(),
            port: port.port,
            table_size: port.table_size,
        })
}

/// Fails unless the port can carry traffic.
pub fn check_port_active(port: &PortInfo) -> Result<(), RdmaError> {
    if port.state.is_active() {
        Ok(())
    } else {
        Err(RdmaError::PortNotActive {
            device: port.device.clone(),
            port: port.port,
            state: port.state.to_string(),
        })
    }
}

/// The warning the agent logs when the chosen GID is not RoCE v2 (RoCE v1 frames are not
/// IP-routable, so probes would not cross a routed fabric). None for RoCE v2 or unknown.
pub fn roce_v1_warning(port: &PortInfo, entry: &GidEntry) -> Option<String> {
    match &entry.gid_type {
        Some(GidType::IbRoceV1) => {
            let v2: Vec<String> = port
                .gids
                .iter()
                .filter(|e| e.gid_type == Some(GidType::RoceV2))
                .map(|e| e.index.to_string())
                .collect();
            let hint = if v2.is_empty() {
                "the port has no RoCE v2 GID".to_string()
            } else {
                format!("RoCE v2 entries are at gid_index {}", v2.join(", "))
            };
            Some(format!(
                "gid_index={} on device {} port {} is an IB/RoCE v1 GID ({}): RoCE v1 is not IP-routable; {hint}",
                entry.index, port.device, port.port, entry.gid
            ))
        }
        _ => None,
    }
}

fn read_text(path: &Path) -> io::Result<String> {
    fs::read_to_string(path)
}

fn bad(path: &Path, reason: impl Into<String>) -> RdmaError {
    RdmaError::Sysfs {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Device names under the class directory, sorted. A missing directory is no devices.
pub fn list_devices(class_dir: &Path) -> Result<Vec<String>, RdmaError> {
    let rd = match fs::read_dir(class_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(bad(class_dir, e.to_string())),
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    Ok(names)
}

/// Port numbers of a device, sorted (entries that are not numbers are ignored).
pub fn list_ports(class_dir: &Path, device: &str) -> Result<Vec<u32>, RdmaError> {
    let dir = class_dir.join(device).join("ports");
    let rd = fs::read_dir(&dir).map_err(|e| bad(&dir, e.to_string()))?;
    let mut ports: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect();
    ports.sort_unstable();
    Ok(ports)
}

/// Reads one GID table entry (`ports/<port>/gids/<index>`): None when the entry is empty
/// or absent. One small file, where `read_port` reads the whole table (1024 entries on
/// soft-RoCE): this is the per-event lookup.
pub fn read_gid(
    class_dir: &Path,
    device: &str,
    port: u32,
    index: u32,
) -> Result<Option<Ipv6Addr>, RdmaError> {
    let path = class_dir
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("gids")
        .join(index.to_string());
    match read_text(&path) {
        Ok(t) => parse_gid(&t).map_err(|r| bad(&path, r)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(bad(&path, e.to_string())),
    }
}

/// Reads one port: state and the whole GID table. Unreadable or malformed GID files are
/// skipped and listed in `bad_files`; a missing port or unreadable state is an error.
pub fn read_port(class_dir: &Path, device: &str, port: u32) -> Result<PortInfo, RdmaError> {
    let pdir = class_dir.join(device).join("ports").join(port.to_string());
    if !pdir.is_dir() {
        let present = list_ports(class_dir, device).unwrap_or_default();
        return Err(RdmaError::NoSuchPort {
            device: device.to_string(),
            port,
            present,
        });
    }
    let state_path = pdir.join("state");
    let state_text = read_text(&state_path).map_err(|e| bad(&state_path, e.to_string()))?;
    let state = parse_port_state(&state_text).map_err(|r| bad(&state_path, r))?;

    let gdir = pdir.join("gids");
    let mut indexes: Vec<u32> = match fs::read_dir(&gdir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(bad(&gdir, e.to_string())),
    };
    indexes.sort_unstable();
    let table_size = indexes.len() as u32;
    let mut gids = Vec::new();
    let mut bad_files = Vec::new();
    for i in indexes {
        let gpath = gdir.join(i.to_string());
        let gid = match read_text(&gpath)
            .map_err(|e| e.to_string())
            .and_then(|t| parse_gid(&t))
        {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(reason) => {
                bad_files.push(BadFile {
                    path: gpath,
                    reason,
                });
                continue;
            }
        };
        let tpath = pdir.join("gid_attrs/types").join(i.to_string());
        let gid_type = match read_text(&tpath) {
            Ok(t) => match parse_gid_type(&t) {
                Ok(ty) => Some(ty),
                Err(reason) => {
                    bad_files.push(BadFile {
                        path: tpath,
                        reason,
                    });
                    None
                }
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => {
                bad_files.push(BadFile {
                    path: tpath,
                    reason: e.to_string(),
                });
                None
            }
        };
        let npath = pdir.join("gid_attrs/ndevs").join(i.to_string());
        let ndev = read_text(&npath)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        gids.push(GidEntry {
            index: i,
            gid,
            gid_type,
            ndev,
        });
    }
    Ok(PortInfo {
        device: device.to_string(),
        port,
        state,
        table_size,
        gids,
        bad_files,
    })
}

/// Renders a port's GID table the way `rpingmesh-hw-check` prints it.
pub fn format_gid_table(p: &PortInfo) -> String {
    let mut s = format!(
        "{} port {}: {} (GID table size {})\n",
        p.device, p.port, p.state, p.table_size
    );
    for e in &p.gids {
        s.push_str(&format!(
            "  gid[{:>3}] {:<39} {:<11} {}\n",
            e.index,
            e.gid.to_string(),
            e.gid_type
                .as_ref()
                .map(|t| t.to_string())
                .unwrap_or_else(|| "?".into()),
            e.ndev.as_deref().unwrap_or("-")
        ));
    }
    for b in &p.bad_files {
        s.push_str(&format!(
            "  unreadable {}: {}\n",
            b.path.display(),
            b.reason
        ));
    }
    s
}

#[cfg(test)]
mod tests;
