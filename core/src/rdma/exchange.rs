//! The connection-information exchange of `rdma_uverbs`, as pure code (no I/O).
//!
//! Before two RC queue pairs can talk, each side must learn the other's queue-pair
//! number, packet sequence number, LID and GID; the client must also learn where the
//! served memory is (virtual address, `rkey`, size). The original exchanged these over a
//! side channel; here they travel over one short TCP connection at the durl's `url`,
//! which stays open for as long as the queue pair lives (the server tears the pair down
//! when it closes).
//!
//! Every message is one frame:
//!
//! ```text
//! magic "SCRD" (4) | version u16 | kind u8 | body length u32 | body
//! ```
//!
//! all integers big-endian. Bodies:
//!
//! - `Connect` (client → server): token length u16, token, then the client's
//!   [`QpInfo`] (its `rkey`, `addr` and `size` are zero: a client serves nothing).
//! - `Accept` (server → client): the server's [`QpInfo`].
//! - `Refuse` (server → client): a [`RefuseCode`] byte, reason length u16, reason (UTF-8).
//!
//! A reader first reads [`HEADER_LEN`] bytes and checks them with [`decode_header`]
//! (magic, version and a body no longer than [`MAX_BODY`], so a hostile length cannot
//! make it allocate), then reads the body and decodes the whole frame with [`decode`].
//!
//! # Example
//! ```
//! use scad_core::rdma::exchange::{decode, encode, Message, QpInfo};
//! let msg = Message::Connect { token: b"secret".to_vec(), qp: QpInfo { qpn: 7, ..QpInfo::default() } };
//! let mut frame = Vec::new();
//! encode(&msg, &mut frame)?;
//! assert_eq!(decode(&frame)?, msg);
//! # Ok::<(), scad_core::rdma::exchange::ExchangeError>(())
//! ```

use std::fmt;

/// First four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"SCRD";
/// Version of this encoding; a peer speaking another is refused.
pub const VERSION: u16 = 1;
/// Bytes of the frame header (magic, version, kind, body length).
pub const HEADER_LEN: usize = 11;
/// Longest token accepted.
pub const MAX_TOKEN: usize = 256;
/// Longest refusal reason accepted.
pub const MAX_REASON: usize = 512;
/// Longest body accepted (room for the largest `Connect` and `Refuse`).
pub const MAX_BODY: usize = 1024;
/// Bytes of an encoded [`QpInfo`].
pub const QP_INFO_LEN: usize = 4 + 4 + 2 + 16 + 1 + 1 + 4 + 8 + 8;

const KIND_CONNECT: u8 = 1;
const KIND_ACCEPT: u8 = 2;
const KIND_REFUSE: u8 = 3;

/// What one side tells the other about its queue pair and, for the server, its memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpInfo {
    /// Queue-pair number.
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// Local identifier of the port (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID at the chosen index (all zero if the port has none).
    pub gid: [u8; 16],
    /// Active MTU of the port as an `ibv_mtu` value (1 = 256 B … 5 = 4096 B).
    pub mtu: u8,
    /// RDMA READs this side can have in flight (initiator) or accept (responder).
    pub rd_atomic: u8,
    /// Remote key of the served memory (0 from a client).
    pub rkey: u32,
    /// Virtual address of the served memory (0 from a client).
    pub addr: u64,
    /// Bytes of the served memory (0 from a client).
    pub size: u64,
}

/// Why a server refused a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RefuseCode {
    /// Wrong or missing token.
    Unauthenticated = 1,
    /// The server is at its connection limit.
    Busy = 2,
    /// The server could not set up a queue pair.
    Failed = 3,
    /// The client speaks another version.
    VersionMismatch = 4,
    /// The client's message could not be decoded.
    Malformed = 5,
    /// Protected mode: the server has no token and serves only clients on its own host.
    Protected = 6,
}

impl RefuseCode {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => RefuseCode::Unauthenticated,
            2 => RefuseCode::Busy,
            3 => RefuseCode::Failed,
            4 => RefuseCode::VersionMismatch,
            5 => RefuseCode::Malformed,
            6 => RefuseCode::Protected,
            _ => return None,
        })
    }
}

