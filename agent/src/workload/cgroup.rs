//! Which job a cgroup path belongs to (pure: text in, [`Workload`] out).
//!
//! Shapes recognized, anywhere in the path (a prefix such as a nested container's or a
//! test's own parent is skipped):
//! - Kubernetes, systemd driver: `kubepods[-QOS]-pod<UID with _>.slice`, then the
//!   container's `cri-containerd-<ID>.scope`, `crio-<ID>.scope` or `docker-<ID>.scope`;
//!   cgroupfs driver: `kubepods[/QOS]/pod<UID>/<ID>`;
//! - Slurm: `job_<N>` (under `slurmstepd.scope` on cgroup v2, `slurm/uid_<U>` on v1),
//!   then `step_<M>` (`batch`, `extern`, `interactive`, or a number);
//! - containers outside Kubernetes: `docker-<ID>.scope`, `docker/<ID>`,
//!   `libpod-<ID>.scope` (podman), `nerdctl-<ID>.scope`, `containerd-<ID>.scope`;
//! - systemd units and scopes: the innermost `*.service` or `*.scope`.
//!
//! Anything else is the cgroup path itself; the root cgroup says nothing (the caller falls
//! back to the process).

use super::{Workload, WorkloadKind};

/// Characters of a container id kept in a workload key (as `docker ps` shows them).
const SHORT_ID: usize = 12;

/// The workload of cgroup `path` (as in `/proc/PID/cgroup`), or `None` for the root.
pub fn parse_path(path: &str) -> Option<Workload> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return None;
    }
    let w = kubernetes(&parts)
        .or_else(|| slurm(&parts))
        .or_else(|| container(&parts))
        .or_else(|| systemd(&parts))
        .unwrap_or_else(|| Workload::new(WorkloadKind::Cgroup, format!("/{}", parts.join("/"))));
    Some(Workload {
        cgroup_path: format!("/{}", parts.join("/")),
        ..w
    })
}

/// The cgroup paths of `/proc/PID/cgroup`: the unified (v2) one, and the v1 ones by
/// controller list (hybrid hosts keep jobs in v1 hierarchies while v2 says `/`).
pub fn parse_proc_cgroup(text: &str) -> (Option<String>, Vec<(String, String)>) {
    let mut v2 = None;
    let mut v1 = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            v2 = Some(path.to_string());
        } else {
            v1.push((ctrls.to_string(), path.to_string()));
        }
    }
    (v2, v1)
}

/// The workload of a process from its `/proc/PID/cgroup`: of the paths of every hierarchy
/// (the unified one first, then v1's, `name=systemd` first), the most specific workload (a
/// pod or a job over a container over a unit over a bare path); `None` when every path is
/// the root. On a hybrid host a Slurm task sits in `job_N` in the v1 hierarchies Slurm
/// uses while the others still show slurmd's unit. A bare path counts only from the
/// unified hierarchy: a v1 controller's own grouping (a resource manager's memory cgroup)
/// names no job.
pub fn from_proc_cgroup(text: &str) -> Option<Workload> {
    let (v2, mut v1) = parse_proc_cgroup(text);
    let rank = |c: &str| match c {
        "name=systemd" => 0,
        c if c.contains("cpuset") => 1,
        c if c.contains("freezer") => 2,
        c if c.contains("memory") => 3,
        _ => 4,
    };
    v1.sort_by_key(|(c, _)| rank(c));
    let mut best: Option<Workload> = None;
    let from_v1 = v1
        .iter()
        .filter_map(|(_, p)| parse_path(p))
        .filter(|w| w.kind != WorkloadKind::Cgroup);
    for w in v2.iter().filter_map(|p| parse_path(p)).chain(from_v1) {
        if best
            .as_ref()
            .is_none_or(|b| w.kind.specificity() > b.kind.specificity())
        {
            best = Some(w);
        }
    }
    best
}

fn short(id: &str) -> String {
    id.chars().take(SHORT_ID).collect()
}

/// `prefix<ID>.scope` -> ID.
fn scope_id<'a>(part: &'a str, prefix: &str) -> Option<&'a str> {
    part.strip_prefix(prefix)?
        .strip_suffix(".scope")
        .filter(|id| !id.is_empty())
}

/// A container's id in a Kubernetes pod (either driver).
fn pod_container(part: &str) -> Option<&str> {
    ["cri-containerd-", "crio-", "docker-"]
        .iter()
        .find_map(|p| scope_id(part, p))
        .or_else(|| {
            (part.len() >= 32 && part.chars().all(|c| c.is_ascii_hexdigit())).then_some(part)
        })
}

fn kubernetes(parts: &[&str]) -> Option<Workload> {
    let k = parts.iter().position(|p| p.starts_with("kubepods"))?;
    for (i, p) in parts.iter().enumerate().skip(k) {
        // systemd driver: kubepods-burstable-pod<uid_>.slice; cgroupfs: pod<uid>.
        let uid = match p.strip_suffix(".slice") {
            Some(s) => s.rsplit_once("-pod").map(|(_, u)| u.replace('_', "-")),
            None => p.strip_prefix("pod").map(str::to_string),
        };
        let Some(uid) = uid.filter(|u| u.len() >= 8) else {
            continue;
        };
        let container = parts.get(i + 1).and_then(|c| pod_container(c));
        let mut w = Workload::new(WorkloadKind::KubernetesPod, format!("k8s/pod-{uid}"));
        w.id = uid;
        w.part = container.map(str::to_string).unwrap_or_default();
        return Some(w);
    }
    None
}

fn slurm(parts: &[&str]) -> Option<Workload> {
    let (i, job) = parts.iter().enumerate().find_map(|(i, p)| {
        let n = p.strip_prefix("job_")?;
        (!n.is_empty() && n.chars().all(|c| c.is_ascii_digit())).then_some((i, n))
    })?;
    let step = parts
        .get(i + 1)
        .and_then(|s| s.strip_prefix("step_"))
        .unwrap_or("");
    let mut w = Workload::new(WorkloadKind::SlurmJob, format!("slurm/{job}"));
    w.id = job.to_string();
    w.part = step.to_string();
    Some(w)
}

fn container(parts: &[&str]) -> Option<Workload> {
    for (i, p) in parts.iter().enumerate().rev() {
        for (prefix, runtime) in [
            ("docker-", "docker"),
            ("libpod-", "podman"),
            ("nerdctl-", "containerd"),
            ("containerd-", "containerd"),
        ] {
            if let Some(id) = scope_id(p, prefix).filter(|id| !id.starts_with("conmon")) {
                return Some(container_workload(runtime, id));
            }
        }
        // cgroupfs driver: docker/<id>.
        if i > 0 && parts[i - 1] == "docker" && pod_container(p).is_some() {
            return Some(container_workload("docker", p));
        }
    }
    None
}

fn container_workload(runtime: &str, id: &str) -> Workload {
    let mut w = Workload::new(WorkloadKind::Container, format!("{runtime}/{}", short(id)));
    w.namespace = runtime.to_string();
    w.id = id.to_string();
    w
}

fn systemd(parts: &[&str]) -> Option<Workload> {
    let unit = parts
        .iter()
        .rev()
        .find(|p| p.ends_with(".service") || p.ends_with(".scope"))?;
    let mut w = Workload::new(WorkloadKind::SystemdUnit, format!("systemd/{unit}"));
    w.name = unit.to_string();
    Some(w)
}

#[cfg(test)]
mod tests;
