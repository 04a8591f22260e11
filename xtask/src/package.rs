//! `cargo xtask package`: Debian packages of the agent and the controller, built with
//! dpkg-deb (Debian's own packager, present on every Debian machine) from a staged tree.
//!
//! - rpingmesh-agent: the agent (release, rdma feature, the eBPF object embedded) and
//!   rpingmesh-hw-check, /etc/rpingmesh/agent.yaml, the systemd unit.
//! - rpingmesh-controller: the controller and rpingmeshctl, /etc/rpingmesh/controller.yaml,
//!   the systemd unit, the Grafana dashboards.
//!
//! Both make the system user `rpingmesh` and /var/lib/rpingmesh at install (postinst),
//! keep the configs as conffiles, stop the unit before removal, and leave the user and
//! the state directory's data to the operator (Debian practice); purge removes the
//! configs. Dependencies come from the binaries' shared libraries (`ldd`, then `dpkg -S`).

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{root, run_streamed, target_dir};

#[derive(clap::Args)]
pub struct PackageArgs {
    /// Where the .deb files go.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// What one package holds.
struct Spec {
    name: &'static str,
    description: &'static str,
    /// (built binary, installed as /usr/bin/<name>)
    bins: &'static [&'static str],
    /// (repository path, installed path, mode); a directory is copied whole.
    files: &'static [(&'static str, &'static str, u32)],
    /// Installed paths that are conffiles.
    conffiles: &'static [&'static str],
    unit: &'static str,
    /// Packages needed beyond the binaries' libraries.
    extra_depends: &'static [&'static str],
    recommends: &'static str,
}

const SPECS: &[Spec] = &[
    Spec {
        name: "rpingmesh-agent",
        description: "rpingmesh agent: RoCE network probing (6-timestamp UD probes), \
                      service-path tracing (eBPF) and intra-host diagnosis (Hostping)",
        bins: &["rpingmesh-agent", "rpingmesh-hw-check"],
        files: &[
            ("configs/agent.yaml", "etc/rpingmesh/agent.yaml", 0o644),
            (
                "deploy/systemd/rpingmesh-agent.service",
                "lib/systemd/system/rpingmesh-agent.service",
                0o644,
            ),
            (
                "README.md",
                "usr/share/doc/rpingmesh-agent/README.md",
                0o644,
            ),
        ],
        conffiles: &["/etc/rpingmesh/agent.yaml"],
        unit: "rpingmesh-agent.service",
        extra_depends: &["adduser"],
        // The agent opens libibverbs and librdmacm with dlopen for the rdma transport
        // only: a udp agent runs without them, so they are recommended, not required.
        recommends: "libibverbs1, librdmacm1, ibverbs-providers, rdma-core",
    },
    Spec {
        name: "rpingmesh-controller",
        description: "rpingmesh controller: RNIC registry, pinglists, analyzer and fault \
                      localization, operator API (gRPC, web page), rpingmeshctl",
        bins: &["rpingmesh-controller", "rpingmeshctl"],
        files: &[
            (
                "configs/controller.yaml",
                "etc/rpingmesh/controller.yaml",
                0o644,
            ),
            (
                "deploy/systemd/rpingmesh-controller.service",
                "lib/systemd/system/rpingmesh-controller.service",
                0o644,
            ),
            (
                "README.md",
                "usr/share/doc/rpingmesh-controller/README.md",
                0o644,
            ),
            // Directories are copied whole.
            (
                "deploy/grafana/dashboards",
                "usr/share/rpingmesh/grafana/dashboards",
                0o644,
            ),
            (
                "deploy/grafana/provisioning",
                "usr/share/rpingmesh/grafana/provisioning",
                0o644,
            ),
        ],
        conffiles: &["/etc/rpingmesh/controller.yaml"],
        unit: "rpingmesh-controller.service",
        extra_depends: &["adduser"],
        recommends: "etcd-client",
    },
];

/// The features the packaged binaries are built with.
const FEATURES: &str = "rpingmesh-agent/rdma,rpingmesh-verbs/rdma";

pub fn run(a: PackageArgs) -> Result<()> {
    let debs = build(a.out.as_deref())?;
    for d in debs {
        println!("{}", d.display());
    }
    Ok(())
}

