//! Helpers shared by the integration tests that talk to memory servers.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use scad_core::protocol::{self, ErrorReply, HelloReply};

/// A raw protocol client, for hostile-input tests.
pub struct Raw(pub TcpStream);

impl Raw {
    /// Connects, with a 10 s receive timeout so a missing reply fails instead of hanging.
    pub fn connect(addr: SocketAddr) -> Raw {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Raw(stream)
    }

    /// Sends bytes as they are.
    pub fn send(&mut self, bytes: &[u8]) {
        self.0.write_all(bytes).unwrap();
    }

    /// Sends a hello with `token` and returns the server's answer.
    pub fn hello(&mut self, token: &[u8]) -> Result<HelloReply, ErrorReply> {
        let mut out = Vec::new();
        protocol::encode_hello(&mut out, 1, token);
        self.send(&out);
        let (ok, payload) = self.reply();
        if ok {
            Ok(HelloReply::decode(&payload).unwrap())
        } else {
            Err(ErrorReply::decode(&payload).unwrap())
        }
    }

    /// Reads one reply: success flag and payload.
    pub fn reply(&mut self) -> (bool, Vec<u8>) {
        let mut head = [0u8; protocol::RESPONSE_HEAD_BYTES];
        self.0.read_exact(&mut head).unwrap();
        let head = protocol::decode_response_head(&head, u32::MAX).unwrap();
        let mut payload = vec![0u8; head.payload_len + head.padding];
        self.0.read_exact(&mut payload).unwrap();
        payload.truncate(head.payload_len);
        (head.ok, payload)
    }

    /// Reads one reply that must be an error.
    pub fn error(&mut self) -> ErrorReply {
        let (ok, payload) = self.reply();
        assert!(!ok, "expected an error reply");
        ErrorReply::decode(&payload).unwrap()
    }

    /// True once the server has closed the connection.
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.0.read(&mut b), Ok(0) | Err(_))
    }
}
