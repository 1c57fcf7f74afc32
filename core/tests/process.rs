//! The `memory_server` binary as a separate process: start, serve, authenticate, stop
//! on SIGTERM and SIGINT, refuse bad arguments.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/server_process.rs"]
mod server_process;

use std::process::Command;

use server_process::Server;

use scad_core::transport::{TcpOptions, TcpTransport};
use scad_core::{Error, Transport};

#[test]
fn serves_and_stops_cleanly_on_sigterm() {
    let server = Server::start(0, "16M", &[]);
    let c = TcpTransport::connect(&server.addr, TcpOptions::default()).unwrap();
    assert_eq!(c.remote_size().unwrap(), 16 << 20);
    let data: Vec<u8> = (0..3 << 20).map(|i| (i % 253) as u8).collect();
    c.write(1 << 20, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(1 << 20, &mut back).unwrap();
    assert!(back == data);
    // A connected, idle client must not keep the server from stopping.
    server.signal("-TERM");
    let status = server.wait_exit();
    assert!(status.success(), "{status}");
    assert!(c.read(0, &mut [0u8; 1]).is_err());
}

#[test]
fn token_protects_the_process_and_sigint_stops_it() {
    let server = Server::start(0, "16M", &["--token", "tok"]);
    let err = TcpTransport::connect(&server.addr, TcpOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Auth { .. }), "{err}");
    let good = TcpOptions {
        token: Some("tok".into()),
        ..TcpOptions::default()
    };
    TcpTransport::connect(&server.addr, good)
        .unwrap()
        .write(0, b"x")
        .unwrap();
    server.signal("-INT");
    assert!(server.wait_exit().success());
}

#[test]
fn bad_arguments_fail_with_a_message() {
    for args in [
        vec!["0", "tcp", "--size", "0"],
        vec!["0", "udp"],
        vec!["99999"],
        vec!["0", "tcp", "--size", "12Q"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_memory_server"))
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("error"), "{args:?}: {stderr}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_memory_server"))
        .arg("--list-devices")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout)
        .to_lowercase()
        .contains("rdma"));
}

#[test]
fn region_tokens_from_flags_and_files() {
    let dir = std::env::temp_dir().join(format!("scad-regions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("regions");
    std::fs::write(&file, "# name:offset:len:token\nfiles:4M:1M:file-secret\n").unwrap();
    let server = Server::start(
        0,
        "16M",
        &[
            "--region",
            "flags:0:4M:flag-secret",
            "--regions-file",
            file.to_str().unwrap(),
        ],
    );
    let open = |token: &str| {
        TcpTransport::connect(
            &server.addr,
            TcpOptions {
                token: Some(token.into()),
                ..TcpOptions::default()
            },
        )
    };
    assert_eq!(open("flag-secret").unwrap().remote_size().unwrap(), 4 << 20);
    let files = open("file-secret").unwrap();
    assert_eq!(files.remote_size().unwrap(), 1 << 20);
    files.write(0, b"in the file region").unwrap();
    assert!(matches!(open("wrong"), Err(Error::Auth { .. })));
    assert!(matches!(
        TcpTransport::connect(&server.addr, TcpOptions::default()),
        Err(Error::Auth { .. })
    ));
    drop(server);
    // Regions that do not fit, or do not parse, stop the server from starting.
    for bad in [["--region", "x:15M:2M:t"], ["--region", "x:0:1M"]] {
        let out = Command::new(env!("CARGO_BIN_EXE_memory_server"))
            .args(["0", "tcp", "--bind", "127.0.0.1", "--size", "16M"])
            .args(bad)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad:?} should fail");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("region"), "{bad:?}: {stderr}");
        assert!(!stderr.contains("flag-secret"));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
