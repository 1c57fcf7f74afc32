//! The memory server and the tcp transport against each other, over real sockets:
//! round trips of every size, vectored calls, bounds, tokens, malformed and hostile
//! clients, concurrency, pipelining, limits, and servers that go away.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Raw;
use scad_core::protocol::{self, ErrorCode, Segment};
use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_core::{Error, ReadOp, Transport, WriteOp};

fn server(size: u64) -> MemoryServer {
    MemoryServer::start("127.0.0.1:0", size, ServerConfig::default()).unwrap()
}

fn client(s: &MemoryServer) -> TcpTransport {
    TcpTransport::connect(&s.local_addr().to_string(), TcpOptions::default()).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn round_trips_of_every_size() {
    let s = server(80 << 20);
    let c = client(&s);
    for (addr, len) in [
        (0u64, 0usize),
        (1, 1),
        (4093, 4096),
        (1 << 20, 64 << 10),
        (3 << 20, 1 << 20),
        (8 << 20, 40 << 20),
    ] {
        let data = pattern(len, len as u8);
        c.write(addr, &data).unwrap();
        let mut back = vec![0u8; len];
        c.read(addr, &mut back).unwrap();
        assert!(back == data, "mismatch for {len} bytes at {addr}");
    }
    assert_eq!(c.remote_size().unwrap(), 80 << 20);
    let st = c.stats();
    assert_eq!(st.read_ops, 6);
    assert_eq!(
        st.bytes_read,
        (1 + 4096 + (64 << 10) + (1 << 20) + (40 << 20)) as u64
    );
    assert!(s.stats().bytes_written >= 40 << 20);
}

#[test]
fn one_gibibyte_in_one_call() {
    let size = 1u64 << 30;
    let s = server(size + 4096);
    let c = client(&s);
    let mut data = vec![0u8; size as usize];
    for (i, chunk) in data.chunks_mut(1 << 20).enumerate() {
        chunk.fill(i as u8);
    }
    data[size as usize - 1] = 0xAB;
    c.write(4096, &data).unwrap();
    let mut back = vec![0u8; size as usize];
    c.read(4096, &mut back).unwrap();
    assert!(back == data, "1 GiB round trip differs");
}

#[test]
fn vectored_reads_and_writes_scatter_and_gather() {
    let s = server(4 << 20);
    let c = client(&s);
    let pages: Vec<Vec<u8>> = (0..256).map(|i| pattern(4096, i as u8)).collect();
    // Scattered, non-monotonic addresses.
    let addrs: Vec<u64> = (0..256u64).map(|i| ((i * 97) % 256) * 8192 + 100).collect();
    let ops: Vec<WriteOp<'_>> = pages
        .iter()
        .zip(&addrs)
        .map(|(p, &a)| WriteOp { addr: a, src: p })
        .collect();
    c.write_vectored(&ops).unwrap();
    let mut back = vec![vec![0u8; 4096]; 256];
    let mut reads: Vec<ReadOp<'_>> = back
        .iter_mut()
        .zip(&addrs)
        .map(|(b, &a)| ReadOp { addr: a, dst: b })
        .collect();
    c.read_vectored(&mut reads).unwrap();
    assert_eq!(back, pages);
    // One page read singly agrees with the vectored view.
    let mut one = vec![0u8; 4096];
    c.read(addrs[17], &mut one).unwrap();
    assert_eq!(one, pages[17]);
}

#[test]
fn out_of_range_is_an_error_and_changes_nothing() {
    let s = server(1 << 16);
    let c = client(&s);
    c.write(0, &[7u8; 16]).unwrap();
    let before = {
        let mut b = vec![0u8; 1 << 16];
        c.read(0, &mut b).unwrap();
        b
    };
    let err = c.write((1 << 16) - 8, &[1u8; 16]).unwrap_err();
    assert!(
        matches!(err, Error::OutOfRange { addr, len: 16, size, .. } if addr == (1 << 16) - 8 && size == 1 << 16),
        "{err}"
    );
    assert!(c
        .read(u64::MAX - 1, &mut [0u8; 4])
        .unwrap_err()
        .is_out_of_range());
    let mut b = [0u8; 1];
    assert!(c.read(1 << 16, &mut b).is_err());
    // A vectored write with one bad piece writes none of them.
    let ok = [9u8; 8];
    let err = c
        .write_vectored(&[
            WriteOp { addr: 0, src: &ok },
            WriteOp {
                addr: 1 << 20,
                src: &ok,
            },
        ])
        .unwrap_err();
    assert!(err.is_out_of_range());
    let mut after = vec![0u8; 1 << 16];
    c.read(0, &mut after).unwrap();
    assert!(after == before, "a refused write changed data");
}

fn assert_still_serving(s: &MemoryServer, addr: u64, expect: &[u8]) {
    let c = client(s);
    let mut back = vec![0u8; expect.len()];
    c.read(addr, &mut back).unwrap();
    assert_eq!(back, expect);
}

#[test]
fn garbage_truncated_and_oversized_frames_are_refused() {
    let s = server(1 << 20);
    client(&s).write(0, b"keep me").unwrap();

    let mut r = Raw::connect(s.local_addr());
    r.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let e = r.error();
    assert!(
        matches!(e.code, ErrorCode::FrameTooLarge | ErrorCode::Malformed),
        "{e}"
    );
    assert!(r.closed());

    let mut r = Raw::connect(s.local_addr());
    r.send(&u32::MAX.to_le_bytes());
    assert_eq!(r.error().code, ErrorCode::FrameTooLarge);
    assert!(r.closed());

    let mut r = Raw::connect(s.local_addr());
    r.hello(b"").unwrap();
    let mut bad = vec![0u8; 4];
    bad.extend_from_slice(&5u64.to_le_bytes());
    bad.push(42); // unknown op
    let len = (bad.len() - 4) as u32;
    bad[..4].copy_from_slice(&len.to_le_bytes());
    r.send(&bad);
    let e = r.error();
    assert_eq!(e.code, ErrorCode::Malformed);
    assert!(e.message.contains("unknown operation"), "{}", e.message);

    // Truncated frame, then the client goes away.
    let mut r = Raw::connect(s.local_addr());
    r.hello(b"").unwrap();
    r.send(&100u32.to_le_bytes());
    r.send(&[1, 2, 3]);
    drop(r);

    // A write request cut off mid-data changes nothing.
    let mut r = Raw::connect(s.local_addr());
    r.hello(b"").unwrap();
    let mut out = Vec::new();
    protocol::encode_write_head(&mut out, 2, &[Segment { addr: 0, len: 4096 }]);
    out.extend_from_slice(&[0xEE; 1000]);
    r.send(&out);
    drop(r);

    std::thread::sleep(Duration::from_millis(50));
    assert_still_serving(&s, 0, b"keep me");
    assert!(s.stats().errors >= 3);
}

#[test]
fn zero_length_and_huge_requests() {
    let s = server(1 << 20);
    let c = client(&s);
    c.read(1 << 20, &mut []).unwrap();
    c.write(0, &[]).unwrap();
    c.read_vectored(&mut []).unwrap();
    // A raw read asking for more than one frame may carry is refused but the
    // connection stays usable.
    let mut r = Raw::connect(s.local_addr());
    r.hello(b"").unwrap();
    let mut out = Vec::new();
    let segs: Vec<Segment> = (0..40)
        .map(|_| Segment {
            addr: 0,
            len: 1 << 19,
        })
        .collect();
    protocol::encode_read(&mut out, 3, &segs);
    r.send(&out);
    assert_eq!(r.error().code, ErrorCode::FrameTooLarge);
    out.clear();
    protocol::encode_size(&mut out, 4);
    r.send(&out);
    let (ok, payload) = r.reply();
    assert!(ok);
    assert_eq!(protocol::decode_size_reply(&payload).unwrap(), 1 << 20);
}

#[test]
fn token_is_checked_before_anything_else() {
    let config = ServerConfig {
        token: Some("s3cret".into()),
        ..ServerConfig::default()
    };
    let s = MemoryServer::start("127.0.0.1:0", 1 << 16, config).unwrap();
    let addr = s.local_addr().to_string();
    let good = TcpOptions {
        token: Some("s3cret".into()),
        ..TcpOptions::default()
    };
    let c = TcpTransport::connect(&addr, good).unwrap();
    c.write(0, b"private").unwrap();

    for token in [
        None,
        Some("wrong".to_owned()),
        Some("s3cret-but-longer".to_owned()),
    ] {
        let err = TcpTransport::connect(
            &addr,
            TcpOptions {
                token,
                ..TcpOptions::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, Error::Auth { .. }), "{err}");
        let lazy = TcpTransport::new(&addr, TcpOptions::default());
        assert!(matches!(lazy.write(0, b"XXXXXXX"), Err(Error::Auth { .. })));
    }
    // Requests before hello are refused and the connection closed.
    let mut r = Raw::connect(s.local_addr());
    let mut out = Vec::new();
    protocol::encode_write_head(&mut out, 1, &[Segment { addr: 0, len: 7 }]);
    out.extend_from_slice(b"XXXXXXX");
    r.send(&out);
    assert_eq!(r.error().code, ErrorCode::Unauthenticated);
    assert!(r.closed());
    let mut back = [0u8; 7];
    c.read(0, &mut back).unwrap();
    assert_eq!(&back, b"private");
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let s = server(1 << 20);
    client(&s).write(0, &pattern(4096, 1)).unwrap();
    let mut r = Raw::connect(s.local_addr());
    r.hello(b"").unwrap();
    let mut out = Vec::new();
    for id in 10..110u64 {
        protocol::encode_read(&mut out, id, &[Segment { addr: id, len: 8 }]);
    }
    r.send(&out);
    for id in 10..110u64 {
        let mut head = [0u8; protocol::RESPONSE_HEAD_BYTES];
        r.0.read_exact(&mut head).unwrap();
        let head = protocol::decode_response_head(&head, u32::MAX).unwrap();
        assert_eq!(head.id, id);
        assert_eq!((head.payload_len, head.padding), (8, 56));
        let mut data = [0u8; 64];
        r.0.read_exact(&mut data).unwrap();
        assert_eq!(&data[..8], &pattern(4096, 1)[id as usize..id as usize + 8]);
    }
}

#[test]
fn many_concurrent_clients_on_disjoint_ranges() {
    let s = server(64 << 20);
    let shared = Arc::new(client(&s));
    let addr = s.local_addr().to_string();
    std::thread::scope(|scope| {
        for t in 0..16u64 {
            let shared = Arc::clone(&shared);
            let addr = addr.clone();
            scope.spawn(move || {
                // Half the threads share one transport, half have their own.
                let own;
                let c: &TcpTransport = if t % 2 == 0 {
                    &shared
                } else {
                    own = TcpTransport::connect(&addr, TcpOptions::default()).unwrap();
                    &own
                };
                let base = t * (4 << 20);
                for round in 0..20u64 {
                    let len = 1000 + (round as usize * 7919) % 200_000;
                    let data = pattern(len, (t + round) as u8);
                    c.write(base + round * 1000, &data).unwrap();
                    let mut back = vec![0u8; len];
                    c.read(base + round * 1000, &mut back).unwrap();
                    assert!(back == data, "thread {t} round {round}");
                }
            });
        }
    });
    assert!(s.stats().connections >= 9);
}

#[test]
fn connection_limit_refuses_with_busy() {
    let config = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let s = MemoryServer::start("127.0.0.1:0", 4096, config).unwrap();
    let a = client(&s);
    let b = client(&s);
    let addr = s.local_addr().to_string();
    let err = TcpTransport::connect(&addr, TcpOptions::default()).unwrap_err();
    assert!(matches!(&err, Error::Busy { .. }), "{err}");
    a.write(0, b"a").unwrap();
    drop(b);
    // A slot frees up once a client leaves.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match TcpTransport::connect(&addr, TcpOptions::default()) {
            Ok(c) => {
                let mut x = [0u8; 1];
                c.read(0, &mut x).unwrap();
                assert_eq!(&x, b"a");
                break;
            }
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("slot never freed: {e}"),
        }
    }
    assert!(s.stats().refused >= 1);
}

