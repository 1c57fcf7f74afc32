//! The Rust side of the Python wheel's `disaggrt` benchmark (benches/python/bench_python.py):
//! the same work the Python `remote_array` does — write an array of float32 through a
//! buffer pool of the `disaggrt` geometry (16 MiB in 64 KiB pages, CLOCK) with
//! `write_direct` (what `buffer_pool.write` does for an array of a quarter of the pool
//! or more) and flush, then materialize it in a second, fresh pool into a fresh array
//! with `read_direct` — straight from Rust, over loopback tcp. The memory server is the
//! one at `ADDR` (the Python benchmark starts a `memory_server` process for each run),
//! or an in-process one when no address is given. Also times the same materialize
//! through the cache (`read`) and a raw transport read of the same bytes into a fresh
//! buffer. Prints one JSON object with the timings of every repetition.
//!
//! ```text
//! cargo run --release -p scad-benches --bin disaggrt-baseline -- [MIB] [REPS] [ADDR]
//! ```

use std::sync::Arc;
use std::time::Instant;

use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{TcpOptions, TcpTransport};
use scad_core::Transport;
use scad_remote_array::{BufferPool, ElementId, EvictionPolicy, MemoryElements};

type BoxResult<T> = Result<T, Box<dyn std::error::Error>>;

/// A pool of the `disaggrt` geometry over `transport`.
fn pool(transport: &Arc<dyn Transport>) -> BoxResult<(BufferPool, ElementId)> {
    let elements = Arc::new(MemoryElements::new());
    let id = elements.add("mem", Arc::clone(transport))?;
    let pool = BufferPool::builder(16 << 20)
        .page_size(64 << 10)
        .policy(EvictionPolicy::Clock)
        .read_ahead(4)
        .elements(elements)
        .build()?;
    Ok((pool, id))
}

fn main() -> BoxResult<()> {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(256);
    let reps: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(5);
    let external = args.next();
    let bytes = mib << 20;
    let server = match external {
        Some(_) => None,
        None => Some(MemoryServer::start(
            "127.0.0.1:0",
            bytes as u64 + (1 << 20),
            ServerConfig::default(),
        )?),
    };
    let addr = match (&external, &server) {
        (Some(a), _) => a.clone(),
        (None, Some(s)) => s.local_addr().to_string(),
        (None, None) => return Err("no memory server".into()),
    };
    let transport = TcpTransport::connect(&addr, TcpOptions::default())?;
    let transport: Arc<dyn Transport> = Arc::new(transport);
    let n = bytes / 4;
    let data: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let mut write_s = Vec::new();
    let mut materialize_s = Vec::new();
    let (mut cached_s, mut raw_s) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let (pool1, id) = pool(&transport)?;
        let t0 = Instant::now();
        pool1.write_direct(id, 0, bytemuck::cast_slice(&data))?;
        pool1.flush()?;
        write_s.push(t0.elapsed().as_secs_f64());
        let (pool2, id) = pool(&transport)?;
        let t1 = Instant::now();
        let mut out = vec![0f32; n];
        pool2.read_direct(id, 0, bytemuck::cast_slice_mut(&mut out))?;
        materialize_s.push(t1.elapsed().as_secs_f64());
        if out != data {
            return Err("materialized data differ".into());
        }
        // The same bytes through the cache (the materialize path before read_direct).
        let t2 = Instant::now();
        let mut out = vec![0f32; n];
        pool2.read(id, 0, bytemuck::cast_slice_mut(&mut out))?;
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
    if let Some(s) = server {
        s.shutdown();
    }
    Ok(())
}
