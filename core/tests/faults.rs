//! Fault injection against a `memory_server` process: kill -9 in the middle of
//! transfers, hostile clients (garbage, truncated and oversized frames, connections
//! that say nothing) filling the connection limit while honest clients keep working.
//! Every acknowledged write must be readable afterwards; nothing may hang.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/server_process.rs"]
mod server_process;

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use scad_core::protocol;
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_core::{Error, Transport};
use server_process::Server;

fn options() -> TcpOptions {
    TcpOptions {
        timeout: Duration::from_secs(5),
        ..TcpOptions::default()
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Runs `f` on a thread and fails the test if it has not finished in `limit` (a hang).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("no result within {limit:?}: the call hung"))
}

#[test]
fn kill_9_mid_transfer_fails_the_client_and_a_restart_serves_again() {
    let mut server = Server::start(0, "64M", &[]);
    let port = server.port();
    let addr = server.addr.clone();
    let started = std::sync::Arc::new(AtomicBool::new(false));
    let flag = started.clone();
    // A client moving 16 MiB per call until the server dies under it.
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let c = TcpTransport::connect(&addr, options()).unwrap();
        let data = pattern(16 << 20, 1);
        let mut back = vec![0u8; data.len()];
        let mut calls = 0u64;
        let result = loop {
            if let Err(e) = c.write(0, &data) {
                break e;
            }
            flag.store(true, Ordering::SeqCst);
            if let Err(e) = c.read(0, &mut back) {
                break e;
            }
            assert!(back == data, "a completed read returned other bytes");
            calls += 1;
        };
        let _ = tx.send(());
        (result, calls, c)
    });
    while !started.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(30));
    server.kill9();
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the client hung after the server was killed");
    let (err, _calls, client) = worker.join().unwrap();
    assert!(
        matches!(
            err,
            Error::Io { .. } | Error::Connect { .. } | Error::Protocol { .. }
        ),
        "{err}"
    );
    // Memory elements are volatile: a restarted server starts empty, and the same
    // transport reaches it on its next call.
    let _again = Server::start(port, "64M", &[]);
    let mut back = vec![1u8; 4096];
    within(Duration::from_secs(30), move || {
        client.read(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0), "a restarted server is empty");
        client.write(0, b"after restart").unwrap();
    });
}

/// One hostile connection: what it sends.
#[derive(Debug, Clone, Copy)]
enum Hostile {
    Silent,
    Garbage,
    Truncated,
    Oversized,
}

fn hostile(addr: &str, kind: Hostile) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut hello = Vec::new();
    protocol::encode_hello(&mut hello, 1, b"");
    let _ = match kind {
        Hostile::Silent => Ok(()),
        Hostile::Garbage => s.write_all(b"\x10\x00\x00\x00GARBAGE-GARBAGE!"),
        Hostile::Truncated => {
            let mut out = hello.clone();
            protocol::encode_write_head(
                &mut out,
                2,
                &[protocol::Segment {
                    addr: 0,
                    len: 1 << 20,
                }],
            );
            out.extend_from_slice(&[0xAA; 4096]);
            s.write_all(&out)
        }
        Hostile::Oversized => {
            let mut out = hello.clone();
            out.extend_from_slice(&u32::MAX.to_le_bytes());
            out.extend_from_slice(&[0xBB; 1024]);
            s.write_all(&out)
        }
    };
    Some(s)
}

#[test]
fn hostile_clients_at_the_connection_limit_lose_no_acknowledged_write() {
    let server = Server::start(
        0,
        "64M",
        &[
            "--max-connections",
            "8",
            "--request-timeout",
            "1",
            "--max-frame",
            "1048576",
        ],
    );
    let addr = server.addr.clone();
    // Four honest clients, each on its own connection and its own 1 MiB.
    let honest: Vec<TcpTransport> = (0..4)
        .map(|_| TcpTransport::connect(&addr, options()).unwrap())
        .collect();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let attacker = {
        let addr = addr.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let kinds = [
                Hostile::Silent,
                Hostile::Garbage,
                Hostile::Truncated,
                Hostile::Oversized,
            ];
            let mut held = Vec::new();
            let mut opened = 0usize;
            while !stop.load(Ordering::SeqCst) {
                if let Some(s) = hostile(&addr, kinds[opened % kinds.len()]) {
                    held.push(s);
                    opened += 1;
                }
                if held.len() > 16 {
                    held.remove(0);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            opened
        })
    };
    let results = within(Duration::from_secs(120), move || {
        std::thread::scope(|scope| {
            let handles: Vec<_> = honest
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    scope.spawn(move || {
                        let base = i as u64 * (1 << 20);
                        let mut shadow = vec![0u8; 1 << 20];
                        let mut acknowledged = 0u64;
                        for round in 0..60u64 {
                            let len = 1 + (round as usize * 7919 + i * 131) % (256 << 10);
                            let off = (round as usize * 104_729) % ((1 << 20) - len);
                            let data = pattern(len, round * 10 + i as u64);
                            // Only acknowledged writes enter the shadow.
                            c.write(base + off as u64, &data).unwrap();
                            shadow[off..off + len].copy_from_slice(&data);
                            acknowledged += 1;
                            let mut back = vec![0u8; len];
                            c.read(base + off as u64, &mut back).unwrap();
                            assert!(back == data, "client {i} round {round}");
                        }
                        let mut all = vec![0u8; 1 << 20];
                        c.read(base, &mut all).unwrap();
                        assert!(all == shadow, "client {i} lost an acknowledged write");
                        acknowledged
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        })
    });
    stop.store(true, Ordering::SeqCst);
    let opened = attacker.join().unwrap();
    assert_eq!(results, vec![60; 4]);
    assert!(opened >= 4, "the attacker opened only {opened} connections");
    // Once the hostile connections are gone, new clients are served again.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match TcpTransport::connect(&addr, options()) {
            Ok(c) => {
                let mut b = [0u8; 1];
                c.read(0, &mut b).unwrap();
                break;
            }
            Err(e @ (Error::Busy { .. } | Error::Io { .. })) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("a new client is not served: {e}"),
        }
    }
}
