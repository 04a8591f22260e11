//! Tests of `registry`.

use super::*;

fn rnic(gid: &str, tor: &str) -> RnicRecord {
    RnicRecord {
        gid: rpingmesh_proto::gid::normalize_gid(gid).unwrap(),
        qpn: 7,
        ip_address: "10.0.0.1".into(),
        host_name: "h".into(),
        tor_id: tor.into(),
        device_name: "mlx5_0".into(),
        agent_id: String::new(),
        last_updated: 0,
    }
}

fn agent(id: &str, tor: &str) -> AgentRecord {
    AgentRecord {
        agent_id: id.into(),
        agent_ip: "10.0.0.1".into(),
        hostname: "h".into(),
        tor_id: tor.into(),
        last_updated: 0,
    }
}

fn sorted(mut v: Vec<RnicRecord>) -> Vec<RnicRecord> {
    v.sort_by(|a, b| a.gid.cmp(&b.gid));
    v
}

fn index_rows(r: &IndexedRegistry) -> Vec<RnicRecord> {
    sorted(r.index().rnics().cloned().collect())
}

#[test]
fn sqlite_file_roundtrip_reloads_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.db");
    {
        let reg = IndexedRegistry::new(Box::new(SqliteRegistry::open(&path).unwrap())).unwrap();
        reg.register_agent(
            &agent("a1", "t1"),
            &[rnic("fd00::1", "t1"), rnic("fd00::2", "t1")],
            100,
        )
        .unwrap();
        reg.register_agent(&agent("a2", "t2"), &[rnic("fd00::3", "t2")], 200)
            .unwrap();
        assert_eq!(index_rows(&reg), sorted(reg.store_rnics().unwrap()));
    }
    let reg = IndexedRegistry::new(Box::new(SqliteRegistry::open(&path).unwrap())).unwrap();
    let idx = reg.index();
    idx.check();
    assert_eq!(idx.len(), 3);
    assert_eq!(idx.tor_gids("t1").len(), 2);
    let r = idx.rnic("fd00:0000:0000:0000:0000:0000:0000:0003").unwrap();
    assert_eq!((r.agent_id.as_str(), r.last_updated, r.qpn), ("a2", 200, 7));
    assert_eq!(idx.agent("a1").unwrap().hostname, "h");
    assert_eq!(idx.agent_gids("a1").len(), 2);
}

#[test]
fn reregistration_replaces_the_agents_rnics_and_moves_gids() {
    let reg = IndexedRegistry::new(Box::new(SqliteRegistry::open_in_memory().unwrap())).unwrap();
    reg.register_agent(
        &agent("a1", "t1"),
        &[rnic("fd00::1", "t1"), rnic("fd00::2", "t1")],
        100,
    )
    .unwrap();
    reg.register_agent(
        &agent("a1", "t1"),
        &[rnic("fd00::2", "t1"), rnic("fd00::4", "t3")],
        150,
    )
    .unwrap();
    {
        let idx = reg.index();
        idx.check();
        let gids: Vec<_> = sorted(idx.rnics().cloned().collect())
            .into_iter()
            .map(|r| r.gid)
            .collect();
        assert!(gids[0].ends_with(":0002") && gids[1].ends_with(":0004"));
        assert!(idx.tor_gids("t1").len() == 1 && idx.tor_gids("t3").len() == 1);
        assert!(idx.rnics().all(|r| r.last_updated == 150));
    }
    // fd00::2 moves to a2; a1 keeps fd00::4.
    reg.register_agent(&agent("a2", "t1"), &[rnic("fd00::2", "t1")], 160)
        .unwrap();
    assert_eq!(index_rows(&reg), sorted(reg.store_rnics().unwrap()));
    reg.index().check();
    assert_eq!(reg.index().agent_gids("a1").len(), 1);
    // And the last one moves too: a1 disappears in both views.
    reg.register_agent(&agent("a3", "t3"), &[rnic("fd00::4", "t3")], 170)
        .unwrap();
    reg.index().check();
    assert!(reg.index().agent("a1").is_none());
    let reloaded =
        IndexedRegistry::new(Box::new(SqliteRegistry::open_in_memory().unwrap())).unwrap();
    assert!(reloaded.index().is_empty());
}

#[test]
fn stale_removal_in_store_and_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.db");
    let reg = IndexedRegistry::new(Box::new(SqliteRegistry::open(&path).unwrap())).unwrap();
    reg.register_agent(&agent("old", "t1"), &[rnic("fd00::1", "t1")], 100)
        .unwrap();
    reg.register_agent(&agent("new", "t2"), &[rnic("fd00::2", "t2")], 900)
        .unwrap();
    assert_eq!(
        reg.remove_stale(1000, 900).unwrap(),
        0,
        "exactly at the threshold stays"
    );
    assert_eq!(reg.remove_stale(1001, 900).unwrap(), 1);
    reg.index().check();
    assert!(reg.index().agent("old").is_none());
    assert_eq!(reg.index().tor_count(), 1);
    // touch refreshes: a later sweep keeps the touched agent.
    assert_eq!(reg.touch("new", 2000).unwrap(), 1);
    assert_eq!(reg.remove_stale(2500, 900).unwrap(), 0);
    drop(reg);
    let reg = IndexedRegistry::new(Box::new(SqliteRegistry::open(&path).unwrap())).unwrap();
    assert_eq!(reg.index().len(), 1);
    assert_eq!(reg.index().rnics().next().unwrap().last_updated, 2000);
    assert!(reg.index().agent("old").is_none());
}