/// Builds both packages into `out` (default target/debian); returns their paths.
pub fn build(out: Option<&Path>) -> Result<Vec<PathBuf>> {
    if !crate::have_tool("dpkg-deb") {
        bail!("xtask package: dpkg-deb not found (it comes with dpkg on Debian)");
    }
    let root = root();
    // The embedded eBPF object: service-tracer's build script takes it when it exists.
    crate::build_ebpf::build_ebpf(&root)?;
    crate::cargo_release(
        &[
            "rpingmesh-agent",
            "rpingmesh-verbs",
            "rpingmesh-controller",
            "rpingmesh-cli",
        ],
        &["--features", FEATURES],
        "packaged binaries",
    )?;
    let version = workspace_version(&root)?;
    let arch = dpkg_arch()?;
    let out = out
        .map(Path::to_path_buf)
        .unwrap_or_else(|| target_dir().join("debian"));
    fs::create_dir_all(&out)?;
    let release = target_dir().join("release");
    let mut debs = Vec::new();
    for spec in SPECS {
        debs.push(package(spec, &root, &release, &out, &version, &arch)?);
    }
    Ok(debs)
}

fn package(
    spec: &Spec,
    root: &Path,
    release: &Path,
    out: &Path,
    version: &str,
    arch: &str,
) -> Result<PathBuf> {
    let stage = out.join(format!("{}-stage", spec.name));
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    let mut depends: BTreeSet<String> = spec.extra_depends.iter().map(|s| s.to_string()).collect();
    for b in spec.bins {
        let from = release.join(b);
        let to = stage.join("usr/bin").join(b);
        install(&from, &to, 0o755)?;
        // The release profile keeps line tables for the benches' profiles; a package
        // does not need them (a sixth of the size).
        let mut strip = Command::new("strip");
        strip.arg("--strip-debug").arg(&to);
        run_streamed(strip, &format!("strip --strip-debug {b}"))?;
        depends.extend(library_packages(&from)?);
    }
    for (from, to, mode) in spec.files {
        install(&root.join(from), &stage.join(to), *mode)?;
    }
    fs::create_dir_all(stage.join("var/lib/rpingmesh"))?;
    let debian = stage.join("DEBIAN");
    fs::create_dir_all(&debian)?;
    let size_kib = dir_size(&stage)?.div_ceil(1024);
    write(
        &debian.join("control"),
        &control(spec, version, arch, &depends, size_kib),
        0o644,
    )?;
    write(
        &debian.join("conffiles"),
        &(spec.conffiles.join("\n") + "\n"),
        0o644,
    )?;
    write(&debian.join("postinst"), &postinst(spec), 0o755)?;
    write(&debian.join("prerm"), &prerm(spec), 0o755)?;
    write(&debian.join("postrm"), &postrm(), 0o755)?;
    let deb = out.join(format!("{}_{version}_{arch}.deb", spec.name));
    let mut cmd = Command::new("dpkg-deb");
    cmd.args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&stage)
        .arg(&deb);
    run_streamed(cmd, &format!("dpkg-deb --build {}", spec.name))?;
    fs::remove_dir_all(&stage)?;
    Ok(deb)
}

fn control(
    spec: &Spec,
    version: &str,
    arch: &str,
    depends: &BTreeSet<String>,
    size_kib: u64,
) -> String {
    let deps: Vec<&str> = depends.iter().map(String::as_str).collect();
    format!(
        "Package: {}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: rpingmesh developers <rpingmesh@localhost>\n\
         Installed-Size: {size_kib}\nDepends: {}\nRecommends: {}\nSection: net\nPriority: optional\n\
         Homepage: https://github.com/rpingmesh/rpingmesh\nDescription: {}\n",
        spec.name,
        deps.join(", "),
        spec.recommends,
        spec.description
    )
}