/// One message of the exchange.
#[derive(Clone, PartialEq, Eq)]
pub enum Message {
    /// Client → server: the shared secret and the client's queue pair.
    Connect {
        /// Shared secret (empty when the client has none).
        token: Vec<u8>,
        /// The client's queue pair.
        qp: QpInfo,
    },
    /// Server → client: the server's queue pair and memory.
    Accept(QpInfo),
    /// Server → client: the connection is refused.
    Refuse {
        /// Why, for the client to act on.
        code: RefuseCode,
        /// Why, for people.
        reason: String,
    },
}

impl fmt::Debug for Message {
    /// Never prints the token.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Message::Connect { token, qp } => f
                .debug_struct("Connect")
                .field("token", &format_args!("<{} bytes>", token.len()))
                .field("qp", qp)
                .finish(),
            Message::Accept(qp) => f.debug_tuple("Accept").field(qp).finish(),
            Message::Refuse { code, reason } => f
                .debug_struct("Refuse")
                .field("code", code)
                .field("reason", reason)
                .finish(),
        }
    }
}

/// A frame that cannot be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// Fewer bytes than the frame needs.
    #[error("truncated message: {needed} bytes needed, {got} present")]
    Truncated {
        /// Bytes the frame needs.
        needed: usize,
        /// Bytes present.
        got: usize,
    },
    /// More bytes than the frame's length says.
    #[error("{extra} unexpected bytes after the message")]
    Trailing {
        /// Bytes beyond the frame.
        extra: usize,
    },
    /// The frame does not start with [`MAGIC`]: the peer is not an RDMA memory server.
    #[error("bad magic {0:02x?}: the peer does not speak the scad RDMA exchange (is it a tcp memory server?)")]
    BadMagic([u8; 4]),
    /// The peer speaks another version of the exchange.
    #[error("peer speaks exchange version {got}, this build speaks {expected}")]
    Version {
        /// The peer's version.
        got: u16,
        /// Ours.
        expected: u16,
    },
    /// An unknown message kind.
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// A body longer than [`MAX_BODY`].
    #[error("message body of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Length announced.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A token longer than [`MAX_TOKEN`].
    #[error("token of {len} bytes exceeds the limit of {max}")]
    TokenTooLong {
        /// Token length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A refusal reason longer than [`MAX_REASON`] or not UTF-8.
    #[error("refusal reason is invalid: {0}")]
    BadReason(String),
    /// An unknown refusal code.
    #[error("unknown refusal code {0}")]
    BadRefuseCode(u8),
}

/// A checked frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message kind byte.
    pub kind: u8,
    /// Bytes of body that follow the header.
    pub body_len: usize,
}

/// Checks the first [`HEADER_LEN`] bytes of a frame: magic, version, kind and length.
///
/// # Errors
/// [`ExchangeError::Truncated`], [`ExchangeError::BadMagic`], [`ExchangeError::Version`],
/// [`ExchangeError::UnknownKind`], [`ExchangeError::TooLarge`].
pub fn decode_header(bytes: &[u8]) -> Result<Header, ExchangeError> {
    let mut r = Reader::new(bytes);
    let magic: [u8; 4] = r.array()?;
    if magic != MAGIC {
        return Err(ExchangeError::BadMagic(magic));
    }
    let version = r.u16()?;
    if version != VERSION {
        return Err(ExchangeError::Version {
            got: version,
            expected: VERSION,
        });
    }
    let kind = r.u8()?;
    if !matches!(kind, KIND_CONNECT | KIND_ACCEPT | KIND_REFUSE) {
        return Err(ExchangeError::UnknownKind(kind));
    }
    let body_len = r.u32()? as usize;
    if body_len > MAX_BODY {
        return Err(ExchangeError::TooLarge {
            len: body_len,
            max: MAX_BODY,
        });
    }
    Ok(Header { kind, body_len })
}