#[test]
fn a_silent_server_times_out_instead_of_hanging() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let hold = std::thread::spawn(move || {
        let (conn, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        drop(conn);
    });
    let options = TcpOptions {
        timeout: Duration::from_millis(200),
        ..TcpOptions::default()
    };
    let started = Instant::now();
    let err = TcpTransport::connect(&addr, options).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    hold.join().unwrap();
}

#[test]
fn server_shutdown_fails_waiting_clients_and_restart_reconnects() {
    let s = server(1 << 20);
    let addr = s.local_addr();
    let c = TcpTransport::connect(
        &addr.to_string(),
        TcpOptions {
            timeout: Duration::from_secs(5),
            ..TcpOptions::default()
        },
    )
    .unwrap();
    c.write(0, b"before").unwrap();
    let started = Instant::now();
    s.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "shutdown with a connected client took {:?}",
        started.elapsed()
    );
    let err = c.read(0, &mut [0u8; 6]).unwrap_err();
    assert!(
        matches!(err, Error::Io { .. } | Error::Connect { .. }),
        "{err}"
    );
    // A new server on the same port: the same transport reconnects on its next call.
    let s2 = MemoryServer::start(&addr.to_string(), 1 << 20, ServerConfig::default()).unwrap();
    c.write(0, b"after").unwrap();
    let mut back = [0u8; 5];
    c.read(0, &mut back).unwrap();
    assert_eq!(&back, b"after");
    drop(s2);
}

