//! Resource limits, region tokens and client robustness of the memory server and the
//! tcp transport: stalled and silent clients, the in-flight budget, idle connections,
//! frames that must fit, per-region access control, connections lost mid-request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::Raw;
use scad_core::protocol::{self, ErrorCode, HelloReply, Segment};
use scad_core::server::{MemoryServer, RegionGrant, ServerConfig};
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_core::{Error, ReadOp, Transport, WriteOp};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed))
        .collect()
}

fn connect(addr: SocketAddr, token: Option<&str>) -> Result<TcpTransport, Error> {
    TcpTransport::connect(
        &addr.to_string(),
        TcpOptions {
            token: token.map(str::to_owned),
            timeout: Duration::from_secs(10),
            ..TcpOptions::default()
        },
    )
}

/// Retries `f` until it succeeds or 10 s pass (for slots that free up asynchronously).
fn eventually<T>(what: &str, mut f: impl FnMut() -> Result<T, Error>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
}

const KIB: u64 = 1024;

fn regions_config() -> ServerConfig {
    ServerConfig {
        token: Some("admin".into()),
        regions: vec![
            RegionGrant::parse("alpha:0:256K:alpha-secret").unwrap(),
            RegionGrant::parse("beta:256K:256K:beta:secret").unwrap(),
        ],
        ..ServerConfig::default()
    }
}

#[test]
fn region_tokens_keep_applications_apart() {
    let s = MemoryServer::start("127.0.0.1:0", 1024 * KIB, regions_config()).unwrap();
    let addr = s.local_addr();
    let alpha = connect(addr, Some("alpha-secret")).unwrap();
    let beta = connect(addr, Some("beta:secret")).unwrap();
    let admin = connect(addr, Some("admin")).unwrap();
    // Each application sees its own region as an address space from 0.
    assert_eq!(alpha.remote_size().unwrap(), 256 * KIB);
    assert_eq!(beta.remote_size().unwrap(), 256 * KIB);
    assert_eq!(admin.remote_size().unwrap(), 1024 * KIB);
    let a = pattern(256 * KIB as usize, 1);
    let b = pattern(256 * KIB as usize, 2);
    alpha.write(0, &a).unwrap();
    beta.write(0, &b).unwrap();
    // Neither can reach past its end, into the other's bytes.
    for c in [&alpha, &beta] {
        assert!(c
            .read(256 * KIB, &mut [0u8; 1])
            .unwrap_err()
            .is_out_of_range());
        assert!(c
            .write(256 * KIB - 4, &[9u8; 8])
            .unwrap_err()
            .is_out_of_range());
    }
    let mut back = vec![0u8; a.len()];
    alpha.read(0, &mut back).unwrap();
    assert!(back == a, "alpha's region changed");
    beta.read(0, &mut back).unwrap();
    assert!(back == b, "beta's region changed");
    // The admin token sees both where the grants put them.
    let mut whole = vec![0u8; 512 * KIB as usize];
    admin.read(0, &mut whole).unwrap();
    assert!(whole[..a.len()] == a[..] && whole[a.len()..] == b[..]);
}

#[test]
fn raw_requests_outside_a_region_are_refused_on_the_server() {
    // The client checks ranges too; this proves the server does, for a hostile client.
    let s = MemoryServer::start("127.0.0.1:0", 1024 * KIB, regions_config()).unwrap();
    let admin = connect(s.local_addr(), Some("admin")).unwrap();
    admin.write(256 * KIB, b"beta's data").unwrap();
    let mut r = Raw::connect(s.local_addr());
    assert_eq!(r.hello(b"alpha-secret").unwrap().size, 256 * KIB);
    let mut out = Vec::new();
    protocol::encode_read(
        &mut out,
        2,
        &[Segment {
            addr: 256 * KIB,
            len: 11,
        }],
    );
    r.send(&out);
    let e = r.error();
    assert_eq!(e.code, ErrorCode::OutOfRange);
    assert_eq!(e.size, 256 * KIB);
    out.clear();
    protocol::encode_write_head(
        &mut out,
        3,
        &[Segment {
            addr: u64::MAX - 2,
            len: 4,
        }],
    );
    out.extend_from_slice(b"XXXX");
    r.send(&out);
    assert_eq!(r.error().code, ErrorCode::OutOfRange);
    let mut back = [0u8; 11];
    admin.read(256 * KIB, &mut back).unwrap();
    assert_eq!(&back, b"beta's data");
}

