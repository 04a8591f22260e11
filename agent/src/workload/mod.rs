//! Workload identity: the job a traced service QP belongs to (a Kubernetes pod, a Slurm
//! job, a container, a systemd unit), from its process's cgroup, so that service paths,
//! their metrics and the findings that touch them name jobs rather than pids.
//!
//! `cgroup.rs` reads a cgroup path (pure); [`WorkloadResolver`] finds the path of a QP's
//! cgroup through a [`HostView`] (`host.rs` reads the real host: `/proc`, the cgroup v2
//! mount, the kubelet's pod directory, `scontrol`), adds the names it can find, and keeps
//! each answer per cgroup id until that cgroup is removed. Unknown layouts fall back to
//! the cgroup path, then to the process name: never to nothing.

pub mod cgroup;
pub mod host;

use std::collections::HashMap;

use rpingmesh_proto::controller_agent::Workload as ProtoWorkload;

/// Cgroups (and processes) remembered at most; past it the oldest half is forgotten
/// (they are looked up again when they are seen again).
pub const CACHE_MAX: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WorkloadKind {
    KubernetesPod,
    SlurmJob,
    Container,
    SystemdUnit,
    /// A cgroup of no layout known here: its path.
    Cgroup,
    /// No cgroup to go by (the root, or none): the process.
    Process,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::KubernetesPod => "k8s_pod",
            WorkloadKind::SlurmJob => "slurm_job",
            WorkloadKind::Container => "container",
            WorkloadKind::SystemdUnit => "systemd_unit",
            WorkloadKind::Cgroup => "cgroup",
            WorkloadKind::Process => "process",
        }
    }

    /// How much a kind says about the job: a pod or a job over a container over a unit
    /// over a bare path.
    pub fn specificity(self) -> u8 {
        match self {
            WorkloadKind::KubernetesPod | WorkloadKind::SlurmJob => 4,
            WorkloadKind::Container => 3,
            WorkloadKind::SystemdUnit => 2,
            WorkloadKind::Cgroup => 1,
            WorkloadKind::Process => 0,
        }
    }
}

/// One workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    pub kind: WorkloadKind,
    /// What operators call it and what service paths group by: `k8s/NAMESPACE/POD`
    /// (`k8s/pod-UID` until the pod's name is known), `slurm/JOBID`, `docker/ID12`,
    /// `systemd/UNIT`, the cgroup path, or the process name.
    pub key: String,
    /// A human name where there is one: the pod's, the Slurm job's, the unit.
    pub name: String,
    /// The pod's namespace; the container runtime.
    pub namespace: String,
    /// Pod UID, Slurm job id, container id.
    pub id: String,
    /// The container in a pod, the Slurm step.
    pub part: String,
    pub cgroup_path: String,
}

impl Workload {
    pub fn new(kind: WorkloadKind, key: String) -> Self {
        Workload {
            kind,
            key,
            name: String::new(),
            namespace: String::new(),
            id: String::new(),
            part: String::new(),
            cgroup_path: String::new(),
        }
    }

    /// The fallback: the process itself.
    pub fn process(comm: &str) -> Self {
        let mut w = Workload::new(WorkloadKind::Process, comm.to_string());
        w.name = comm.to_string();
        w
    }

    pub fn to_proto(&self) -> ProtoWorkload {
        ProtoWorkload {
            kind: self.kind.as_str().to_string(),
            key: self.key.clone(),
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            id: self.id.clone(),
            part: self.part.clone(),
            cgroup_path: self.cgroup_path.clone(),
        }
    }
}

/// What the resolver asks of the host (the real one in `host.rs`; tests build their own).
pub trait HostView: Send {
    /// `/proc/PID/cgroup`, while the process lives.
    fn proc_cgroup(&self, pid: u32) -> Option<String>;
    /// The id (inode) of cgroup v2 path `path`, while it exists.
    fn cgroup_id(&self, path: &str) -> Option<u64>;
    /// The v2 path of cgroup `id`, found by walking the hierarchy.
    fn find_cgroup(&self, id: u64) -> Option<String>;
    /// (namespace, name) of Kubernetes pod `uid`, from the kubelet's pod directory.
    fn pod_names(&self, uid: &str) -> Option<(String, String)>;
    /// Slurm job `id`'s name, where Slurm's tools are installed.
    fn slurm_job_name(&self, id: &str) -> Option<String>;
    /// Whether process `pid` lives.
    fn alive(&self, pid: u32) -> bool;
}

/// Resolves QPs' (pid, cgroup id) to workloads, remembering each cgroup's answer while
/// the cgroup exists and each pod's and job's names.
pub struct WorkloadResolver<H: HostView> {
    host: H,
    /// By cgroup id: answers read from the cgroup itself.
    by_cgroup: HashMap<u64, Workload>,
    /// By pid: answers read from a process's hierarchies when its cgroup id said nothing
    /// (a hybrid host's v2 root, a QP learned without its cgroup).
    by_pid: HashMap<u32, Workload>,
    pods: HashMap<String, Option<(String, String)>>,
    jobs: HashMap<String, Option<String>>,
}

