//! Tests of `completion.rs`.

use super::*;

/// A RoCE v2 / IPv6 GRH as the HCA writes it.
pub(crate) fn grh_v6(src: Ipv6Addr, dst: Ipv6Addr, flow_label: u32, tclass: u8) -> [u8; 40] {
    let mut g = [0u8; 40];
    let vtf: u32 = (6 << 28) | ((tclass as u32) << 20) | (flow_label & 0xF_FFFF);
    g[0..4].copy_from_slice(&vtf.to_be_bytes());
    g[4..6].copy_from_slice(&48u16.to_be_bytes()); // UDP 8 + BTH 12 + DETH 8 + 40 - ... (not checked)
    g[6] = 17;
    g[7] = 64;
    g[8..24].copy_from_slice(&src.octets());
    g[24..40].copy_from_slice(&dst.octets());
    g
}

/// A RoCE v2 / IPv4 GRH area: 20 undefined bytes, then the IPv4 header.
pub(crate) fn grh_v4(src: Ipv4Addr, dst: Ipv4Addr, garbage: u8) -> [u8; 40] {
    let mut g = [garbage; 40];
    let h = &mut g[20..40];
    h.copy_from_slice(&[0u8; 20]);
    h[0] = 0x45;
    h[1] = 0x68; // DSCP 26
    h[2..4].copy_from_slice(&76u16.to_be_bytes());
    h[6] = 0x40; // DF
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let mut sum: u32 = 0;
    for p in h.chunks(2) {
        sum += u16::from_be_bytes([p[0], p[1]]) as u32;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    g
}

fn buf(grh: [u8; 40], payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; GRH_LEN + PAYLOAD_LEN];
    b[..40].copy_from_slice(&grh);
    b[40..40 + payload.len()].copy_from_slice(payload);
    b
}

fn recv_rec(slot: u32, byte_len: u32, src_qp: u32) -> WcRecord {
    WcRecord {
        wr_id: WrKind::Recv(slot).to_wr_id(),
        status: WC_SUCCESS,
        opcode: WC_OPCODE_RECV,
        byte_len,
        src_qp,
        wc_flags: WC_FLAG_GRH,
        ts_ns: 777_000,
    }
}

#[test]
fn wr_id_roundtrip() {
    for k in [
        WrKind::Send { id: 0, slot: 0 },
        WrKind::Send {
            id: u32::MAX,
            slot: 65_535,
        },
        WrKind::Recv(0),
        WrKind::Recv(511),
    ] {
        assert_eq!(WrKind::from_wr_id(k.to_wr_id()), k);
    }
    assert_ne!(
        WrKind::Send { id: 3, slot: 0 }.to_wr_id(),
        WrKind::Recv(3).to_wr_id()
    );
}

