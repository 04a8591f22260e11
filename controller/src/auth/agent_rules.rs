//! What an agent may say, given who its certificate says it is: the node-restriction
//! rules. Pure: the caller's identity and the registry index in, a denial or nothing out.
//!
//! An agent speaks for the agent_id its certificate names, for the hostname it registered,
//! and for the RNICs registered under its agent_id. Nothing else: not another agent's
//! registration, RNICs, paths, service flows or host report.

use super::identity::Denial;
use crate::registry::RegistryIndex;

fn deny(rpc: &'static str, reason: &'static str, message: String) -> Denial {
    Denial {
        rpc,
        reason,
        message: format!("{rpc}: {message}"),
    }
}

/// The request's agent_id must be the certificate's.
pub fn agent_id(rpc: &'static str, identity: &str, claimed: &str) -> Result<(), Denial> {
    if claimed == identity {
        return Ok(());
    }
    Err(deny(
        rpc,
        "agent_id",
        format!("certificate names agent {identity:?}, request speaks for agent {claimed:?}"),
    ))
}

/// A registration: its agent_id is the caller's, no GID is another agent's, and the
/// hostname is not another agent's.
pub fn registration(
    identity: &str,
    claimed: &str,
    hostname: &str,
    gids: &[&str],
    idx: &RegistryIndex,
) -> Result<(), Denial> {
    const RPC: &str = "RegisterAgent";
    agent_id(RPC, identity, claimed)?;
    for g in gids {
        if let Some(r) = idx.rnic(g) {
            if r.agent_id != identity {
                return Err(deny(
                    RPC,
                    "rnic_owner",
                    format!(
                        "certificate names agent {identity:?}, GID {g} is agent {:?}'s",
                        r.agent_id
                    ),
                ));
            }
        }
    }
    if !hostname.is_empty() && hostname != identity {
        if let Some(other) = idx
            .agents()
            .find(|a| a.hostname == hostname && a.agent_id != identity)
        {
            return Err(deny(
                RPC,
                "hostname",
                format!(
                    "certificate names agent {identity:?}, hostname {hostname:?} is agent {:?}'s",
                    other.agent_id
                ),
            ));
        }
    }
    Ok(())
}

/// A pinglist request: for the caller, and for one of its own RNICs.
pub fn pinglist(
    identity: &str,
    claimed: &str,
    requester_gid: Option<&str>,
    idx: &RegistryIndex,
) -> Result<(), Denial> {
    const RPC: &str = "GetPinglist";
    if !claimed.is_empty() {
        agent_id(RPC, identity, claimed)?;
    }
    match requester_gid {
        Some(g) => own_gid(RPC, "requester_gid", identity, g, idx),
        None => Ok(()),
    }
}

/// One GID the caller names as its own: unknown GIDs are left to the RPC's own checks
/// (not found), known ones must be the caller's.
pub fn own_gid(
    rpc: &'static str,
    reason: &'static str,
    identity: &str,
    gid: &str,
    idx: &RegistryIndex,
) -> Result<(), Denial> {
    match idx.rnic(gid) {
        Some(r) if r.agent_id != identity => Err(deny(
            rpc,
            reason,
            format!(
                "certificate names agent {identity:?}, GID {gid} is agent {:?}'s",
                r.agent_id
            ),
        )),
        _ => Ok(()),
    }
}

/// A path report: every summary's source RNIC is one the caller registered. `sources`
/// are normalized GIDs.
pub fn path_sources<'a>(
    identity: &str,
    claimed: &str,
    sources: impl IntoIterator<Item = &'a str>,
    idx: &RegistryIndex,
) -> Result<(), Denial> {
    const RPC: &str = "ReportProbeAnalysis";
    agent_id(RPC, identity, claimed)?;
    let own = idx.agent_gids(identity);
    for s in sources {
        if !own.iter().any(|g| g == s) {
            let whose = idx
                .rnic(s)
                .map(|r| format!("agent {:?}'s", r.agent_id))
                .unwrap_or_else(|| "not registered".into());
            return Err(deny(
                RPC,
                "source_gid",
                format!(
                    "certificate names agent {identity:?}, a summary's source GID {s} is {whose}"
                ),
            ));
        }
    }
    Ok(())
}

/// A host report: the caller's, about the host it registered (or the one its
/// certificate names).
pub fn host_report(
    identity: &str,
    claimed: &str,
    hostname: &str,
    idx: &RegistryIndex,
) -> Result<(), Denial> {
    const RPC: &str = "ReportHostHealth";
    agent_id(RPC, identity, claimed)?;
    let registered = idx.agent(identity).map(|a| a.hostname.as_str());
    if hostname == identity || registered == Some(hostname) {
        return Ok(());
    }
    Err(deny(
        RPC,
        "hostname",
        format!(
            "certificate names agent {identity:?} (host {:?}), report is about host {hostname:?}",
            registered.unwrap_or("not registered")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{AgentRecord, RnicRecord};

    const GA: &str = "fe80:0000:0000:0000:0000:0000:0000:00a1";
    const GB: &str = "fe80:0000:0000:0000:0000:0000:0000:00b1";

    fn fleet() -> RegistryIndex {
        let mut idx = RegistryIndex::default();
        for (id, host, gid) in [("a", "host-a", GA), ("b", "host-b", GB)] {
            let agent = AgentRecord {
                agent_id: id.into(),
                hostname: host.into(),
                tor_id: "tor".into(),
                ..Default::default()
            };
            let rnic = RnicRecord {
                gid: gid.into(),
                agent_id: id.into(),
                tor_id: "tor".into(),
                ..Default::default()
            };
            idx.register_agent(&agent, &[rnic], 1);
        }
        idx
    }

    #[test]
    fn an_agent_speaks_for_itself() {
        let idx = fleet();
        assert!(registration("a", "a", "host-a", &[GA], &idx).is_ok());
        assert!(pinglist("a", "a", Some(GA), &idx).is_ok());
        assert!(path_sources("a", "a", [GA], &idx).is_ok());
        assert!(host_report("a", "a", "host-a", &idx).is_ok());
        // A new agent registering fresh RNICs under its own name.
        assert!(registration("c", "c", "host-c", &["fe80::c1"], &idx).is_ok());
    }

    #[test]
    fn an_agent_cannot_speak_for_another() {
        let idx = fleet();
        let reasons = [
            registration("a", "b", "host-b", &[GB], &idx),
            registration("a", "a", "host-a", &[GA, GB], &idx),
            registration("a", "a", "host-b", &[GA], &idx),
            pinglist("a", "b", None, &idx),
            pinglist("a", "", Some(GB), &idx),
            path_sources("a", "a", [GA, GB], &idx),
            path_sources("a", "b", [GB], &idx),
            host_report("a", "a", "host-b", &idx),
            host_report("a", "b", "host-b", &idx),
        ]
        .map(|r| r.unwrap_err().reason);
        assert_eq!(
            reasons,
            [
                "agent_id",
                "rnic_owner",
                "hostname",
                "agent_id",
                "requester_gid",
                "source_gid",
                "agent_id",
                "hostname",
                "agent_id"
            ]
        );
        let d = path_sources("a", "a", [GB], &idx).unwrap_err();
        assert_eq!(
            d.message,
            format!(
                "ReportProbeAnalysis: certificate names agent \"a\", a summary's source GID {GB} is agent \"b\"'s"
            )
        );
    }
}
