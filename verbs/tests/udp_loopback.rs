//! The udp transport on real loopback sockets (127.0.0.1 and ::1).

use std::collections::HashMap;
use std::mem::{size_of, zeroed};
use std::net::{Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use rpingmesh_verbs::clock::realtime_ns;
use rpingmesh_verbs::udp::UdpEndpoint;
use rpingmesh_verbs::{Endpoint, SendId, SendParams, TransportEvent, VerbsError};

const V4: &str = "127.0.0.1:0";
const V6: &str = "[::1]:0";

/// Collects events from `ep` until `done(events)` holds; fails after 5 s.
async fn collect_until(
    ep: &UdpEndpoint,
    events: &mut Vec<TransportEvent>,
    done: impl Fn(&[TransportEvent]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !done(events) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left, ep.wait_events(events)).await {
            Ok(r) => r.expect("wait_events"),
            Err(_) => panic!("timed out; have {events:?}"),
        }
    }
}

fn sent_ids(events: &[TransportEvent]) -> Vec<SendId> {
    events
        .iter()
        .filter_map(|e| match e {
            TransportEvent::Sent { id, .. } => Some(*id),
            _ => None,
        })
        .collect()
}

fn received(events: &[TransportEvent]) -> Vec<(Endpoint, usize, [u8; 64], Option<u64>)> {
    events
        .iter()
        .filter_map(|e| match e {
            TransportEvent::Received {
                from,
                len,
                data,
                rx_ts_ns,
                ..
            } => Some((*from, *len, *data, *rx_ts_ns)),
            _ => None,
        })
        .collect()
}

fn tx_ts(events: &[TransportEvent], want: SendId) -> u64 {
    events
        .iter()
        .find_map(|e| match e {
            TransportEvent::Sent { id, tx_ts_ns } if *id == want => Some(*tx_ts_ns),
            _ => None,
        })
        .expect("send completion")
}

async fn ping_pong(addr: &str) {
    let a = UdpEndpoint::bind(addr.parse().unwrap(), "a0").unwrap();
    let b = UdpEndpoint::bind(addr.parse().unwrap(), "b0").unwrap();
    assert_ne!(a.local().qpn, 0);
    assert_eq!(a.local().qpn, a.local_addr().port() as u32);
    assert_eq!(a.device_name(), "a0");
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    let params = SendParams {
        flow_label: 0x12345,
        traffic_class: 0,
        service_level: 0,
    };

    let probe: Vec<u8> = (0..40u8).collect();
    let before = realtime_ns();
    let id_probe = a.send(&b.local(), &params, &probe).unwrap();
    collect_until(&b, &mut eb, |e| !received(e).is_empty()).await;
    let (from, len, data, t3) = received(&eb)[0];
    assert_eq!(from, a.local(), "source endpoint");
    assert_eq!(len, 40);
    assert_eq!(&data[..40], &probe[..]);
    let t3 = t3.expect("rx timestamp");
    assert!(
        t3.abs_diff(realtime_ns()) < 1_000_000_000,
        "rx ts {t3} far from realtime"
    );
    assert!(
        t3 + 1_000 >= before,
        "rx ts {t3} before the send started at {before}"
    );

    let ack = [7u8; 40];
    let id_ack = b.send(&from, &params, &ack).unwrap();
    collect_until(&b, &mut eb, |e| sent_ids(e).contains(&id_ack)).await;
    collect_until(&a, &mut ea, |e| {
        !received(e).is_empty() && sent_ids(e).contains(&id_probe)
    })
    .await;
    let (from_b, len_b, data_b, t5) = received(&ea)[0];
    assert_eq!((from_b, len_b), (b.local(), 40));
    assert_eq!(&data_b[..40], &ack[..]);

    let t2 = tx_ts(&ea, id_probe);
    let t4 = tx_ts(&eb, id_ack);
    let t5 = t5.expect("rx timestamp");
    // One host clock: the probe is sent before it is received, and so on.
    assert!(t2 <= t3, "T2 {t2} > T3 {t3}");
    assert!(t3 <= t4, "T3 {t3} > T4 {t4}");
    assert!(t4 <= t5, "T4 {t4} > T5 {t5}");
    assert!(t5 - t2 < 1_000_000_000);
}

#[tokio::test]
async fn ping_pong_v4() {
    ping_pong(V4).await;
}

#[tokio::test]
async fn ping_pong_v6() {
    ping_pong(V6).await;
}