#[test]
fn receive_over_ipv4_roce_v2_gives_v4_mapped_source() {
    let payload: Vec<u8> = (0u8..40).collect();
    // 0x60 garbage in the undefined half must not be mistaken for an IPv6 header.
    let b = buf(
        grh_v4(Ipv4Addr::new(10, 0, 0, 7), Ipv4Addr::new(10, 0, 0, 8), 0x60),
        &payload,
    );
    match translate(&recv_rec(5, 80, 0x00_0123), &b, GRH_LEN + PAYLOAD_LEN) {
        WcOutcome::Event {
            event:
                TransportEvent::Received {
                    from,
                    len,
                    data,
                    rx_ts_ns,
                    flow_label,
                },
            repost,
        } => {
            assert_eq!(flow_label, None, "IPv4 carries no flow label");
            assert_eq!(
                from,
                Endpoint {
                    gid: "::ffff:10.0.0.7".parse().unwrap(),
                    qpn: 0x123
                }
            );
            assert_eq!(len, 40);
            assert_eq!(&data[..40], &payload[..]);
            assert!(data[40..].iter().all(|&x| x == 0));
            assert_eq!(rx_ts_ns, Some(777_000));
            assert_eq!(repost, Some(5));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn receive_over_ipv6_gives_the_source_gid() {
    let src: Ipv6Addr = "fd00::1:7".parse().unwrap();
    let b = buf(
        grh_v6(src, "fd00::1:8".parse().unwrap(), 0xABCDE, 0x68),
        &[9; 40],
    );
    let out = translate(&recv_rec(0, 80, 0xFF00_0042), &b, GRH_LEN + PAYLOAD_LEN);
    let WcOutcome::Event {
        event:
            TransportEvent::Received {
                from,
                len,
                flow_label,
                ..
            },
        ..
    } = out
    else {
        panic!("{out:?}")
    };
    // The responder echoes it in its ACKs.
    assert_eq!(flow_label, Some(0xABCDE));
    // src_qp is 24 bits; junk above them is ignored.
    assert_eq!(
        from,
        Endpoint {
            gid: src,
            qpn: 0x42
        }
    );
    assert_eq!(len, 40);
}

#[test]
fn send_completion_becomes_sent() {
    let rec = WcRecord {
        wr_id: WrKind::Send { id: 41, slot: 7 }.to_wr_id(),
        status: WC_SUCCESS,
        opcode: WC_OPCODE_SEND,
        byte_len: 0,
        src_qp: 0,
        wc_flags: 0,
        ts_ns: 123,
    };
    assert_eq!(
        translate(&rec, &[], GRH_LEN + PAYLOAD_LEN),
        WcOutcome::Event {
            event: TransportEvent::Sent {
                id: 41,
                tx_ts_ns: 123
            },
            repost: None
        }
    );
}

#[test]
fn error_statuses_fail_the_qp() {
    let mut rec = recv_rec(3, 0, 0);
    rec.status = WC_WR_FLUSH_ERR;
    assert_eq!(
        translate(&rec, &[], GRH_LEN + PAYLOAD_LEN),
        WcOutcome::Failed {
            kind: WrKind::Recv(3),
            status: 5,
            reason: "receive slot 3 completed with status 5 (IBV_WC_WR_FLUSH_ERR)".into()
        }
    );
    let rec = WcRecord {
        wr_id: WrKind::Send { id: 9, slot: 1 }.to_wr_id(),
        status: 12,
        opcode: 0,
        byte_len: 0,
        src_qp: 0,
        wc_flags: 0,
        ts_ns: 0,
    };
    let WcOutcome::Failed { reason, .. } = translate(&rec, &[], GRH_LEN + PAYLOAD_LEN) else {
        panic!()
    };
    assert_eq!(
        reason,
        "send 9 completed with status 12 (IBV_WC_RETRY_EXC_ERR)"
    );
    assert_eq!(wc_status_name(99), "IBV_WC_UNKNOWN");
}

#[test]
fn malformed_receives_are_reposted_not_delivered() {
    let good = buf(
        grh_v6("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap(), 0, 0),
        &[1; 40],
    );
    // No GRH flag.
    let mut r = recv_rec(1, 80, 1);
    r.wc_flags = 0;
    assert_eq!(
        translate(&r, &good, GRH_LEN + PAYLOAD_LEN),
        WcOutcome::Malformed {
            reason: "receive slot 1 has no GRH (not RoCE?)".into(),
            repost: Some(1)
        }
    );
    // Shorter than a GRH, or longer than the buffer.
    for bl in [39u32, 200] {
        let out = translate(&recv_rec(2, bl, 1), &good, GRH_LEN + PAYLOAD_LEN);
        let WcOutcome::Malformed { reason, repost } = out else {
            panic!()
        };
        assert!(reason.contains(&format!("byte_len {bl}")), "{reason}");
        assert_eq!(repost, Some(2));
    }
    // Neither header: zeroed GRH area.
    let zero = buf([0; 40], &[1; 40]);
    let WcOutcome::Malformed { reason, .. } =
        translate(&recv_rec(4, 80, 1), &zero, GRH_LEN + PAYLOAD_LEN)
    else {
        panic!()
    };
    assert!(
        reason.starts_with("receive slot 4: GRH holds neither"),
        "{reason}"
    );
    // soft-RoCE loopback between two GIDs of one device: zeroed first 20 bytes and an
    // IPv4 header whose checksum was never computed (the first real run lost every
    // probe on this).
    let mut g = grh_v4(
        Ipv4Addr::new(198, 18, 0, 3),
        Ipv4Addr::new(198, 18, 0, 1),
        0,
    );
    g[30] = 0;
    g[31] = 0;
    assert_eq!(
        grh_source(&g).unwrap().to_ipv4_mapped(),
        Some(Ipv4Addr::new(198, 18, 0, 3))
    );
    // An IPv4 header with a bad checksum inside an IPv6-looking area falls back to v6.
    let mut g = grh_v4(Ipv4Addr::new(1, 2, 3, 4), Ipv4Addr::new(5, 6, 7, 8), 0x60);
    g[30] ^= 0xFF;
    assert!(grh_source(&g).unwrap().to_ipv4_mapped().is_none());
    // Receive completion with a send opcode.
    let mut r = recv_rec(6, 80, 1);
    r.opcode = WC_OPCODE_SEND;
    assert!(matches!(
        translate(&r, &good, GRH_LEN + PAYLOAD_LEN),
        WcOutcome::Malformed {
            repost: Some(6),
            ..
        }
    ));
    assert!(grh_source(&[0; 10]).unwrap_err().contains("10 bytes"));
}

#[test]
fn a_datagram_longer_than_a_probe_keeps_its_length() {
    // A 1024-byte stray in a 1064-byte slot: delivered with its true length (the
    // agent drops it as malformed), only the head was copied.
    let b = buf(
        grh_v4(Ipv4Addr::new(10, 1, 1, 1), Ipv4Addr::new(10, 1, 1, 2), 0),
        &[0x5A; 64],
    );
    let WcOutcome::Event {
        event: TransportEvent::Received { len, data, .. },
        repost,
    } = translate(&recv_rec(3, 40 + 1024, 7), &b, 40 + 1024)
    else {
        panic!()
    };
    assert_eq!((len, data[63], repost), (1024, 0x5A, Some(3)));
    // Beyond the slot the HCA cannot have written it: malformed.
    assert!(matches!(
        translate(&recv_rec(3, 40 + 1025, 7), &b, 40 + 1024),
        WcOutcome::Malformed { .. }
    ));
}

#[test]
fn empty_payload_is_a_zero_length_receive() {
    let b = buf(
        grh_v4(Ipv4Addr::new(10, 1, 1, 1), Ipv4Addr::new(10, 1, 1, 2), 0),
        &[],
    );
    let WcOutcome::Event {
        event: TransportEvent::Received { len, .. },
        ..
    } = translate(&recv_rec(0, 40, 7), &b, GRH_LEN + PAYLOAD_LEN)
    else {
        panic!()
    };
    assert_eq!(len, 0);
}
