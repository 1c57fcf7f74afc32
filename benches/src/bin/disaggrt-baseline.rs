//! The Rust side of the Python wheel's `disaggrt` benchmark (benches/python/bench_python.py):
//! the same work the Python `remote_array` does — write an array of float32 through a
//! buffer pool of the `disaggrt` geometry (16 MiB in 64 KiB pages, CLOCK), flush, then
//! materialize it into a fresh array with `read_direct` — straight from Rust, against an
//! in-process memory server over loopback tcp. Also times the same materialize through
//! the cache (`read`) and a raw transport read of the same bytes into a fresh buffer.
//! Prints one JSON object with the timings of every repetition.
//!
//! ```text
//! cargo run --release -p scad-benches --bin disaggrt-baseline -- [MIB] [REPS]
//! ```

use std::sync::Arc;
use std::time::Instant;

use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_core::Transport;
use scad_remote_array::{BufferPool, EvictionPolicy, MemoryElements};

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> BoxResult<()> {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(256);
    let reps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let bytes = mib << 20;
    let server = MemoryServer::start(
        "127.0.0.1:0",
        bytes as u64 + (1 << 20),
        ServerConfig::default(),
    )?;
    let transport = TcpTransport::connect(&server.local_addr().to_string(), TcpOptions::default())?;
    let transport: Arc<dyn Transport> = Arc::new(transport);
    let elements = Arc::new(MemoryElements::new());
    let id = elements.add("mem", Arc::clone(&transport))?;
    let pool = BufferPool::builder(16 << 20)
        .page_size(64 << 10)
        .policy(EvictionPolicy::Clock)
        .read_ahead(4)
        .elements(elements)
        .build()?;
    let n = bytes / 4;
    let data: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let mut write_s = Vec::new();
    let mut materialize_s = Vec::new();
    let (mut cached_s, mut raw_s) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t0 = Instant::now();
        pool.write(id, 0, bytemuck::cast_slice(&data))?;
        pool.flush()?;
        write_s.push(t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        let mut out = vec![0f32; n];
        pool.read_direct(id, 0, bytemuck::cast_slice_mut(&mut out))?;
        materialize_s.push(t1.elapsed().as_secs_f64());
        if out != data {
            return Err("materialized data differ".into());
        }
        // The same bytes through the cache (the materialize path before read_direct).
        let t2 = Instant::now();
        let mut out = vec![0f32; n];
        pool.read(id, 0, bytemuck::cast_slice_mut(&mut out))?;
        cached_s.push(t2.elapsed().as_secs_f64());
        // Baseline: a raw bulk read of the same bytes into a fresh buffer.
        let t3 = Instant::now();
        let mut raw = vec![0u8; bytes];
        transport.read(0, &mut raw)?;
        raw_s.push(t3.elapsed().as_secs_f64());
        if bytemuck::cast_slice::<f32, u8>(&out) != &raw[..] {
            return Err("cached or raw read differ".into());
        }
    }
    println!(
        "{{\"bytes\":{bytes},\"write_s\":{write_s:?},\"materialize_s\":{materialize_s:?},\
         \"materialize_cached_s\":{cached_s:?},\"raw_read_s\":{raw_s:?}}}"
    );
    server.shutdown();
    Ok(())
}
