//! The names a client certificate carries (SAN DNS names and URIs, subject CN and OU) and
//! which of them is the caller's identity. Pure: bytes in, names out; the bytes come from
//! a TLS peer, so every malformed input is an error, never a panic (fuzzed).

use rustls_pki_types::CertificateDer;

/// The names of one certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertNames {
    pub dns: Vec<String>,
    pub uris: Vec<String>,
    /// The subject's common name (the first, if several).
    pub cn: Option<String>,
    /// The subject's organizational units (roles map from them).
    pub ous: Vec<String>,
}

/// Where the agent identity is read from (`tls_identity_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdentitySource {
    /// The first SAN DNS name, else the first SAN URI, else the subject CN.
    Auto,
    SanDns,
    SanUri,
    Cn,
}

impl IdentitySource {
    pub const NAMES: &'static str = "auto, san_dns, san_uri or cn";

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => IdentitySource::Auto,
            "san_dns" => IdentitySource::SanDns,
            "san_uri" => IdentitySource::SanUri,
            "cn" => IdentitySource::Cn,
            _ => return None,
        })
    }
}

impl CertNames {
    /// The identity `from` names, if the certificate has one there.
    pub fn identity(&self, from: IdentitySource) -> Option<&str> {
        let dns = self.dns.first().map(String::as_str);
        let uri = self.uris.first().map(String::as_str);
        let cn = self.cn.as_deref();
        match from {
            IdentitySource::Auto => dns.or(uri).or(cn),
            IdentitySource::SanDns => dns,
            IdentitySource::SanUri => uri,
            IdentitySource::Cn => cn,
        }
        .filter(|s| !s.is_empty())
    }
}

/// A certificate the names could not be read from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("client certificate: {0}")]
pub struct CertError(pub String);

/// Reads the names of a DER certificate (the TLS layer has verified its chain already).
pub fn cert_names(der: &[u8]) -> Result<CertNames, CertError> {
    let der = CertificateDer::from(der);
    let cert = webpki::EndEntityCert::try_from(&der)
        .map_err(|e| CertError(format!("not a readable X.509 certificate ({e:?})")))?;
    let mut names = CertNames {
        dns: cert.valid_dns_names().map(str::to_string).collect(),
        uris: cert.valid_uri_names().map(str::to_string).collect(),
        ..Default::default()
    };
    for (oid, value) in subject_attributes(cert.subject())? {
        match oid {
            OID_CN if names.cn.is_none() => names.cn = Some(value),
            OID_OU => names.ous.push(value),
            _ => {}
        }
    }
    Ok(names)
}

/// id-at-commonName (2.5.4.3) and id-at-organizationalUnitName (2.5.4.11), DER content.
const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
const OID_OU: &[u8] = &[0x55, 0x04, 0x0b];

const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
const TAG_OID: u8 = 0x06;

/// The (OID, text) pairs of a subject Name's content (the RDNSequence without its outer
/// SEQUENCE header, as webpki hands it out). Values that are not strings are skipped.
pub fn subject_attributes(subject: &[u8]) -> Result<Vec<(&[u8], String)>, CertError> {
    let mut out = Vec::new();
    let mut rdns = subject;
    while !rdns.is_empty() {
        let (set, rest) = tlv(rdns, TAG_SET, "subject RDN")?;
        rdns = rest;
        let mut atvs = set;
        while !atvs.is_empty() {
            let (atv, rest) = tlv(atvs, TAG_SEQUENCE, "subject attribute")?;
            atvs = rest;
            let (oid, value) = tlv(atv, TAG_OID, "attribute type")?;
            let (tag, content, _) = any_tlv(value, "attribute value")?;
            if let Some(text) = directory_string(tag, content) {
                out.push((oid, text));
            }
        }
    }
    Ok(out)
}

/// A DirectoryString's text: UTF8String, PrintableString, IA5String, TeletexString (read
/// as Latin-1) or BMPString (UTF-16BE).
fn directory_string(tag: u8, content: &[u8]) -> Option<String> {
    match tag {
        0x0c | 0x13 | 0x16 => std::str::from_utf8(content).ok().map(str::to_string),
        0x14 => Some(content.iter().map(|&b| b as char).collect()),
        0x1e if content.len().is_multiple_of(2) => {
            let units: Vec<u16> = content
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16(&units).ok()
        }
        _ => None,
    }
}

