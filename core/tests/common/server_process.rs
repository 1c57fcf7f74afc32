//! A `memory_server` child process for the integration tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running `memory_server`, killed on drop.
pub struct Server {
    pub child: Child,
    /// `HOST:PORT` it announced.
    pub addr: String,
}

impl Server {
    /// Starts `memory_server PORT tcp --bind 127.0.0.1 --size SIZE EXTRA...` and waits
    /// for its `listening on` line.
    pub fn start(port: u16, size: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_memory_server"))
            .args([
                &port.to_string(),
                "tcp",
                "--bind",
                "127.0.0.1",
                "--size",
                size,
            ])
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

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// Sends a signal (`"-TERM"`, `"-INT"`, `"-9"`).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// kill -9, and reap it.
    pub fn kill9(&mut self) {
        self.signal("-9");
        self.child.wait().unwrap();
    }

    /// Waits up to 10 s for the process to exit.
    pub fn wait_exit(mut self) -> ExitStatus {
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
