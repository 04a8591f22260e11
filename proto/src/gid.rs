//! GID text form. GIDs travel as strings; we always write the full form (eight
//! zero-padded groups) and accept any IPv6 text form on input, so that two GIDs compare
//! equal as strings whatever their source.

use std::net::{IpAddr, Ipv6Addr};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid GID {0:?}: expected an IPv6 address (any text form) or an IPv4 address")]
pub struct GidError(pub String);

/// Full form of a GID: `fe80:0000:0000:0000:0001:0002:0003:0004`.
pub fn format_gid(addr: &Ipv6Addr) -> String {
    let s = addr.segments();
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}:{:04x}:{:04x}:{:04x}:{:04x}",
        s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]
    )
}

/// Parses any IPv6 text form (or an IPv4 address, taken as v4-mapped) into an address.
pub fn parse_gid(text: &str) -> Result<Ipv6Addr, GidError> {
    let t = text.trim();
    match t.parse::<IpAddr>() {
        Ok(IpAddr::V6(a)) => Ok(a),
        Ok(IpAddr::V4(a)) => Ok(a.to_ipv6_mapped()),
        Err(_) => Err(GidError(text.to_string())),
    }
}

/// Normalizes any accepted GID text into the full form.
pub fn normalize_gid(text: &str) -> Result<String, GidError> {
    parse_gid(text).map(|a| format_gid(&a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compressed_and_full_forms_normalize_equal() {
        let full = "fe80:0000:0000:0000:0001:0002:0003:0004";
        assert_eq!(normalize_gid("fe80::1:2:3:4").unwrap(), full);
        assert_eq!(normalize_gid(full).unwrap(), full);
        assert_eq!(normalize_gid("FE80::1:2:3:4").unwrap(), full);
    }

    #[test]
    fn ipv4_becomes_v4_mapped() {
        assert_eq!(
            normalize_gid("10.0.0.1").unwrap(),
            "0000:0000:0000:0000:0000:ffff:0a00:0001"
        );
        assert_eq!(
            normalize_gid("::ffff:10.0.0.1").unwrap(),
            "0000:0000:0000:0000:0000:ffff:0a00:0001"
        );
    }

    #[test]
    fn garbage_is_rejected_with_the_input_named() {
        let e = normalize_gid("not-a-gid").unwrap_err();
        assert!(e.to_string().contains("not-a-gid"));
        assert!(normalize_gid("").is_err());
    }
}
