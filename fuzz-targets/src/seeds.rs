//! The seed inputs built in code (packets, events, BTF, ring bytes, RPC messages). They
//! are checked in under `fuzz/corpus/<target>/` next to the seeds copied from real files
//! (configs, scenarios, certificates, an ELF); `tests/smoke.rs` checks that the files
//! match this code (`RPINGMESH_FUZZ_BLESS=1` rewrites them).

use prost::Message;
use rpingmesh_agent_common::event::*;
use rpingmesh_agent_common::wire::ProbePacket;
use rpingmesh_proto::controller_agent as pb;
use rpingmesh_rc_ring::echo::EchoMsg;
use rpingmesh_rc_ring::frag::fragments;
use rpingmesh_rc_ring::geometry::{commit_word, CREDIT_LANDING_OFFSET, HEADER_BYTES, SLOT_BYTES};
use rpingmesh_rc_ring::Descriptor;

use crate::{RPC_HOST_HEALTH, RPC_PINGLIST, RPC_PROBE_ANALYSIS, RPC_REGISTER, RPC_SERVICE_FLOWS};

/// (target, file name, bytes) of every generated seed.
pub fn generated() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let mut v = Vec::new();
    let probe = ProbePacket::probe(0xDEAD_BEEF_0000_002A, 1_000_000_007);
    let ack1 = ProbePacket::first_ack(&probe, 1_000_050_000);
    let ack2 = ProbePacket::second_ack(&probe, 1_000_050_000, 1_000_051_000);
    v.push(("probe_wire", "probe", probe.encode().to_vec()));
    v.push(("probe_wire", "first_ack", ack1.encode().to_vec()));
    v.push(("probe_wire", "second_ack", ack2.encode().to_vec()));
    v.push((
        "probe_wire",
        "grh_v6_probe",
        [grh_v6(), probe.encode()].concat(),
    ));
    v.push((
        "probe_wire",
        "grh_v4_ack",
        [grh_v4(), ack2.encode()].concat(),
    ));

    let events = qp_events();
    v.push(("ebpf_event", "modify_rtr", events[1].as_bytes().to_vec()));
    v.push((
        "ebpf_event",
        "lifecycle",
        events.iter().flat_map(|e| e.as_bytes().to_vec()).collect(),
    ));

    v.push(("btf", "kernel_structs", kernel_btf()));

    let d = Descriptor {
        addr: 0x7f00_1234_0000,
        rkey: 0x1234,
        slots: 64,
        mapped_len: 20480,
        nonce: 42,
    };
    v.push(("rc_ring", "descriptor", d.encode().to_vec()));
    let p = EchoMsg::Probe {
        id: 9,
        next_gap_us: 1000,
    };
    let e = EchoMsg::Echo {
        id: 9,
        caught_hot: true,
        turnaround_ns: 1500,
    };
    v.push(("rc_ring", "echo_probe", p.encode().to_vec()));
    v.push(("rc_ring", "echo", e.encode().to_vec()));
    v.push(("rc_ring", "ring_fragments", ring_region(0, &[b'x'; 300], 2)));
    v.push(("rc_ring", "ring_echo", ring_region(0, &e.encode(), 1)));

    for (name, sel, body) in rpc_messages() {
        v.push(("agent_rpc", name, [&[sel][..], &body].concat()));
    }

    v.push((
        "host_text",
        "gid",
        b"fe80:0000:0000:0000:0a00:27ff:fe4c:1a2b\n".to_vec(),
    ));
    v.push(("host_text", "port_state", b"4: ACTIVE\n".to_vec()));
    v.push(("host_text", "gid_type", b"RoCE v2\n".to_vec()));
    v.push((
        "host_text",
        "kallsyms",
        b"ffffffffc0a01230 t ib_uverbs_create_qp\t[ib_uverbs]\nffffffffc0a04560 T ib_modify_qp_with_udata\t[ib_core]\n".to_vec(),
    ));
    v.push((
        "host_text",
        "ldconfig",
        b"\tlibibverbs.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libibverbs.so.1\n".to_vec(),
    ));
    v.push((
        "host_text",
        "rdma_res",
        b"link rxe0/1 lqpn 17 rqpn 18 type RC state RTS sq-psn 0 comm ibv_rc_pingpong\n".to_vec(),
    ));
    v.push((
        "host_text",
        "diag",
        b"uprobe: cannot read field 6 (err -14)".to_vec(),
    ));
    v
}

