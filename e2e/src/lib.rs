//! Helpers for the end-to-end tests: real `rpingmesh-controller` / `rpingmesh-agent`
//! processes (killed on drop, never orphaned), network namespaces joined by a bridge
//! (removed on drop), and small gRPC conveniences.
//!
//! The binaries are not built by this crate: `cargo xtask test` builds the workspace first.
//! A test that cannot find a binary panics with a message saying how to build it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rpingmesh_proto::controller_agent::controller_service_client::ControllerServiceClient;
use rpingmesh_proto::controller_agent::PathSummary;
use rpingmesh_proto::operator::operator_service_client::OperatorServiceClient;
use rpingmesh_proto::operator::{ListPathsRequest, ListRnicsRequest, RnicStatus};
use tonic::transport::Channel;

pub mod demo;
mod etcd_server;
pub mod fake_service;
pub mod grafana;
pub mod netns;
pub mod pki;
pub mod soak;
pub mod vm;

pub use etcd_server::Etcd;

pub const CONTROLLER_BIN: &str = "rpingmesh-controller";
/// How long `spawn_controller` waits for the "controller listening" line.
pub const CONTROLLER_START_TIMEOUT: Duration = Duration::from_secs(90);
pub const AGENT_BIN: &str = "rpingmesh-agent";
/// The probe port every agent binds (the Go version's default).
pub const PROBE_PORT: u16 = 18515;

// ---------------------------------------------------------------------------------------
// Binaries

/// Directory holding the workspace binaries: `$RPINGMESH_BIN_DIR`, else the profile
/// directory this test executable lives in (`target/<profile>/deps/<test>` -> `target/<profile>`).
pub fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RPINGMESH_BIN_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test executable has a parent dir");
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps has a parent").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// Path of a workspace binary; panics with a clear message when it was not built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    if !p.is_file() {
        panic!(
            "binary {name} not found at {}: build it first with \
             `cargo build -p rpingmesh-controller -p rpingmesh-agent` \
             (`cargo xtask test` does this), or set RPINGMESH_BIN_DIR",
            p.display()
        );
    }
    p
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Returns true (after printing why) when a root-only test must be skipped.
pub fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    // Written to the stderr handle directly: libtest captures eprintln! of passing tests.
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED {test}: needs root (network namespaces, veth, bridge, nftables); \
         run `sudo cargo xtask test` or the CI to exercise it"
    );
    true
}

// ---------------------------------------------------------------------------------------
// Processes

/// A child process with its stdout/stderr in files. Dropping it stops the process
/// (SIGTERM, then SIGKILL); the child also gets SIGKILL if the test process dies.
pub struct Proc {
    pub name: String,
    child: Child,
    pub stdout_path: PathBuf,
    pub stderr_path: PathBuf,
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Spawns `program args` (inside `netns` via `ip netns exec` when given), with its
    /// output in `<dir>/<name>.stdout|.stderr`.
    pub fn spawn(
        dir: &Path,
        name: &str,
        netns: Option<&str>,
        program: &Path,
        args: &[String],
    ) -> Result<Proc> {
        Self::spawn_env(dir, name, netns, program, args, &[])
    }

    /// As [`Proc::spawn`], with extra environment variables.
    pub fn spawn_env(
        dir: &Path,
        name: &str,
        netns: Option<&str>,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Result<Proc> {
        let stdout_path = dir.join(format!("{name}.stdout"));
        let stderr_path = dir.join(format!("{name}.stderr"));
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(File::create(&stdout_path)?)
            .stderr(File::create(&stderr_path)?);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning {name} ({})", program.display()))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            stdout_path,
            stderr_path,
            exited: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        self.poll_exit().is_none()
    }

    pub fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            if let Ok(Some(st)) = self.child.try_wait() {
                self.exited = Some(st);
            }
        }
        self.exited
    }

    /// Waits (bounded) for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.poll_exit() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stderr(&self) -> String {
        read_lossy(&self.stderr_path)
    }

    pub fn stdout(&self) -> String {
        read_lossy(&self.stdout_path)
    }

    /// Sends `sig` (e.g. SIGKILL) if the process still runs; `wait_exit` reaps it.
    pub fn signal(&mut self, sig: libc::c_int) {
        if self.poll_exit().is_none() {
            // SAFETY: signalling our own child, which has not been reaped yet.
            unsafe { libc::kill(self.child.id() as libc::pid_t, sig) };
        }
    }

    /// Stops the process: SIGTERM, up to 3 s grace, then SIGKILL.
    pub fn stop(&mut self) {
        Self::stop_all([self]);
    }

    /// SIGTERM to every process at once, then waits for each (10 s in all, then
    /// SIGKILL). Agents stopped one after the other would each probe the ones already
    /// gone, and on a slow machine count those probes lost.
    pub fn stop_all<'a>(procs: impl IntoIterator<Item = &'a mut Proc>) {
        let mut running: Vec<&mut Proc> = procs
            .into_iter()
            .filter_map(|p| p.poll_exit().is_none().then_some(p))
            .collect();
        for p in &running {
            // SAFETY: signalling our own child, which has not been reaped yet.
            unsafe { libc::kill(p.child.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in &mut running {
            let left = deadline.saturating_duration_since(Instant::now());
            if p.wait_exit(left).is_none() {
                let _ = p.child.kill();
                if let Ok(st) = p.child.wait() {
                    p.exited = Some(st);
                }
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            let tail = tail_lines(&self.stderr(), 40);
            eprintln!(
                "----- {} (pid {}) stderr, last lines -----\n{tail}\n-----",
                self.name,
                self.child.id()
            );
        }
    }
}

/// The child gets SIGKILL when the thread that spawned it dies, so a crashed or killed
/// test never leaves processes behind.
pub fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl and getppid are async-signal-safe; no allocation in the closure.
    let parent = std::process::id() as libc::pid_t;
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                return Err(std::io::Error::other("parent already exited"));
            }
            Ok(())
        });
    }
}

