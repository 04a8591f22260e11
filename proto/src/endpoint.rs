//! gRPC endpoint addresses as users write them, turned into the URIs tonic dials. One
//! place for the agent's controller_addr and both sides' otel_collector_addr, so the
//! forms the Go version accepts work everywhere: bare `host:port`, `grpc://host:port`
//! (the Go agent's default collector address), `grpcs://`, `http://`, `https://`.

/// The URI to dial for `addr`: `grpc://` means plaintext HTTP/2 (`http://`), `grpcs://`
/// TLS (`https://`); a bare `host:port` gets `https://` when `tls`, else `http://`; an
/// explicit `http(s)://` is kept.
pub fn grpc_uri(addr: &str, tls: bool) -> String {
    let a = addr.trim();
    if let Some(rest) = a.strip_prefix("grpc://") {
        format!("http://{rest}")
    } else if let Some(rest) = a.strip_prefix("grpcs://") {
        format!("https://{rest}")
    } else if a.contains("://") {
        a.to_string()
    } else if tls {
        format!("https://{a}")
    } else {
        format!("http://{a}")
    }
}

/// Checks each `tls_*` file a client's `tls_mode` needs with `need(key, value)` (`files`:
/// the CA, the certificate, the key): none when `disabled`, the CA with `tls`, all three
/// with `mtls`.
pub fn check_client_tls_files<E>(
    tls_mode: &str,
    files: [&str; 3],
    mut need: impl FnMut(&str, &str) -> Result<(), E>,
) -> Result<(), E> {
    let keys = ["tls_ca_file", "tls_cert_file", "tls_key_file"];
    let needed = match tls_mode {
        "mtls" => 3,
        "tls" => 1,
        _ => 0,
    };
    keys.into_iter()
        .zip(files)
        .take(needed)
        .try_for_each(|(key, v)| need(key, v))
}

/// Client TLS for a controller connection from the `tls_*` keys (the agent's and
/// rpingmeshctl's): the CA always, the client identity for mTLS, the server name when
/// set. A file that cannot be read is an error naming its key.
pub fn client_tls_config(
    mtls: bool,
    ca_file: &str,
    cert_file: &str,
    key_file: &str,
    server_name: &str,
) -> Result<tonic::transport::ClientTlsConfig, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let read = |key: &str, path: &str| {
        std::fs::read(path).map_err(|e| format!("{key}: cannot read {path}: {e}"))
    };
    let mut cfg =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read("tls_ca_file", ca_file)?));
    if mtls {
        cfg = cfg.identity(Identity::from_pem(
            read("tls_cert_file", cert_file)?,
            read("tls_key_file", key_file)?,
        ));
    }
    if !server_name.is_empty() {
        cfg = cfg.domain_name(server_name.to_string());
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_forms_and_ours() {
        assert_eq!(grpc_uri("localhost:4317", false), "http://localhost:4317");
        assert_eq!(
            grpc_uri("grpc://localhost:4317", false),
            "http://localhost:4317"
        );
        assert_eq!(grpc_uri("grpcs://c:4317", false), "https://c:4317");
        assert_eq!(grpc_uri(" c:1 ", true), "https://c:1");
        assert_eq!(grpc_uri("http://c:1", true), "http://c:1");
        assert_eq!(grpc_uri("https://c:1", false), "https://c:1");
    }
}
