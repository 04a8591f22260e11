//! Tests of `cgroup.rs`.

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
    let w =
        from_proc_cgroup("0::/system.slice/slurmstepd.scope/job_9/step_0/user/task_0\n").unwrap();
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