#[test]
fn without_the_right_token_nothing_is_read_or_written() {
    // Regions alone (no global token) turn authentication on.
    let config = ServerConfig {
        token: None,
        ..regions_config()
    };
    let s = MemoryServer::start("127.0.0.1:0", 1024 * KIB, config).unwrap();
    let addr = s.local_addr();
    let alpha = connect(addr, Some("alpha-secret")).unwrap();
    alpha.write(0, b"alpha private").unwrap();
    for token in [None, Some("admin"), Some("alpha"), Some("alpha-secret ")] {
        let err = connect(addr, token).unwrap_err();
        assert!(matches!(err, Error::Auth { .. }), "{token:?}: {err}");
        let lazy = TcpTransport::new(
            &addr.to_string(),
            TcpOptions {
                token: token.map(str::to_owned),
                ..TcpOptions::default()
            },
        );
        assert!(matches!(
            lazy.write(0, b"overwritten!!"),
            Err(Error::Auth { .. })
        ));
        assert!(matches!(
            lazy.read(0, &mut [0u8; 13]),
            Err(Error::Auth { .. })
        ));
    }
    // Requests without a hello, or after a refused one, are not served either.
    let mut r = Raw::connect(addr);
    assert_eq!(
        r.hello(b"nope").unwrap_err().code,
        ErrorCode::Unauthenticated
    );
    assert!(r.closed());
    let mut r = Raw::connect(addr);
    let mut out = Vec::new();
    protocol::encode_read(&mut out, 1, &[Segment { addr: 0, len: 13 }]);
    r.send(&out);
    assert_eq!(r.error().code, ErrorCode::Unauthenticated);
    assert!(r.closed());
    let mut back = [0u8; 13];
    alpha.read(0, &mut back).unwrap();
    assert_eq!(&back, b"alpha private");
    assert_eq!(s.stats().bytes_read, 13, "only alpha's own read was served");
}

#[test]
fn bad_region_configurations_are_refused() {
    assert!(RegionGrant::parse("a:0:1K").is_err());
    assert!(RegionGrant::parse("a:x:1K:t").is_err());
    assert!(RegionGrant::parse("a:0:-1:t").is_err());
    let g = RegionGrant::parse("a:1M:2K:t:with:colons").unwrap();
    assert_eq!(
        (g.offset, g.len, g.token.as_str()),
        (1 << 20, 2048, "t:with:colons")
    );
    assert!(
        !format!("{g:?}").contains("colons"),
        "Debug must not print tokens"
    );
    let grant = |name: &str, offset: u64, len: u64, token: &str| RegionGrant {
        name: name.into(),
        offset,
        len,
        token: token.into(),
    };
    let bad = [
        vec![grant("a", 0, 0, "t")],
        vec![grant("a", 60 * KIB, 8 * KIB, "t")],
        vec![grant("a", u64::MAX, 2, "t")],
        vec![grant("a", 0, KIB, "")],
        vec![grant("", 0, KIB, "t")],
        vec![grant("a", 0, KIB, "t"), grant("a", KIB, KIB, "u")],
        vec![grant("a", 0, KIB, "t"), grant("b", KIB, KIB, "t")],
        vec![grant("a", 0, KIB, "admin")],
    ];
    for regions in bad {
        let config = ServerConfig {
            token: Some("admin".into()),
            regions: regions.clone(),
            ..ServerConfig::default()
        };
        let r = MemoryServer::start("127.0.0.1:0", 64 * KIB, config);
        assert!(
            matches!(r, Err(Error::Server { .. })),
            "{regions:?} accepted"
        );
    }
}

#[test]
fn a_half_sent_frame_is_cut_off_by_the_request_timeout() {
    let config = ServerConfig {
        request_timeout: Some(Duration::from_millis(300)),
        ..ServerConfig::default()
    };
    let s = MemoryServer::start("127.0.0.1:0", 64 * KIB, config).unwrap();
    let c = connect(s.local_addr(), None).unwrap();
    c.write(0, b"intact").unwrap();
    let mut r = Raw::connect(s.local_addr());
    r.hello(b"").unwrap();
    // Half a write frame, then nothing.
    let mut out = Vec::new();
    protocol::encode_write_head(&mut out, 7, &[Segment { addr: 0, len: 4096 }]);
    out.extend_from_slice(&[0xEE; 100]);
    r.send(&out);
    // Others are served meanwhile.
    let mut back = [0u8; 6];
    c.read(0, &mut back).unwrap();
    let e = r.error();
    assert_eq!(e.code, ErrorCode::RequestTimeout, "{e}");
    assert!(r.closed());
    c.read(0, &mut back).unwrap();
    assert_eq!(&back, b"intact", "a cut-off write changed data");
}

