//! The resolver over a host built in memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;

#[derive(Default)]
struct FakeHost {
    procs: HashMap<u32, String>,
    /// v2 path -> id.
    cgroups: HashMap<String, u64>,
    pods: HashMap<String, (String, String)>,
    jobs: HashMap<String, String>,
    /// Lookups that cost something (walks, scontrol), counted.
    walks: AtomicU32,
    scontrols: AtomicU32,
}

impl HostView for FakeHost {
    fn proc_cgroup(&self, pid: u32) -> Option<String> {
        self.procs.get(&pid).cloned()
    }
    fn cgroup_id(&self, path: &str) -> Option<u64> {
        self.cgroups.get(path).copied()
    }
    fn find_cgroup(&self, id: u64) -> Option<String> {
        self.walks.fetch_add(1, Ordering::Relaxed);
        self.cgroups
            .iter()
            .find(|(_, &i)| i == id)
            .map(|(p, _)| p.clone())
    }
    fn pod_names(&self, uid: &str) -> Option<(String, String)> {
        self.pods.get(uid).cloned()
    }
    fn slurm_job_name(&self, id: &str) -> Option<String> {
        self.scontrols.fetch_add(1, Ordering::Relaxed);
        self.jobs.get(id).cloned()
    }
    fn alive(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }
}

const POD: &str = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod11111111_2222_3333_4444_555555555555.slice/cri-containerd-abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789.scope";
const JOB: &str = "/system.slice/slurmstepd.scope/job_77/step_0/user/task_0";

fn host() -> FakeHost {
    let mut h = FakeHost::default();
    h.cgroups.insert(POD.into(), 501);
    h.cgroups.insert(JOB.into(), 502);
    h.cgroups
        .insert("/system.slice/trainer.service".into(), 503);
    h.cgroups.insert("/".into(), 1);
    h.procs.insert(10, format!("0::{POD}\n"));
    h.procs.insert(20, format!("0::{JOB}\n"));
    h.procs
        .insert(30, "0::/system.slice/trainer.service\n".into());
    h.pods.insert(
        "11111111-2222-3333-4444-555555555555".into(),
        ("ml".into(), "worker-0".into()),
    );
    h.jobs.insert("77".into(), "pretrain".into());
    h
}

#[test]
fn each_kind_resolves_with_its_names() {
    let mut r = WorkloadResolver::new(host());
    let pod = r.resolve(10, 501, "python3");
    assert_eq!(
        (
            pod.kind,
            pod.key.as_str(),
            pod.namespace.as_str(),
            pod.name.as_str()
        ),
        (
            WorkloadKind::KubernetesPod,
            "k8s/ml/worker-0",
            "ml",
            "worker-0"
        )
    );
    assert_eq!(pod.cgroup_path, POD);
    let job = r.resolve(20, 502, "python3");
    assert_eq!(
        (job.key.as_str(), job.name.as_str(), job.part.as_str()),
        ("slurm/77", "pretrain", "0")
    );
    let unit = r.resolve(30, 503, "trainer");
    assert_eq!(unit.key, "systemd/trainer.service");
    // No cgroup to go by, no process: the process name.
    let p = r.resolve(99, 0, "ib_write_bw");
    assert_eq!(
        (p.kind, p.key.as_str()),
        (WorkloadKind::Process, "ib_write_bw")
    );
}

#[test]
fn a_process_that_moved_or_exited_still_resolves_by_its_cgroup_id() {
    let mut h = host();
    // pid 10 moved to the root since it made its QP: the id is found by a walk.
    h.procs.insert(10, "0::/\n".into());
    // pid 40 exited: its id alone.
    let mut r = WorkloadResolver::new(h);
    assert_eq!(r.resolve(10, 501, "x").key, "k8s/ml/worker-0");
    assert_eq!(r.resolve(40, 502, "x").key, "slurm/77");
    assert_eq!(r.host.walks.load(Ordering::Relaxed), 2);
}

#[test]
fn answers_are_cached_per_cgroup_and_forgotten_when_it_goes() {
    let mut r = WorkloadResolver::new(host());
    for _ in 0..5 {
        assert_eq!(r.resolve(20, 502, "x").key, "slurm/77");
    }
    assert_eq!(
        r.host.scontrols.load(Ordering::Relaxed),
        1,
        "scontrol once per job"
    );
    assert_eq!(r.cached(), (1, 0));
    // The job ends: its cgroup is removed; the id may come back as another cgroup.
    r.host.cgroups.remove(JOB);
    r.host.procs.remove(&20);
    r.sweep();
    assert_eq!(r.cached(), (0, 0));
    r.host
        .cgroups
        .insert("/system.slice/other.service".into(), 502);
    assert_eq!(r.resolve(21, 502, "x").key, "systemd/other.service");
}

#[test]
fn a_hybrid_hosts_v1_job_is_found_through_the_process() {
    let mut h = host();
    // v2 shows the root (id 1) for everyone; Slurm uses v1's freezer.
    h.procs.insert(
        50,
        "12:freezer:/slurm/uid_1000/job_88/step_2/task_0\n1:name=systemd:/system.slice/slurmd.service\n0::/\n".into(),
    );
    h.procs.insert(51, "1:name=systemd:/\n0::/\n".into());
    let mut r = WorkloadResolver::new(h);
    let w = r.resolve(50, 1, "python3");
    assert_eq!((w.key.as_str(), w.part.as_str()), ("slurm/88", "2"));
    // The root's id is never cached as a job (everyone shares it).
    assert_eq!(r.cached(), (0, 1));
    assert_eq!(r.resolve(51, 1, "bash").key, "bash");
    // The process exits: forgotten.
    r.host.procs.remove(&50);
    r.sweep();
    assert_eq!(r.cached(), (0, 0));
}

#[test]
fn unknown_layouts_fall_back_to_the_path_and_pods_without_names_to_their_uid() {
    let mut h = host();
    h.cgroups.insert("/batch/run7".into(), 600);
    h.procs.insert(60, "0::/batch/run7\n".into());
    h.pods.clear();
    let mut r = WorkloadResolver::new(h);
    let w = r.resolve(60, 600, "x");
    assert_eq!(
        (w.kind, w.key.as_str()),
        (WorkloadKind::Cgroup, "/batch/run7")
    );
    assert_eq!(
        r.resolve(10, 501, "x").key,
        "k8s/pod-11111111-2222-3333-4444-555555555555"
    );
}

#[test]
fn the_cache_is_bounded() {
    let mut h = host();
    for i in 0..(CACHE_MAX as u64 + 10) {
        h.cgroups
            .insert(format!("/system.slice/u{i}.service"), 10_000 + i);
    }
    let mut r = WorkloadResolver::new(h);
    for i in 0..(CACHE_MAX as u64 + 10) {
        r.resolve(0, 10_000 + i, "x");
    }
    assert!(r.cached().0 <= CACHE_MAX);
}