/// One TLV with the expected tag: (content, rest).
fn tlv<'a>(b: &'a [u8], want: u8, what: &str) -> Result<(&'a [u8], &'a [u8]), CertError> {
    let (tag, content, rest) = any_tlv(b, what)?;
    if tag != want {
        return Err(CertError(format!(
            "{what}: tag 0x{tag:02x}, expected 0x{want:02x}"
        )));
    }
    Ok((content, rest))
}

/// One DER TLV (single-byte tags; definite lengths of at most 4 bytes): (tag, content, rest).
fn any_tlv<'a>(b: &'a [u8], what: &str) -> Result<(u8, &'a [u8], &'a [u8]), CertError> {
    let short = || CertError(format!("{what}: truncated"));
    let (&tag, b) = b.split_first().ok_or_else(short)?;
    let (&first, mut b) = b.split_first().ok_or_else(short)?;
    let len = if first < 0x80 {
        first as usize
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || b.len() < n {
            return Err(CertError(format!("{what}: bad length")));
        }
        let len = b[..n].iter().fold(0usize, |a, &x| (a << 8) | x as usize);
        b = &b[n..];
        len
    };
    if b.len() < len {
        return Err(short());
    }
    Ok((tag, &b[..len], &b[len..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RDNs of a subject: each (oid, tag, value) in its own SET.
    fn subject(attrs: &[(&[u8], u8, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (oid, tag, value) in attrs {
            let mut atv = vec![TAG_OID, oid.len() as u8];
            atv.extend_from_slice(oid);
            atv.extend_from_slice(&[*tag, value.len() as u8]);
            atv.extend_from_slice(value);
            let mut seq = vec![TAG_SEQUENCE, atv.len() as u8];
            seq.extend(atv);
            out.extend_from_slice(&[TAG_SET, seq.len() as u8]);
            out.extend(seq);
        }
        out
    }

    #[test]
    fn subject_cn_and_ous_in_every_string_type() {
        let s = subject(&[
            (&[0x55, 0x04, 0x06], 0x13, b"JP"),
            (OID_OU, 0x0c, b"operators"),
            (OID_CN, 0x13, b"gpu001"),
            (OID_OU, 0x1e, &[0, b'v', 0, b'x']),
        ]);
        let attrs = subject_attributes(&s).unwrap();
        let texts: Vec<&str> = attrs.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(texts, ["JP", "operators", "gpu001", "vx"]);
        assert_eq!(attrs[2].0, OID_CN);
    }

    #[test]
    fn malformed_subjects_are_errors_not_panics() {
        let good = subject(&[(OID_CN, 0x0c, b"gpu001")]);
        for cut in 0..good.len() {
            assert!(subject_attributes(&good[..cut]).is_err() || cut == 0);
        }
        assert!(subject_attributes(&[TAG_SET, 0x85, 1, 2, 3, 4, 5]).is_err());
        assert!(subject_attributes(&[TAG_SEQUENCE, 0]).is_err());
        assert!(cert_names(b"not a certificate").is_err());
    }

    #[test]
    fn identity_prefers_what_the_config_names() {
        let n = CertNames {
            dns: vec!["gpu001.example".into()],
            uris: vec!["spiffe://fleet/agent/gpu001".into()],
            cn: Some("gpu001".into()),
            ous: vec![],
        };
        assert_eq!(n.identity(IdentitySource::Auto), Some("gpu001.example"));
        assert_eq!(n.identity(IdentitySource::Cn), Some("gpu001"));
        assert_eq!(
            n.identity(IdentitySource::SanUri),
            Some("spiffe://fleet/agent/gpu001")
        );
        let cn_only = CertNames {
            cn: Some("gpu002".into()),
            ..Default::default()
        };
        assert_eq!(cn_only.identity(IdentitySource::Auto), Some("gpu002"));
        assert_eq!(cn_only.identity(IdentitySource::SanDns), None);
        assert_eq!(
            IdentitySource::parse("SAN_DNS"),
            Some(IdentitySource::SanDns)
        );
        assert_eq!(IdentitySource::parse("subject"), None);
    }
}