/// An IPv6 GRH (RoCE v2 over IPv6, or IB): version 6, flow label 0x12345.
fn grh_v6() -> [u8; 40] {
    let mut g = [0u8; 40];
    g[..4].copy_from_slice(&0x6001_2345u32.to_be_bytes());
    g[8..24].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    g[24..40].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    g
}

/// RoCE v2 over IPv4: 20 undefined bytes, then an IPv4 header with its checksum.
fn grh_v4() -> [u8; 40] {
    let mut g = [0u8; 40];
    let h = &mut g[20..];
    h[..12].copy_from_slice(&[0x45, 0, 0, 68, 0, 0, 0x40, 0, 64, 17, 0, 0]);
    h[12..16].copy_from_slice(&[198, 18, 0, 1]);
    h[16..20].copy_from_slice(&[198, 18, 0, 2]);
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    g
}

/// Create, modify to RTR with a GRH, query in RTS, destroy, and the owner's exit.
fn qp_events() -> Vec<QpEvent> {
    let mut base = QpEvent::zeroed();
    base.tgid = 4242;
    base.pid = 4242;
    base.qp_num = 17;
    base.source = SOURCE_KPROBE;
    base.comm[..7].copy_from_slice(b"trainer");
    base.dev_name[..6].copy_from_slice(b"mlx5_0");
    base.port = 1;
    base.qp_type = 2;
    let at = |kind: u8, ns: u64| {
        let mut e = base;
        e.kind = kind;
        e.boot_ns = ns;
        e
    };
    let mut modify = at(KIND_MODIFY, 2_000);
    modify.attr_mask = QP_ATTR_STATE | QP_ATTR_AV | QP_ATTR_PORT | QP_ATTR_DEST_QPN;
    modify.qp_state = QPS_RTR;
    modify.flags = FLAG_GRH;
    modify.dgid = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9];
    modify.dest_qp_num = 99;
    modify.flow_label = 0x12345;
    modify.sgid_index = 3;
    modify.hop_limit = 64;
    let mut query = modify;
    query.kind = KIND_QUERY;
    query.boot_ns = 3_000;
    query.qp_state = QPS_RTS;
    vec![
        at(KIND_CREATE, 1_000),
        modify,
        query,
        at(KIND_DESTROY, 4_000),
        at(KIND_EXIT, 5_000),
    ]
}