/// Decodes exactly one whole frame (header and body).
///
/// # Errors
/// Any [`ExchangeError`]; never panics, whatever the input.
pub fn decode(frame: &[u8]) -> Result<Message, ExchangeError> {
    let header = decode_header(frame)?;
    let needed = HEADER_LEN + header.body_len;
    if frame.len() < needed {
        return Err(ExchangeError::Truncated {
            needed,
            got: frame.len(),
        });
    }
    if frame.len() > needed {
        return Err(ExchangeError::Trailing {
            extra: frame.len() - needed,
        });
    }
    decode_body(header.kind, &frame[HEADER_LEN..])
}

/// Decodes a body whose header [`decode_header`] has already checked.
///
/// # Errors
/// Any [`ExchangeError`]; never panics, whatever the input.
pub fn decode_body(kind: u8, body: &[u8]) -> Result<Message, ExchangeError> {
    let mut r = Reader::new(body);
    let msg = match kind {
        KIND_CONNECT => {
            let len = usize::from(r.u16()?);
            if len > MAX_TOKEN {
                return Err(ExchangeError::TokenTooLong {
                    len,
                    max: MAX_TOKEN,
                });
            }
            let token = r.bytes(len)?.to_vec();
            let qp = r.qp_info()?;
            Message::Connect { token, qp }
        }
        KIND_ACCEPT => Message::Accept(r.qp_info()?),
        KIND_REFUSE => {
            let raw = r.u8()?;
            let code = RefuseCode::from_u8(raw).ok_or(ExchangeError::BadRefuseCode(raw))?;
            let len = usize::from(r.u16()?);
            if len > MAX_REASON {
                return Err(ExchangeError::BadReason(format!(
                    "{len} bytes exceed the limit of {MAX_REASON}"
                )));
            }
            let reason = std::str::from_utf8(r.bytes(len)?)
                .map_err(|e| ExchangeError::BadReason(e.to_string()))?
                .to_owned();
            Message::Refuse { code, reason }
        }
        other => return Err(ExchangeError::UnknownKind(other)),
    };
    r.finish()?;
    Ok(msg)
}

