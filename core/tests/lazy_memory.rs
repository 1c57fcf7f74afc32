//! Every address space this crate allocates — a memory server's region, a local
//! transport's, a registered buffer — is mapped, not committed: this process stays
//! small while holding 8 GiB of each, and grows only by what is written. (One test in
//! its own binary, so no other test allocates while it measures VmRSS.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{LocalTransport, TcpOptions, TcpTransport};
use scad_core::{RegisteredBuffer, Transport};

const MIB: u64 = 1 << 20;

fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

#[test]
fn eight_gib_address_spaces_cost_only_what_is_written() {
    let before = rss();
    let server = MemoryServer::start("127.0.0.1:0", 8 << 30, ServerConfig::default()).unwrap();
    let local = LocalTransport::new(8 << 30).unwrap();
    let buffer = RegisteredBuffer::new(8 << 30).unwrap();
    let mapped = rss();
    assert!(
        mapped < before + 64 * MIB,
        "mapping 3 x 8 GiB grew the process from {before} to {mapped} B"
    );

    // Unwritten memory reads as zeros without being committed.
    let mut chunk = vec![7u8; MIB as usize];
    for i in 0..64u64 {
        local.read(i * 128 * MIB, &mut chunk).unwrap();
        assert!(chunk.iter().all(|&b| b == 0));
    }
    let read = rss();

    // 16 MiB written into each grows the process by about 48 MiB.
    let data = vec![0x5Au8; 16 * MIB as usize];
    local.write((8 << 30) - 16 * MIB, &data).unwrap();
    buffer.write_at(4096, &data).unwrap();
    let tcp =
        TcpTransport::connect(&server.local_addr().to_string(), TcpOptions::default()).unwrap();
    tcp.write(1 << 32, &data).unwrap();
    let written = rss();
    println!(
        "in-process: {:.1} MiB before, {:.1} MiB with an 8 GiB server, local transport and \
         buffer mapped, {:.1} MiB after reading 64 MiB unwritten, {:.1} MiB after writing \
         16 MiB into each",
        before as f64 / MIB as f64,
        mapped as f64 / MIB as f64,
        read as f64 / MIB as f64,
        written as f64 / MIB as f64
    );
    assert!(read < mapped + 16 * MIB, "{mapped} -> {read} B after reads");
    assert!(
        written >= read + 40 * MIB,
        "writes are resident: {read} -> {written} B"
    );
    assert!(
        written < read + 48 * MIB + 64 * MIB,
        "{read} -> {written} B"
    );
    let mut back = vec![0u8; data.len()];
    server.region().read(1 << 32, &mut back).unwrap();
    assert!(back == data);
}
