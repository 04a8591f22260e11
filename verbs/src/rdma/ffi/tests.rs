//! The verbs owners' pure helpers, and what runs without a device (errors, mappings).

use super::*;
use crate::rdma::completion as c;

#[test]
fn pure_constants_match_libibverbs() {
    assert_eq!(c::WC_SUCCESS, ibv_wc_status::IBV_WC_SUCCESS as u32);
    assert_eq!(
        c::WC_WR_FLUSH_ERR,
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR as u32
    );
    assert_eq!(c::WC_OPCODE_SEND, ibv_wc_opcode::IBV_WC_SEND as u32);
    assert_eq!(
        c::WC_OPCODE_RDMA_WRITE,
        ibv_wc_opcode::IBV_WC_RDMA_WRITE as u32
    );
    assert_eq!(c::WC_OPCODE_RECV, ibv_wc_opcode::IBV_WC_RECV as u32);
    assert_eq!(c::WC_FLAG_GRH, ibv_wc_flags::IBV_WC_GRH.0);
    for s in 0..=ibv_wc_status::IBV_WC_TM_RNDV_INCOMPLETE {
        // SAFETY: ibv_wc_status_str returns a static string for any value.
        let lib = unsafe { CStr::from_ptr(ibv_wc_status_str(s)) }
            .to_string_lossy()
            .into_owned();
        assert!(
            c::wc_status_name(s as u32).starts_with("IBV_WC_"),
            "{s} {lib}"
        );
    }
    assert_eq!(
        async_event_name(ibv_event_type::IBV_EVENT_DEVICE_FATAL as u32),
        "IBV_EVENT_DEVICE_FATAL"
    );
    assert_eq!(
        async_event_name(ibv_event_type::IBV_EVENT_WQ_FATAL as u32),
        "IBV_EVENT_WQ_FATAL"
    );
    for (ours, lib) in [
        (EVENT_DEVICE_FATAL, ibv_event_type::IBV_EVENT_DEVICE_FATAL),
        (EVENT_PORT_ACTIVE, ibv_event_type::IBV_EVENT_PORT_ACTIVE),
        (EVENT_PORT_ERR, ibv_event_type::IBV_EVENT_PORT_ERR),
        (EVENT_GID_CHANGE, ibv_event_type::IBV_EVENT_GID_CHANGE),
    ] {
        assert_eq!(ours, lib as u32);
    }
    assert!(async_event_is_fatal(EVENT_DEVICE_FATAL));
    assert!(async_event_is_fatal(
        ibv_event_type::IBV_EVENT_QP_FATAL as u32
    ));
    // The QP survives a port going down: not fatal, the endpoint pauses instead.
    assert!(!async_event_is_fatal(EVENT_PORT_ERR));
    assert!(!async_event_is_fatal(EVENT_PORT_ACTIVE));
    assert!(async_event_has_port(EVENT_PORT_ERR) && async_event_has_port(EVENT_GID_CHANGE));
    assert!(!async_event_has_port(EVENT_DEVICE_FATAL));
}

#[test]
fn mtu_codes_match_libibverbs() {
    assert_eq!(mtu_enum(256), ibv_mtu::IBV_MTU_256 as u32);
    assert_eq!(mtu_enum(512), ibv_mtu::IBV_MTU_512 as u32);
    assert_eq!(mtu_enum(1024), ibv_mtu::IBV_MTU_1024 as u32);
    assert_eq!(mtu_enum(2048), ibv_mtu::IBV_MTU_2048 as u32);
    assert_eq!(mtu_enum(4096), ibv_mtu::IBV_MTU_4096 as u32);
    assert_eq!(mtu_enum(1500), ibv_mtu::IBV_MTU_1024 as u32);
    assert_eq!(mtu_enum(9000), ibv_mtu::IBV_MTU_4096 as u32);
    assert_eq!(mtu_enum(0), ibv_mtu::IBV_MTU_256 as u32);
    assert_eq!(wc_status_str(0), "success");
    assert_eq!(
        wc_status_str(ibv_wc_status::IBV_WC_REM_ACCESS_ERR as u32),
        "remote access error"
    );
}

#[test]
fn host_memory_maps_and_unmaps() {
    let m = HostMem::map(5000, None).unwrap();
    assert_eq!(m.len % 4096, 0);
    assert!(m.len >= 5000);
    // SAFETY: reading our own zero-filled mapping.
    assert!(unsafe { std::slice::from_raw_parts(m.ptr.as_ptr(), m.len) }
        .iter()
        .all(|&b| b == 0));
}

/// Node 0 binds where the kernel has NUMA (and the pages are checked to be there);
/// a node that does not exist fails with the one line naming mbind and the node.
#[test]
fn host_memory_binds_or_says_why() {
    match HostMem::map(3 * 4096, Some(&NodeMask::single(0))) {
        Ok(m) => assert_eq!(m.len, 3 * 4096),
        Err(e) => assert!(
            e.starts_with("mbind(MPOL_BIND, node 0) of 12288 bytes failed: "),
            "{e}"
        ),
    }
    let e = HostMem::map(4096, Some(&NodeMask::single(1023)))
        .err()
        .unwrap();
    assert!(
        e.starts_with("mbind(MPOL_BIND, node 1023) of 4096 bytes failed: "),
        "{e}"
    );
    assert!(
        e.contains("is node 1023 online?") && !e.contains('\n'),
        "{e}"
    );
}

/// On this machine (no RDMA in the kernel) the device list fails with the clear line.
/// On an RDMA host the same call lists devices; both outcomes are checked strictly.
#[test]
fn device_list_gives_names_or_the_clear_line() {
    match device_names() {
        Ok(names) => assert!(!names.is_empty() && names.iter().all(|n| !n.is_empty())),
        Err(e) => {
            let s = e.to_string();
            assert!(
                s.starts_with("no RDMA devices: ") && s.ends_with("; use transport: udp"),
                "{s}"
            );
            assert!(!s.contains('\n'));
        }
    }
}
