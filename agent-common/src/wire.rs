//! The 40-byte big-endian probe packet, identical to the Go/Zig R-Pingmesh wire format.
//!
//! | off | size | field                                   |
//! |-----|------|-----------------------------------------|
//! | 0   | 1    | version (1)                             |
//! | 1   | 1    | msg_type (0 probe, 1 ACK)               |
//! | 2   | 1    | ack_type (0 n/a, 1 first, 2 second)     |
//! | 3   | 1    | flags (reserved)                        |
//! | 4   | 8    | sequence_num                            |
//! | 12  | 8    | t1 (ns)                                 |
//! | 20  | 8    | t3 (ns)                                 |
//! | 28  | 8    | t4 (ns)                                 |
//! | 36  | 4    | reserved, zero                          |

pub const PACKET_LEN: usize = 40;
pub const WIRE_VERSION: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsgType {
    Probe = 0,
    Ack = 1,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckType {
    None = 0,
    First = 1,
    Second = 2,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbePacket {
    pub msg_type: MsgType,
    pub ack_type: AckType,
    pub flags: u8,
    pub sequence: u64,
    pub t1: u64,
    pub t3: u64,
    pub t4: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// Fewer than 40 bytes.
    Short {
        len: usize,
    },
    BadVersion {
        version: u8,
    },
    UnknownMsgType {
        msg_type: u8,
    },
    UnknownAckType {
        ack_type: u8,
    },
    /// A probe with ack_type != 0, or an ACK with ack_type == 0.
    Inconsistent {
        msg_type: u8,
        ack_type: u8,
    },
}

impl core::fmt::Display for WireError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            WireError::Short { len } => {
                write!(f, "probe packet too short: {len} bytes, need {PACKET_LEN}")
            }
            WireError::BadVersion { version } => {
                write!(
                    f,
                    "probe packet version {version} unsupported (expected {WIRE_VERSION})"
                )
            }
            WireError::UnknownMsgType { msg_type } => {
                write!(
                    f,
                    "probe packet msg_type {msg_type} unknown (0 probe, 1 ack)"
                )
            }
            WireError::UnknownAckType { ack_type } => {
                write!(
                    f,
                    "probe packet ack_type {ack_type} unknown (0 n/a, 1 first, 2 second)"
                )
            }
            WireError::Inconsistent { msg_type, ack_type } => write!(
                f,
                "probe packet msg_type {msg_type} with ack_type {ack_type} is inconsistent \
                 (a probe has ack_type 0, an ack has 1 or 2)"
            ),
        }
    }
}

// `core::error::Error` is stable in core, so the std-facing impl needs no std.
#[cfg(feature = "user")]
impl core::error::Error for WireError {}

impl MsgType {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(MsgType::Probe),
            1 => Some(MsgType::Ack),
            _ => None,
        }
    }
}

impl AckType {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(AckType::None),
            1 => Some(AckType::First),
            2 => Some(AckType::Second),
            _ => None,
        }
    }
}

fn be_u64(buf: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[off..off + 8]);
    u64::from_be_bytes(b)
}

impl ProbePacket {
    pub fn probe(sequence: u64, t1: u64) -> Self {
        ProbePacket {
            msg_type: MsgType::Probe,
            ack_type: AckType::None,
            flags: 0,
            sequence,
            t1,
            t3: 0,
            t4: 0,
        }
    }
    /// The first ACK answering `probe`: echoes its sequence and T1, carries T3.
    pub fn first_ack(probe: &ProbePacket, t3: u64) -> Self {
        ProbePacket {
            msg_type: MsgType::Ack,
            ack_type: AckType::First,
            flags: 0,
            sequence: probe.sequence,
            t1: probe.t1,
            t3,
            t4: 0,
        }
    }
    /// The second ACK answering `probe`: carries T3 and the first ACK's send time T4.
    pub fn second_ack(probe: &ProbePacket, t3: u64, t4: u64) -> Self {
        ProbePacket {
            msg_type: MsgType::Ack,
            ack_type: AckType::Second,
            flags: 0,
            sequence: probe.sequence,
            t1: probe.t1,
            t3,
            t4,
        }
    }
    pub fn encode(&self) -> [u8; PACKET_LEN] {
        let mut b = [0u8; PACKET_LEN];
        b[0] = WIRE_VERSION;
        b[1] = self.msg_type as u8;
        b[2] = self.ack_type as u8;
        b[3] = self.flags;
        b[4..12].copy_from_slice(&self.sequence.to_be_bytes());
        b[12..20].copy_from_slice(&self.t1.to_be_bytes());
        b[20..28].copy_from_slice(&self.t3.to_be_bytes());
        b[28..36].copy_from_slice(&self.t4.to_be_bytes());
        // 36..40 reserved, zero.
        b
    }
    /// Decodes the first 40 bytes; extra trailing bytes are ignored (a GRH-stripped
    /// receive buffer may be larger than the packet).
    pub fn decode(buf: &[u8]) -> Result<Self, WireError> {
        if buf.len() < PACKET_LEN {
            return Err(WireError::Short { len: buf.len() });
        }
        if buf[0] != WIRE_VERSION {
            return Err(WireError::BadVersion { version: buf[0] });
        }
        let msg_type =
            MsgType::from_u8(buf[1]).ok_or(WireError::UnknownMsgType { msg_type: buf[1] })?;
        let ack_type =
            AckType::from_u8(buf[2]).ok_or(WireError::UnknownAckType { ack_type: buf[2] })?;
        let consistent = match msg_type {
            MsgType::Probe => ack_type == AckType::None,
            MsgType::Ack => ack_type != AckType::None,
        };
        if !consistent {
            return Err(WireError::Inconsistent {
                msg_type: buf[1],
                ack_type: buf[2],
            });
        }
        // Reserved bytes are not checked: a future sender may use them.
        Ok(ProbePacket {
            msg_type,
            ack_type,
            flags: buf[3],
            sequence: be_u64(buf, 4),
            t1: be_u64(buf, 12),
            t3: be_u64(buf, 20),
            t4: be_u64(buf, 28),
        })
    }
}

#[cfg(test)]
mod tests {
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
}
