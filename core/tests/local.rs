//! The in-process transport and durl-driven opening of transports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use scad_core::transport::{self, LocalTransport};
use scad_core::{Durl, Error, ReadOp, Transport, WriteOp};

#[test]
fn vectored_calls_are_checked_whole_and_counted_once() {
    let t = LocalTransport::new(8192).unwrap();
    let a = [1u8; 100];
    let b = [2u8; 100];
    t.write_vectored(&[
        WriteOp { addr: 0, src: &a },
        WriteOp {
            addr: 4000,
            src: &b,
        },
    ])
    .unwrap();
    let err = t
        .write_vectored(&[
            WriteOp { addr: 200, src: &a },
            WriteOp {
                addr: 8150,
                src: &b,
            },
        ])
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                addr: 8150,
                len: 100,
                size: 8192,
                op: "write"
            }
        ),
        "{err}"
    );
    let (mut x, mut y, mut z) = ([0u8; 100], [0u8; 100], [9u8; 100]);
    t.read_vectored(&mut [
        ReadOp {
            addr: 0,
            dst: &mut x,
        },
        ReadOp {
            addr: 4000,
            dst: &mut y,
        },
        ReadOp {
            addr: 200,
            dst: &mut z,
        },
    ])
    .unwrap();
    assert_eq!((x, y), (a, b));
    assert_eq!(z, [0u8; 100], "the refused vectored write wrote nothing");
    let st = t.stats();
    assert_eq!(
        (st.write_ops, st.bytes_written, st.read_ops, st.bytes_read),
        (1, 200, 1, 300)
    );
}

#[test]
fn open_builds_transports_from_durls() {
    let d: Durl = "m;rdma_local;size,4096;".parse().unwrap();
    let t = transport::open(&d.name, &d.resolve().unwrap()).unwrap();
    assert_eq!(t.remote_size().unwrap(), 4096);
    let server: Durl = "m;rdma_tcp_server;url,tcp://*:1;size,4096;"
        .parse()
        .unwrap();
    assert!(matches!(
        transport::open("m", &server.resolve().unwrap()),
        Err(Error::Unsupported(_))
    ));
    // A client durl pointing nowhere opens lazily and fails on first use.
    let tcp: Durl = "m;rdma_tcp;url,tcp://127.0.0.1:1;timeout_ms,500;"
        .parse()
        .unwrap();
    let t = transport::open("m", &tcp.resolve().unwrap()).unwrap();
    assert!(matches!(
        t.read(0, &mut [0u8; 4]),
        Err(Error::Connect { .. })
    ));
}
