//! The .deb packages of `cargo xtask package` (which `cargo xtask test` runs first),
//! installed with dpkg on this machine: the files, the system user and the state
//! directory are there, the agent binary carries the eBPF object and its unit only the
//! capabilities it needs; the controller starts from its packaged config the way its
//! unit would (its ExecStart as its User=, via setpriv) and answers; purge leaves none of the files.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rpingmesh_e2e::*;

const PACKAGES: [&str; 2] = ["rpingmesh-agent", "rpingmesh-controller"];

fn debs() -> Vec<PathBuf> {
    let dir = bin_dir().join("../debian");
    PACKAGES
        .iter()
        .map(|p| {
            std::fs::read_dir(&dir)
                .ok()
                .and_then(|rd| {
                    rd.filter_map(|e| e.ok()).map(|e| e.path()).find(|f| {
                        let n = f.file_name().unwrap().to_string_lossy().to_string();
                        n.starts_with(&format!("{p}_")) && n.ends_with(".deb")
                    })
                })
                .unwrap_or_else(|| {
                    panic!(
                        "no {p}_*.deb in {}: run `cargo xtask package` (`cargo xtask test` does)",
                        dir.display()
                    )
                })
        })
        .collect()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const DB: &str = "/var/lib/rpingmesh/controller.db";
const DB_ASIDE: &str = "/var/lib/rpingmesh-controller.db.before-package-test";

/// Purges the packages when the test ends, whatever happened, and puts back a registry
/// file that was there before (the packaged controller must make its own, as its user).
struct Installed {
    moved_aside: bool,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").arg("--purge").args(PACKAGES).output();
        if self.moved_aside {
            let _ = std::fs::create_dir_all("/var/lib/rpingmesh");
            let _ = std::fs::rename(DB_ASIDE, DB);
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packages_install_run_and_purge_cleanly() {
    assert!(
        unsafe { libc::geteuid() } == 0,
        "the package test installs with dpkg: run it as root"
    );
    let debs = debs();
    let moved_aside = Path::new(DB).exists() && std::fs::rename(DB, DB_ASIDE).is_ok();
    let _guard = Installed { moved_aside };
    run(Command::new("dpkg").arg("-i").args(&debs));
    let files: Vec<String> = PACKAGES
        .iter()
        .flat_map(|p| {
            run(Command::new("dpkg").args(["-L", p]))
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|f| Path::new(f).is_file())
        .collect();
    for f in [
        "/usr/bin/rpingmesh-agent",
        "/usr/bin/rpingmesh-hw-check",
        "/usr/bin/rpingmesh-controller",
        "/usr/bin/rpingmeshctl",
        "/etc/rpingmesh/agent.yaml",
        "/etc/rpingmesh/controller.yaml",
        "/lib/systemd/system/rpingmesh-agent.service",
        "/lib/systemd/system/rpingmesh-controller.service",
    ] {
        assert!(files.iter().any(|x| x == f), "{f} not installed: {files:?}");
    }
    let conffiles =
        run(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}\n", "rpingmesh-controller"]));
    assert!(
        conffiles.contains("/etc/rpingmesh/controller.yaml"),
        "{conffiles}"
    );
    // The system user and its state directory.
    let user = run(Command::new("getent").args(["passwd", "rpingmesh"]));
    assert!(user.contains("/var/lib/rpingmesh"), "{user}");
    let owner = run(Command::new("stat").args(["-c", "%U:%G %a", "/var/lib/rpingmesh"]));
    assert_eq!(owner.trim(), "rpingmesh:rpingmesh 750");
    // The agent: release build with the eBPF object embedded, and its unit's capabilities.
    let obj = std::fs::read(bin_dir().join("../bpfel-unknown-none/release/rpingmesh-agent-ebpf.o"))
        .expect("the eBPF object `cargo xtask build-ebpf` makes");
    let agent = std::fs::read("/usr/bin/rpingmesh-agent").unwrap();
    assert!(
        contains(&agent, &obj[..obj.len().min(4096)]),
        "the agent binary lacks the eBPF object"
    );
    let unit = std::fs::read_to_string("/lib/systemd/system/rpingmesh-agent.service").unwrap();
    assert!(
        unit.lines()
            .any(|l| l == "CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_IPC_LOCK"),
        "{unit}"
    );
    // rdma-core is opened with dlopen by the rdma transport alone: a udp agent starts
    // without it, and the package only recommends it.
    let field = |f: &str| {
        run(Command::new("dpkg-query").args(["-W", &format!("-f=${{{f}}}"), "rpingmesh-agent"]))
    };
    let (deps, recommends) = (field("Depends"), field("Recommends"));
    assert!(
        !deps.contains("libibverbs"),
        "the agent links rdma-core: {deps}"
    );
    for lib in ["libibverbs1", "librdmacm1"] {
        assert!(
            recommends.contains(lib),
            "Recommends lacks {lib}: {recommends}"
        );
    }
    // Without libibverbs the rdma path is one line that names it (masked in a private
    // mount namespace; /dev/null is not a library).
    let lib = format!(
        "/usr/lib/{}-linux-gnu/libibverbs.so.1",
        std::env::consts::ARCH
    );
    let lib = std::fs::canonicalize(lib).unwrap();
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c"])
        .arg(format!(
            "mount --bind /dev/null {} && exec /usr/bin/rpingmesh-hw-check",
            lib.display()
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "hw-check without libibverbs: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("cannot load libibverbs.so.1") && err.contains("install libibverbs1"),
        "{err}"
    );

    // The controller as its unit starts it: ExecStart, as User=.
    let unit = std::fs::read_to_string("/lib/systemd/system/rpingmesh-controller.service").unwrap();
    let field = |k: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k}= in the unit"))
            .to_string()
    };
    let (exec, user) = (field("ExecStart"), field("User"));
    // setpriv execs (no wrapper process in between, as under systemd): signals and the
    // exit status are the controller's own.
    let mut argv: Vec<String> = vec![
        format!("--reuid={user}"),
        format!("--regid={user}"),
        "--init-groups".into(),
        "--".into(),
    ];
    argv.extend(exec.split_whitespace().map(str::to_string));
    let dir = tempfile::tempdir().unwrap();
    let mut ctl = Proc::spawn(
        dir.path(),
        "packaged-controller",
        None,
        Path::new("setpriv"),
        &argv,
    )
    .unwrap();
    let listening = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        let s = ctl.stderr();
        async move { s.contains("controller listening").then_some(()) }
    })
    .await;
    assert!(
        listening.is_some(),
        "the packaged controller did not start:\n{}",
        ctl.stderr()
    );
    let mut op = operator("http://127.0.0.1:50051").await.unwrap();
    let rnics = list_rnics(&mut op).await.unwrap();
    assert!(rnics.is_empty());
    let db = run(Command::new("stat").args(["-c", "%U", DB]));
    assert_eq!(
        db.trim(),
        "rpingmesh",
        "the registry file belongs to the service user"
    );
    ctl.stop();
    assert!(
        ctl.poll_exit().is_some_and(|s| s.success()),
        "{}",
        ctl.stderr()
    );

    // Purge: none of the packages' files is left; the data file is the operator's.
    std::fs::remove_file(DB).unwrap();
    run(Command::new("dpkg").arg("--purge").args(PACKAGES));
    let left: Vec<&String> = files.iter().filter(|f| Path::new(f).exists()).collect();
    assert!(left.is_empty(), "left after purge: {left:?}");
    assert!(!Path::new("/etc/rpingmesh/controller.yaml").exists());
    for p in PACKAGES {
        let st = Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", p])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&st.stdout);
        assert!(
            !s.contains("installed") || s.contains("not-installed"),
            "{p}: {s}"
        );
    }
}