#[test]
fn a_stall_is_excused_by_its_length_in_store_and_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.db");
    let reg = IndexedRegistry::new(Box::new(SqliteRegistry::open(&path).unwrap())).unwrap();
    reg.register_agent(&agent("a", "t1"), &[rnic("fd00::1", "t1")], 100)
        .unwrap();
    reg.register_agent(&agent("b", "t1"), &[rnic("fd00::2", "t1")], 195)
        .unwrap();
    // The controller did not run for 8 s; it is 200 now.
    assert_eq!(reg.excuse(8, 200).unwrap(), 2);
    let at = |reg: &IndexedRegistry, g: &str| {
        let g = rpingmesh_proto::gid::normalize_gid(g).unwrap();
        reg.index().rnic(&g).unwrap().last_updated
    };
    assert_eq!(
        (at(&reg, "fd00::1"), at(&reg, "fd00::2")),
        (108, 200),
        "capped at now"
    );
    assert_eq!(reg.index().agent("a").unwrap().last_updated, 108);
    reg.index().check();
    drop(reg);
    let reg = IndexedRegistry::new(Box::new(SqliteRegistry::open(&path).unwrap())).unwrap();
    assert_eq!(
        (at(&reg, "fd00::1"), at(&reg, "fd00::2")),
        (108, 200),
        "the store agrees"
    );
    assert_eq!(reg.index().agent("a").unwrap().last_updated, 108);
}

#[test]
fn grace_at_start_refreshes_everyone_in_store_and_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("reg.db");
    let reg = IndexedRegistry::new(Box::new(SqliteRegistry::open(&path).unwrap())).unwrap();
    reg.register_agent(&agent("old", "t1"), &[rnic("fd00::1", "t1")], 100)
        .unwrap();
    reg.register_agent(&agent("new", "t2"), &[rnic("fd00::2", "t2")], 3000)
        .unwrap();
    drop(reg);
    // Restarted at 2000, long after "old" was last heard of.
    let reg = IndexedRegistry::new(Box::new(SqliteRegistry::open(&path).unwrap())).unwrap();
    assert_eq!(reg.excuse(u64::MAX, 2000).unwrap(), 2);
    let at = |g: &str| {
        let g = rpingmesh_proto::gid::normalize_gid(g).unwrap();
        reg.index().rnic(&g).unwrap().last_updated
    };
    assert_eq!(
        (at("fd00::1"), at("fd00::2")),
        (2000, 3000),
        "never moved back"
    );
    assert_eq!(reg.index().agent("old").unwrap().last_updated, 2000);
    reg.index().check();
    // Not purged at once; purged a stale threshold after the grace.
    assert_eq!(reg.remove_stale(2500, 900).unwrap(), 0);
    assert_eq!(reg.remove_stale(2901, 900).unwrap(), 1);
    drop(reg);
    let reg = IndexedRegistry::new(Box::new(SqliteRegistry::open(&path).unwrap())).unwrap();
    assert_eq!(reg.index().len(), 1, "the store agrees");
}

#[test]
fn store_drops_an_agent_whose_last_gid_moved() {
    let mut st = SqliteRegistry::open_in_memory().unwrap();
    st.register_agent(
        &agent("a1", "t1"),
        &[rnic("fd00::1", "t1"), rnic("fd00::2", "t1")],
        1,
    )
    .unwrap();
    st.register_agent(&agent("a2", "t1"), &[rnic("fd00::1", "t1")], 2)
        .unwrap();
    let ids = |st: &SqliteRegistry| {
        let mut v: Vec<_> = st
            .list_agents()
            .unwrap()
            .into_iter()
            .map(|a| a.agent_id)
            .collect();
        v.sort();
        v
    };
    assert_eq!(ids(&st), vec!["a1", "a2"], "a1 still owns fd00::2");
    st.register_agent(&agent("a3", "t1"), &[rnic("fd00::2", "t1")], 3)
        .unwrap();
    assert_eq!(ids(&st), vec!["a2", "a3"]);
    assert_eq!(
        st.lookup_rnic(&rnic("fd00::2", "t1").gid)
            .unwrap()
            .unwrap()
            .agent_id,
        "a3"
    );
    assert_eq!(st.remove_stale(1000, 997).unwrap(), 1);
    assert_eq!(ids(&st), vec!["a3"]);
}

#[test]
fn missing_directory_is_created_or_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    // Created on first start, as for /var/lib/rpingmesh.
    SqliteRegistry::open(&dir.path().join("a/b/x.db")).unwrap();
    assert!(dir.path().join("a/b/x.db").is_file());
    // A parent that cannot be a directory: one line naming it.
    let file = dir.path().join("f");
    std::fs::write(&file, "").unwrap();
    let e = SqliteRegistry::open(&file.join("x.db")).err().unwrap();
    assert!(
        e.to_string().contains(&file.display().to_string())
            && e.to_string().contains("set database_uri"),
        "{e}"
    );
}