/// BTF with every struct and member the agent resolves (`kernel_offsets_from`), reached
/// through a typedef/const chain and an anonymous union, plus the other kinds and a
/// kind_flag bitfield struct.
fn kernel_btf() -> Vec<u8> {
    let mut strings = vec![0u8];
    let mut name = |s: &str| -> u32 {
        if s.is_empty() {
            return 0;
        }
        let off = strings.len() as u32;
        strings.extend_from_slice(s.as_bytes());
        strings.push(0);
        off
    };
    let mut t: Vec<u8> = Vec::new();
    let w = |t: &mut Vec<u8>, words: &[u32]| {
        words
            .iter()
            .for_each(|x| t.extend_from_slice(&x.to_le_bytes()))
    };
    let info = |kind: u32, vlen: u32| (kind << 24) | vlen;
    // 1 int, 2 typedef u32 -> 1, 3 const -> 2, 4 ptr -> 0, 5 int[16], 6 enum, 7 fwd,
    // 8 func_proto, 9 anonymous union { sl, port_num }.
    w(&mut t, &[name("int"), info(1, 0), 4, 32]);
    w(&mut t, &[name("u32"), info(8, 0), 1]);
    w(&mut t, &[0, info(10, 0), 2]);
    w(&mut t, &[0, info(2, 0), 0]);
    w(&mut t, &[0, info(3, 0), 0, 1, 1, 16]);
    w(
        &mut t,
        &[name("ib_qp_state"), info(6, 1), 4, name("IB_QPS_RTR"), 2],
    );
    w(&mut t, &[name("ib_uqp_object"), info(7, 0), 0]);
    w(&mut t, &[0, info(13, 1), 1, name("qp"), 4]);
    w(
        &mut t,
        &[0, info(5, 2), 8, name("sl"), 3, 0, name("port_num"), 1, 32],
    );
    // (struct, [(member, type id, bit offset)])
    type Struct<'a> = (&'a str, &'a [(&'a str, u32, u32)]);
    let structs: &[Struct] = &[
        (
            "task_struct",
            &[("tgid", 1, 800), ("comm", 5, 1600), ("signal", 4, 2400)],
        ),
        ("signal_struct", &[("live", 3, 32)]),
        (
            "ib_qp",
            &[
                ("device", 4, 0),
                ("qp_num", 3, 960),
                ("qp_type", 1, 1056),
                ("port", 1, 1120),
                ("res", 1, 1280),
            ],
        ),
        ("ib_device", &[("name", 5, 192)]),
        (
            "ib_qp_attr",
            &[
                ("qp_state", 1, 0),
                ("dest_qp_num", 2, 128),
                ("port_num", 1, 320),
                ("ah_attr", 1, 384),
            ],
        ),
        (
            "rdma_ah_attr",
            &[("grh", 1, 0), ("", 9, 320), ("ah_flags", 1, 480)],
        ),
        (
            "ib_global_route",
            &[
                ("dgid", 5, 0),
                ("flow_label", 2, 128),
                ("sgid_index", 1, 160),
                ("hop_limit", 1, 168),
                ("traffic_class", 1, 176),
            ],
        ),
        ("rdma_restrack_entry", &[("task", 4, 64)]),
    ];
    for (sname, members) in structs {
        w(&mut t, &[name(sname), info(4, members.len() as u32), 256]);
        for (m, ty, bits) in members.iter() {
            w(&mut t, &[name(m), *ty, *bits]);
        }
    }
    // struct outer { a; b:3 at bit 66 } with kind_flag (bitfield sizes in the offsets).
    w(&mut t, &[name("outer"), (1 << 31) | info(4, 2), 16]);
    w(&mut t, &[name("a"), 1, 0]);
    w(&mut t, &[name("b"), 1, (3 << 24) | 66]);
    rpingmesh_service_tracer::btf::encode_blob(&t, &strings)
}

/// The rc_ring target's input: a mode byte, then a two-slot region with `msg` published
/// as ring messages (fragmented past one slot) and a credit of `credit` landed.
fn ring_region(mode: u8, msg: &[u8], credit: u64) -> Vec<u8> {
    let mut r = vec![0u8; HEADER_BYTES + 2 * SLOT_BYTES];
    r[CREDIT_LANDING_OFFSET..CREDIT_LANDING_OFFSET + 8].copy_from_slice(&credit.to_le_bytes());
    let payloads: Vec<Vec<u8>> = if msg.len() <= rpingmesh_rc_ring::MAX_PAYLOAD && credit == 1 {
        vec![msg.to_vec()]
    } else {
        fragments(msg).map(|(b, n)| b[..n].to_vec()).collect()
    };
    for (i, p) in payloads.iter().take(2).enumerate() {
        let seq = i as u64 + 1;
        let commit = HEADER_BYTES + i * SLOT_BYTES + 248;
        r[commit - p.len()..commit].copy_from_slice(p);
        r[commit..commit + 8].copy_from_slice(&commit_word(seq, p.len()).to_le_bytes());
    }
    [&[mode][..], &r].concat()
}

const GID_A: &str = "fd00:0000:0000:0000:0000:0000:0001:0001";
const GID_B: &str = "fd00:0000:0000:0000:0000:0000:0002:0001";

