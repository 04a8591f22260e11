//! The fake-ibverbs fixture: a process with libibverbs-named functions and the real
//! struct layouts, driven line by line, whose QPs the agent's uprobes learn as service
//! paths.

use std::io::{BufRead, BufReader, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Builds the fixture with plain rustc (it has no dependencies), as the tracer's tests do.
pub fn build_fixture(dir: &Path, name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/fake-ibverbs/src/main.rs");
    let exe = dir.join(name);
    let out = Command::new("rustc")
        .args(["--edition", "2021", "-C", "opt-level=1", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("rustc runs");
    assert!(
        out.status.success(),
        "building the fixture: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The fixture process, driven line by line; killed on drop.
pub struct Fixture {
    child: Child,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
}

impl Fixture {
    pub fn spawn(exe: &Path, args: &[&str]) -> Fixture {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("fixture starts");
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Fixture { child, stdin, out }
    }
    /// One RC QP on the pseudo-RNIC `udp0` (local QPN 0x345, remote 0x777), connected
    /// to `dest` with `flow_label` when told `go`.
    pub fn qp_to(exe: &Path, dest: Ipv4Addr, flow_label: u32) -> Fixture {
        Fixture::qp_numbered(exe, dest, flow_label, 0x345)
    }

    /// As [`Fixture::qp_to`], with local QPN `qpn`.
    pub fn qp_numbered(exe: &Path, dest: Ipv4Addr, flow_label: u32, qpn: u32) -> Fixture {
        Fixture::spawn(
            exe,
            &[
                "--dev",
                "udp0",
                "--port",
                "1",
                "--sgid-index",
                "0",
                "--qpn",
                &format!("{qpn:#x}"),
                "--dest-qpn",
                "0x777",
                "--dgid",
                &gid_hex(dest),
                "--flow-label",
                &format!("{flow_label:#x}"),
                "--sl",
                "0",
                "--tc",
                "0",
            ],
        )
    }

    pub fn expect(&mut self, prefix: &str) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        assert!(l.starts_with(prefix), "fixture said {l:?}, want {prefix}");
        l
    }
    /// The fixture's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn go(&mut self) {
        self.stdin.write_all(b"go\n").unwrap();
        self.stdin.flush().unwrap();
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A GID as the fixture takes it: 32 hex digits.
pub fn gid_hex(ip: Ipv4Addr) -> String {
    ip.to_ipv6_mapped()
        .octets()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