#[test]
fn connections_that_send_nothing_lose_their_slot() {
    let config = ServerConfig {
        max_connections: 2,
        request_timeout: Some(Duration::from_millis(300)),
        ..ServerConfig::default()
    };
    let s = MemoryServer::start("127.0.0.1:0", 64 * KIB, config).unwrap();
    let mut silent: Vec<Raw> = (0..2).map(|_| Raw::connect(s.local_addr())).collect();
    // Both silent connections are told why they are closed...
    for r in &mut silent {
        assert_eq!(r.error().code, ErrorCode::RequestTimeout);
        assert!(r.closed());
    }
    // ...and their slots serve real clients again.
    let c = eventually("connect after the silent ones", || {
        connect(s.local_addr(), None)
    });
    c.write(0, b"served").unwrap();
}

#[test]
fn the_in_flight_budget_refuses_with_busy_and_recovers() {
    let config = ServerConfig {
        max_frame: 64 * 1024,
        max_in_flight: 64 * 1024,
        in_flight_wait: Duration::from_millis(100),
        request_timeout: Some(Duration::from_secs(30)),
        ..ServerConfig::default()
    };
    let s = MemoryServer::start("127.0.0.1:0", 1024 * KIB, config).unwrap();
    let c = connect(s.local_addr(), None).unwrap();
    let data = pattern(32 * 1024, 5);
    c.write(0, &data).unwrap();
    // A hostile client announces a 60 KiB write and sends only part of it: its frame
    // holds most of the budget while it is buffered.
    let mut hog = Raw::connect(s.local_addr());
    hog.hello(b"").unwrap();
    let mut out = Vec::new();
    protocol::encode_write_head(
        &mut out,
        9,
        &[Segment {
            addr: 512 * KIB,
            len: 60 * 1024,
        }],
    );
    out.extend_from_slice(&[1u8; 10]);
    hog.send(&out);
    // Wait until the server has taken the hog's frame into its budget (the hog's
    // hello was answered, so its frame is the next thing the server reads).
    let err = eventually("a busy refusal", || {
        match c.read(0, &mut vec![0u8; 32 * 1024]) {
            Err(e @ Error::Busy { .. }) => Ok(e),
            Ok(()) => Err(Error::InvalidArgument("not busy yet".into())),
            Err(e) => panic!("unexpected {e}"),
        }
    });
    assert!(err.to_string().contains("in flight"), "{err}");
    let err = c.write(0, &data).unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err}");
    assert!(s.stats().busy >= 2);
    // Small requests still fit beside the hog.
    let mut small = [0u8; 16];
    c.read(0, &mut small).unwrap();
    assert_eq!(&small[..], &data[..16]);
    // Once the hog goes away its bytes are given back.
    drop(hog);
    eventually("write after the hog left", || c.write(0, &data));
    let mut back = vec![0u8; data.len()];
    c.read(0, &mut back).unwrap();
    assert!(back == data);
}

#[test]
fn idle_connections_are_closed_and_the_client_reconnects_unnoticed() {
    let config = ServerConfig {
        idle_timeout: Some(Duration::from_millis(200)),
        ..ServerConfig::default()
    };
    let s = MemoryServer::start("127.0.0.1:0", 64 * KIB, config).unwrap();
    let c = connect(s.local_addr(), None).unwrap();
    c.write(0, b"kept").unwrap();
    // The raw view: an idle connection gets a notice, then is closed.
    let mut r = Raw::connect(s.local_addr());
    r.hello(b"").unwrap();
    let e = r.error();
    assert_eq!(e.code, ErrorCode::IdleTimeout);
    assert!(r.closed());
    // The transport's pooled connection was closed the same way; its next call
    // notices and retries on a new connection.
    let mut back = [0u8; 4];
    c.read(0, &mut back).unwrap();
    assert_eq!(&back, b"kept");
    std::thread::sleep(Duration::from_millis(500));
    c.write(0, b"more").unwrap();
    c.read(0, &mut back).unwrap();
    assert_eq!(&back, b"more");
    assert!(s.stats().connections >= 3);
}