pub fn read_lossy(p: &Path) -> String {
    let mut buf = Vec::new();
    if let Ok(mut f) = File::open(p) {
        let _ = f.read_to_end(&mut buf);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

pub fn tail_lines(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Non-empty lines of a text.
pub fn non_empty_lines(s: &str) -> Vec<&str> {
    s.lines().filter(|l| !l.trim().is_empty()).collect()
}

// ---------------------------------------------------------------------------------------
// Controller and agents

pub struct Controller {
    pub proc: Proc,
    pub addr: SocketAddr,
}

impl Controller {
    /// `http://addr` for tonic clients.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Starts a controller listening on `listen` (port 0 allowed) and waits (up to 20 s) for
/// its "controller listening" log line, from which it takes the bound address.
pub fn spawn_controller(
    dir: &Path,
    name: &str,
    netns: Option<&str>,
    listen: &str,
    extra: &[&str],
) -> Result<Controller> {
    let mut args: Vec<String> = vec!["--listen-addr".into(), listen.into()];
    // Defaults unless `extra` names them.
    for (flag, default) in [
        ("--database-uri", "sqlite::memory:"),
        ("--log-level", "info"),
    ] {
        if !extra.contains(&flag) {
            args.extend([flag.to_string(), default.to_string()]);
        }
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut proc = Proc::spawn(dir, name, netns, &bin(CONTROLLER_BIN), &args)?;
    // Generous: a debug build paged in over 9p by a TCG guest on a loaded host starts slowly.
    let deadline = Instant::now() + CONTROLLER_START_TIMEOUT;
    loop {
        if let Some(addr) = listening_addr(&proc.stderr()) {
            return Ok(Controller { proc, addr });
        }
        if let Some(st) = proc.poll_exit() {
            bail!(
                "controller {name} exited ({st}) before listening:\n{}",
                tail_lines(&proc.stderr(), 20)
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "controller {name} logged no \"controller listening\" line within {} s:\n{}",
                CONTROLLER_START_TIMEOUT.as_secs(),
                tail_lines(&proc.stderr(), 20)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Finds the bound address in the controller's "controller listening" JSON log line:
/// any string value (or word of the message) that parses as a socket address.
pub fn listening_addr(log: &str) -> Option<SocketAddr> {
    for line in log.lines().filter(|l| l.contains("controller listening")) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            if let Some(a) = find_sockaddr(&v) {
                return Some(a);
            }
        }
        if let Some(a) = line
            .split(|c: char| c.is_whitespace() || c == '"' || c == ',' || c == '=')
            .find_map(|w| w.parse::<SocketAddr>().ok())
        {
            return Some(a);
        }
    }
    None
}

fn find_sockaddr(v: &serde_json::Value) -> Option<SocketAddr> {
    match v {
        serde_json::Value::String(s) => s.parse().ok().or_else(|| {
            s.split_whitespace()
                .find_map(|w| w.trim_matches(|c| c == ',' || c == '"').parse().ok())
        }),
        serde_json::Value::Object(m) => m.values().find_map(find_sockaddr),
        serde_json::Value::Array(a) => a.iter().find_map(find_sockaddr),
        _ => None,
    }
}

/// Agent command line: the essentials plus `extra` flags.
pub struct AgentArgs {
    pub agent_id: String,
    pub tor_id: String,
    pub controller_addr: String,
    pub udp_addresses: Vec<std::net::IpAddr>,
    pub extra: Vec<String>,
}

impl AgentArgs {
    pub fn new(
        agent_id: &str,
        tor_id: &str,
        controller_addr: &str,
        ip: impl Into<std::net::IpAddr>,
    ) -> Self {
        AgentArgs {
            agent_id: agent_id.into(),
            tor_id: tor_id.into(),
            controller_addr: controller_addr.into(),
            udp_addresses: vec![ip.into()],
            extra: Vec::new(),
        }
    }

    pub fn flag(mut self, name: &str, value: impl ToString) -> Self {
        self.extra.push(name.into());
        self.extra.push(value.to_string());
        self
    }

    pub fn to_args(&self) -> Vec<String> {
        let addrs: Vec<String> = self.udp_addresses.iter().map(|a| a.to_string()).collect();
        let mut v: Vec<String> = vec![
            "--agent-id".into(),
            self.agent_id.clone(),
            "--tor-id".into(),
            self.tor_id.clone(),
            "--controller-addr".into(),
            self.controller_addr.clone(),
            "--udp-addresses".into(),
            addrs.join(","),
            "--udp-port".into(),
            PROBE_PORT.to_string(),
            "--transport".into(),
            "udp".into(),
        ];
        if !self.extra.iter().any(|a| a == "--log-level") {
            v.extend(["--log-level".into(), "info".into()]);
        }
        v.extend(self.extra.iter().cloned());
        v
    }
}

pub fn spawn_agent(dir: &Path, netns: Option<&str>, a: &AgentArgs) -> Result<Proc> {
    Proc::spawn(dir, &a.agent_id, netns, &bin(AGENT_BIN), &a.to_args())
}

/// A plain HTTP/1.1 GET (the tests' only HTTP client): (status, content type, body).
pub fn http_get(addr: SocketAddr, path: &str, accept: &str) -> Result<(u16, String, String)> {
    http_get_with(addr, path, accept, &[])
}

/// [`http_get`] with more request headers (e.g. `("Authorization", "Bearer T")`).
pub fn http_get_with(
    addr: SocketAddr,
    path: &str,
    accept: &str,
    headers: &[(&str, &str)],
) -> Result<(u16, String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\n{extra}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("GET {path}: no header end"))?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("GET {path}: bad status line"))?;
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, ctype, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(len.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// GID of a UDP pseudo-RNIC bound to an IPv4 address (the v4-mapped IPv6, full form).
pub fn gid_of(ip: Ipv4Addr) -> String {
    rpingmesh_proto::gid::format_gid(&ip.to_ipv6_mapped())
}

// ---------------------------------------------------------------------------------------
// gRPC conveniences

/// Connects (retrying for up to 10 s) to an endpoint like `http://127.0.0.1:50051`.
pub async fn channel(endpoint: &str) -> Result<Channel> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ep = Channel::from_shared(endpoint.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10));
        match ep.connect().await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() >= deadline => {
                bail!("cannot connect to {endpoint}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

pub async fn operator(endpoint: &str) -> Result<OperatorServiceClient<Channel>> {
    Ok(OperatorServiceClient::new(channel(endpoint).await?))
}

pub async fn controller_client(endpoint: &str) -> Result<ControllerServiceClient<Channel>> {
    Ok(ControllerServiceClient::new(channel(endpoint).await?))
}

pub async fn list_rnics(op: &mut OperatorServiceClient<Channel>) -> Result<Vec<RnicStatus>> {
    Ok(op
        .list_rnics(ListRnicsRequest::default())
        .await?
        .into_inner()
        .rnics)
}

/// Every retained window of every path.
pub async fn all_windows(op: &mut OperatorServiceClient<Channel>) -> Result<Vec<PathSummary>> {
    Ok(op
        .list_paths(ListPathsRequest {
            all_windows: true,
            ..Default::default()
        })
        .await?
        .into_inner()
        .paths)
}

/// One summary per (source GID, target GID, window start): agents may report a window
/// more than once (retries), and the controller may return overlapping sets.
pub fn dedupe(ws: Vec<PathSummary>) -> Vec<PathSummary> {
    let mut m: BTreeMap<(String, String, u64), PathSummary> = BTreeMap::new();
    for w in ws {
        m.insert(
            (
                w.source_gid.clone(),
                w.target_gid.clone(),
                w.window_start_unix_ns,
            ),
            w,
        );
    }
    m.into_values().collect()
}

/// Polls `f` every `every` until it yields a value or `timeout` passes.
pub async fn wait_for<T, F, Fut>(timeout: Duration, every: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

pub fn unix_ns_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64
}

/// A TCP port that was free a moment ago (for tests that must know a port in advance).
pub fn free_tcp_port(ip: Ipv4Addr) -> u16 {
    let l = std::net::TcpListener::bind((ip, 0)).expect("bind an ephemeral port");
    l.local_addr().expect("local_addr").port()
}

/// Median of a non-empty list.
pub fn median(mut v: Vec<u64>) -> u64 {
    assert!(!v.is_empty(), "median of an empty list");
    v.sort_unstable();
    v[v.len() / 2]
}
