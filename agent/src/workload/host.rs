//! The real host behind [`HostView`]: `/proc/PID/cgroup`, the cgroup v2 hierarchy wherever
//! it is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host), the
//! kubelet's pod directories and Slurm's `scontrol`. Each lookup is bounded (a walk by
//! directory count, `scontrol` by time); the text parsers are pure and tested.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::HostView;

/// Directories a search for a cgroup id visits at most.
const WALK_MAX_DIRS: usize = 100_000;
/// How long `scontrol` may take.
const SCONTROL_TIMEOUT: Duration = Duration::from_secs(2);

pub struct RealHost {
    proc_root: PathBuf,
    /// The cgroup v2 mount (None: no unified hierarchy; only /proc's v1 paths then).
    cgroup2: Option<PathBuf>,
    kubelet_pods: PathBuf,
    /// `scontrol` to run ("" = do not ask Slurm).
    scontrol: String,
}

impl RealHost {
    /// `kubelet_root` (`/var/lib/kubelet`) holds `pods/<UID>/`; `scontrol` is the command
    /// ("" = never).
    pub fn new(kubelet_root: &str, scontrol: &str) -> Self {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        RealHost {
            proc_root: PathBuf::from("/proc"),
            cgroup2: cgroup2_mount(&mountinfo).map(PathBuf::from),
            kubelet_pods: Path::new(kubelet_root).join("pods"),
            scontrol: scontrol.to_string(),
        }
    }

    /// Where the unified hierarchy is mounted, if anywhere.
    pub fn cgroup2_root(&self) -> Option<&Path> {
        self.cgroup2.as_deref()
    }

    fn cgroup_dir(&self, path: &str) -> Option<PathBuf> {
        let root = self.cgroup2.as_ref()?;
        Some(root.join(path.trim_start_matches('/')))
    }
}

/// The mount point of the first cgroup2 file system in `/proc/self/mountinfo`.
pub fn cgroup2_mount(mountinfo: &str) -> Option<String> {
    mountinfo.lines().find_map(|l| {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(unescape_mount))?
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// (namespace, pod name) from a kubelet pod directory's files: the namespace of a
/// projected service-account volume, the pod's hostname from the kubelet-managed
/// `etc-hosts` (its last entry; the pod's name unless the pod sets `hostname`).
pub fn pod_names_from(namespace_file: &str, etc_hosts: &str) -> Option<(String, String)> {
    let ns = namespace_file.trim();
    let name = etc_hosts
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with('#'))?
        .split_whitespace()
        .nth(1)?;
    (!ns.is_empty() && valid_name(ns) && valid_name(name))
        .then(|| (ns.to_string(), name.to_string()))
}

/// A DNS-label-like Kubernetes name (what a metric attribute may carry).
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
}

/// The job name in `scontrol show job ID --oneliner` output.
pub fn slurm_job_name_from(scontrol_out: &str) -> Option<String> {
    let v = scontrol_out
        .split_whitespace()
        .find_map(|f| f.strip_prefix("JobName="))?;
    (!v.is_empty() && v.len() <= 128 && !v.chars().any(char::is_control)).then(|| v.to_string())
}

impl HostView for RealHost {
    fn proc_cgroup(&self, pid: u32) -> Option<String> {
        std::fs::read_to_string(self.proc_root.join(pid.to_string()).join("cgroup")).ok()
    }

    fn cgroup_id(&self, path: &str) -> Option<u64> {
        let dir = self.cgroup_dir(path)?;
        let m = std::fs::metadata(dir).ok()?;
        m.is_dir().then(|| m.ino())
    }

    fn find_cgroup(&self, id: u64) -> Option<String> {
        let root = self.cgroup2.as_ref()?;
        let mut stack = vec![root.clone()];
        let mut visited = 0;
        while let Some(dir) = stack.pop() {
            visited += 1;
            if visited > WALK_MAX_DIRS {
                return None;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let Ok(m) = e.metadata() else { continue };
                if !m.is_dir() {
                    continue;
                }
                if m.ino() == id {
                    let rel = e.path();
                    let rel = rel.strip_prefix(root).ok()?;
                    return Some(format!("/{}", rel.display()));
                }
                stack.push(e.path());
            }
        }
        None
    }

    fn pod_names(&self, uid: &str) -> Option<(String, String)> {
        if uid.contains('/') || uid.contains("..") {
            return None;
        }
        let pod = self.kubelet_pods.join(uid);
        let hosts = std::fs::read_to_string(pod.join("etc-hosts")).ok()?;
        // The service-account token volume (kube-api-access-*) carries the namespace.
        let projected = pod.join("volumes").join("kubernetes.io~projected");
        let ns = std::fs::read_dir(projected)
            .ok()?
            .flatten()
            .find_map(|v| std::fs::read_to_string(v.path().join("namespace")).ok())?;
        pod_names_from(&ns, &hosts)
    }

    fn slurm_job_name(&self, id: &str) -> Option<String> {
        if self.scontrol.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let mut child = Command::new(&self.scontrol)
            .args(["show", "job", id, "--oneliner"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + SCONTROL_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
            }
        }
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
        slurm_job_name_from(&out)
    }

    fn alive(&self, pid: u32) -> bool {
        self.proc_root.join(pid.to_string()).exists()
    }
}

#[cfg(test)]
mod tests;