impl<H: HostView> WorkloadResolver<H> {
    pub fn new(host: H) -> Self {
        WorkloadResolver {
            host,
            by_cgroup: HashMap::new(),
            by_pid: HashMap::new(),
            pods: HashMap::new(),
            jobs: HashMap::new(),
        }
    }

    /// The workload of a QP created by `pid` (`comm`) in cgroup `cgroup_id` (0: not known).
    pub fn resolve(&mut self, pid: u32, cgroup_id: u64, comm: &str) -> Workload {
        if let Some(w) = self.by_cgroup.get(&cgroup_id) {
            return w.clone();
        }
        if let Some(w) = self.by_pid.get(&pid) {
            return w.clone();
        }
        // The cgroup the QP was made in: the process's v2 path when it is still there
        // (one stat), else a walk for the id.
        let proc_text = self.host.proc_cgroup(pid);
        let from_id = (cgroup_id != 0)
            .then(|| {
                let v2 = proc_text
                    .as_deref()
                    .and_then(|t| cgroup::parse_proc_cgroup(t).0)
                    .filter(|p| self.host.cgroup_id(p) == Some(cgroup_id));
                v2.or_else(|| self.host.find_cgroup(cgroup_id))
            })
            .flatten()
            .and_then(|p| cgroup::parse_path(&p));
        let named = |w: &Workload| w.kind != WorkloadKind::Cgroup;
        let mut w = match from_id {
            Some(w) if named(&w) => {
                let w = self.enrich(w);
                insert_bounded(&mut self.by_cgroup, cgroup_id, w.clone());
                return w;
            }
            other => other,
        };
        if let Some(pw) = proc_text
            .as_deref()
            .and_then(cgroup::from_proc_cgroup)
            .filter(|pw| {
                w.as_ref()
                    .is_none_or(|w| pw.kind.specificity() > w.kind.specificity())
            })
        {
            w = Some(pw);
        }
        let w = match w {
            Some(w) => self.enrich(w),
            None => Workload::process(comm),
        };
        if w.kind != WorkloadKind::Process && proc_text.is_some() {
            insert_bounded(&mut self.by_pid, pid, w.clone());
        }
        w
    }

    /// Names from the host: a pod's namespace and name, a Slurm job's name (each looked
    /// up once).
    fn enrich(&mut self, mut w: Workload) -> Workload {
        match w.kind {
            WorkloadKind::KubernetesPod => {
                let host = &self.host;
                let names = remembered(&mut self.pods, &w.id, |id| host.pod_names(id));
                if let Some((ns, name)) = names {
                    w.key = format!("k8s/{ns}/{name}");
                    w.namespace = ns;
                    w.name = name;
                }
            }
            WorkloadKind::SlurmJob => {
                let host = &self.host;
                let name = remembered(&mut self.jobs, &w.id, |id| host.slurm_job_name(id));
                w.name = name.unwrap_or_default();
            }
            _ => {}
        }
        w
    }

    /// Forgets cgroups that were removed and processes that exited (their ids are
    /// reused), and names of pods and jobs no longer remembered by any of them.
    pub fn sweep(&mut self) {
        let host = &self.host;
        self.by_cgroup
            .retain(|id, w| host.cgroup_id(&w.cgroup_path) == Some(*id));
        self.by_pid.retain(|pid, _| host.alive(*pid));
        let live: Vec<&Workload> = self
            .by_cgroup
            .values()
            .chain(self.by_pid.values())
            .collect();
        self.pods.retain(|uid, _| {
            live.iter()
                .any(|w| w.kind == WorkloadKind::KubernetesPod && &w.id == uid)
        });
        self.jobs.retain(|id, _| {
            live.iter()
                .any(|w| w.kind == WorkloadKind::SlurmJob && &w.id == id)
        });
    }

    /// (cgroups, processes) remembered.
    pub fn cached(&self) -> (usize, usize) {
        (self.by_cgroup.len(), self.by_pid.len())
    }
}

/// Inserts into a cache of at most [`CACHE_MAX`] entries: when full, an arbitrary half is
/// forgotten first (looked up again when seen again).
/// `id`'s value in `m`, looked up with `look` (and remembered) the first time.
fn remembered<V: Clone>(m: &mut HashMap<String, V>, id: &str, look: impl FnOnce(&str) -> V) -> V {
    if let Some(v) = m.get(id) {
        return v.clone();
    }
    let v = look(id);
    insert_bounded(m, id.to_string(), v.clone());
    v
}

fn insert_bounded<K: std::hash::Hash + Eq + Clone, V>(m: &mut HashMap<K, V>, k: K, v: V) {
    if m.len() >= CACHE_MAX && !m.contains_key(&k) {
        let drop: Vec<K> = m.keys().take(CACHE_MAX / 2).cloned().collect();
        for d in drop {
            m.remove(&d);
        }
    }
    m.insert(k, v);
}

#[cfg(test)]
mod tests;
