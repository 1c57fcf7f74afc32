//! The exchange of [`QpInfo`] over TCP: framing on a stream, the client's side and the
//! server's side. Independent of any device (the server's side takes a closure that
//! makes the queue pair), so it is tested without RDMA hardware.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use subtle::ConstantTimeEq;

use super::exchange::{self, ExchangeError, Message, QpInfo, RefuseCode, HEADER_LEN};
use crate::error::{Error, Result};

/// Why reading a message failed.
#[derive(Debug)]
pub(crate) enum ReadError {
    Io(io::Error),
    Exchange(ExchangeError),
}

/// Writes one message.
pub(crate) fn write_message(w: &mut impl Write, msg: &Message) -> io::Result<()> {
    let mut out = Vec::with_capacity(HEADER_LEN + 64);
    exchange::encode(msg, &mut out).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    w.write_all(&out)?;
    w.flush()
}

/// Reads one message: the header first, checked before the body is read, so a hostile
/// length never makes us allocate or wait for more than [`exchange::MAX_BODY`] bytes.
pub(crate) fn read_message(r: &mut impl Read) -> std::result::Result<Message, ReadError> {
    let mut head = [0u8; HEADER_LEN];
    r.read_exact(&mut head).map_err(ReadError::Io)?;
    let header = exchange::decode_header(&head).map_err(ReadError::Exchange)?;
    let mut body = vec![0u8; header.body_len];
    r.read_exact(&mut body).map_err(ReadError::Io)?;
    exchange::decode_body(header.kind, &body).map_err(ReadError::Exchange)
}

/// Timeouts of the client's side.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientTimeouts {
    pub(crate) connect: Duration,
    pub(crate) exchange: Duration,
}

/// The client's side: connects to `addr`, sends our token and queue pair, and returns
/// the open stream (which must stay open while the pair is used) and the server's
/// answer.
///
/// # Errors
/// [`Error::Connect`], [`Error::Timeout`], [`Error::Io`], [`Error::Auth`] for a refused
/// token, [`Error::Rdma`] for any other refusal or a malformed answer.
pub(crate) fn client_exchange(
    addr: &str,
    token: Option<&str>,
    local: &QpInfo,
    timeouts: ClientTimeouts,
) -> Result<(TcpStream, QpInfo)> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|source| Error::Connect {
            peer: addr.to_owned(),
            source,
        })?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the address resolved to nothing");
    let mut stream = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, timeouts.connect) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut stream = stream.ok_or_else(|| Error::Connect {
        peer: addr.to_owned(),
        source: last,
    })?;
    let io_err = |op: &'static str, e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Timeout {
            what: format!("RDMA connection exchange with {addr}"),
            timeout: timeouts.exchange,
        },
        io::ErrorKind::UnexpectedEof => Error::io(
            addr,
            op,
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the server closed the connection during the exchange",
            ),
        ),
        _ => Error::io(addr, op, e),
    };
    stream
        .set_nodelay(true)
        .and_then(|()| stream.set_read_timeout(Some(timeouts.exchange)))
        .and_then(|()| stream.set_write_timeout(Some(timeouts.exchange)))
        .map_err(|e| io_err("configure socket", e))?;
    let hello = Message::Connect {
        token: token.unwrap_or("").as_bytes().to_vec(),
        qp: *local,
    };
    write_message(&mut stream, &hello).map_err(|e| io_err("send queue-pair information", e))?;
    let reply = match read_message(&mut stream) {
        Ok(m) => m,
        Err(ReadError::Io(e)) => return Err(io_err("receive queue-pair information", e)),
        Err(ReadError::Exchange(e)) => {
            return Err(Error::Rdma {
                op: "exchange connection information",
                reason: format!("with {addr}: {e}"),
                source: None,
            })
        }
    };
    match reply {
        Message::Accept(remote) => {
            // The exchange is over; the stream now only signals the pair's lifetime.
            let _ = stream.set_read_timeout(None);
            Ok((stream, remote))
        }
        Message::Refuse {
            code: RefuseCode::Unauthenticated | RefuseCode::Protected,
            reason,
        } => Err(Error::Auth {
            peer: addr.to_owned(),
            message: reason,
        }),
        Message::Refuse { code, reason } => Err(Error::Rdma {
            op: "connect",
            reason: format!("RDMA memory server {addr} refused ({code:?}): {reason}"),
            source: None,
        }),
        Message::Connect { .. } => Err(Error::Rdma {
            op: "exchange connection information",
            reason: format!("{addr} answered with a Connect message"),
            source: None,
        }),
    }
}

/// Why the server's side ended without a queue pair.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("refused ({code:?}): {reason}")]
    Refused { code: RefuseCode, reason: String },
}

/// Sends a refusal (best effort: the peer may already be gone).
pub(crate) fn refuse(w: &mut impl Write, code: RefuseCode, reason: &str) {
    let _ = write_message(
        w,
        &Message::Refuse {
            code,
            reason: reason.to_owned(),
        },
    );
}