async fn one_completion_per_send(addr: &str) {
    let a = UdpEndpoint::bind(addr.parse().unwrap(), "a").unwrap();
    let b = UdpEndpoint::bind(addr.parse().unwrap(), "b").unwrap();
    let n = 300u32;
    let mut ids = Vec::new();
    let (mut ea, mut eb) = (Vec::new(), Vec::new());
    for i in 0..n {
        ids.push(
            a.send(&b.local(), &SendParams::default(), &i.to_be_bytes())
                .unwrap(),
        );
        // Drain like the agent does: undrained queues overflow the receive buffer.
        if i % 32 == 0 {
            a.poll_events(&mut ea).unwrap();
            b.poll_events(&mut eb).unwrap();
        }
    }
    let expected: Vec<SendId> = (0..n).collect();
    assert_eq!(ids, expected, "ids count sends from 0");
    collect_until(&a, &mut ea, |e| sent_ids(e).len() >= n as usize).await;
    // Nothing extra arrives.
    tokio::time::sleep(Duration::from_millis(50)).await;
    a.poll_events(&mut ea).unwrap();
    let mut counts: HashMap<SendId, usize> = HashMap::new();
    for id in sent_ids(&ea) {
        *counts.entry(id).or_default() += 1;
    }
    assert_eq!(counts.len(), n as usize);
    assert!(
        counts.iter().all(|(id, c)| *c == 1 && *id < n),
        "{counts:?}"
    );
    collect_until(&b, &mut eb, |e| received(e).len() >= n as usize).await;
    assert!(received(&eb).iter().all(|r| r.1 == 4 && r.3.is_some()));
}

#[tokio::test]
async fn one_completion_per_send_v4() {
    one_completion_per_send(V4).await;
}

#[tokio::test]
async fn one_completion_per_send_v6() {
    one_completion_per_send(V6).await;
}

#[tokio::test]
async fn explicit_send_ids_on_this_kernel() {
    // Kernels >= 6.13 accept SCM_TS_OPT_ID; older ones fall back without losing ids
    // (checked by one_completion_per_send_*). Report which path ran.
    let a = UdpEndpoint::bind(V4.parse().unwrap(), "a").unwrap();
    let b = UdpEndpoint::bind(V4.parse().unwrap(), "b").unwrap();
    a.send(&b.local(), &SendParams::default(), b"x").unwrap();
    eprintln!("explicit send ids: {}", a.explicit_send_ids());
}

#[tokio::test]
async fn failed_send_does_not_shift_ids() {
    let a = UdpEndpoint::bind(V4.parse().unwrap(), "a").unwrap();
    let b = UdpEndpoint::bind(V4.parse().unwrap(), "b").unwrap();
    let id0 = a.send(&b.local(), &SendParams::default(), b"one").unwrap();
    // Too large for UDP: refused by the kernel.
    let huge = vec![0u8; 70_000];
    assert!(a.send(&b.local(), &SendParams::default(), &huge).is_err());
    let id1 = a.send(&b.local(), &SendParams::default(), b"two").unwrap();
    let mut ea = Vec::new();
    collect_until(&a, &mut ea, |e| sent_ids(e).len() >= 2).await;
    let mut got = sent_ids(&ea);
    got.sort();
    let mut want = vec![id0, id1];
    want.sort();
    assert_eq!(got, want);
}

#[tokio::test]
async fn oversized_datagram_reports_real_length() {
    for addr in [V4, V6] {
        let a = UdpEndpoint::bind(addr.parse().unwrap(), "a").unwrap();
        let b = UdpEndpoint::bind(addr.parse().unwrap(), "b").unwrap();
        let payload: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
        a.send(&b.local(), &SendParams::default(), &payload)
            .unwrap();
        let mut eb = Vec::new();
        collect_until(&b, &mut eb, |e| !received(e).is_empty()).await;
        let (_, len, data, _) = received(&eb)[0];
        assert_eq!(len, 200);
        assert_eq!(&data[..], &payload[..64]);
    }
}

#[tokio::test]
async fn address_family_mismatch_is_an_error() {
    let a = UdpEndpoint::bind(V4.parse().unwrap(), "a").unwrap();
    let v6 = Endpoint {
        gid: Ipv6Addr::LOCALHOST,
        qpn: 9,
    };
    let e = a.send(&v6, &SendParams::default(), b"x").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("not IPv4-mapped"), "{e}");
    let bad_qpn = Endpoint {
        gid: a.local().gid,
        qpn: 70_000,
    };
    let e = a.send(&bad_qpn, &SendParams::default(), b"x").unwrap_err();
    assert!(e.to_string().contains("QPN 70000"), "{e}");
    assert_eq!(
        a.local().gid,
        "::ffff:127.0.0.1".parse::<Ipv6Addr>().unwrap()
    );
    assert_eq!(a.ip_string(), "127.0.0.1");
}

