//! Probe targets as the driver sees them: a pinglist entry with its GID parsed.

use std::net::Ipv6Addr;

use rpingmesh_proto::controller_agent::PingTarget;
use rpingmesh_proto::gid::{format_gid, parse_gid};
use rpingmesh_protocol::PinglistKind;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    pub gid: Ipv6Addr,
    /// Full-form GID text (what summaries carry).
    pub gid_text: String,
    pub qpn: u32,
    pub tor_id: String,
    pub hostname: String,
    pub device_name: String,
    /// The target RNIC's IP address (where its RC ring listener is), as registered.
    pub ip: String,
    pub kind: PinglistKind,
    /// Legacy single label, used verbatim when `flow_label_count <= 1`.
    pub flow_label: u32,
    pub flow_label_count: u32,
    pub flow_label_seed: u32,
    /// SERVICE targets: the service's GRH traffic class and SL (0 = the agent's config).
    pub traffic_class: u8,
    pub service_level: u8,
    /// SERVICE targets: the service name (empty otherwise).
    pub service: String,
    /// FOCUS targets: exactly these flow labels (empty otherwise).
    pub flow_labels: Vec<u32>,
}

impl ProbeTarget {
    /// Converts a pinglist entry; `kind` is the list it came in. A bad GID is an error
    /// naming it (the caller skips that entry).
    pub fn from_proto(t: &PingTarget, kind: PinglistKind) -> Result<Self, String> {
        let gid = parse_gid(&t.target_gid).map_err(|e| e.to_string())?;
        Ok(ProbeTarget {
            gid,
            gid_text: format_gid(&gid),
            qpn: t.target_qpn,
            tor_id: t.target_tor_id.clone(),
            hostname: t.target_hostname.clone(),
            device_name: t.target_device_name.clone(),
            ip: t.target_ip.clone(),
            kind,
            flow_label: t.flow_label,
            flow_label_count: t.flow_label_count,
            flow_label_seed: t.flow_label_seed,
            // Out-of-range values are a bad entry, not something to truncate silently.
            traffic_class: u8::try_from(t.traffic_class).map_err(|_| {
                format!(
                    "target {}: traffic_class {} > 255",
                    t.target_gid, t.traffic_class
                )
            })?,
            service_level: u8::try_from(t.service_level)
                .ok()
                .filter(|sl| *sl <= 15)
                .ok_or_else(|| {
                    format!(
                        "target {}: service_level {} > 15",
                        t.target_gid, t.service_level
                    )
                })?,
            service: if kind == PinglistKind::Service {
                t.service.clone()
            } else {
                String::new()
            },
            flow_labels: if kind == PinglistKind::Focus {
                t.flow_labels.clone()
            } else {
                Vec::new()
            },
        })
    }

    /// A target for tests and benches (no controller): one flow label.
    pub fn new(gid: Ipv6Addr, qpn: u32, tor_id: &str, kind: PinglistKind) -> Self {
        ProbeTarget {
            gid,
            gid_text: format_gid(&gid),
            qpn,
            tor_id: tor_id.to_string(),
            hostname: String::new(),
            device_name: String::new(),
            ip: String::new(),
            kind,
            flow_label: 0,
            flow_label_count: 1,
            flow_label_seed: 0,
            traffic_class: 0,
            service_level: 0,
            service: String::new(),
            flow_labels: Vec::new(),
        }
    }
}

/// The pinglists of one RNIC, as last fetched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pinglists {
    pub tor_mesh: Vec<ProbeTarget>,
    pub inter_tor: Vec<ProbeTarget>,
    pub service: Vec<ProbeTarget>,
    /// Adaptive probing: through what the controller suspects (usually empty).
    pub focus: Vec<ProbeTarget>,
    /// Hostping R2R: the other RNICs of this host (made by the agent, not fetched).
    pub host: Vec<ProbeTarget>,
}

impl Pinglists {
    pub fn list(&self, kind: PinglistKind) -> &[ProbeTarget] {
        match kind {
            PinglistKind::TorMesh => &self.tor_mesh,
            PinglistKind::InterTor => &self.inter_tor,
            PinglistKind::Service => &self.service,
            PinglistKind::Focus => &self.focus,
            PinglistKind::Host => &self.host,
        }
    }
    pub fn list_mut(&mut self, kind: PinglistKind) -> &mut Vec<ProbeTarget> {
        match kind {
            PinglistKind::TorMesh => &mut self.tor_mesh,
            PinglistKind::InterTor => &mut self.inter_tor,
            PinglistKind::Service => &mut self.service,
            PinglistKind::Focus => &mut self.focus,
            PinglistKind::Host => &mut self.host,
        }
    }
}

/// Converts a fetched list, skipping (and returning) entries with a bad GID.
pub fn convert_list(list: &[PingTarget], kind: PinglistKind) -> (Vec<ProbeTarget>, Vec<String>) {
    let mut ok = Vec::with_capacity(list.len());
    let mut bad = Vec::new();
    for t in list {
        match ProbeTarget::from_proto(t, kind) {
            Ok(p) => ok.push(p),
            Err(e) => bad.push(e),
        }
    }
    (ok, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converts_and_normalizes() {
        let t = PingTarget {
            target_gid: "fe80::1".into(),
            target_qpn: 7,
            target_tor_id: "tor-b".into(),
            flow_label_count: 4,
            flow_label_seed: 0xdead_beef,
            ..Default::default()
        };
        let bad = PingTarget {
            target_gid: "nope".into(),
            ..Default::default()
        };
        let (ok, errs) = convert_list(&[t, bad], PinglistKind::InterTor);
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].gid_text, "fe80:0000:0000:0000:0000:0000:0000:0001");
        assert_eq!(ok[0].kind, PinglistKind::InterTor);
        assert_eq!(ok[0].flow_label_seed, 0xdead_beef);
        assert_eq!(errs.len(), 1);
        assert!(errs[0].contains("nope"));
    }

    #[test]
    fn service_targets_keep_label_tc_sl_and_name() {
        let t = PingTarget {
            target_gid: "::ffff:127.0.5.2".into(),
            target_qpn: 18515,
            target_tor_id: "tor-b".into(),
            flow_label: 0x5a5a5,
            flow_label_count: 1,
            flow_label_seed: 0x5a5a5,
            traffic_class: 96,
            service_level: 4,
            service: "training".into(),
            pinglist_type: 2,
            ..Default::default()
        };
        let (ok, bad) = convert_list(std::slice::from_ref(&t), PinglistKind::Service);
        assert!(bad.is_empty());
        let p = &ok[0];
        assert_eq!(p.gid_text, "0000:0000:0000:0000:0000:ffff:7f00:0502");
        assert_eq!(
            (p.flow_label, p.traffic_class, p.service_level),
            (0x5a5a5, 96, 4)
        );
        assert_eq!(p.service, "training");
        // A ToR list ignores a stray service name.
        let (ok, _) = convert_list(std::slice::from_ref(&t), PinglistKind::TorMesh);
        assert_eq!(ok[0].service, "");
        // Out-of-range TC/SL are bad entries naming the target.
        let (ok, bad) = convert_list(
            &[
                PingTarget {
                    traffic_class: 300,
                    ..t.clone()
                },
                PingTarget {
                    service_level: 16,
                    ..t
                },
            ],
            PinglistKind::Service,
        );
        assert!(ok.is_empty());
        assert!(bad[0].contains("traffic_class 300"), "{}", bad[0]);
        assert!(bad[1].contains("service_level 16"), "{}", bad[1]);
    }
}
