//! Tests of `host.rs`.

use super::*;

#[test]
fn the_cgroup2_mount_on_unified_and_hybrid_hosts() {
    let unified = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
    assert_eq!(cgroup2_mount(unified).as_deref(), Some("/sys/fs/cgroup"));
    let hybrid = "25 23 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                      27 25 0:24 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n";
    assert_eq!(
        cgroup2_mount(hybrid).as_deref(),
        Some("/sys/fs/cgroup/unified")
    );
    assert_eq!(
        cgroup2_mount("27 25 0:24 / /x rw - cgroup cgroup rw\n"),
        None
    );
    assert_eq!(
        cgroup2_mount("1 2 0:1 / /odd\\040dir rw - cgroup2 cgroup2 rw\n").as_deref(),
        Some("/odd dir")
    );
    assert_eq!(cgroup2_mount("garbage\n"), None);
}

#[test]
fn pod_names_from_the_kubelets_files() {
    let hosts = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n\n10.244.1.7\ttrain-llm-worker-3\n";
    assert_eq!(
        pod_names_from("ml-team\n", hosts),
        Some(("ml-team".into(), "train-llm-worker-3".into()))
    );
    assert_eq!(pod_names_from("", hosts), None);
    assert_eq!(pod_names_from("ml team", hosts), None);
    assert_eq!(pod_names_from("ml", "# only a comment\n"), None);
}

#[test]
fn the_job_name_from_scontrol() {
    let out = "JobId=4711 JobName=llama-70b-pretrain UserId=alice(1000) GroupId=ml(1000) JobState=RUNNING\n";
    assert_eq!(
        slurm_job_name_from(out).as_deref(),
        Some("llama-70b-pretrain")
    );
    assert_eq!(
        slurm_job_name_from("slurm_load_jobs error: Invalid job id specified"),
        None
    );
    assert_eq!(slurm_job_name_from("JobId=1 JobName= X=1"), None);
}

#[test]
fn this_hosts_own_cgroup_resolves_through_its_id() {
    let h = RealHost::new("/nonexistent-kubelet", "");
    let Some(root) = h.cgroup2_root() else {
        eprintln!("SKIP: no cgroup2 mount here");
        return;
    };
    let text = h.proc_cgroup(std::process::id()).unwrap();
    let path = super::super::cgroup::parse_proc_cgroup(&text).0.unwrap();
    let id = h
        .cgroup_id(&path)
        .unwrap_or_else(|| panic!("{path} under {root:?}"));
    if path != "/" {
        assert_eq!(h.find_cgroup(id).as_deref(), Some(path.as_str()));
    }
    assert!(h.alive(std::process::id()));
    assert_eq!(h.pod_names("x"), None);
    assert_eq!(h.slurm_job_name("1"), None, "scontrol off");
}
