//! Micro-benchmarks of the rdma backend's per-operation paths that run without hardware,
//! each against a plain baseline measured in the same run (run by `cargo xtask bench`):
//!
//! - address-handle cache hit (what every send pays) vs a plain `HashMap` lookup;
//! - completion -> event (translate a receive completion, push it on the SPSC event ring,
//!   pop it on the consumer side) vs a plain `VecDeque` push + pop of the same event.
//!
//! Output: one JSON object per line. Flags: `--runs N` (default 5), `--ops N` per run.

use std::collections::{HashMap, VecDeque};
use std::hint::black_box;
use std::net::Ipv6Addr;
use std::time::Instant;

use rpingmesh_verbs::rdma::ah_cache::AhKey;
use rpingmesh_verbs::rdma::completion::{
    translate, WcOutcome, WcRecord, WrKind, GRH_LEN, WC_FLAG_GRH, WC_OPCODE_RECV, WC_SUCCESS,
};
use rpingmesh_verbs::rdma::ring;
use rpingmesh_verbs::{Endpoint, TransportEvent};

/// 64 targets x 16 flow labels: the paths an agent with a full ECMP set cycles through.
const TARGETS: u16 = 64;
const LABELS: u32 = 16;

fn main() {
    let mut runs = 5usize;
    let mut ops = 2_000_000usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().and_then(|v| v.parse::<usize>().ok());
        match (a.as_str(), v) {
            ("--runs", Some(n)) if n > 0 => runs = n,
            ("--ops", Some(n)) if n > 0 => ops = n,
            _ => {
                eprintln!("verbs-bench: usage: verbs-bench [--runs N] [--ops N]");
                std::process::exit(2);
            }
        }
    }

    let keys: Vec<AhKey> = (0..TARGETS)
        .flat_map(|t| {
            (0..LABELS).map(move |l| {
                AhKey::new(
                    Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 1, t),
                    0x1000 + l * 7919,
                    0,
                    0,
                )
            })
        })
        .collect();

    let (mut cache_ns, mut map_ns) = (Vec::new(), Vec::new());
    let (mut ring_ns, mut deque_ns) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        map_ns.push(hashmap_lookup(&keys, ops));
        cache_ns.push(ah_cache_hit(&keys, ops));
        deque_ns.push(deque_push_pop(ops));
        ring_ns.push(completion_to_event(ops));
    }
    report(
        "ah_cache_hit",
        "hashmap_lookup",
        &mut cache_ns,
        &mut map_ns,
        runs,
        ops,
    );
    ah_hit_rate_line();
    report(
        "completion_to_event",
        "queue_push_pop",
        &mut ring_ns,
        &mut deque_ns,
        runs,
        ops,
    );
}

/// AH cache hit rate when every probe round visits 256 targets x 64 flow labels (the
/// scheduler's round robin), with the cache at its default 4096 entries vs sized to the
/// pinglist (`reserve`, as the agent does on every pinglist), over 4 rounds.
fn ah_hit_rate_line() {
    use rpingmesh_verbs::rdma::ah_table::{AhTable, Lookup, DEFAULT_MAX_AGE_NS};
    const T: u16 = 256;
    const L: u32 = 64;
    const ROUNDS: u32 = 4;
    let rate = |reserve: bool| {
        let mut t: AhTable<u32> = AhTable::new(4096, DEFAULT_MAX_AGE_NS);
        if reserve {
            t.reserve(T as usize * L as usize * 2);
        }
        for _ in 0..ROUNDS {
            for target in 0..T {
                for l in 0..L {
                    let k = AhKey::new(
                        Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 2, target),
                        l * 7919,
                        0,
                        0,
                    );
                    if t.lookup(&k, 0) == Lookup::Miss {
                        t.resolved(k, Ok(0), 0);
                    }
                }
            }
        }
        let s = t.stats().cache;
        s.hits as f64 / (s.hits + s.misses) as f64
    };
    let (fixed, sized) = (rate(false), rate(true));
    println!(
        "{{\"bench\":\"ah_hit_rate\",\"targets\":{T},\"labels\":{L},\"rounds\":{ROUNDS},\
         \"hit_rate_cache_4096\":{fixed:.3},\"hit_rate_sized_to_pinglist\":{sized:.3},\
         \"best_possible\":{:.3}}}",
        (ROUNDS - 1) as f64 / ROUNDS as f64
    );
}

