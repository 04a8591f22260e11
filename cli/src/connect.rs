//! Reaching the controller: address and TLS settings (the agent's `tls_*` keys, from flags,
//! `RPINGMESH_*` variables or an agent YAML), the channel with its timeouts, and the
//! failure classes that become the exit codes.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use rpingmesh_proto::endpoint::check_client_tls_files;
use rpingmesh_proto::operator::operator_service_client::OperatorServiceClient;

/// Exit status: the controller answered every call.
pub const EXIT_OK: u8 = 0;
/// Exit status: the controller answered with an error status (bad filter, unsupported call).
pub const EXIT_RPC: u8 = 1;
/// Exit status: bad flags, environment or config file (clap's own usage errors are 2 too).
pub const EXIT_USAGE: u8 = 2;
/// Exit status: the controller could not be reached (connect, TLS handshake, deadline).
pub const EXIT_UNREACHABLE: u8 = 3;
/// Exit status: the controller refused the caller (no or unknown token or certificate:
/// UNAUTHENTICATED; a role that may not do this: PERMISSION_DENIED).
pub const EXIT_DENIED: u8 = 4;

/// The operator API client every command uses (with the bearer token, if any).
pub type Operator = OperatorServiceClient<InterceptedService<Channel, Bearer>>;

/// Adds `authorization: Bearer TOKEN` to every call (`--token-file`).
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A bearer token; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

pub const DEFAULT_CONTROLLER: &str = "localhost:50051";

/// Why a command failed; each class has its own exit status. The text is one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The controller answered with an error status.
    Rpc(String),
    /// Bad flags, environment or config file.
    Usage(String),
    /// No answer from the controller.
    Unreachable(String),
    /// The controller refused who we are or what our role may do.
    Denied(String),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Rpc(_) => EXIT_RPC,
            Failure::Usage(_) => EXIT_USAGE,
            Failure::Unreachable(_) => EXIT_UNREACHABLE,
            Failure::Denied(_) => EXIT_DENIED,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (Failure::Rpc(s) | Failure::Usage(s) | Failure::Unreachable(s) | Failure::Denied(s)) =
            self;
        f.write_str(s)
    }
}

/// `tls_mode`, as the agent spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    Disabled,
    Tls,
    Mtls,
}

impl TlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            TlsMode::Disabled => "disabled",
            TlsMode::Tls => "tls",
            TlsMode::Mtls => "mtls",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "disabled" => Some(TlsMode::Disabled),
            "tls" => Some(TlsMode::Tls),
            "mtls" => Some(TlsMode::Mtls),
            _ => None,
        }
    }
}

/// Connection settings as given on the command line (flags already merged with their
/// `RPINGMESH_*` variables by clap); `None` = not given. Global: they go before or after
/// the subcommand.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Connection")]
pub struct Given {
    /// Controller gRPC address (host:port, http:// or https://) [default: localhost:50051]
    #[arg(long, global = true, env = "RPINGMESH_CONTROLLER_ADDR")]
    pub controller: Option<String>,
    /// Agent YAML (configs/agent.yaml) to take controller_addr and tls_* from.
    #[arg(long, global = true, value_name = "AGENT_YAML")]
    pub config: Option<PathBuf>,
    /// disabled, tls (server authenticated) or mtls (client certificate too) [default: disabled]
    #[arg(long, global = true, env = "RPINGMESH_TLS_MODE", value_enum)]
    pub tls_mode: Option<TlsMode>,
    /// Client certificate (PEM), for mtls.
    #[arg(
        long,
        global = true,
        env = "RPINGMESH_TLS_CERT_FILE",
        value_name = "PEM"
    )]
    pub tls_cert_file: Option<String>,
    /// Client private key (PEM), for mtls.
    #[arg(
        long,
        global = true,
        env = "RPINGMESH_TLS_KEY_FILE",
        value_name = "PEM"
    )]
    pub tls_key_file: Option<String>,
    /// CA certificate (PEM) the controller's certificate must chain to, for tls and mtls.
    #[arg(long, global = true, env = "RPINGMESH_TLS_CA_FILE", value_name = "PEM")]
    pub tls_ca_file: Option<String>,
    /// Name to check the controller's certificate against (default: the address's host).
    #[arg(
        long,
        global = true,
        env = "RPINGMESH_TLS_SERVER_NAME",
        value_name = "NAME"
    )]
    pub tls_server_name: Option<String>,
    /// File with an operator or viewer bearer token (sent as `authorization: Bearer`).
    #[arg(long, global = true, env = "RPINGMESH_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Seconds to wait for the connection and for each call.
    #[arg(long = "timeout-sec", global = true, visible_alias = "timeout", value_name = "SECS",
          default_value = "5", value_parser = parse_timeout)]
    pub timeout: Duration,
}

