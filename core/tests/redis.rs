//! The `redis` transport against a real `redis-server` started by each test (through
//! `scad_core::redis_server`).
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use scad_core::durl::Durl;
use scad_core::redis_server::RedisServer;
use scad_core::transport::{self, redis::BLOCK_BYTES};
use scad_core::{Error, ReadOp, Transport, WriteOp};

/// A `redis-server` on a free loopback port, killed on drop.
struct Redis {
    server: RedisServer,
}

impl Redis {
    fn start(password: Option<&str>) -> Redis {
        let args = match password {
            Some(p) => vec!["--requirepass", p],
            None => Vec::new(),
        };
        let server = RedisServer::start(&args)
            .expect("redis-server must be on PATH (scripts/setup.sh installs it)");
        Redis { server }
    }

    fn durl(&self, name: &str, size: u64, extra: &str) -> String {
        format!(
            "{name};redis;url,tcp://127.0.0.1:{};size,{size};{extra}",
            self.server.port()
        )
    }
}

fn open(durl: &str) -> scad_core::Result<std::sync::Arc<dyn Transport>> {
    let d: Durl = durl.parse()?;
    transport::open(&d.name, &d.resolve()?)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn round_trips_across_block_boundaries_and_unwritten_memory_reads_zero() {
    let redis = Redis::start(None);
    let size = 4 * BLOCK_BYTES;
    let t = open(&redis.durl("mem", size, "")).unwrap();
    assert_eq!(t.remote_size().unwrap(), size);

    // A range straddling two block boundaries, written at an odd address.
    let addr = BLOCK_BYTES - 1000;
    let data = pattern(BLOCK_BYTES as usize + 5000, 7);
    t.write(addr, &data).unwrap();
    let mut back = vec![0xffu8; data.len()];
    t.read(addr, &mut back).unwrap();
    assert_eq!(back, data);

    // Around the written range: zeros, including in a block never written.
    let mut before = vec![0xffu8; 100];
    t.read(addr - 100, &mut before).unwrap();
    assert!(before.iter().all(|&b| b == 0));
    let mut untouched = vec![0xffu8; 4096];
    t.read(3 * BLOCK_BYTES + 10, &mut untouched).unwrap();
    assert!(untouched.iter().all(|&b| b == 0));

    let stats = t.stats();
    assert_eq!(stats.bytes_written, data.len() as u64);
    assert_eq!(stats.bytes_read, (data.len() + 100 + 4096) as u64);
}

#[test]
fn vectored_calls_and_separate_prefixes_do_not_mix() {
    let redis = Redis::start(None);
    let a = open(&redis.durl("a", 2 * BLOCK_BYTES, "prefix,app-a;")).unwrap();
    let b = open(&redis.durl("b", 2 * BLOCK_BYTES, "prefix,app-b;")).unwrap();
    let (x, y) = (pattern(3000, 1), pattern(70_000, 2));
    a.write_vectored(&[
        WriteOp { addr: 0, src: &x },
        WriteOp {
            addr: BLOCK_BYTES - 10,
            src: &y,
        },
    ])
    .unwrap();
    let (mut x2, mut y2) = (vec![0u8; x.len()], vec![0u8; y.len()]);
    a.read_vectored(&mut [
        ReadOp {
            addr: BLOCK_BYTES - 10,
            dst: &mut y2,
        },
        ReadOp {
            addr: 0,
            dst: &mut x2,
        },
    ])
    .unwrap();
    assert_eq!((x2, y2), (x, y));
    let mut other = vec![0xffu8; 3000];
    b.read(0, &mut other).unwrap();
    assert!(
        other.iter().all(|&v| v == 0),
        "prefix app-b saw app-a's data"
    );
}

#[test]
fn out_of_range_accesses_are_refused_and_change_nothing() {
    let redis = Redis::start(None);
    let t = open(&redis.durl("mem", 8192, "")).unwrap();
    t.write(0, &[9u8; 8192]).unwrap();
    let err = t.write(8000, &[1u8; 200]).unwrap_err();
    assert!(
        matches!(err, Error::OutOfRange { op: "write", .. }),
        "{err}"
    );
    // A vectored write with one bad piece writes none of them.
    let err = t
        .write_vectored(&[
            WriteOp {
                addr: 0,
                src: &[2u8; 10],
            },
            WriteOp {
                addr: u64::MAX - 1,
                src: &[2u8; 10],
            },
        ])
        .unwrap_err();
    assert!(matches!(err, Error::OutOfRange { .. }), "{err}");
    let mut back = vec![0u8; 8192];
    t.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 9));
    assert!(matches!(
        t.read(8192, &mut [0u8; 1]),
        Err(Error::OutOfRange { op: "read", .. })
    ));
}

#[test]
fn passwords_are_checked() {
    let redis = Redis::start(Some("s3cret"));
    let err = open(&redis.durl("mem", 4096, "")).unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "no password: {err}");
    let err = open(&redis.durl("mem", 4096, "token,wrong;")).unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "wrong password: {err}");
    let t = open(&redis.durl("mem", 4096, "token,s3cret;")).unwrap();
    t.write(0, b"ok").unwrap();
}

#[test]
fn a_server_that_goes_away_gives_an_error_not_a_hang() {
    let mut redis = Redis::start(None);
    let t = open(&redis.durl("mem", 4096, "timeout_ms,2000;")).unwrap();
    t.write(0, b"before").unwrap();
    redis.server.stop().unwrap();
    let started = Instant::now();
    let err = t.read(0, &mut [0u8; 6]).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(20), "{err}");
    // Nothing listens on the port any more: opening fails clearly.
    let err = open(&redis.durl("mem", 4096, "timeout_ms,500;")).unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err}");
}