#[test]
fn many_tiny_pieces_fit_the_smallest_frames() {
    let config = ServerConfig {
        max_frame: protocol::MIN_MAX_FRAME,
        ..ServerConfig::default()
    };
    let s = MemoryServer::start("127.0.0.1:0", 1024 * KIB, config).unwrap();
    let c = connect(s.local_addr(), None).unwrap();
    // Pieces small enough that their segment descriptors outweigh their data.
    let pieces: Vec<Vec<u8>> = (0..3000).map(|i| pattern(1 + i % 13, i as u8)).collect();
    let addrs: Vec<u64> = (0..3000u64).map(|i| (i * 7919) % 60_000 * 16).collect();
    let ops: Vec<WriteOp<'_>> = pieces
        .iter()
        .zip(&addrs)
        .map(|(p, &addr)| WriteOp { addr, src: p })
        .collect();
    c.write_vectored(&ops).unwrap();
    let mut back: Vec<Vec<u8>> = pieces.iter().map(|p| vec![0u8; p.len()]).collect();
    let mut reads: Vec<ReadOp<'_>> = back
        .iter_mut()
        .zip(&addrs)
        .map(|(b, &addr)| ReadOp { addr, dst: b })
        .collect();
    c.read_vectored(&mut reads).unwrap();
    assert_eq!(back, pieces);
    // A frame limit below the data of one piece splits the piece itself.
    let big = pattern(50_000, 3);
    c.write(100, &big).unwrap();
    let mut b = vec![0u8; big.len()];
    c.read(100, &mut b).unwrap();
    assert!(b == big);
}

/// A fake memory server that answers the hello and then misbehaves on the first
/// request as `misbehave` says.
fn fake_server(misbehave: fn(TcpStream)) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut len = [0u8; 4];
        conn.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        conn.read_exact(&mut body).unwrap();
        let mut out = Vec::new();
        HelloReply {
            version: protocol::VERSION,
            max_frame: protocol::DEFAULT_MAX_FRAME,
            size: 1 << 20,
        }
        .encode(&mut out, protocol::peek_id(&body));
        conn.write_all(&out).unwrap();
        // The first request's head, then the misbehaviour.
        conn.read_exact(&mut len).unwrap();
        misbehave(conn);
    });
    (addr, handle)
}

fn half_reply(mut conn: TcpStream) -> TcpStream {
    let mut out = Vec::new();
    protocol::encode_ok_head(&mut out, 2, 4096);
    out.extend_from_slice(&[7u8; 1000]);
    let _ = conn.write_all(&out);
    conn
}

#[test]
fn a_server_dying_mid_reply_is_an_error_and_a_restart_is_picked_up() {
    let (addr, handle) = fake_server(|conn| drop(half_reply(conn)));
    let c = connect(addr, None).unwrap();
    let mut dst = vec![0u8; 4096];
    // The pooled connection breaks; the one retry finds nobody listening.
    let err = c.read(0, &mut dst).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Io { .. } | Error::Protocol { .. } | Error::Connect { .. }
        ),
        "{err}"
    );
    handle.join().unwrap();
    // A real server comes back on the same port: the next call reconnects.
    let s = MemoryServer::start(&addr.to_string(), 1 << 20, ServerConfig::default()).unwrap();
    c.write(0, b"back again").unwrap();
    let mut back = [0u8; 10];
    c.read(0, &mut back).unwrap();
    assert_eq!(&back, b"back again");
    drop(s);
}

#[test]
fn a_server_stalling_mid_reply_times_out() {
    let (addr, handle) = fake_server(|conn| {
        let conn = half_reply(conn);
        std::thread::sleep(Duration::from_secs(2));
        drop(conn);
    });
    let c = TcpTransport::connect(
        &addr.to_string(),
        TcpOptions {
            timeout: Duration::from_millis(200),
            ..TcpOptions::default()
        },
    )
    .unwrap();
    let mut dst = vec![0u8; 4096];
    let err = c.read(0, &mut dst).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    handle.join().unwrap();
}