/// Appends the frame of `msg` to `out`.
///
/// # Errors
/// [`ExchangeError::TokenTooLong`] or [`ExchangeError::BadReason`] for fields over their
/// limits (nothing is appended then).
pub fn encode(msg: &Message, out: &mut Vec<u8>) -> Result<(), ExchangeError> {
    let mut body = Vec::with_capacity(64);
    let kind = match msg {
        Message::Connect { token, qp } => {
            if token.len() > MAX_TOKEN {
                return Err(ExchangeError::TokenTooLong {
                    len: token.len(),
                    max: MAX_TOKEN,
                });
            }
            body.extend_from_slice(&(token.len() as u16).to_be_bytes());
            body.extend_from_slice(token);
            put_qp_info(&mut body, qp);
            KIND_CONNECT
        }
        Message::Accept(qp) => {
            put_qp_info(&mut body, qp);
            KIND_ACCEPT
        }
        Message::Refuse { code, reason } => {
            // Reasons are ours, not the peer's: shorten an over-long one at a char boundary.
            let mut end = reason.len().min(MAX_REASON);
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            body.push(*code as u8);
            body.extend_from_slice(&(end as u16).to_be_bytes());
            body.extend_from_slice(&reason.as_bytes()[..end]);
            KIND_REFUSE
        }
    };
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

fn put_qp_info(out: &mut Vec<u8>, qp: &QpInfo) {
    out.extend_from_slice(&qp.qpn.to_be_bytes());
    out.extend_from_slice(&qp.psn.to_be_bytes());
    out.extend_from_slice(&qp.lid.to_be_bytes());
    out.extend_from_slice(&qp.gid);
    out.push(qp.mtu);
    out.push(qp.rd_atomic);
    out.extend_from_slice(&qp.rkey.to_be_bytes());
    out.extend_from_slice(&qp.addr.to_be_bytes());
    out.extend_from_slice(&qp.size.to_be_bytes());
}

/// A bounds-checked cursor: every read either succeeds or reports truncation.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], ExchangeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(ExchangeError::Truncated {
                needed: self.pos.saturating_add(n),
                got: self.buf.len(),
            });
        };
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ExchangeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, ExchangeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, ExchangeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, ExchangeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, ExchangeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn qp_info(&mut self) -> Result<QpInfo, ExchangeError> {
        Ok(QpInfo {
            qpn: self.u32()?,
            psn: self.u32()?,
            lid: self.u16()?,
            gid: self.array()?,
            mtu: self.u8()?,
            rd_atomic: self.u8()?,
            rkey: self.u32()?,
            addr: self.u64()?,
            size: self.u64()?,
        })
    }

    fn finish(&self) -> Result<(), ExchangeError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            extra => Err(ExchangeError::Trailing { extra }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> QpInfo {
        QpInfo {
            qpn: 0x00ab_cdef,
            psn: 0x0012_3456,
            lid: 7,
            gid: [
                0xfe, 0x80, 0, 0, 0, 0, 0, 0, 2, 2, 0xc9, 0xff, 0xfe, 0, 0, 1,
            ],
            mtu: 3,
            rd_atomic: 16,
            rkey: 0xdead_beef,
            addr: 0x7f00_1234_5000,
            size: 1 << 30,
        }
    }

    fn frame(msg: &Message) -> Vec<u8> {
        let mut out = Vec::new();
        encode(msg, &mut out).unwrap();
        out
    }

    #[test]
    fn every_message_round_trips() {
        let msgs = [
            Message::Connect {
                token: b"s3cret".to_vec(),
                qp: info(),
            },
            Message::Connect {
                token: Vec::new(),
                qp: QpInfo::default(),
            },
            Message::Accept(info()),
            Message::Refuse {
                code: RefuseCode::Unauthenticated,
                reason: "wrong or missing token".into(),
            },
            Message::Refuse {
                code: RefuseCode::Protected,
                reason: "protected mode".into(),
            },
        ];
        for msg in msgs {
            let bytes = frame(&msg);
            let header = decode_header(&bytes).unwrap();
            assert_eq!(header.body_len, bytes.len() - HEADER_LEN);
            assert_eq!(decode(&bytes).unwrap(), msg);
        }
        assert_eq!(
            frame(&Message::Accept(info())).len(),
            HEADER_LEN + QP_INFO_LEN
        );
    }

    #[test]
    fn truncated_frames_are_rejected_at_every_length() {
        let bytes = frame(&Message::Connect {
            token: b"tok".to_vec(),
            qp: info(),
        });
        for cut in 0..bytes.len() {
            assert!(
                matches!(decode(&bytes[..cut]), Err(ExchangeError::Truncated { .. })),
                "cut at {cut}"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(decode(&long), Err(ExchangeError::Trailing { extra: 1 }));
    }

    #[test]
    fn body_shorter_than_its_fields_is_truncation_not_panic() {
        // Header says 3 body bytes, the Connect body claims a 200-byte token.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&VERSION.to_be_bytes());
        bytes.push(KIND_CONNECT);
        bytes.extend_from_slice(&3u32.to_be_bytes());
        bytes.extend_from_slice(&[0, 200, 1]);
        assert!(matches!(
            decode(&bytes),
            Err(ExchangeError::Truncated { .. })
        ));
    }

    #[test]
    fn bad_magic_names_the_likely_mistake() {
        let mut bytes = frame(&Message::Accept(info()));
        bytes[..4].copy_from_slice(b"SCAD");
        let err = decode(&bytes).unwrap_err();
        assert_eq!(err, ExchangeError::BadMagic(*b"SCAD"));
        assert!(err.to_string().contains("tcp memory server"));
    }

    #[test]
    fn wrong_version_is_reported_with_both_versions() {
        let mut bytes = frame(&Message::Accept(info()));
        bytes[4..6].copy_from_slice(&(VERSION + 1).to_be_bytes());
        assert_eq!(
            decode_header(&bytes),
            Err(ExchangeError::Version {
                got: VERSION + 1,
                expected: VERSION
            })
        );
    }

    #[test]
    fn oversized_token_is_rejected_both_ways() {
        let msg = Message::Connect {
            token: vec![b'x'; MAX_TOKEN + 1],
            qp: info(),
        };
        let mut out = Vec::new();
        assert_eq!(
            encode(&msg, &mut out),
            Err(ExchangeError::TokenTooLong {
                len: MAX_TOKEN + 1,
                max: MAX_TOKEN
            })
        );
        assert!(out.is_empty(), "nothing appended on error");
        // Hand-built frame with a token one byte too long.
        let mut body = Vec::new();
        body.extend_from_slice(&((MAX_TOKEN + 1) as u16).to_be_bytes());
        body.extend_from_slice(&vec![b'x'; MAX_TOKEN + 1]);
        put_qp_info(&mut body, &info());
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&VERSION.to_be_bytes());
        bytes.push(KIND_CONNECT);
        bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&body);
        assert!(matches!(
            decode(&bytes),
            Err(ExchangeError::TokenTooLong { .. })
        ));
        // The largest allowed token still fits a body.
        let max = Message::Connect {
            token: vec![b'x'; MAX_TOKEN],
            qp: info(),
        };
        assert_eq!(decode(&frame(&max)).unwrap(), max);
    }

    #[test]
    fn oversized_length_is_rejected_from_the_header_alone() {
        let mut bytes = frame(&Message::Accept(info()));
        bytes[7..11].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(
            decode_header(&bytes[..HEADER_LEN]),
            Err(ExchangeError::TooLarge {
                len: u32::MAX as usize,
                max: MAX_BODY
            })
        );
    }

    #[test]
    fn unknown_kind_and_refusal_code_are_rejected() {
        let mut bytes = frame(&Message::Accept(info()));
        bytes[6] = 9;
        assert_eq!(decode(&bytes), Err(ExchangeError::UnknownKind(9)));
        let mut bytes = frame(&Message::Refuse {
            code: RefuseCode::Busy,
            reason: "full".into(),
        });
        bytes[HEADER_LEN] = 0;
        assert_eq!(decode(&bytes), Err(ExchangeError::BadRefuseCode(0)));
        let mut bytes = frame(&Message::Refuse {
            code: RefuseCode::Busy,
            reason: "ab".into(),
        });
        let n = bytes.len();
        bytes[n - 1] = 0xff;
        assert!(matches!(decode(&bytes), Err(ExchangeError::BadReason(_))));
    }

    #[test]
    fn long_reasons_are_shortened_not_refused() {
        let reason = "é".repeat(MAX_REASON);
        let bytes = frame(&Message::Refuse {
            code: RefuseCode::Failed,
            reason: reason.clone(),
        });
        match decode(&bytes).unwrap() {
            Message::Refuse { reason: got, .. } => {
                assert!(got.len() <= MAX_REASON);
                assert!(reason.starts_with(&got));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn debug_never_shows_the_token() {
        let msg = Message::Connect {
            token: b"hunter2".to_vec(),
            qp: info(),
        };
        let shown = format!("{msg:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("<7 bytes>"));
    }

    proptest::proptest! {
        #[test]
        fn decoding_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..1200)) {
            let _ = decode(&bytes);
            let _ = decode_header(&bytes);
            for kind in [KIND_CONNECT, KIND_ACCEPT, KIND_REFUSE, 0, 255] {
                let _ = decode_body(kind, &bytes);
            }
        }

        #[test]
        fn decoding_valid_headers_with_random_bodies_never_panics(
            kind in 1u8..=3,
            body in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
        ) {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(&MAGIC);
            bytes.extend_from_slice(&VERSION.to_be_bytes());
            bytes.push(kind);
            bytes.extend_from_slice(&(body.len() as u32).to_be_bytes());
            bytes.extend_from_slice(&body);
            let _ = decode(&bytes);
        }

        #[test]
        fn connect_round_trips(
            token in proptest::collection::vec(proptest::num::u8::ANY, 0..=MAX_TOKEN),
            qpn in 0u32..(1 << 24), psn in 0u32..(1 << 24), lid: u16, gid: [u8; 16],
            rkey: u32, addr: u64, size: u64,
        ) {
            let msg = Message::Connect {
                token,
                qp: QpInfo { qpn, psn, lid, gid, mtu: 5, rd_atomic: 1, rkey, addr, size },
            };
            let mut out = Vec::new();
            encode(&msg, &mut out).unwrap();
            proptest::prop_assert_eq!(decode(&out).unwrap(), msg);
        }
    }
}
