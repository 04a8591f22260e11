//! Workloads end to end (root, real cgroups, network namespaces): the test makes cgroup v2
//! hierarchies shaped like a Kubernetes pod's container, a Slurm job step and a systemd
//! service, runs the fake-ibverbs service in each (agent A traces it with uprobes), with a
//! kubelet pod directory and an `scontrol` of its own making for the names. The pod and
//! the unit talk to agent B's RNIC, the job to agent C's. The controller lists three
//! service paths, each under its workload (kind, key, names, container or step). Then C's
//! RNIC goes dark (nftables drops its probes): the RNIC finding's impact lists the Slurm
//! job and nothing else, and `rpingmeshctl job` shows it. Killing the job's process
//! removes its path and only its path.

use rpingmesh_e2e::netns::BridgeNet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rpingmesh_e2e::fake_service::{build_fixture, Fixture};
use rpingmesh_e2e::*;
use rpingmesh_proto::operator::{ListServicePathsRequest, ServicePath};

const WINDOW_SEC: u64 = 2;
const POD_UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
const CONTAINER: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";

/// The test's cgroups under the unified hierarchy, removed (deepest first) on drop.
struct Cgroups {
    root: PathBuf,
    dirs: Vec<PathBuf>,
}

impl Cgroups {
    fn make(&mut self, rel: &str) -> PathBuf {
        let mut d = self.root.clone();
        for part in rel.split('/') {
            d.push(part);
            if !d.exists() {
                std::fs::create_dir(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
                self.dirs.push(d.clone());
            }
        }
        d
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            // A cgroup goes once its processes are gone; they are killed by now.
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn cgroup2_root() -> Option<PathBuf> {
    let mi = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    rpingmesh_agent::workload::host::cgroup2_mount(&mi).map(PathBuf::from)
}

/// A kubelet pod directory and an scontrol, as the agent reads them.
fn host_sources(dir: &Path) -> (PathBuf, PathBuf) {
    let kubelet = dir.join("kubelet");
    let pod = kubelet.join("pods").join(POD_UID);
    let ns_dir = pod.join("volumes/kubernetes.io~projected/kube-api-access-x7k2p");
    std::fs::create_dir_all(&ns_dir).unwrap();
    std::fs::write(ns_dir.join("namespace"), "ml-team").unwrap();
    std::fs::write(
        pod.join("etc-hosts"),
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.244.3.9\ttrainer-0\n",
    )
    .unwrap();
    let scontrol = dir.join("scontrol");
    std::fs::write(
        &scontrol,
        "#!/bin/sh\n[ \"$3\" = 4242 ] && echo \"JobId=4242 JobName=llama-pretrain UserId=alice(1000) JobState=RUNNING\"\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &scontrol,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    (kubelet, scontrol)
}

async fn service_paths(endpoint: &str) -> Vec<ServicePath> {
    let Ok(mut op) = operator(endpoint).await else {
        return Vec::new();
    };
    op.list_service_paths(ListServicePathsRequest::default())
        .await
        .map(|r| r.into_inner().paths)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_paths_name_the_pod_the_slurm_job_and_the_unit_they_serve() {
    if skip_unless_root("service_paths_name_the_pod_the_slurm_job_and_the_unit_they_serve") {
        return;
    }
    let Some(cg_root) = cgroup2_root() else {
        eprintln!("SKIP: no cgroup v2 hierarchy mounted");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (kubelet, scontrol) = host_sources(dir.path());
    let mut cg = Cgroups {
        root: cg_root.clone(),
        dirs: Vec::new(),
    };
    let base = format!("rpm-e2e-{}", std::process::id());
    let pod_cg = cg.make(&format!(
        "{base}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{CONTAINER}.scope",
        POD_UID.replace('-', "_")
    ));
    let job_cg = cg.make(&format!(
        "{base}/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0"
    ));
    let unit_cg = cg.make(&format!("{base}/system.slice/nccl-allreduce.service"));

    let fixture = build_fixture(dir.path(), "fake-ibverbs");
    let mut net = BridgeNet::new().expect("bridge");
    let c_ns = net.add_host("c", 1).expect("controller namespace");
    let listen = format!("{}:50051", net.ip(1));
    let ctl = spawn_controller(
        dir.path(),
        "controller",
        Some(&c_ns),
        &listen,
        &[
            "--metrics-enabled",
            "false",
            "--analyzer-localize-settle-sec",
            "1",
        ],
    )
    .unwrap();
    let ep = ctl.endpoint();
    let mut agents = Vec::new();
    let mut ips = Vec::new();
    for (i, (id, tor)) in [("wl-a", "tor-a"), ("wl-b", "tor-b"), ("wl-c", "tor-b")]
        .into_iter()
        .enumerate()
    {
        let host = 11 + i as u8;
        let ns = net.add_host(id, host).expect("agent namespace");
        let ip = net.ip(host);
        let mut args = AgentArgs::new(id, tor, &listen, ip)
            .flag("--hostname", id)
            .flag("--metrics-enabled", "false")
            .flag("--hostping-enabled", "false")
            .flag("--analysis-window-sec", WINDOW_SEC)
            .flag("--probe-interval-ms", 20)
            .flag("--tor-mesh-probe-rate-per-second", 50)
            .flag("--inter-tor-probe-rate-per-second", 50)
            .flag("--pinglist-update-interval-sec", 2)
            .flag("--service-flow-report-interval-ms", 300);
        args = if id == "wl-a" {
            args.flag("--service-tracing-mode", "uprobe")
                .flag("--service-tracing-uprobe-targets", fixture.display())
                .flag("--workload-kubelet-dir", kubelet.display())
                .flag("--workload-scontrol", scontrol.display())
        } else {
            args.flag("--service-tracing-mode", "off")
        };
        agents.push((spawn_agent(dir.path(), Some(&ns), &args).unwrap(), ns));
        ips.push(ip);
    }
    let a = &agents[0].0;
    let on = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        let on = a.stderr().contains("service tracing on");
        async move { on.then_some(()) }
    })
    .await;
    assert!(
        on.is_some(),
        "agent A did not start tracing:\n{}",
        tail_lines(&a.stderr(), 30)
    );

    // One service in each cgroup, moved there before it makes its QP.
    let mut services = Vec::new();
    let (b_ip, c_ip) = (ips[1], ips[2]);
    for (i, (cgroup, dest)) in [(&pod_cg, b_ip), (&job_cg, c_ip), (&unit_cg, b_ip)]
        .into_iter()
        .enumerate()
    {
        let mut fx = Fixture::qp_numbered(&fixture, dest, 0x1000 + i as u32, 0x345 + i as u32);
        fx.expect("ready");
        std::fs::write(cgroup.join("cgroup.procs"), fx.pid().to_string())
            .unwrap_or_else(|e| panic!("moving the service into {}: {e}", cgroup.display()));
        fx.go();
        fx.expect("connected");
        services.push(fx);
    }

    let want = [
        (
            "k8s/ml-team/trainer-0",
            "k8s_pod",
            "trainer-0",
            "ml-team",
            CONTAINER,
        ),
        ("slurm/4242", "slurm_job", "llama-pretrain", "", "0"),
        (
            "systemd/nccl-allreduce.service",
            "systemd_unit",
            "nccl-allreduce.service",
            "",
            "",
        ),
    ];
    let ga = gid_of(ips[0]);
    let listed = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let (ep, ga) = (ep.clone(), ga.clone());
        async move {
            let ps: Vec<ServicePath> = service_paths(&ep)
                .await
                .into_iter()
                .filter(|p| p.source_gid == ga && p.monitored)
                .collect();
            (ps.len() == 3).then_some(ps)
        }
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "three service paths never listed:\nA: {}",
            tail_lines(&a.stderr(), 40)
        )
    });
    for (key, kind, name, namespace, part) in want {
        let p = listed
            .iter()
            .find(|p| p.service == key)
            .unwrap_or_else(|| panic!("no path of {key}: {listed:#?}"));
        let w = p.workload.clone().unwrap_or_default();
        assert_eq!(
            (
                w.key.as_str(),
                w.kind.as_str(),
                w.name.as_str(),
                w.namespace.as_str()
            ),
            (key, kind, name, namespace),
            "{p:#?}"
        );
        assert!(
            w.cgroup_path
                .starts_with(&format!("/rpm-e2e-{}/", std::process::id())),
            "{w:?}"
        );
        assert_eq!(p.qps.len(), 1);
        assert_eq!(p.qps[0].workload_part, part, "{p:#?}");
    }
    let pod = listed.iter().find(|p| p.service == want[0].0).unwrap();
    assert_eq!(pod.workload.as_ref().unwrap().id, POD_UID);

    // C's RNIC goes dark: the finding names the job whose path ends there, alone.
    net.host(&agents[2].1)
        .unwrap()
        .nft(&format!(
            "table inet rpm_dark {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    \
             udp dport {PROBE_PORT} drop\n  }}\n  chain output {{\n    type filter hook output priority 0; policy accept;\n    \
             udp sport {PROBE_PORT} drop\n  }}\n}}\n"
        ))
        .expect("dropping C's probes");
    let op = operator(&ep).await.unwrap();
    let dark_at = std::time::Instant::now();
    // What the controller last listed, for the failure message.
    let last_seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let finding = wait_for(Duration::from_secs(40), Duration::from_millis(300), || {
        let (mut op, last_seen) = (op.clone(), last_seen.clone());
        async move {
            let all = op
                .list_findings(rpingmesh_proto::operator::ListFindingsRequest::default())
                .await
                .ok()?
                .into_inner()
                .findings;
            *last_seen.lock().unwrap() = all
                .iter()
                .map(|f| {
                    format!(
                        "{} {} open={} severity={} impact={} ({}, confidence {:.2})",
                        f.kind,
                        f.location,
                        f.open,
                        f.severity,
                        f.impact.len(),
                        f.symptom,
                        f.confidence
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            all.into_iter().find(|f| {
                f.open && f.kind == "rnic" && f.location == "wl-c/udp0" && !f.impact.is_empty()
            })
        }
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "no RNIC finding with an impact for wl-c within 40 s; the findings listed last:\n{}\n\
             controller:\n{}",
            last_seen.lock().unwrap(),
            tail_lines(&ctl.proc.stderr(), 30)
        )
    });
    eprintln!(
        "workloads: the RNIC finding came {:?} after C went dark",
        dark_at.elapsed()
    );
    let hurt: Vec<(&str, u32, u32)> = finding
        .impact
        .iter()
        .map(|i| (i.service.as_str(), i.paths_affected, i.paths_total))
        .collect();
    assert_eq!(hurt, [("slurm/4242", 1, 1)], "{finding:#?}");
    let w = finding.impact[0].workload.clone().unwrap();
    assert_eq!(
        (w.kind.as_str(), w.name.as_str()),
        ("slurm_job", "llama-pretrain")
    );
    let job = std::process::Command::new(bin("rpingmeshctl"))
        .args([
            "--controller",
            &ctl.addr.to_string(),
            "job",
            "llama-pretrain",
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&job.stdout);
    assert!(
        job.status.success(),
        "{}",
        String::from_utf8_lossy(&job.stderr)
    );
    // Its path and the finding that hurts it (a three-RNIC fabric may name more
    // components on a loaded machine: the RNIC finding's impact above is the check).
    assert!(
        out.contains("slurm/4242 (slurm_job, llama-pretrain)")
            && out.contains("1 live service paths")
            && out.contains("findings touch it")
            && out
                .lines()
                .any(|l| l.contains("wl-c/udp0") && l.contains("slurm/4242")),
        "{out}"
    );

    // The Slurm job's process dies: its path goes, the others stay.
    drop(services.remove(1));
    let after = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let (ep, ga) = (ep.clone(), ga.clone());
        async move {
            let ps: Vec<String> = service_paths(&ep)
                .await
                .into_iter()
                .filter(|p| p.source_gid == ga)
                .map(|p| p.service)
                .collect();
            (ps.len() == 2).then_some(ps)
        }
    })
    .await
    .unwrap_or_else(|| panic!("the job's path stayed:\nA: {}", tail_lines(&a.stderr(), 30)));
    assert!(!after.iter().any(|s| s == "slurm/4242"), "{after:?}");
    drop(services);
    drop(agents);
    drop(ctl);
    drop(net);
}
