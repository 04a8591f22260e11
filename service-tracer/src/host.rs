//! Facts about the host the tracer needs: privileges, kprobe availability, libibverbs
//! location, ELF symbol offsets, process start times. Parsing is pure; thin wrappers read.

use std::path::{Path, PathBuf};

pub const KPROBE_SYMBOLS: [&str; 3] = [
    "ib_create_qp_user",
    "ib_modify_qp_with_udata",
    "ib_destroy_qp_user",
];

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// `Ok(())` when the effective capability set `eff` allows loading and attaching
/// tracing programs (CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN), else the reason.
pub fn check_caps(eff: u64) -> Result<(), String> {
    let has = |c: u32| eff & (1u64 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err(format!(
            "need CAP_BPF and CAP_PERFMON (or root); effective capabilities are {eff:#x}"
        ))
    }
}

/// This process's effective capabilities (/proc/self/status, CapEff) checked.
pub fn check_privileges() -> Result<(), String> {
    let st = procfs::process::Process::myself()
        .and_then(|p| p.status())
        .map_err(|e| format!("reading /proc/self/status: {e}"))?;
    check_caps(st.capeff)
}

/// Which of `wanted` appear as symbol names in /proc/kallsyms text.
pub fn kallsyms_has_all(kallsyms: &str, wanted: &[&str]) -> bool {
    let mut found = vec![false; wanted.len()];
    for line in kallsyms.lines() {
        if let Some(name) = line.split_whitespace().nth(2) {
            if let Some(i) = wanted.iter().position(|w| *w == name) {
                found[i] = true;
            }
        }
    }
    found.iter().all(|f| *f)
}

/// kprobes attach when the kprobe PMU or a kprobe_events file exists.
pub fn kprobes_attachable() -> bool {
    [
        "/sys/bus/event_source/devices/kprobe/type",
        "/sys/kernel/tracing/kprobe_events",
        "/sys/kernel/debug/tracing/kprobe_events",
    ]
    .iter()
    .any(|p| Path::new(p).exists())
}

pub fn kprobe_symbols_present() -> bool {
    std::fs::read_to_string("/proc/kallsyms").is_ok_and(|s| kallsyms_has_all(&s, &KPROBE_SYMBOLS))
}

