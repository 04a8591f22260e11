//! Tests of `udp.rs`.

use std::net::Ipv6Addr;

use super::*;

fn cmsg_bytes(items: &[(libc::c_int, libc::c_int, &[u8])]) -> Vec<u8> {
    let mut b = CmsgBuf([0; CMSG_BUF_LEN]);
    let mut off = 0;
    for &(l, t, d) in items {
        push_cmsg(&mut b, &mut off, l, t, d);
    }
    b.0[..off].to_vec()
}

#[test]
fn cmsg_walk_roundtrip() {
    let buf = cmsg_bytes(&[(1, 2, &[9, 9, 9]), (3, 4, &7u32.to_ne_bytes())]);
    let v: Vec<_> = cmsgs(&buf).map(|(l, t, d)| (l, t, d.to_vec())).collect();
    assert_eq!(
        v,
        [(1, 2, vec![9, 9, 9]), (3, 4, 7u32.to_ne_bytes().to_vec())]
    );
}

#[test]
fn cmsg_walk_survives_garbage() {
    // Truncated header, zero length, length beyond the buffer, huge length.
    let good = cmsg_bytes(&[(1, 2, &[1, 2, 3, 4])]);
    assert_eq!(cmsgs(&good[..5]).count(), 0);
    let mut zero = good.clone();
    zero[..size_of::<usize>()].fill(0);
    assert_eq!(cmsgs(&zero).count(), 0);
    let mut long = good.clone();
    long[..size_of::<usize>()].copy_from_slice(&(good.len() + 1).to_ne_bytes());
    assert_eq!(cmsgs(&long).count(), 0);
    let mut huge = good.clone();
    huge[..size_of::<usize>()].copy_from_slice(&usize::MAX.to_ne_bytes());
    assert_eq!(cmsgs(&huge).count(), 0);
    for seed in 0..500u32 {
        let junk: Vec<u8> = (0..64u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) as u8)
            .collect();
        for (_, _, d) in cmsgs(&junk) {
            let _ = software_ts(d);
            let _ = extended_err(d);
        }
    }
}

#[test]
fn timestamp_payloads() {
    let tl = size_of::<libc::timespec>();
    let mut d = vec![0u8; 3 * tl];
    assert_eq!(software_ts(&d), None);
    let ts = libc::timespec {
        tv_sec: 2,
        tv_nsec: 5,
    };
    // SAFETY: d holds at least one timespec.
    unsafe { std::ptr::write_unaligned(d.as_mut_ptr() as *mut libc::timespec, ts) };
    assert_eq!(software_ts(&d), Some(2_000_000_005));
    assert_eq!(software_ts(&d[..tl]), None, "short payload");
    assert!(extended_err(&[0u8; 4]).is_none());
}

#[test]
fn sockaddr_roundtrip() {
    for a in ["127.0.0.1:4791", "[::1]:9", "[fe80::1%3]:1000"] {
        let a: SocketAddr = a.parse().unwrap();
        let (ss, len) = to_sockaddr(&a, 0);
        assert_eq!(from_sockaddr(&ss, len), Some(a));
    }
    let (ss, len) = to_sockaddr(&"[::1]:9".parse().unwrap(), 0x12345u32.to_be());
    match from_sockaddr(&ss, len) {
        Some(SocketAddr::V6(a)) => assert_eq!(a.flowinfo(), 0x12345),
        other => panic!("{other:?}"),
    }
    let (ss, _) = to_sockaddr(&"127.0.0.1:1".parse().unwrap(), 0);
    assert_eq!(from_sockaddr(&ss, 3), None, "short length");
}