#[test]
fn bad_server_configuration_is_refused() {
    let tiny = ServerConfig {
        max_frame: 10,
        ..ServerConfig::default()
    };
    assert!(matches!(
        MemoryServer::start("127.0.0.1:0", 4096, tiny),
        Err(Error::Server { .. })
    ));
    let none = ServerConfig {
        max_connections: 0,
        ..ServerConfig::default()
    };
    assert!(MemoryServer::start("127.0.0.1:0", 4096, none).is_err());
    assert!(matches!(
        MemoryServer::start("not an address", 4096, ServerConfig::default()),
        Err(Error::Server { .. })
    ));
    assert!(matches!(
        MemoryServer::start("127.0.0.1:0", u64::MAX, ServerConfig::default()),
        Err(Error::Alloc { .. })
    ));
    let err = TcpTransport::connect("127.0.0.1:1", TcpOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err}");
}

#[test]
fn small_frames_split_large_transfers() {
    let config = ServerConfig {
        max_frame: 8192,
        ..ServerConfig::default()
    };
    let s = MemoryServer::start("127.0.0.1:0", 1 << 20, config).unwrap();
    let c = client(&s);
    let data = pattern(300_000, 3);
    c.write(5, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(5, &mut back).unwrap();
    assert!(back == data);
    assert!(
        s.stats().requests > 70,
        "expected many small frames, saw {}",
        s.stats().requests
    );
}