/// Makes the kernel query every QP of every RDMA device, the way `rdma res show qp`
/// does (the netlink resource dump calls ib_query_qp per QP); the output is not needed,
/// the query probes see the answers. Returns the number of QPs listed.
pub fn query_all_qps() -> Result<usize, String> {
    let rdma = ["/usr/bin/rdma", "/usr/sbin/rdma", "/sbin/rdma", "/bin/rdma"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .ok_or("no `rdma` tool (iproute2) to list the kernel's QPs")?;
    let out = std::process::Command::new(rdma)
        .args(["res", "show", "qp"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", rdma.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} res show qp failed ({}): {}",
            rdma.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(count_qp_lines(&String::from_utf8_lossy(&out.stdout)))
}

/// QP rows of `rdma res show qp` text output.
pub fn count_qp_lines(out: &str) -> usize {
    out.lines().filter(|l| l.contains(" lqpn ")).count()
}

/// libibverbs paths from `ldconfig -p` output (x86-64 entries first).
pub fn parse_ldconfig(out: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("libibverbs.so.1 "))
        .filter_map(|l| l.split("=>").nth(1).map(|p| PathBuf::from(p.trim())))
        .collect();
    v.dedup();
    v
}

/// Where libibverbs lives on this host: `ldconfig -p`, then the Debian/RHEL defaults.
pub fn discover_libibverbs() -> Vec<PathBuf> {
    let mut v = std::process::Command::new("ldconfig")
        .arg("-p")
        .output()
        .ok()
        .map(|o| parse_ldconfig(&String::from_utf8_lossy(&o.stdout)))
        .unwrap_or_default();
    if v.is_empty() {
        v = [
            "/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
            "/lib/x86_64-linux-gnu/libibverbs.so.1",
            "/usr/lib64/libibverbs.so.1",
        ]
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .take(1)
        .collect();
    }
    // Canonical paths: the same file reached through /lib and /usr/lib is one inode.
    let mut c: Vec<PathBuf> = v
        .into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
        .collect();
    c.dedup();
    c
}

/// File offset of the default-version definition of `symbol` in an ELF file (what the
/// dynamic linker binds to), from .dynsym or .symtab. Versioned libraries such as
/// libibverbs export compat versions too (`ibv_create_qp@IBVERBS_1.0`); those are
/// hidden in .gnu.version and skipped.
pub fn symbol_file_offset(elf: &[u8], symbol: &str) -> Result<Option<u64>, String> {
    use object::{Object, ObjectSection, ObjectSymbol};
    let obj = object::File::parse(elf).map_err(|e| format!("not an ELF file: {e}"))?;
    let versym = obj
        .section_by_name(".gnu.version")
        .and_then(|s| s.data().ok());
    let hidden = |idx: usize| {
        versym
            .and_then(|v| v.get(2 * idx..2 * idx + 2))
            .is_some_and(|b| u16::from_le_bytes([b[0], b[1]]) & 0x8000 != 0)
    };
    let mut best = None;
    for (dynamic, syms) in [(true, obj.dynamic_symbols()), (false, obj.symbols())] {
        for s in syms {
            if s.name() != Ok(symbol) || !s.is_definition() || s.address() == 0 {
                continue;
            }
            if dynamic && hidden(s.index().0) {
                continue;
            }
            best = Some(s);
            break;
        }
        if best.is_some() {
            break;
        }
    }
    let Some(s) = best else { return Ok(None) };
    let sec_idx = s
        .section_index()
        .ok_or_else(|| format!("{symbol} is not in a section"))?;
    let sec = obj
        .section_by_index(sec_idx)
        .map_err(|e| format!("{symbol}: {e}"))?;
    let (off, len) = sec
        .file_range()
        .ok_or_else(|| format!("{symbol}: section has no file data"))?;
    // A malformed file may place the symbol outside its section.
    s.address()
        .checked_sub(sec.address())
        .filter(|rel| *rel < len)
        .and_then(|rel| rel.checked_add(off))
        .map(Some)
        .ok_or_else(|| {
            format!(
                "{symbol}: address {:#x} outside its section ({:#x}, {len} bytes)",
                s.address(),
                sec.address()
            )
        })
}

#[derive(Debug, PartialEq, Eq)]
pub enum Liveness {
    Gone,
    /// Alive; started at this boot ns.
    Started(u64),
    Unknown,
}

/// Whether `pid` still runs, and since when (CLOCK_BOOTTIME ns, from the start time in
/// /proc/<pid>/stat), to tell an exit from a reused pid.
pub fn process_liveness(pid: u32) -> Liveness {
    let Ok(pid) = i32::try_from(pid) else {
        return Liveness::Unknown;
    };
    match procfs::process::Process::new(pid).and_then(|p| p.stat()) {
        Ok(st) => Liveness::Started(
            st.starttime.saturating_mul(1_000_000_000) / procfs::ticks_per_second().max(1),
        ),
        Err(procfs::ProcError::NotFound(_)) => Liveness::Gone,
        Err(_) => Liveness::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_rows_of_rdma_res_are_counted() {
        let out = "link rxes0/1 lqpn 17 type UD state RTS sq-psn 0 pdn 3 pid 279 comm rpingmesh-agent \n\
                   link rxes0/1 lqpn 21 rqpn 22 type RC state RTS rq-psn 1 sq-psn 2 path-mig-state MIGRATED pdn 5 pid 287 comm ibv_rc_pingpong \n\
                   link rxes0/1 lqpn 1 type GSI state RTS sq-psn 0 comm [ib_core] \n";
        assert_eq!(count_qp_lines(out), 3);
        assert_eq!(count_qp_lines(""), 0);
    }

    #[test]
    fn caps() {
        assert!(check_caps(0x1ff_ffff_ffff).is_ok());
        assert!(check_caps(0xc0_0000_0000).is_ok()); // BPF+PERFMON
        let e = check_caps(0x40_0000_0000).unwrap_err(); // PERFMON only
        assert!(e.contains("CAP_BPF"), "{e}");
        assert!(check_caps(0).is_err());
        // This process: root here has everything, an unprivileged run nothing.
        let me = procfs::process::Process::myself()
            .unwrap()
            .status()
            .unwrap();
        assert_eq!(check_privileges().is_ok(), check_caps(me.capeff).is_ok());
    }

    #[test]
    fn kallsyms() {
        let t = "ffffffffc0a01000 T ib_create_qp_user\t[ib_core]\nffffffffc0a02000 t ib_modify_qp_with_udata\t[ib_core]\n0 T ib_destroy_qp_user [ib_core]\n";
        assert!(kallsyms_has_all(t, &KPROBE_SYMBOLS));
        assert!(!kallsyms_has_all(
            "0 T ib_create_qp_user_x\n",
            &KPROBE_SYMBOLS
        ));
    }

    #[test]
    fn ldconfig() {
        let o = "1234 libs found in cache `/etc/ld.so.cache'\n\tlibibverbs.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libibverbs.so.1\n\tlibibverbs.so (libc6,x86-64) => /lib/x86_64-linux-gnu/libibverbs.so\n";
        assert_eq!(
            parse_ldconfig(o),
            vec![PathBuf::from("/lib/x86_64-linux-gnu/libibverbs.so.1")]
        );
    }

    #[test]
    fn liveness_of_this_process_and_of_none() {
        // Started after boot, before now (CLOCK_BOOTTIME).
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the timespec we pass.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        let now = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        match process_liveness(std::process::id()) {
            Liveness::Started(s) => assert!(s > 0 && s <= now, "{s} vs {now}"),
            other => panic!("{other:?}"),
        }
        // Beyond pid_max: never a process.
        assert_eq!(process_liveness(1 << 30), Liveness::Gone);
        assert_eq!(process_liveness(u32::MAX), Liveness::Unknown);
    }

    #[test]
    fn own_executable_symbol() {
        // This test binary defines `main`; its file offset lies inside the file.
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let off = symbol_file_offset(&exe, "main").unwrap().expect("main");
        assert!(off > 0 && off < exe.len() as u64);
        assert_eq!(
            symbol_file_offset(&exe, "no_such_symbol_here").unwrap(),
            None
        );
        assert!(symbol_file_offset(b"not elf", "main").is_err());
    }
}