async fn completions(a: &UdpEndpoint, n: usize) -> Vec<SendId> {
    let mut ev = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while ev
        .iter()
        .filter(|e| matches!(e, TransportEvent::Sent { .. }))
        .count()
        < n
    {
        tokio::time::timeout_at(deadline, a.wait_events(&mut ev))
            .await
            .expect("timeout")
            .unwrap();
    }
    ev.iter()
        .filter_map(|e| match e {
            TransportEvent::Sent { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn explicit_ids_are_honoured_by_the_kernel() {
    let a = UdpEndpoint::bind("127.0.0.1:0".parse().unwrap(), "a").unwrap();
    let b = UdpEndpoint::bind("127.0.0.1:0".parse().unwrap(), "b").unwrap();
    a.send(&b.local(), &SendParams::default(), b"0").unwrap();
    if !a.explicit_send_ids() {
        eprintln!("kernel without SCM_TS_OPT_ID: explicit path not testable here");
        return;
    }
    // The kernel's own counter is 0 here; ids far from it prove the cmsg is used.
    a.next_id.store(1_000, Ordering::Relaxed);
    for _ in 0..3 {
        a.send(&b.local(), &SendParams::default(), b"x").unwrap();
    }
    assert_eq!(completions(&a, 4).await, [0, 1_000, 1_001, 1_002]);
}

#[tokio::test]
async fn implicit_counter_fallback_matches_kernel() {
    let a = UdpEndpoint::bind("[::1]:0".parse().unwrap(), "a").unwrap();
    let b = UdpEndpoint::bind("[::1]:0".parse().unwrap(), "b").unwrap();
    a.explicit_ids.store(false, Ordering::Relaxed);
    a.probing_ids.store(false, Ordering::Relaxed);
    let mut ids = Vec::new();
    for i in 0..5u8 {
        ids.push(a.send(&b.local(), &SendParams::default(), &[i]).unwrap());
        // Refused before the kernel assigns an id: must not advance the counter.
        assert!(a
            .send(&b.local(), &SendParams::default(), &vec![0u8; 70_000])
            .is_err());
    }
    assert_eq!(ids, [0, 1, 2, 3, 4]);
    assert_eq!(completions(&a, 5).await, ids);
}

/// Untimed sends take no id and leave no completion; timed ids stay contiguous and
/// match the kernel's, in both id modes.
async fn untimed_sends_take_no_id(explicit: bool) {
    let a = UdpEndpoint::bind("127.0.0.1:0".parse().unwrap(), "a").unwrap();
    let b = UdpEndpoint::bind("127.0.0.1:0".parse().unwrap(), "b").unwrap();
    if !explicit {
        a.explicit_ids.store(false, Ordering::Relaxed);
        a.probing_ids.store(false, Ordering::Relaxed);
    }
    let p = SendParams::default();
    let mut ids = Vec::new();
    for i in 0..4u8 {
        a.send_untimed(&b.local(), &p, &[i]).unwrap();
        ids.push(a.send(&b.local(), &p, &[i]).unwrap());
        a.send_untimed(&b.local(), &p, &[i]).unwrap();
    }
    assert!(
        a.untimed_ok.load(Ordering::Relaxed),
        "per-send SO_TIMESTAMPING refused"
    );
    assert_eq!(ids, [0, 1, 2, 3]);
    assert_eq!(completions(&a, 4).await, ids);
    // Every datagram arrived, and nothing more is queued on a's error queue.
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while got.len() < 12 {
        tokio::time::timeout_at(deadline, b.wait_events(&mut got))
            .await
            .expect("timeout")
            .unwrap();
    }
    assert!(
        got.iter().all(|e| matches!(
            e,
            TransportEvent::Received {
                len: 1,
                rx_ts_ns: Some(_),
                ..
            }
        )),
        "{got:?}"
    );
    let mut rest = Vec::new();
    a.poll_completions(&mut rest).unwrap();
    assert!(rest.is_empty(), "{rest:?}");
}

#[tokio::test]
async fn untimed_sends_explicit_ids() {
    untimed_sends_take_no_id(true).await;
}

#[tokio::test]
async fn untimed_sends_implicit_ids() {
    untimed_sends_take_no_id(false).await;
}

#[tokio::test]
async fn batches_larger_than_one_recvmmsg() {
    let a = UdpEndpoint::bind("[::1]:0".parse().unwrap(), "a").unwrap();
    let b = UdpEndpoint::bind("[::1]:0".parse().unwrap(), "b").unwrap();
    let n = 3 * RECV_BATCH + 1;
    for i in 0..n {
        a.send(&b.local(), &SendParams::default(), &[i as u8; 40])
            .unwrap();
    }
    let mut ev = Vec::new();
    b.poll_events(&mut ev).unwrap();
    let firsts: Vec<u8> = ev
        .iter()
        .map(|e| match e {
            TransportEvent::Received { len: 40, data, .. } => data[0],
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(firsts, (0..n as u8).collect::<Vec<_>>());
    assert_eq!(completions(&a, n).await, (0..n as u32).collect::<Vec<_>>());
}

#[test]
fn endpoints_of_addresses() {
    let e = endpoint_of(&"10.1.2.3:4791".parse().unwrap());
    assert_eq!(e.gid, "::ffff:10.1.2.3".parse::<Ipv6Addr>().unwrap());
    assert_eq!(e.qpn, 4791);
}

#[tokio::test]
async fn a_batch_goes_out_in_order_and_a_refused_datagram_costs_only_itself() {
    let a = UdpEndpoint::bind("127.0.0.1:0".parse().unwrap(), "a").unwrap();
    let b = UdpEndpoint::bind("127.0.0.1:0".parse().unwrap(), "b").unwrap();
    // The first send settles the id mode; batches need explicit ids (Linux >= 6.13).
    a.send(&b.local(), &SendParams::default(), &[0xee; 8])
        .unwrap();
    if !a.explicit_send_ids() {
        eprintln!("skipped: this kernel has no explicit send ids (one-by-one fallback)");
        return;
    }
    completions(&a, 1).await;
    b.poll_events(&mut Vec::new()).unwrap();
    // Two sendmmsg chunks; in them one datagram the kernel refuses (too big for UDP)
    // and one with no IPv4 address (refused before the call).
    let n = SEND_BATCH + 10;
    let bad_dest = Endpoint {
        gid: "fe80::1".parse().unwrap(),
        qpn: 1,
    };
    let batch: Vec<(Endpoint, SendParams, Vec<u8>)> = (0..n)
        .map(|i| match i {
            7 => (b.local(), SendParams::default(), vec![7; 70_000]),
            20 => (bad_dest, SendParams::default(), vec![20; 40]),
            _ => (b.local(), SendParams::default(), vec![i as u8; 40]),
        })
        .collect();
    let mut results = Vec::new();
    a.send_batch(&batch, &mut results);
    assert_eq!(results.len(), n);
    let refused: Vec<usize> = (0..n).filter(|&i| results[i].is_err()).collect();
    assert_eq!(refused, [7, 20], "{results:?}");
    assert_eq!(
        results[7].as_ref().unwrap_err().raw_os_error(),
        Some(libc::EMSGSIZE)
    );
    let ids: Vec<SendId> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().copied())
        .collect();
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while got.len() < n - 2 {
        let mut ev = Vec::new();
        tokio::time::timeout_at(deadline, b.wait_events(&mut ev))
            .await
            .expect("timeout")
            .unwrap();
        got.extend(ev.iter().filter_map(|e| match e {
            TransportEvent::Received { len: 40, data, .. } => Some(data[0] as usize),
            _ => None,
        }));
    }
    let sent: Vec<usize> = (0..n).filter(|i| ![7, 20].contains(i)).collect();
    assert_eq!(got, sent.iter().map(|&i| i % 256).collect::<Vec<_>>());
    // Every datagram sent got its TX timestamp under the id its result named.
    let mut done = completions(&a, ids.len()).await;
    done.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(done, want);
}