/// The system user, its state directory, and (with systemd running) the unit known.
fn postinst(spec: &Spec) -> String {
    format!(
        r#"#!/bin/sh
set -e
if [ "$1" = configure ]; then
    if ! getent group rpingmesh >/dev/null; then
        addgroup --system --quiet rpingmesh
    fi
    if ! getent passwd rpingmesh >/dev/null; then
        adduser --system --quiet --ingroup rpingmesh --home /var/lib/rpingmesh \
            --no-create-home --shell /usr/sbin/nologin rpingmesh
    fi
    # The agent's unit asks for the rdma group (/dev/infiniband/*).
    if ! getent group rdma >/dev/null; then
        addgroup --system --quiet rdma
    fi
    chown rpingmesh:rpingmesh /var/lib/rpingmesh
    chmod 0750 /var/lib/rpingmesh
    if [ -d /run/systemd/system ]; then
        systemctl daemon-reload >/dev/null || true
        # Not started here: it needs its config (tor_id, controller_addr) first.
        systemctl enable {unit} >/dev/null || true
    fi
fi
exit 0
"#,
        unit = spec.unit
    )
}

fn prerm(spec: &Spec) -> String {
    format!(
        r#"#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    systemctl stop {unit} >/dev/null 2>&1 || true
    systemctl disable {unit} >/dev/null 2>&1 || true
fi
exit 0
"#,
        unit = spec.unit
    )
}

fn postrm() -> String {
    r#"#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
fi
# /var/lib/rpingmesh is left when it still holds data (the controller's SQLite file) or
# the other package; the user stays (Debian practice: files may still belong to it).
if [ "$1" = purge ]; then
    rmdir /var/lib/rpingmesh 2>/dev/null || true
fi
exit 0
"#
    .to_string()
}

/// The Debian packages of `bin`'s shared libraries (`ldd`, then `dpkg -S`).
fn library_packages(bin: &Path) -> Result<BTreeSet<String>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .with_context(|| format!("ldd {}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut pkgs = BTreeSet::new();
    for line in text.lines() {
        let Some(path) = line
            .split_whitespace()
            .find(|w| w.starts_with('/'))
            .map(str::to_string)
        else {
            continue;
        };
        // dpkg knows the path under /usr when the library was found through /lib.
        let real = fs::canonicalize(&path).unwrap_or_else(|_| PathBuf::from(&path));
        for p in [PathBuf::from(&path), real.clone(), strip_usr_merge(&real)] {
            let q = Command::new("dpkg").arg("-S").arg(&p).output()?;
            if q.status.success() {
                let s = String::from_utf8_lossy(&q.stdout);
                if let Some(pkg) = s.lines().next().and_then(|l| l.split(':').next()) {
                    pkgs.insert(pkg.trim().to_string());
                    break;
                }
            }
        }
    }
    Ok(pkgs)
}

/// /usr/lib/x => /lib/x (dpkg records some libraries under the pre-usrmerge path).
fn strip_usr_merge(p: &Path) -> PathBuf {
    p.strip_prefix("/usr")
        .map(|r| Path::new("/").join(r))
        .unwrap_or_else(|_| p.to_path_buf())
}

fn workspace_version(root: &Path) -> Result<String> {
    let text = fs::read_to_string(root.join("Cargo.toml"))?;
    let mut in_pkg = false;
    for line in text.lines() {
        let l = line.trim();
        if l.starts_with('[') {
            in_pkg = l == "[workspace.package]";
            continue;
        }
        if in_pkg {
            if let Some(v) = l.strip_prefix("version") {
                let v = v.trim().trim_start_matches('=').trim().trim_matches('"');
                return Ok(v.to_string());
            }
        }
    }
    bail!("no version in [workspace.package] of Cargo.toml")
}

fn dpkg_arch() -> Result<String> {
    let out = Command::new("dpkg")
        .arg("--print-architecture")
        .output()
        .context("dpkg --print-architecture")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    if from.is_dir() {
        for e in fs::read_dir(from)? {
            let e = e?;
            install(&e.path(), &to.join(e.file_name()), mode)?;
        }
        return Ok(());
    }
    if let Some(d) = to.parent() {
        fs::create_dir_all(d)?;
    }
    fs::copy(from, to).with_context(|| format!("{} -> {}", from.display(), to.display()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn write(path: &Path, text: &str, mode: u32) -> Result<()> {
    fs::write(path, text)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn dir_size(d: &Path) -> Result<u64> {
    let mut n = 0;
    for e in fs::read_dir(d)? {
        let e = e?;
        let m = e.metadata()?;
        n += if m.is_dir() {
            dir_size(&e.path())?
        } else {
            m.len()
        };
    }
    Ok(n)
}