/// `--timeout-sec`: whole seconds, 1 to 3600.
fn parse_timeout(s: &str) -> Result<Duration, String> {
    match s.parse::<u64>() {
        Ok(n @ 1..=3600) => Ok(Duration::from_secs(n)),
        _ => Err(format!(
            "{s:?} is not a whole number of seconds from 1 to 3600"
        )),
    }
}

/// Resolved and validated connection settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub controller: String,
    pub tls_mode: TlsMode,
    pub tls_cert_file: String,
    pub tls_key_file: String,
    pub tls_ca_file: String,
    pub tls_server_name: String,
    pub token: Option<Token>,
    pub timeout: Duration,
}

/// What one command runs with: a client of the controller, the controller as resolved (its
/// address and timeout name a failure) and whether the output is JSON rows.
pub struct Call<'a> {
    pub op: Operator,
    pub target: &'a Target,
    pub json: bool,
}

/// The keys rpingmeshctl takes from an agent YAML; every other key is ignored.
const FILE_KEYS: [&str; 6] = [
    "controller_addr",
    "tls_mode",
    "tls_cert_file",
    "tls_key_file",
    "tls_ca_file",
    "tls_server_name",
];

/// Reads `controller_addr` and the `tls_*` keys of an agent YAML (other keys ignored).
fn read_agent_yaml(path: &Path) -> Result<Vec<(&'static str, String)>, Failure> {
    let usage = |m: String| Failure::Usage(format!("--config {}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| usage(format!("cannot read: {e}")))?;
    let doc: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_saphyr::from_str(&text).map_err(|e| usage(format!("bad YAML: {}", one_line(&e))))?
    };
    let map = match doc {
        serde_json::Value::Object(m) => m,
        serde_json::Value::Null => return Ok(Vec::new()),
        _ => return Err(usage("expected a mapping of config keys".into())),
    };
    let mut out = Vec::new();
    for key in FILE_KEYS {
        let v = match map.get(key) {
            None | Some(serde_json::Value::Null) => continue,
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => v.to_string(),
            Some(_) => return Err(usage(format!("config key `{key}` must be a string"))),
        };
        out.push((key, v));
    }
    Ok(out)
}

/// The token of `--token-file`: its first line, trimmed; it must be one HTTP header value.
fn read_token(path: &Path) -> Result<Token, Failure> {
    let usage = |m: String| Failure::Usage(format!("--token-file {}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| usage(format!("cannot read: {e}")))?;
    let t = text.lines().next().unwrap_or("").trim();
    if t.is_empty() {
        return Err(usage("empty".into()));
    }
    if !t.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(usage(
            "the token must be printable ASCII without spaces".into(),
        ));
    }
    Ok(Token(t.to_string()))
}

fn one_line(e: &dyn std::fmt::Display) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Flags (and their variables) over the agent YAML of `--config` over defaults, then the
/// agent's TLS checks: `tls` needs `tls_ca_file`; `mtls` needs it plus cert and key.
pub fn resolve(g: &Given) -> Result<Target, Failure> {
    let file = match &g.config {
        Some(p) => read_agent_yaml(p)?,
        None => Vec::new(),
    };
    let from_file = |key: &str| file.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone());
    let pick = |flag: &Option<String>, key: &str| {
        flag.clone().or_else(|| from_file(key)).unwrap_or_default()
    };
    let tls_mode = match g.tls_mode {
        Some(m) => m,
        None => match from_file("tls_mode") {
            None => TlsMode::Disabled,
            Some(s) => TlsMode::parse(&s).ok_or_else(|| {
                Failure::Usage(format!(
                    "tls_mode must be disabled, tls or mtls, got {s:?} (in {})",
                    g.config.as_deref().unwrap_or(Path::new("?")).display()
                ))
            })?,
        },
    };
    let mut controller = pick(&g.controller, "controller_addr");
    if g.controller.is_none() && from_file("controller_addr").is_none() {
        controller = DEFAULT_CONTROLLER.into();
    }
    let t = Target {
        controller: controller.trim().to_string(),
        tls_mode,
        tls_cert_file: pick(&g.tls_cert_file, "tls_cert_file"),
        tls_key_file: pick(&g.tls_key_file, "tls_key_file"),
        tls_ca_file: pick(&g.tls_ca_file, "tls_ca_file"),
        tls_server_name: pick(&g.tls_server_name, "tls_server_name"),
        token: match &g.token_file {
            Some(p) => Some(read_token(p)?),
            None => None,
        },
        timeout: g.timeout.max(Duration::from_millis(100)),
    };
    if t.controller.is_empty() {
        return Err(Failure::Usage(
            "--controller must not be empty (e.g. localhost:50051)".into(),
        ));
    }
    let scheme = t.controller.to_ascii_lowercase();
    let scheme = scheme.split_once("://").map_or("", |(s, _)| s);
    match (t.tls_mode, scheme) {
        (TlsMode::Disabled, "https" | "grpcs") => {
            return Err(Failure::Usage(format!(
                "--controller {}: an {scheme}:// address needs --tls-mode tls or mtls",
                t.controller
            )))
        }
        (TlsMode::Tls | TlsMode::Mtls, "http" | "grpc") => {
            return Err(Failure::Usage(format!(
                "--controller {}: tls_mode {} needs host:port or an https:// address",
                t.controller,
                t.tls_mode.as_str()
            )))
        }
        _ => {}
    }
    t.validate_tls()?;
    Ok(t)
}

impl Target {
    /// The agent's `validate_tls`, with the flag names added.
    fn validate_tls(&self) -> Result<(), Failure> {
        let need = |key: &str, v: &str| -> Result<(), Failure> {
            let flag = format!("--{}", key.replace('_', "-"));
            if v.is_empty() {
                return Err(Failure::Usage(format!(
                    "{key} is required when tls_mode is {} (set {flag}, RPINGMESH_{} or {key} in --config)",
                    self.tls_mode.as_str(),
                    key.to_ascii_uppercase()
                )));
            }
            if !Path::new(v).is_file() {
                return Err(Failure::Usage(format!("{key}: file {v} does not exist")));
            }
            // Checked here so that a wrong file is a usage error, not a failed handshake.
            let text = std::fs::read(v)
                .map_err(|e| Failure::Usage(format!("{key}: cannot read {v}: {e}")))?;
            let text = String::from_utf8_lossy(&text);
            let (marker, what) = if key == "tls_key_file" {
                ("PRIVATE KEY-----", "PEM private key")
            } else {
                ("-----BEGIN CERTIFICATE-----", "PEM certificate")
            };
            if !text.contains(marker) {
                return Err(Failure::Usage(format!("{key}: {v} holds no {what}")));
            }
            Ok(())
        };
        let files = [&self.tls_ca_file, &self.tls_cert_file, &self.tls_key_file];
        check_client_tls_files(self.tls_mode.as_str(), files.map(String::as_str), need)
    }

    /// The endpoint as the agent builds it: `https://` with TLS, the CA as the only root,
    /// the client identity with mTLS, `tls_server_name` to override the checked name.
    pub fn endpoint(&self) -> Result<Endpoint, Failure> {
        let tls = self.tls_mode != TlsMode::Disabled;
        let uri = rpingmesh_proto::endpoint::grpc_uri(&self.controller, tls);
        let mut ep = Endpoint::from_shared(uri)
            .map_err(|e| {
                Failure::Usage(format!(
                    "bad --controller address {:?}: {}",
                    self.controller,
                    chain(&e)
                ))
            })?
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .tcp_nodelay(true);
        if tls {
            let cfg = rpingmesh_proto::endpoint::client_tls_config(
                self.tls_mode == TlsMode::Mtls,
                &self.tls_ca_file,
                &self.tls_cert_file,
                &self.tls_key_file,
                &self.tls_server_name,
            )
            .map_err(Failure::Usage)?;
            ep = ep.tls_config(cfg).map_err(|e| {
                Failure::Usage(format!(
                    "tls_mode {}: bad TLS setup: {}",
                    self.tls_mode.as_str(),
                    chain(&e)
                ))
            })?;
        }
        Ok(ep)
    }

    /// Connects now (TCP and, with TLS, the handshake), bounded by the timeout.
    pub async fn connect(&self) -> Result<Operator, Failure> {
        let ep = self.endpoint()?;
        let ch = match tokio::time::timeout(self.timeout, ep.connect()).await {
            Ok(Ok(ch)) => ch,
            Ok(Err(e)) => return Err(self.unreachable(&chain(&e))),
            Err(_) => {
                return Err(self.unreachable(&format!("no connection within {:?}", self.timeout)))
            }
        };
        let bearer =
            match &self.token {
                Some(Token(t)) => Some(format!("Bearer {t}").parse().map_err(|_| {
                    Failure::Usage("--token-file: not a valid header value".into())
                })?),
                None => None,
            };
        Ok(OperatorServiceClient::with_interceptor(ch, Bearer(bearer)))
    }

    fn unreachable(&self, why: &str) -> Failure {
        // tonic wraps every cause in "transport error"; keep the cause.
        let why = why.replace("transport error: ", "");
        let mut parts: Vec<&str> = why.split(": ").collect();
        parts.dedup();
        let why = parts.join(": ");
        let mut s = format!("cannot reach controller at {}: {why}", self.controller);
        if let Some(hint) = self.hint(&why) {
            s.push_str(" (");
            s.push_str(hint);
            s.push(')');
        }
        Failure::Unreachable(s)
    }

    /// What to check when the failure looks like a TLS mismatch. With TLS 1.3 a refused
    /// client certificate is seen by the client only as a connection closed at the first
    /// call (or a fatal alert): the hint names the likely cause.
    fn hint(&self, why: &str) -> Option<&'static str> {
        let w = why.to_ascii_lowercase();
        let closed = [
            "connection closed",
            "broken pipe",
            "reset",
            "canceled",
            "alert",
            "eof",
            "protocol error",
            "frame",
        ]
        .iter()
        .any(|k| w.contains(k));
        let bad_peer = w.contains("invalid peer certificate");
        match self.tls_mode {
            TlsMode::Disabled if closed => {
                Some("is the controller running TLS? try --tls-mode tls or mtls")
            }
            TlsMode::Tls | TlsMode::Mtls if bad_peer => Some(
                "the controller's certificate does not match --tls-ca-file or the server name; see --tls-server-name",
            ),
            TlsMode::Tls if closed || w.contains("certificaterequired") => Some(
                "the controller may require a client certificate: --tls-mode mtls with --tls-cert-file and --tls-key-file",
            ),
            TlsMode::Mtls if closed => Some(
                "the controller may have refused the client certificate: is --tls-cert-file signed by the CA the controller trusts?",
            ),
            _ => None,
        }
    }

    /// The RPC's answer, or its failure as [`Self::rpc_failure`] classifies it (`what`
    /// names the call in the message).
    pub fn answer<T>(
        &self,
        what: &str,
        r: Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T, Failure> {
        r.map(tonic::Response::into_inner)
            .map_err(|s| self.rpc_failure(what, s))
    }

    /// Classifies an RPC failure: a status the controller sent is `Rpc`; a status made on
    /// this side from a transport failure, `Unavailable` and deadlines are `Unreachable`.
    pub fn rpc_failure(&self, what: &str, s: tonic::Status) -> Failure {
        use std::error::Error;
        let msg = s.message().replace('\n', " ");
        let local = s.source().is_some();
        if local && s.code() == tonic::Code::Cancelled && msg == "Timeout expired" {
            return self.unreachable(&format!("no answer to {what} within {:?}", self.timeout));
        }
        if local
            || matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
            )
        {
            let why = match s.source() {
                Some(src) => {
                    let c = chain(src);
                    if c.contains(&msg) {
                        c
                    } else {
                        format!("{msg}: {c}")
                    }
                }
                None => msg,
            };
            return self.unreachable(&format!("{what}: {why}"));
        }
        match s.code() {
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                Failure::Denied(format!("{what}: {:?}: {msg}", s.code()))
            }
            tonic::Code::Unimplemented => Failure::Rpc(format!(
                "{what}: the controller at {} does not support this call ({msg})",
                self.controller
            )),
            c => Failure::Rpc(format!("{what}: {c:?}: {msg}")),
        }
    }
}

