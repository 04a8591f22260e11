//! One function per untrusted input: bytes from the network (probe packets, GRHs, RC
//! ring descriptors and slots, agent RPC messages, client certificates), from the kernel
//! (eBPF ring-buffer events, BTF, sysfs and /proc text) and config files. Each takes
//! arbitrary bytes and must not panic; where a decoder has an encoder, a decoded value
//! must also round-trip. The libFuzzer targets in `fuzz/` call these (one each, by the
//! same name); `tests/smoke.rs` runs them over the seed corpus and mutations of it.

use std::sync::{Arc, OnceLock};

use rpingmesh_agent_common::event::{QpEvent, QP_EVENT_SIZE};
use rpingmesh_agent_common::wire::ProbePacket;
use rpingmesh_rc_ring::echo::{EchoMsg, ECHO_LEN};
use rpingmesh_rc_ring::frag::Reassembler;
use rpingmesh_rc_ring::geometry::{CREDIT_LANDING_OFFSET, SEQ_MAX, SLOT_BYTES};
use rpingmesh_rc_ring::{Descriptor, Geometry, HeapRegion, Receiver, Sender, Step, MAX_PAYLOAD};
use rpingmesh_service_tracer::btf::{self, Btf};
use rpingmesh_service_tracer::flows::ChangeLog;
use rpingmesh_service_tracer::{FlowTable, FlowTableConfig, Gid};
use rpingmesh_verbs::rdma::completion::{self, WcOutcome, WcRecord, WrKind, GRH_LEN};
use rpingmesh_verbs::TransportEvent;

pub mod seeds;

/// A fuzz target: arbitrary bytes in, no panic.
pub type Target = fn(&[u8]);

/// Every target by name, as `fuzz/fuzz_targets/<name>.rs` and `fuzz/corpus/<name>/`.
pub const TARGETS: &[(&str, Target)] = &[
    ("probe_wire", probe_wire),
    ("ebpf_event", ebpf_event),
    ("btf", btf),
    ("rc_ring", rc_ring),
    ("agent_config", agent_config),
    ("controller_config", controller_config),
    ("scenario_yaml", scenario_yaml),
    ("cert_names", cert_names),
    ("agent_rpc", agent_rpc),
    ("host_text", host_text),
];

/// The 40-byte probe/ACK decoder, the GRH source parser, and the whole receive-completion
/// translation (a completion record chosen by the last byte over the input as the slot).
pub fn probe_wire(data: &[u8]) {
    if let Ok(p) = ProbePacket::decode(data) {
        let enc = p.encode();
        assert_eq!(ProbePacket::decode(&enc), Ok(p));
        // Everything but the reserved tail round-trips.
        assert_eq!(enc[..36], data[..36]);
    }
    if let Ok((_, label)) = completion::grh_source_and_label(data) {
        assert!(label.is_none_or(|l| l <= 0xF_FFFF));
    }
    let _ = completion::grh_source(data);
    let sel = data.last().copied().unwrap_or(0);
    let send = sel & 1 != 0;
    let rec = WcRecord {
        wr_id: if send {
            WrKind::Send { id: 7, slot: 3 }.to_wr_id()
        } else {
            WrKind::Recv(u32::from(sel)).to_wr_id()
        },
        status: if sel & 2 != 0 {
            u32::from(sel >> 3)
        } else {
            completion::WC_SUCCESS
        },
        opcode: match (sel & 4 != 0, send) {
            (true, _) => completion::WC_OPCODE_RDMA_WRITE,
            (false, true) => completion::WC_OPCODE_SEND,
            (false, false) => completion::WC_OPCODE_RECV,
        },
        byte_len: if sel & 16 != 0 {
            u32::from(sel).wrapping_mul(0x0101_0101)
        } else {
            data.len() as u32
        },
        src_qp: 0xAB12_3456,
        wc_flags: if sel & 8 != 0 {
            0
        } else {
            completion::WC_FLAG_GRH
        },
        ts_ns: 1,
    };
    let slot_len = if sel & 32 != 0 {
        data.len() / 2
    } else {
        data.len()
    };
    if let WcOutcome::Event {
        event: TransportEvent::Received { from, len, .. },
        ..
    } = completion::translate(&rec, data, slot_len)
    {
        assert!(from.qpn <= 0xFF_FFFF);
        assert_eq!(len + GRH_LEN, rec.byte_len as usize);
        assert!(rec.byte_len as usize <= slot_len);
    }
}