/// One message of each agent RPC, in the order an agent sends them.
fn rpc_messages() -> Vec<(&'static str, u8, Vec<u8>)> {
    let rnic = |gid: &str, tor: &str, dev: &str| pb::RnicInfo {
        gid: gid.into(),
        qpn: 17,
        ip_address: "198.18.0.1".into(),
        host_name: "fz-host".into(),
        tor_id: tor.into(),
        device_name: dev.into(),
    };
    let register = pb::AgentRegistrationRequest {
        agent_id: "fz-agent".into(),
        agent_ip: "198.18.0.1".into(),
        hostname: "fz-host".into(),
        tor_id: "tor1".into(),
        rnics: vec![rnic(GID_A, "tor1", "mlx5_0"), rnic(GID_B, "tor2", "mlx5_1")],
        agent_version: "0.1.0".into(),
    };
    let pinglist = pb::PinglistRequest {
        agent_id: "fz-agent".into(),
        tor_id: "tor1".into(),
        requester_gid: GID_A.into(),
        r#type: pb::PinglistType::InterTor as i32,
    };
    let report = pb::ProbeAnalysisReport {
        agent_id: "fz-agent".into(),
        summaries: vec![pb::PathSummary {
            source_gid: GID_A.into(),
            source_tor_id: "tor1".into(),
            target_gid: GID_B.into(),
            target_tor_id: "tor2".into(),
            target_qpn: 17,
            window_start_unix_ns: 1_750_000_000_000_000_000,
            window_duration_ms: 5000,
            probe_total: 100,
            probe_success: 97,
            probe_failed: 3,
            network_rtt_min_ns: 2_000,
            network_rtt_max_ns: 90_000,
            network_rtt_p50_ns: 4_000,
            network_rtt_p99_ns: 30_000,
            pinglist_type: pb::PinglistType::InterTor as i32,
            flow_labels: vec![pb::FlowLabelStats {
                flow_label: 0x12345,
                probe_total: 50,
                probe_failed: 3,
                network_rtt_p50_ns: 4_000,
                network_rtt_max_ns: 90_000,
                probe_invalid: 1,
            }],
            rc_ring: Some(pb::RcRingStats {
                probe_total: 10,
                probe_lost: 1,
                probe_late: 1,
                network_rtt_min_ns: 1_000,
                network_rtt_p50_ns: 2_000,
                network_rtt_p99_ns: 5_000,
                network_rtt_max_ns: 6_000,
                responder_delay_p50_ns: 300,
            }),
            ..Default::default()
        }],
        await_window_unix_ns: 0,
    };
    let flows = pb::ServiceFlowReport {
        agent_id: "fz-agent".into(),
        full_sync: true,
        upserts: vec![pb::ServiceFlow {
            local_gid: GID_A.into(),
            local_qpn: 17,
            remote_gid: GID_B.into(),
            remote_qpn: 99,
            flow_label: 0x12345,
            pid: 4242,
            comm: "trainer".into(),
            first_seen_unix_ns: 1_750_000_000_000_000_000,
            last_seen_unix_ns: 1_750_000_001_000_000_000,
            service: "training".into(),
            ..Default::default()
        }],
        removals: vec![pb::ServiceFlowKey {
            local_gid: GID_B.into(),
            local_qpn: 5,
        }],
    };
    let health = pb::HostHealthReport {
        agent_id: "fz-agent".into(),
        hostname: "fz-host".into(),
        checked_unix_ns: 1_750_000_000_000_000_000,
        tree: "pcie".into(),
        mode: "idle".into(),
        findings: vec![pb::HostFinding {
            kind: "link_degraded".into(),
            location: "0000:3b:00.0".into(),
            detail: "x8 of x16".into(),
        }],
        report_json: "{}".into(),
    };
    vec![
        ("0_register", RPC_REGISTER, register.encode_to_vec()),
        ("1_pinglist", RPC_PINGLIST, pinglist.encode_to_vec()),
        (
            "2_probe_analysis",
            RPC_PROBE_ANALYSIS,
            report.encode_to_vec(),
        ),
        (
            "2_await_window",
            RPC_PROBE_ANALYSIS,
            pb::ProbeAnalysisReport {
                agent_id: "fz-agent".into(),
                summaries: Vec::new(),
                await_window_unix_ns: 1_750_000_000_000_000_000,
            }
            .encode_to_vec(),
        ),
        ("3_service_flows", RPC_SERVICE_FLOWS, flows.encode_to_vec()),
        ("4_host_health", RPC_HOST_HEALTH, health.encode_to_vec()),
    ]
}