fn report(what: &str, baseline: &str, ours: &mut [f64], base: &mut [f64], runs: usize, ops: usize) {
    let (o, b) = (median(ours), median(base));
    println!(
        "{{\"bench\":\"{what}\",\"unit\":\"ns/op\",\"ns_per_op\":{o:.2},\"baseline\":\"{baseline}\",\
         \"baseline_ns_per_op\":{b:.2},\"ratio_to_baseline\":{:.2},\"runs\":{runs},\"ops\":{ops}}}",
        o / b
    );
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn hashmap_lookup(keys: &[AhKey], ops: usize) -> f64 {
    let map: HashMap<AhKey, u64> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (*k, i as u64))
        .collect();
    let start = Instant::now();
    let mut acc = 0u64;
    for i in 0..ops {
        acc = acc.wrapping_add(*map.get(black_box(&keys[i % keys.len()])).unwrap());
    }
    black_box(acc);
    start.elapsed().as_nanos() as f64 / ops as f64
}

/// What every send pays for its address handle: `AhTable::lookup` (LRU hit plus the
/// age and loss checks), every path resolved beforehand.
fn ah_cache_hit(keys: &[AhKey], ops: usize) -> f64 {
    use rpingmesh_verbs::rdma::ah_table::{AhTable, Lookup, DEFAULT_MAX_AGE_NS};
    let mut table: AhTable<u64> = AhTable::new(4096, DEFAULT_MAX_AGE_NS);
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(table.lookup(k, 0), Lookup::Miss);
        table.resolved(*k, Ok(i as u64), 0);
    }
    let start = Instant::now();
    let mut acc = 0u64;
    for i in 0..ops {
        if let Lookup::Hit { handle, .. } = table.lookup(black_box(&keys[i % keys.len()]), 1) {
            acc = acc.wrapping_add(*handle);
        }
    }
    black_box(acc);
    let ns = start.elapsed().as_nanos() as f64 / ops as f64;
    let s = table.stats().cache;
    assert_eq!(s.hits, ops as u64, "the bench measures hits only");
    ns
}

fn sample_event() -> TransportEvent {
    TransportEvent::Received {
        from: Endpoint {
            gid: Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2),
            qpn: 0x11,
        },
        len: 40,
        data: [7u8; 64],
        rx_ts_ns: Some(1),
        flow_label: None,
    }
}

fn deque_push_pop(ops: usize) -> f64 {
    let mut q: VecDeque<TransportEvent> = VecDeque::with_capacity(8192);
    let ev = sample_event();
    let start = Instant::now();
    for i in 0..ops {
        let mut e = ev;
        if let TransportEvent::Received { rx_ts_ns, .. } = &mut e {
            *rx_ts_ns = Some(i as u64);
        }
        q.push_back(black_box(e));
        black_box(q.pop_front());
    }
    start.elapsed().as_nanos() as f64 / ops as f64
}

/// A receive slot as the NIC leaves it: an IPv6 GRH then the 40-byte probe.
fn receive_slot() -> Vec<u8> {
    let mut buf = vec![0u8; GRH_LEN + 64];
    buf[0] = 0x60;
    buf[8..24].copy_from_slice(&Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 2).octets());
    buf[GRH_LEN] = 1; // wire version
    buf
}

fn completion_to_event(ops: usize) -> f64 {
    let (mut tx, mut rx) = ring::channel::<TransportEvent>(8192);
    let buf = receive_slot();
    let start = Instant::now();
    for i in 0..ops {
        let rec = WcRecord {
            wr_id: WrKind::Recv((i % 512) as u32).to_wr_id(),
            status: WC_SUCCESS,
            opcode: WC_OPCODE_RECV,
            byte_len: (GRH_LEN + 40) as u32,
            src_qp: 0x11,
            wc_flags: WC_FLAG_GRH,
            ts_ns: i as u64,
        };
        match translate(black_box(&rec), &buf, buf.len()) {
            WcOutcome::Event { event, .. } => {
                if tx.push(event).is_err() {
                    unreachable!("the consumer keeps the ring empty");
                }
            }
            other => panic!("bench input must translate to an event: {other:?}"),
        }
        black_box(rx.pop());
    }
    let ns = start.elapsed().as_nanos() as f64 / ops as f64;
    assert_eq!(tx.stats().dropped, 0);
    ns
}
