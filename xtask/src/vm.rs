//! The soft-RoCE VM test bed: Debian's stock kernel under qemu (TCG), booted by
//! virtme-ng with this machine's root filesystem shared in (notes: shared/notes/rdma-vm.md).
//! `ensure_test_bed` installs what it needs; the guest itself is booted by
//! e2e/tests/vm_rdma.rs, once for all its tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Result};

use crate::{have_tool, install_needs, is_root, root, run_streamed, Need};

/// virtme-ng release the recipe was verified with.
const VIRTME_NG: &str = "virtme-ng==1.42";

const VM_NEEDED: &[Need] = &[
    Need {
        what: "qemu-system-x86_64",
        present: || have_tool("qemu-system-x86_64"),
        package: "qemu-system-x86",
        why: "boots the VM test bed (TCG)",
    },
    Need {
        what: "a kernel with rdma_rxe modules",
        present: || kernel_with_rxe().is_some(),
        package: "linux-image-amd64",
        why: "Debian's stock kernel: soft-RoCE, kprobes and module BTF in the VM",
    },
    Need {
        what: "busybox",
        present: || Path::new("/bin/busybox").is_file() || have_tool("busybox"),
        package: "busybox-static",
        why: "the VM's init",
    },
    Need {
        what: "ibv_rc_pingpong",
        present: || have_tool("ibv_rc_pingpong"),
        package: "ibverbs-utils",
        why: "real RC and UD services inside the VM (ibv_rc_pingpong, ibv_ud_pingpong)",
    },
    Need {
        what: "librxe",
        present: || {
            Path::new("/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so").is_file()
                || have_glob("/usr/lib/x86_64-linux-gnu/libibverbs", "librxe")
        },
        package: "ibverbs-providers",
        why: "the soft-RoCE userspace provider",
    },
    Need {
        what: "rping",
        present: || have_tool("rping"),
        package: "rdmacm-utils",
        why: "an RDMA-CM service inside the VM",
    },
    Need {
        what: "python3 venv",
        present: || {
            Command::new(python())
                .args(["-c", "import ensurepip, venv"])
                .output()
                .is_ok_and(|o| o.status.success())
        },
        package: "python3-venv",
        why: "a virtualenv for virtme-ng",
    },
];

fn have_glob(dir: &str, prefix: &str) -> bool {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
        })
        .unwrap_or(false)
}

/// Debian's python (the one python3-venv completes), else whatever python3 is on PATH.
fn python() -> PathBuf {
    let deb = PathBuf::from("/usr/bin/python3");
    if deb.is_file() {
        deb
    } else {
        PathBuf::from("python3")
    }
}

/// The newest /boot/vmlinuz-* whose modules include rdma_rxe.
pub fn kernel_with_rxe() -> Option<PathBuf> {
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir("/boot")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let ver = name.strip_prefix("vmlinuz-")?.to_string();
            Path::new("/lib/modules")
                .join(&ver)
                .join("kernel/drivers/infiniband/sw/rxe")
                .is_dir()
                .then(|| (ver, e.path()))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// `<root>/.tools/vng`: the virtualenv holding virtme-ng.
pub fn vng_venv() -> PathBuf {
    root().join(".tools/vng")
}

/// Installs the VM packages (root) and virtme-ng in its venv. Without root it only says
/// what is missing: the VM tests then print their SKIP lines.
pub fn ensure_test_bed() -> Result<()> {
    install_needs("vm", VM_NEEDED)?;
    if !is_root() {
        return Ok(());
    }
    let venv = vng_venv();
    let vng = venv.join("bin/vng");
    if vng.is_file() {
        return Ok(());
    }
    eprintln!("xtask vm: installing {VIRTME_NG} into {}", venv.display());
    let mut mk = Command::new(python());
    mk.args(["-m", "venv"]).arg(&venv);
    run_streamed(mk, &format!("python3 -m venv {}", venv.display()))?;
    let mut pip = Command::new(venv.join("bin/pip"));
    pip.args(["install", "--quiet", VIRTME_NG]);
    run_streamed(pip, &format!("pip install {VIRTME_NG}"))?;
    if !vng.is_file() {
        bail!("{VIRTME_NG} installed but {} is missing", vng.display());
    }
    Ok(())
}

/// `cargo xtask vm-test`: test bed, eBPF object, build, then the VM tests alone.
pub fn vm_test() -> Result<()> {
    crate::deps()?;
    ensure_test_bed()?;
    crate::build_ebpf::build_ebpf(&root())?;
    crate::build_for_tests()?;
    let mut t = crate::cargo();
    t.args([
        "test",
        "-p",
        "rpingmesh-e2e",
        "--test",
        "vm_rdma",
        "--",
        "--nocapture",
    ]);
    run_streamed(t, "cargo test -p rpingmesh-e2e --test vm_rdma")
}