/// An error with its causes on one line ("transport error: ...: Connection refused").
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s.replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A file that passes the PEM checks (content is not parsed before connecting).
    fn pem_file() -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(
            f,
            "-----BEGIN CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----"
        )
        .unwrap();
        f
    }

    fn given() -> Given {
        Given {
            timeout: Duration::from_secs(5),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_are_plaintext_localhost() {
        let t = resolve(&given()).unwrap();
        assert_eq!(t.controller, DEFAULT_CONTROLLER);
        assert_eq!(t.tls_mode, TlsMode::Disabled);
    }

    #[test]
    fn tls_checks_mirror_the_agent() {
        let e = resolve(&Given {
            tls_mode: Some(TlsMode::Tls),
            ..given()
        })
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("tls_ca_file is required when tls_mode is tls"),
            "{e}"
        );
        assert_eq!(e.exit_code(), EXIT_USAGE);
        let e = resolve(&Given {
            tls_mode: Some(TlsMode::Tls),
            tls_ca_file: Some("/nonexistent/ca.pem".into()),
            ..given()
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "tls_ca_file: file /nonexistent/ca.pem does not exist"
        );
        let empty = tempfile::NamedTempFile::new().unwrap();
        let e = resolve(&Given {
            tls_mode: Some(TlsMode::Tls),
            tls_ca_file: Some(empty.path().to_str().unwrap().into()),
            ..given()
        })
        .unwrap_err();
        assert!(e.to_string().ends_with("holds no PEM certificate"), "{e}");
        let f = pem_file();
        let p = f.path().to_str().unwrap().to_string();
        let e = resolve(&Given {
            tls_mode: Some(TlsMode::Mtls),
            tls_ca_file: Some(p.clone()),
            tls_cert_file: Some(p.clone()),
            ..given()
        })
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("tls_key_file is required when tls_mode is mtls"),
            "{e}"
        );
        // Files are ignored when TLS is disabled, as by the agent.
        resolve(&Given {
            tls_cert_file: Some("/nonexistent".into()),
            ..given()
        })
        .unwrap();
    }

    #[test]
    fn agent_yaml_below_flags() {
        let ca = pem_file();
        let ca_path = ca.path().to_str().unwrap();
        let mut f = tempfile::NamedTempFile::new().unwrap();
        write!(
            f,
            "tor_id: tor-1\nprobe_interval_ms: 100\ncontroller_addr: ctl.example:50051\n\
             tls_mode: tls\ntls_ca_file: {ca_path}\ntls_server_name: 7\n"
        )
        .unwrap();
        let g = Given {
            config: Some(f.path().to_path_buf()),
            ..given()
        };
        let t = resolve(&g).unwrap();
        assert_eq!(t.controller, "ctl.example:50051");
        assert_eq!(t.tls_mode, TlsMode::Tls);
        assert_eq!(t.tls_ca_file, ca_path);
        assert_eq!(t.tls_server_name, "7");
        let t = resolve(&Given {
            controller: Some("other:1".into()),
            tls_mode: Some(TlsMode::Disabled),
            ..g
        })
        .unwrap();
        assert_eq!(t.controller, "other:1");
        assert_eq!(t.tls_mode, TlsMode::Disabled);
    }

    #[test]
    fn bad_agent_yaml_is_a_usage_error() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "tls_mode: ssl").unwrap();
        let e = resolve(&Given {
            config: Some(f.path().to_path_buf()),
            ..given()
        })
        .unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        assert!(e.to_string().contains("tls_mode"), "{e}");
        let e = resolve(&Given {
            config: Some("/nonexistent/agent.yaml".into()),
            ..given()
        })
        .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/agent.yaml"), "{e}");
        let mut f = tempfile::NamedTempFile::new().unwrap();
        writeln!(f, "tls_mode: [unterminated").unwrap();
        let e = resolve(&Given {
            config: Some(f.path().to_path_buf()),
            ..given()
        })
        .unwrap_err();
        assert!(
            !e.to_string().contains('\n') && e.to_string().contains("bad YAML"),
            "{e}"
        );
    }

    #[test]
    fn scheme_must_match_the_mode() {
        let e = resolve(&Given {
            controller: Some("https://h:1".into()),
            ..given()
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("needs --tls-mode tls or mtls"),
            "{e}"
        );
        let f = pem_file();
        let e = resolve(&Given {
            controller: Some("http://h:1".into()),
            tls_mode: Some(TlsMode::Tls),
            tls_ca_file: Some(f.path().to_str().unwrap().into()),
            ..given()
        })
        .unwrap_err();
        assert_eq!(e.exit_code(), EXIT_USAGE);
        let t = resolve(&Given {
            controller: Some("https://h:1".into()),
            tls_mode: Some(TlsMode::Tls),
            tls_ca_file: Some(f.path().to_str().unwrap().into()),
            ..given()
        })
        .unwrap();
        assert_eq!(t.controller, "https://h:1");
    }

    #[test]
    fn status_classes() {
        let t = resolve(&given()).unwrap();
        let f = t.rpc_failure("x", tonic::Status::invalid_argument("bad gid"));
        assert_eq!(f, Failure::Rpc("x: InvalidArgument: bad gid".into()));
        let f = t.rpc_failure("x", tonic::Status::unavailable("down"));
        assert_eq!(f.exit_code(), EXIT_UNREACHABLE);
        let f = t.rpc_failure("x", tonic::Status::deadline_exceeded("slow"));
        assert_eq!(f.exit_code(), EXIT_UNREACHABLE);
        let f = t.rpc_failure("x", tonic::Status::unimplemented(""));
        assert_eq!(f.exit_code(), EXIT_RPC);
    }
}