/// The eBPF ring-buffer record decoder, and a stream of records through a small flow
/// table (so evictions, tombstones and process exits are reached) and its change log.
pub fn ebpf_event(data: &[u8]) {
    if let Some(ev) = QpEvent::from_bytes(data) {
        assert_eq!(ev.as_bytes(), &data[..QP_EVENT_SIZE]);
    }
    let mut table = FlowTable::new(FlowTableConfig {
        max_qps: 4,
        max_tombstones: 3,
    });
    let resolver = |_dev: &str, port: u8, sgid: u8| -> Option<Gid> {
        (sgid != 0xff).then(|| {
            let mut g = [0u8; 16];
            g[0] = 0xfd;
            g[14] = port;
            g[15] = sgid;
            g
        })
    };
    let filter = |tgid: u32, _dev: &str, _qpn: u32| tgid == 1;
    let mut log = ChangeLog::new(3);
    let mut out = Vec::new();
    for rec in data.chunks(QP_EVENT_SIZE) {
        table.apply_bytes(rec, &resolver, &filter, &mut out);
        log.record(out.drain(..));
        assert!(table.tracked_qps() <= 4 && table.len() <= table.tracked_qps());
    }
    let _ = table.take_tgid_changes();
    let _ = log.drain(&table);
    // Every owner exits: nothing may be left.
    for (i, tgid) in table.tgids().into_iter().enumerate() {
        let started = (i % 2 == 0).then_some(u64::MAX);
        table.process_gone(tgid, started, &mut out);
        if started.is_some() {
            table.process_gone(tgid, None, &mut out);
        }
    }
    log.record(out.drain(..));
    let _ = log.drain(&table);
    assert_eq!(table.tracked_qps(), 0);
    assert!(table.is_empty());
}

/// The kernel BTF reader (vmlinux and split module BTF) and the offset lookups the agent
/// makes with it.
pub fn btf(data: &[u8]) {
    let Ok(base) = Btf::parse("fuzz", data) else {
        return;
    };
    let _ = btf::kernel_offsets_from(&base);
    let _ = btf::task_offsets_from(&base);
    for (s, m) in [
        ("outer", "a"),
        ("outer", "b"),
        ("outer", "d"),
        ("ib_qp", "x"),
    ] {
        let _ = base.member_offset(s, m);
    }
    // The same bytes as module BTF on top of themselves (ids and strings continue).
    if let Ok(split) = Btf::parse_split("fuzz-split", data, &base) {
        let _ = btf::kernel_offsets_from(&split);
    }
}