/// The server's side: reads the client's message, checks its token in constant time
/// before anything else is done, makes the queue pair with `make` (given the client's
/// information, returning ours and whatever must live as long as the connection), and
/// answers.
///
/// # Errors
/// [`ServeError::Refused`] after telling the client why; [`ServeError::Io`].
pub(crate) fn serve_exchange<S: Read + Write, T>(
    stream: &mut S,
    token: Option<&str>,
    make: impl FnOnce(&QpInfo) -> Result<(QpInfo, T)>,
) -> std::result::Result<T, ServeError> {
    let fail = |stream: &mut S, code: RefuseCode, reason: String| {
        refuse(stream, code, &reason);
        ServeError::Refused { code, reason }
    };
    let msg = match read_message(stream) {
        Ok(m) => m,
        Err(ReadError::Io(e)) => return Err(e.into()),
        Err(ReadError::Exchange(e)) => {
            let code = if matches!(e, ExchangeError::Version { .. }) {
                RefuseCode::VersionMismatch
            } else {
                RefuseCode::Malformed
            };
            return Err(fail(stream, code, e.to_string()));
        }
    };
    let Message::Connect { token: given, qp } = msg else {
        return Err(fail(
            stream,
            RefuseCode::Malformed,
            "the first message must be Connect".into(),
        ));
    };
    if let Some(expected) = token {
        if !bool::from(expected.as_bytes().ct_eq(&given)) {
            return Err(fail(
                stream,
                RefuseCode::Unauthenticated,
                "wrong or missing token".into(),
            ));
        }
    }
    let (ours, keep) = match make(&qp) {
        Ok(v) => v,
        Err(e) => return Err(fail(stream, RefuseCode::Failed, e.to_string())),
    };
    write_message(stream, &Message::Accept(ours))?;
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    const TIMEOUTS: ClientTimeouts = ClientTimeouts {
        connect: Duration::from_secs(5),
        exchange: Duration::from_secs(5),
    };

    fn server_info() -> QpInfo {
        QpInfo {
            qpn: 99,
            psn: 5,
            rkey: 0x1234,
            addr: 0x10_0000,
            size: 4096,
            mtu: 3,
            rd_atomic: 16,
            ..QpInfo::default()
        }
    }

    /// A one-connection server running `serve_exchange`; returns its address and whether
    /// `make` was called.
    fn one_shot(
        token: Option<&'static str>,
    ) -> (
        String,
        Arc<AtomicBool>,
        std::thread::JoinHandle<Option<QpInfo>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let made = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&made);
        let handle = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            serve_exchange(&mut s, token, |client| {
                flag.store(true, Ordering::SeqCst);
                Ok((server_info(), *client))
            })
            .ok()
        });
        (addr, made, handle)
    }

    #[test]
    fn exchange_round_trip_with_token() {
        let (addr, made, server) = one_shot(Some("tok"));
        let local = QpInfo {
            qpn: 7,
            psn: 8,
            ..QpInfo::default()
        };
        let (_stream, remote) = client_exchange(&addr, Some("tok"), &local, TIMEOUTS).unwrap();
        assert_eq!(remote, server_info());
        assert_eq!(server.join().unwrap(), Some(local));
        assert!(made.load(Ordering::SeqCst));
    }

    #[test]
    fn wrong_token_is_refused_before_any_queue_pair_is_made() {
        for given in [Some("nope"), None, Some("tok-longer")] {
            let (addr, made, server) = one_shot(Some("tok"));
            let err = client_exchange(&addr, given, &QpInfo::default(), TIMEOUTS).unwrap_err();
            assert!(
                matches!(&err, Error::Auth { message, .. } if message.contains("token")),
                "{err}"
            );
            assert_eq!(server.join().unwrap(), None);
            assert!(!made.load(Ordering::SeqCst), "make ran for token {given:?}");
        }
    }

    #[test]
    fn server_without_token_accepts_anyone() {
        let (addr, _, server) = one_shot(None);
        client_exchange(&addr, Some("whatever"), &QpInfo::default(), TIMEOUTS).unwrap();
        assert!(server.join().unwrap().is_some());
    }

    #[test]
    fn failing_queue_pair_setup_is_reported_to_the_client() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            serve_exchange(&mut s, None, |_| -> Result<(QpInfo, ())> {
                Err(Error::InvalidArgument("no queue pairs today".into()))
            })
            .unwrap_err()
        });
        let err = client_exchange(&addr, None, &QpInfo::default(), TIMEOUTS).unwrap_err();
        assert!(err.to_string().contains("no queue pairs today"), "{err}");
        assert!(matches!(
            server.join().unwrap(),
            ServeError::Refused {
                code: RefuseCode::Failed,
                ..
            }
        ));
    }

    #[test]
    fn garbage_and_foreign_versions_are_refused_with_a_reason() {
        let cases: [(&[u8], RefuseCode); 2] = [
            (b"GET / HTTP/1.1\r\n\r\n", RefuseCode::Malformed),
            (
                &[b'S', b'C', b'R', b'D', 0, 9, 1, 0, 0, 0, 0],
                RefuseCode::VersionMismatch,
            ),
        ];
        for (bytes, want) in cases {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let server = std::thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                serve_exchange(&mut s, None, |c| Ok((server_info(), *c))).unwrap_err()
            });
            let mut c = TcpStream::connect(addr).unwrap();
            c.write_all(bytes).unwrap();
            match read_message(&mut c) {
                Ok(Message::Refuse { code, .. }) => assert_eq!(code, want),
                other => panic!("{other:?}"),
            }
            assert!(
                matches!(server.join().unwrap(), ServeError::Refused { code, .. } if code == want)
            );
        }
    }

    #[test]
    fn a_tcp_memory_server_is_recognised_as_the_wrong_kind_of_server() {
        let server = crate::server::MemoryServer::start(
            "127.0.0.1:0",
            4096,
            crate::server::ServerConfig::default(),
        )
        .unwrap();
        let err = client_exchange(
            &server.local_addr().to_string(),
            None,
            &QpInfo::default(),
            TIMEOUTS,
        )
        .unwrap_err();
        // The tcp server answers our bytes with its own frame (or closes): either way
        // the client reports it instead of hanging.
        let text = err.to_string();
        assert!(
            text.contains("magic") || text.contains("closed") || text.contains("I/O"),
            "{text}"
        );
    }

    #[test]
    fn nobody_listening_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let err = client_exchange(&addr, None, &QpInfo::default(), TIMEOUTS).unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err}");
    }
}
