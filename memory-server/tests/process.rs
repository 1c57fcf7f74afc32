//! The `memory_server` binary as a separate process: start, serve, authenticate, stop
//! on SIGTERM and SIGINT, refuse bad arguments.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use scad_core::transport::{TcpOptions, TcpTransport};
use scad_core::{Error, Transport};

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memory_server"))
            .args(["0", "tcp", "--bind", "127.0.0.1", "--size", "16M"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Server { child, addr }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    fn wait_exit(mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "server did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn serves_and_stops_cleanly_on_sigterm() {
    let server = Server::start(&[]);
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
    let server = Server::start(&["--token", "tok"]);
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