#[test]
fn bind_outside_runtime_is_an_error() {
    match UdpEndpoint::bind(V4.parse().unwrap(), "a") {
        Err(VerbsError::Socket { what, .. }) => assert_eq!(what, "register with tokio"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("bind outside a runtime must fail"),
    }
}

#[tokio::test]
async fn bind_to_foreign_address_names_it() {
    // TEST-NET-1 is never a local address.
    let addr: SocketAddr = "192.0.2.1:0".parse().unwrap();
    match UdpEndpoint::bind(addr, "a") {
        Err(e @ VerbsError::Bind { .. }) => assert!(e.to_string().contains("192.0.2.1"), "{e}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("bind to a foreign address must fail"),
    }
}

/// A plain IPv6 UDP socket on ::1 that reports the flow info and traffic class of what
/// it receives.
fn flowinfo_receiver() -> (OwnedFd, u16) {
    unsafe {
        let fd = libc::socket(libc::AF_INET6, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let fd = OwnedFd::from_raw_fd(fd);
        let one: libc::c_int = 1;
        for opt in [libc::IPV6_FLOWINFO, libc::IPV6_RECVTCLASS] {
            let r = libc::setsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_IPV6,
                opt,
                &one as *const _ as *const libc::c_void,
                size_of::<libc::c_int>() as u32,
            );
            assert_eq!(r, 0, "setsockopt {opt}");
        }
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const libc::c_void,
            size_of::<libc::timeval>() as u32,
        );
        let mut sin6: libc::sockaddr_in6 = zeroed();
        sin6.sin6_family = libc::AF_INET6 as u16;
        sin6.sin6_addr.s6_addr = Ipv6Addr::LOCALHOST.octets();
        let r = libc::bind(
            fd.as_raw_fd(),
            &sin6 as *const _ as *const libc::sockaddr,
            size_of::<libc::sockaddr_in6>() as u32,
        );
        assert_eq!(r, 0);
        let mut len = size_of::<libc::sockaddr_in6>() as u32;
        libc::getsockname(
            fd.as_raw_fd(),
            &mut sin6 as *mut _ as *mut libc::sockaddr,
            &mut len,
        );
        (fd, u16::from_be(sin6.sin6_port))
    }
}

/// Blocking receive of one datagram: (flow label, traffic class).
fn recv_flowinfo(fd: &OwnedFd) -> (Option<u32>, Option<u8>) {
    unsafe {
        let mut data = [0u8; 64];
        let mut ctl = [0u64; 32];
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr() as *mut _,
            iov_len: data.len(),
        };
        let mut msg: libc::msghdr = zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctl.as_mut_ptr() as *mut _;
        msg.msg_controllen = size_of::<[u64; 32]>();
        let n = libc::recvmsg(fd.as_raw_fd(), &mut msg, 0);
        assert!(n >= 0, "recvmsg: {}", std::io::Error::last_os_error());
        let (mut label, mut tclass) = (None, None);
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let d = libc::CMSG_DATA(c);
            if (*c).cmsg_level == libc::IPPROTO_IPV6 && (*c).cmsg_type == libc::IPV6_FLOWINFO {
                let v = std::ptr::read_unaligned(d as *const u32);
                label = Some(u32::from_be(v) & 0xF_FFFF);
            }
            if (*c).cmsg_level == libc::IPPROTO_IPV6 && (*c).cmsg_type == libc::IPV6_TCLASS {
                tclass = Some(std::ptr::read_unaligned(d as *const libc::c_int) as u8);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        (label, tclass)
    }
}

#[tokio::test]
async fn ipv6_flow_label_and_traffic_class_per_send() {
    let a = UdpEndpoint::bind(V6.parse().unwrap(), "a").unwrap();
    let (rx, port) = flowinfo_receiver();
    let to = Endpoint {
        gid: Ipv6Addr::LOCALHOST,
        qpn: port as u32,
    };
    for (label, tc) in [
        (0xABCDEu32, 0x68u8),
        (0x00001, 0),
        (0xFFFFF, 0xB8),
        (0x1_23456, 4),
    ] {
        let params = SendParams {
            flow_label: label,
            traffic_class: tc,
            service_level: 0,
        };
        a.send(&to, &params, b"probe").unwrap();
        let (got_label, got_tc) = recv_flowinfo(&rx);
        assert_eq!(
            got_label,
            Some(label & 0xF_FFFF),
            "flow label for {label:#x}"
        );
        assert_eq!(got_tc, Some(tc), "traffic class");
    }
}

#[tokio::test]
async fn ipv4_traffic_class_per_send() {
    let a = UdpEndpoint::bind(V4.parse().unwrap(), "a").unwrap();
    let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let one: libc::c_int = 1;
    let r = unsafe {
        libc::setsockopt(
            rx.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_RECVTOS,
            &one as *const _ as *const libc::c_void,
            4,
        )
    };
    assert_eq!(r, 0);
    let port = rx.local_addr().unwrap().port();
    let to = Endpoint {
        gid: "::ffff:127.0.0.1".parse().unwrap(),
        qpn: port as u32,
    };
    for tc in [0x68u8, 0] {
        a.send(
            &to,
            &SendParams {
                flow_label: 5,
                traffic_class: tc,
                service_level: 0,
            },
            b"p",
        )
        .unwrap();
        // Blocking is fine here: nothing else runs on this test's runtime.
        let got = unsafe {
            let mut data = [0u8; 16];
            let mut ctl = [0u64; 16];
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr() as *mut _,
                iov_len: data.len(),
            };
            let mut msg: libc::msghdr = zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = ctl.as_mut_ptr() as *mut _;
            msg.msg_controllen = size_of::<[u64; 16]>();
            assert!(libc::recvmsg(rx.as_raw_fd(), &mut msg, 0) >= 0);
            let mut tos = None;
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TOS {
                    tos = Some(*libc::CMSG_DATA(c));
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
            tos
        };
        assert_eq!(got, Some(tc));
    }
}