/// RC ring: the CM descriptor, the echo-probe message, and a peer-written ring (the
/// input is the region: slots, commit words, the credit landing word) read by a
/// receiver into the reassembler, while a sender takes the landed credit.
pub fn rc_ring(data: &[u8]) {
    if let Ok(d) = Descriptor::decode(data) {
        assert_eq!(Descriptor::decode(&d.encode()), Ok(d));
        let g = Geometry::from_descriptor(&d);
        for seq in [1, 2, u64::from(d.slots), u64::from(d.slots) + 1, SEQ_MAX] {
            assert!(g.commit_offset(seq) + 8 <= g.mapped_len());
        }
    }
    let _ = EchoMsg::decode(data);
    if let Some(m) = data.get(..ECHO_LEN).and_then(|b| EchoMsg::decode(b).ok()) {
        assert_eq!(EchoMsg::decode(&m.encode()), Ok(m));
    }
    let Some((&mode, region_bytes)) = data.split_first() else {
        return;
    };
    let geom = Geometry::for_budget(2 * SLOT_BYTES, 4096).expect("two slots fit");
    let mem = HeapRegion::zeroed(geom.mapped_len());
    let region = mem.region();
    let n = region_bytes.len().min(region.len());
    region.copy_in(0, &region_bytes[..n]);
    // Near the end of the sequence space or at the start.
    let first = if mode & 1 != 0 { SEQ_MAX - 2 } else { 1 };
    let landed = region.load_acquire(CREDIT_LANDING_OFFSET);
    let mut rx = Receiver::starting_at(geom, first, region);
    let mut frags = Reassembler::new(2 * MAX_PAYLOAD);
    let mut buf = [0u8; MAX_PAYLOAD];
    for _ in 0..4 {
        match rx.recv(region, &mut buf) {
            Ok(Some(len)) => {
                assert!((1..=MAX_PAYLOAD).contains(&len));
                if let Ok(Some(msg)) = frags.push(&buf[..len]) {
                    assert!(msg.len() <= 2 * MAX_PAYLOAD);
                    let _ = EchoMsg::decode(&msg);
                }
                let _ = EchoMsg::decode(&buf[..len]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    let mut tx = Sender::starting_at(geom, 4, first);
    for _ in 0..4 {
        match tx.send(&[mode; 8]) {
            Ok(Step::ReadCredit(read)) => {
                let _ = tx.credit_read_completed(read.wr_id, landed);
                break;
            }
            Ok(Step::Write(w)) => {
                let _ = tx.write_completed(w.wr_id);
            }
            Ok(_) | Err(_) => break,
        }
    }
    assert!(tx.in_flight() <= u64::from(geom.slots()));
}

/// The agent's YAML config through its real layering and validation.
pub fn agent_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = rpingmesh_agent::config::AgentConfig::from_yaml_str(text) {
        let _ = cfg.exporter();
        let _ = cfg.prometheus_socket_addr();
        let _ = cfg.rc_ring_kinds();
        let _ = (
            cfg.tor_mesh_rate(),
            cfg.inter_tor_rate(),
            cfg.service_rate(),
        );
        let _ = cfg.tor_of("mlx5_0");
    }
}

/// The controller's YAML config through its real layering and validation. Validation
/// reads `analyzer_topology_file` and opens the TLS files: inputs that could name a
/// device, a FIFO or procfs (which would block or never end) are skipped.
pub fn controller_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if text.contains('\\')
        || ["/dev", "/proc", "/sys", "/run"]
            .iter()
            .any(|p| text.contains(p))
    {
        return;
    }
    if let Ok(cfg) = rpingmesh_controller::ControllerConfig::from_yaml_str(text) {
        let _ = cfg.analyzer_params();
        let _ = cfg.focus_params();
        let _ = cfg.database();
        let _ = cfg.exporter();
        let _ = cfg.http_socket_addr();
        let _ = cfg.agent_auth();
        let _ = cfg.operator_auth_enabled();
        let _ = cfg.otel_endpoint();
    }
}

/// The simulator's scenario files.
pub fn scenario_yaml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(s) = rpingmesh_sim::scenario::Scenario::from_yaml(text) {
        let _ = s.fabric.host_groups();
        for f in &s.faults {
            let _ = rpingmesh_sim::scenario::ground_truth(f);
        }
    }
}

/// The names in a TLS client certificate (agent identity, operator roles).
pub fn cert_names(data: &[u8]) {
    use rpingmesh_controller::auth::cert::{self, IdentitySource};
    if let Ok(names) = cert::cert_names(data) {
        for from in [
            IdentitySource::Auto,
            IdentitySource::SanDns,
            IdentitySource::SanUri,
            IdentitySource::Cn,
        ] {
            let _ = names.identity(from);
        }
    }
    let _ = cert::subject_attributes(data);
}

/// Which agent RPC a first byte selects (`agent_rpc`), in the seeds' order.
pub const RPC_REGISTER: u8 = 0;
pub const RPC_PINGLIST: u8 = 1;
pub const RPC_PROBE_ANALYSIS: u8 = 2;
pub const RPC_SERVICE_FLOWS: u8 = 3;
pub const RPC_HOST_HEALTH: u8 = 4;

struct RpcHarness {
    rt: tokio::runtime::Runtime,
    svc: rpingmesh_controller::service::ControllerSvc,
}

fn rpc_harness() -> &'static RpcHarness {
    static H: OnceLock<RpcHarness> = OnceLock::new();
    H.get_or_init(|| {
        use rpingmesh_controller::telemetry::AnalyzerMetrics;
        use rpingmesh_controller::{ControllerConfig, ControllerState};
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let cfg = ControllerConfig {
            database_uri: "sqlite::memory:".into(),
            metrics_enabled: false,
            ..Default::default()
        };
        let state = {
            let _guard = rt.enter();
            ControllerState::new(&cfg, AnalyzerMetrics::noop()).expect("controller state")
        };
        RpcHarness {
            rt,
            svc: rpingmesh_controller::service::ControllerSvc(Arc::new(state)),
        }
    })
}

