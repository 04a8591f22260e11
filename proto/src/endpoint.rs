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