#[test]
fn inconsistent_limits_are_refused_at_start() {
    for config in [
        ServerConfig {
            max_in_flight: 1024,
            ..ServerConfig::default()
        },
        ServerConfig {
            request_timeout: Some(Duration::ZERO),
            ..ServerConfig::default()
        },
        ServerConfig {
            idle_timeout: Some(Duration::ZERO),
            ..ServerConfig::default()
        },
        ServerConfig {
            token: Some("x".repeat(protocol::MAX_TOKEN + 1)),
            ..ServerConfig::default()
        },
    ] {
        let shown = format!("{config:?}");
        assert!(
            matches!(
                MemoryServer::start("127.0.0.1:0", 4096, config),
                Err(Error::Server { .. })
            ),
            "{shown} accepted"
        );
    }
    // No timeouts at all is allowed (and waits forever).
    let open = ServerConfig {
        request_timeout: None,
        idle_timeout: None,
        ..ServerConfig::default()
    };
    let s = MemoryServer::start("127.0.0.1:0", 4096, open).unwrap();
    connect(s.local_addr(), None)
        .unwrap()
        .write(0, b"ok")
        .unwrap();
}

/// One raw request of the model test.
#[derive(Debug, Clone)]
enum ModelOp {
    Read(Vec<Segment>),
    Write(Vec<Segment>, u8),
}

fn model_op() -> impl proptest::strategy::Strategy<Value = ModelOp> {
    use proptest::prelude::*;
    // Addresses reach past the 32 KiB region so some requests must be refused.
    let segment = (0u64..40 * 1024, 0u32..9 * 1024).prop_map(|(addr, len)| Segment { addr, len });
    let segments = proptest::collection::vec(segment, 1..4);
    prop_oneof![
        segments.clone().prop_map(ModelOp::Read),
        (segments, any::<u8>()).prop_map(|(s, seed)| ModelOp::Write(s, seed)),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(24))]

    /// Raw requests from a region's client against a model of its region: every reply
    /// is what the model predicts, refused requests change nothing, and nothing
    /// outside the region ever changes.
    #[test]
    fn a_region_behaves_like_its_model(ops in proptest::collection::vec(model_op(), 1..24)) {
        const REGION: usize = 32 * 1024;
        let config = ServerConfig {
            token: Some("admin".into()),
            regions: vec![RegionGrant::parse("r:16K:32K:t").unwrap()],
            ..ServerConfig::default()
        };
        let s = MemoryServer::start("127.0.0.1:0", 64 * KIB, config).unwrap();
        let mut r = Raw::connect(s.local_addr());
        assert_eq!(r.hello(b"t").unwrap().size, REGION as u64);
        let mut model = vec![0u8; REGION];
        for (id, op) in ops.iter().enumerate() {
            let id = id as u64 + 10;
            let segments = match op {
                ModelOp::Read(s) | ModelOp::Write(s, _) => s,
            };
            let fits = segments
                .iter()
                .all(|s| s.addr + u64::from(s.len) <= REGION as u64);
            let mut out = Vec::new();
            let mut data = Vec::new();
            match op {
                ModelOp::Read(segs) => protocol::encode_read(&mut out, id, segs),
                ModelOp::Write(segs, seed) => {
                    for s in segs {
                        data.extend(pattern(s.len as usize, *seed ^ s.len as u8));
                    }
                    protocol::encode_write_head(&mut out, id, segs);
                    out.extend_from_slice(&data);
                }
            }
            r.send(&out);
            let (ok, payload) = r.reply();
            if !fits {
                proptest::prop_assert!(!ok, "request {op:?} outside the region was served");
                let e = protocol::ErrorReply::decode(&payload).unwrap();
                proptest::prop_assert_eq!(e.code, ErrorCode::OutOfRange);
                continue;
            }
            proptest::prop_assert!(ok, "request {:?} inside the region was refused", op);
            match op {
                ModelOp::Read(segs) => {
                    let want: Vec<u8> = segs
                        .iter()
                        .flat_map(|s| model[s.addr as usize..][..s.len as usize].to_vec())
                        .collect();
                    proptest::prop_assert!(payload == want, "read {:?} differs from the model", segs);
                }
                ModelOp::Write(segs, _) => {
                    let mut pos = 0;
                    for s in segs {
                        let len = s.len as usize;
                        model[s.addr as usize..][..len].copy_from_slice(&data[pos..pos + len]);
                        pos += len;
                    }
                }
            }
        }
        let admin = connect(s.local_addr(), Some("admin")).unwrap();
        let mut whole = vec![0u8; 64 * 1024];
        admin.read(0, &mut whole).unwrap();
        proptest::prop_assert!(whole[..16 * 1024].iter().all(|&b| b == 0), "bytes before the region changed");
        proptest::prop_assert!(whole[16 * 1024 + REGION..].iter().all(|&b| b == 0), "bytes after the region changed");
        proptest::prop_assert!(whole[16 * 1024..16 * 1024 + REGION] == model[..], "the region differs from the model");
    }
}
