//! Network namespaces for the tests: created, joined by veth pairs to a bridge, given
//! addresses, and removed on drop.

use super::*;

/// Runs a command, returning stdout; an error carries the command and its stderr.
pub fn run(args: &[&str]) -> Result<String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .with_context(|| format!("running {}", args.join(" ")))?;
    succeeded(args, out)
}

/// A finished command's stdout; an error carries the command and its stderr.
fn succeeded(args: &[&str], out: std::process::Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command with `input` on stdin (for `nft -f -`).
pub fn run_stdin(args: &[&str], input: &str) -> Result<()> {
    use std::io::Write;
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", args.join(" ")))?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(input.as_bytes())?;
    succeeded(args, child.wait_with_output()?).map(drop)
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `rpm<pid>...` -> pid
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("rpm")?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Removes namespaces and links left by earlier runs that were killed (their owner pid
/// is gone). Only names of the form `rpm<pid>...` are touched.
pub fn cleanup_stale() {
    if let Ok(list) = run(&["ip", "netns", "list"]) {
        for ns in list.lines().filter_map(|l| l.split_whitespace().next()) {
            if owner_pid(ns).is_some_and(|p| !pid_alive(p)) {
                let _ = run(&["ip", "netns", "del", ns]);
            }
        }
    }
    if let Ok(list) = run(&["ip", "-o", "link", "show"]) {
        for l in list.lines() {
            // "12: rpm123b: <...>" or "13: rpm123h1@if2: <...>"
            let Some(name) = l.split(": ").nth(1) else {
                continue;
            };
            let name = name.split('@').next().unwrap_or(name);
            if owner_pid(name).is_some_and(|p| !pid_alive(p)) {
                let _ = run(&["ip", "link", "del", name]);
            }
        }
    }
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(name: &str) -> Result<Netns> {
        run(&["ip", "netns", "add", name])?;
        let ns = Netns { name: name.into() };
        run(&["ip", "-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Runs a command inside the namespace.
    pub fn exec(&self, args: &[&str]) -> Result<String> {
        let mut v = vec!["ip", "netns", "exec", self.name.as_str()];
        v.extend_from_slice(args);
        run(&v)
    }

    /// Runs `f` on a thread that has entered the namespace: sockets it opens live there.
    pub fn run_in<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(|| {
                use std::os::fd::AsRawFd;
                let fd = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
                // SAFETY: setns on a valid namespace fd affects only this thread.
                if unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    bail!("setns {path}: {}", std::io::Error::last_os_error());
                }
                Ok(f())
            })
            .join()
            .map_err(|_| anyhow::anyhow!("thread in {path} panicked"))?
        })
    }

    /// Loads an nftables rule set inside the namespace.
    pub fn nft(&self, ruleset: &str) -> Result<()> {
        run_stdin(
            &["ip", "netns", "exec", &self.name, "nft", "-f", "-"],
            ruleset,
        )
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = run(&["ip", "netns", "del", &self.name]) {
            eprintln!("cleanup: {e}");
        }
    }
}

/// A bridge in the root namespace with an address `.254` of a per-run /24 inside
/// 10.77.0.0/16, and namespaces attached to it by veth pairs. Drop removes all of it.
pub struct BridgeNet {
    pub prefix: String,
    pub bridge: String,
    /// third octet of 10.77.<subnet>.0/24
    pub subnet: u8,
    hosts: Vec<Netns>,
}

impl BridgeNet {
    pub fn new() -> Result<BridgeNet> {
        cleanup_stale();
        let pid = std::process::id();
        let prefix = format!("rpm{pid}");
        let used = run(&["ip", "-4", "-o", "addr", "show"])? + &run(&["ip", "-4", "route"])?;
        let start = (pid % 200) as u8 + 20;
        let subnet = (0..200u8)
            .map(|i| ((start as u16 + i as u16 - 20) % 200 + 20) as u8)
            .find(|s| !used.contains(&format!("10.77.{s}.")))
            .context("no free 10.77.x.0/24 subnet")?;
        let bridge = format!("{prefix}b");
        run(&["ip", "link", "add", &bridge, "type", "bridge"])?;
        let net = BridgeNet {
            prefix,
            bridge: bridge.clone(),
            subnet,
            hosts: Vec::new(),
        };
        run(&[
            "ip",
            "addr",
            "add",
            &format!("10.77.{subnet}.254/24"),
            "dev",
            &bridge,
        ])?;
        run(&["ip", "link", "set", &bridge, "up"])?;
        Ok(net)
    }

    pub fn ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, host)
    }

    /// Creates namespace `<prefix>-<suffix>` with eth0 = 10.77.<subnet>.<host>/24 on the
    /// bridge. Returns the namespace name.
    pub fn add_host(&mut self, suffix: &str, host: u8) -> Result<String> {
        let ns_name = format!("{}-{suffix}", self.prefix);
        let ns = Netns::new(&ns_name)?;
        let veth = format!("{}h{}", self.prefix, self.hosts.len());
        run(&[
            "ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns_name,
        ])?;
        self.hosts.push(ns);
        run(&["ip", "link", "set", &veth, "master", &self.bridge])?;
        run(&["ip", "link", "set", &veth, "up"])?;
        let addr = format!("{}/24", self.ip(host));
        run(&["ip", "-n", &ns_name, "addr", "add", &addr, "dev", "eth0"])?;
        run(&["ip", "-n", &ns_name, "link", "set", "eth0", "up"])?;
        Ok(ns_name)
    }

    pub fn host(&self, ns_name: &str) -> Option<&Netns> {
        self.hosts.iter().find(|n| n.name == ns_name)
    }
}

impl Drop for BridgeNet {
    fn drop(&mut self) {
        // Deleting a namespace destroys its veth end and with it the bridge port.
        self.hosts.clear();
        if let Err(e) = run(&["ip", "link", "del", &self.bridge]) {
            eprintln!("cleanup: {e}");
        }
    }
}
