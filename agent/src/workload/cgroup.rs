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
mod tests {
    use super::*;

    const UID: &str = "6a2b1c3d-4e5f-6789-abcd-ef0123456789";
    const CID: &str = "3f1e9a7c2b4d6e8f0a1b2c3d4e5f60718293a4b5c6d7e8f9012345678abcdef0";

    fn key(path: &str) -> (WorkloadKind, String, String, String) {
        let w = parse_path(path).unwrap();
        (w.kind, w.key, w.id, w.part)
    }

    #[test]
    fn kubernetes_pods_under_both_drivers_and_every_runtime() {
        let uid_ = UID.replace('-', "_");
        let want = |part: &str| {
            (
                WorkloadKind::KubernetesPod,
                format!("k8s/pod-{UID}"),
                UID.to_string(),
                part.to_string(),
            )
        };
        for path in [
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{CID}.scope"),
            format!("/kubepods.slice/kubepods-pod{uid_}.slice/docker-{CID}.scope"),
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-{CID}.scope"),
            format!("/kubepods/burstable/pod{UID}/{CID}"),
            format!("/kubepods/pod{UID}/{CID}"),
            // Nested under another hierarchy (a test's parent, kind's node container).
            format!("/rpm-test/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/cri-containerd-{CID}.scope"),
        ] {
            assert_eq!(key(&path), want(CID), "{path}");
        }
        // The pod's own cgroup (no container): the pod, no part.
        assert_eq!(
            key(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice"
            )),
            want("")
        );
        // The QoS slices alone are no pod.
        assert_eq!(
            key("/kubepods.slice/kubepods-burstable.slice").0,
            WorkloadKind::Cgroup
        );
    }

    #[test]
    fn slurm_jobs_and_steps_on_v2_and_v1() {
        let want = |step: &str| {
            (
                WorkloadKind::SlurmJob,
                "slurm/4711".to_string(),
                "4711".to_string(),
                step.to_string(),
            )
        };
        assert_eq!(
            key("/system.slice/slurmstepd.scope/job_4711/step_0/user/task_0"),
            want("0")
        );
        assert_eq!(
            key("/system.slice/slurmstepd.scope/job_4711/step_batch/user/task_0"),
            want("batch")
        );
        assert_eq!(
            key("/system.slice/slurmstepd.scope/job_4711/step_extern"),
            want("extern")
        );
        assert_eq!(key("/slurm/uid_1000/job_4711/step_3/task_1"), want("3"));
        assert_eq!(key("/system.slice/slurmstepd.scope/job_4711"), want(""));
        // Not a job: a non-numeric id.
        assert_eq!(key("/x/job_abc").0, WorkloadKind::Cgroup);
    }

    #[test]
    fn containers_outside_kubernetes() {
        let w = parse_path(&format!("/system.slice/docker-{CID}.scope")).unwrap();
        assert_eq!(
            (w.kind, w.key.as_str(), w.namespace.as_str(), w.id.as_str()),
            (
                WorkloadKind::Container,
                "docker/3f1e9a7c2b4d",
                "docker",
                CID
            )
        );
        assert_eq!(key(&format!("/docker/{CID}")).1, "docker/3f1e9a7c2b4d");
        assert_eq!(
            key(&format!("/machine.slice/libpod-{CID}.scope")).1,
            "podman/3f1e9a7c2b4d"
        );
        assert_eq!(
            key(&format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope"
            ))
            .1,
            "podman/3f1e9a7c2b4d"
        );
        assert_eq!(
            key(&format!("/system.slice/nerdctl-{CID}.scope")).1,
            "containerd/3f1e9a7c2b4d"
        );
    }

    #[test]
    fn systemd_units_and_scopes() {
        let w = parse_path("/system.slice/nccl-tests.service").unwrap();
        assert_eq!(
            (w.kind, w.key.as_str(), w.name.as_str()),
            (
                WorkloadKind::SystemdUnit,
                "systemd/nccl-tests.service",
                "nccl-tests.service"
            )
        );
        assert_eq!(
            key("/user.slice/user-1000.slice/user@1000.service/app.slice/app-train.scope").1,
            "systemd/app-train.scope"
        );
        assert_eq!(
            key("/user.slice/user-1000.slice/session-5.scope").1,
            "systemd/session-5.scope"
        );
        assert_eq!(
            key("/system.slice/run-r3f.scope").1,
            "systemd/run-r3f.scope"
        );
    }

    #[test]
    fn unknown_layouts_are_their_path_and_the_root_is_nothing() {
        let w = parse_path("/batch/team-a/run7").unwrap();
        assert_eq!(
            (w.kind, w.key.as_str(), w.cgroup_path.as_str()),
            (
                WorkloadKind::Cgroup,
                "/batch/team-a/run7",
                "/batch/team-a/run7"
            )
        );
        assert_eq!(parse_path("/"), None);
        assert_eq!(parse_path(""), None);
        assert_eq!(parse_path("//"), None);
    }

    #[test]
    fn proc_cgroup_prefers_v2_and_falls_back_to_a_v1_job() {
        // Pure v2.
        let w = from_proc_cgroup("0::/system.slice/slurmstepd.scope/job_9/step_0/user/task_0\n")
            .unwrap();
        assert_eq!(w.key, "slurm/9");
        // Hybrid: v2 says "/", the v1 hierarchies hold the Slurm job.
        let hybrid = "12:freezer:/slurm/uid_1000/job_9/step_1/task_0\n\
                      4:memory:/slurm/uid_1000/job_9/step_1\n\
                      1:name=systemd:/system.slice/slurmd.service\n\
                      0::/\n";
        let w = from_proc_cgroup(hybrid).unwrap();
        // name=systemd still shows slurmd's unit: the job is more specific.
        assert_eq!((w.key.as_str(), w.part.as_str()), ("slurm/9", "1"));
        // Equally specific: the unified hierarchy first.
        let both = "0::/system.slice/a.service\n1:name=systemd:/system.slice/b.service\n";
        assert_eq!(from_proc_cgroup(both).unwrap().key, "systemd/a.service");
        // Everything at the root: nothing.
        assert_eq!(from_proc_cgroup("1:name=systemd:/\n0::/\n"), None);
        // A v1 controller's own grouping is no job (a sandbox's memory cgroup).
        assert_eq!(
            from_proc_cgroup("4:memory:/process_api/4ca6ddf4\n0::/\n"),
            None
        );
        // An unknown v2 path stays the answer when v1 has nothing better.
        assert_eq!(
            from_proc_cgroup("0::/batch/run7\n1:cpu:/\n").unwrap().key,
            "/batch/run7"
        );
        // Garbage lines are skipped.
        assert_eq!(
            from_proc_cgroup("garbage\n0::/system.slice/x.service\n")
                .unwrap()
                .key,
            "systemd/x.service"
        );
    }
}