/// An agent RPC from arbitrary bytes: the first byte picks the request type (modulo 5),
/// the rest is its protobuf body; what decodes goes to the real handler of an in-process
/// controller (SQLite in memory, kept across inputs). Any error status is fine.
pub fn agent_rpc(data: &[u8]) {
    let _ = agent_rpc_call(data);
}

/// What `agent_rpc` does, with the handler's result (`None`: nothing decoded).
pub fn agent_rpc_call(data: &[u8]) -> Option<Result<(), tonic::Status>> {
    use prost::Message;
    use rpingmesh_proto::controller_agent as pb;
    use rpingmesh_proto::controller_agent::controller_service_server::ControllerService;
    use tonic::Request;
    let (&sel, body) = data.split_first()?;
    let h = rpc_harness();
    let svc = &h.svc;
    let rt = &h.rt;
    Some(match sel % 5 {
        RPC_REGISTER => {
            let m = pb::AgentRegistrationRequest::decode(body).ok()?;
            rt.block_on(svc.register_agent(Request::new(m))).map(drop)
        }
        RPC_PINGLIST => {
            let m = pb::PinglistRequest::decode(body).ok()?;
            rt.block_on(svc.get_pinglist(Request::new(m))).map(drop)
        }
        RPC_PROBE_ANALYSIS => {
            let m = pb::ProbeAnalysisReport::decode(body).ok()?;
            rt.block_on(svc.report_probe_analysis(Request::new(m)))
                .map(drop)
        }
        RPC_SERVICE_FLOWS => {
            let m = pb::ServiceFlowReport::decode(body).ok()?;
            rt.block_on(svc.report_service_flows(Request::new(m)))
                .map(drop)
        }
        _ => {
            let m = pb::HostHealthReport::decode(body).ok()?;
            rt.block_on(svc.report_host_health(Request::new(m)))
                .map(drop)
        }
    })
}

/// Text the agent reads from the kernel and the host: sysfs GID tables and port states,
/// /proc/kallsyms, `ldconfig -p`, `rdma res show qp`, the eBPF programs' log records,
/// and the ELF symbol lookup of libibverbs for uprobes.
pub fn host_text(data: &[u8]) {
    use rpingmesh_service_tracer::{diag, host};
    use rpingmesh_verbs::rdma::sysfs;
    let text = String::from_utf8_lossy(data);
    let _ = sysfs::parse_gid(&text);
    let _ = sysfs::parse_gid_type(&text);
    let _ = sysfs::parse_port_state(&text);
    let _ = host::kallsyms_has_all(&text, &["ib_uverbs_create_qp", "ib_modify_qp_with_udata"]);
    let _ = host::parse_ldconfig(&text);
    let _ = host::count_qp_lines(&text);
    let _ = diag::name_fields(&text);
    let _ = host::symbol_file_offset(data, "ibv_modify_qp");
}
