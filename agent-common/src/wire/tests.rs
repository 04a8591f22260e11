//! Tests of `wire.rs`.

extern crate std;
use super::*;
use std::format;
use std::vec::Vec;

// Hand-written from the layout table, not produced by encode().
const GOLDEN_PROBE: [u8; 40] = [
    0x01, 0x00, 0x00, 0x00, // version, probe, n/a, flags
    0xDE, 0xAD, 0xBE, 0xEF, 0x00, 0x00, 0x00, 0x2A, // sequence
    0x00, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, // t1
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // t3
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, // t4
    0x00, 0x00, 0x00, 0x00, // reserved
];
const GOLDEN_SECOND_ACK: [u8; 40] = [
    0x01, 0x01, 0x02, 0x80, // version, ack, second, flags 0x80
    0x00, 0x00, 0x00, 0x07, 0xFF, 0xFF, 0xFF, 0xFF, // sequence
    0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // t1
    0x17, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xE8, // t3
    0x17, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0xD0, // t4
    0x00, 0x00, 0x00, 0x00,
];

fn golden_probe() -> ProbePacket {
    ProbePacket::probe(0xDEAD_BEEF_0000_002A, 0x0000_0001_0203_0405)
}
fn golden_second() -> ProbePacket {
    ProbePacket {
        msg_type: MsgType::Ack,
        ack_type: AckType::Second,
        flags: 0x80,
        sequence: 0x0000_0007_FFFF_FFFF,
        t1: 0x1122_3344_5566_7788,
        t3: 0x1700_0000_0000_03E8,
        t4: 0x1700_0000_0000_07D0,
    }
}

#[test]
fn encode_matches_golden() {
    assert_eq!(golden_probe().encode(), GOLDEN_PROBE);
    assert_eq!(golden_second().encode(), GOLDEN_SECOND_ACK);
}

#[test]
fn decode_matches_golden() {
    assert_eq!(ProbePacket::decode(&GOLDEN_PROBE), Ok(golden_probe()));
    assert_eq!(ProbePacket::decode(&GOLDEN_SECOND_ACK), Ok(golden_second()));
}

#[test]
fn first_ack_golden_and_roundtrip() {
    let p = golden_probe();
    let a = ProbePacket::first_ack(&p, 0x0102_0304_0506_0708);
    let b = a.encode();
    assert_eq!(&b[0..4], &[1, 1, 1, 0]);
    assert_eq!(&b[4..12], &GOLDEN_PROBE[4..12]);
    assert_eq!(&b[12..20], &GOLDEN_PROBE[12..20]);
    assert_eq!(&b[20..28], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&b[28..40], &[0u8; 12]);
    assert_eq!(ProbePacket::decode(&b), Ok(a));
    let s = ProbePacket::second_ack(&p, 5, 9);
    assert_eq!(ProbePacket::decode(&s.encode()), Ok(s));
    assert_eq!((s.t1, s.t3, s.t4, s.sequence), (p.t1, 5, 9, p.sequence));
}

#[test]
fn short_packet() {
    assert_eq!(
        ProbePacket::decode(&GOLDEN_PROBE[..39]),
        Err(WireError::Short { len: 39 })
    );
    assert_eq!(ProbePacket::decode(&[]), Err(WireError::Short { len: 0 }));
}

#[test]
fn bad_version() {
    for v in [0u8, 2, 0xFF] {
        let mut b = GOLDEN_PROBE;
        b[0] = v;
        assert_eq!(
            ProbePacket::decode(&b),
            Err(WireError::BadVersion { version: v })
        );
    }
}

#[test]
fn unknown_types() {
    let mut b = GOLDEN_PROBE;
    b[1] = 2;
    assert_eq!(
        ProbePacket::decode(&b),
        Err(WireError::UnknownMsgType { msg_type: 2 })
    );
    let mut b = GOLDEN_SECOND_ACK;
    b[2] = 3;
    assert_eq!(
        ProbePacket::decode(&b),
        Err(WireError::UnknownAckType { ack_type: 3 })
    );
}

#[test]
fn inconsistent_combinations() {
    let mut b = GOLDEN_PROBE;
    b[2] = 1;
    assert_eq!(
        ProbePacket::decode(&b),
        Err(WireError::Inconsistent {
            msg_type: 0,
            ack_type: 1
        })
    );
    let mut b = GOLDEN_SECOND_ACK;
    b[2] = 0;
    assert_eq!(
        ProbePacket::decode(&b),
        Err(WireError::Inconsistent {
            msg_type: 1,
            ack_type: 0
        })
    );
}

#[test]
fn trailing_bytes_ignored() {
    let mut v: Vec<u8> = GOLDEN_SECOND_ACK.to_vec();
    v.extend_from_slice(&[0xAB; 24]);
    assert_eq!(ProbePacket::decode(&v), Ok(golden_second()));
}

#[test]
fn display_names_the_culprit() {
    assert_eq!(
        format!("{}", WireError::Short { len: 3 }),
        "probe packet too short: 3 bytes, need 40"
    );
    assert!(format!("{}", WireError::BadVersion { version: 9 }).contains("version 9"));
    assert!(format!("{}", WireError::UnknownMsgType { msg_type: 7 }).contains("msg_type 7"));
    assert!(format!("{}", WireError::UnknownAckType { ack_type: 4 }).contains("ack_type 4"));
    assert!(format!(
        "{}",
        WireError::Inconsistent {
            msg_type: 1,
            ack_type: 0
        }
    )
    .contains("msg_type 1 with ack_type 0"));
}
