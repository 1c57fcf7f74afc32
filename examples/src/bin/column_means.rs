//! Column means of a remote matrix, chunk by chunk, through a small buffer pool.
//!
//! Two embedded memory servers stand in for two memory elements. One compute element
//! writes a matrix to them, striped, and hands on its metadata as JSON; the next
//! opens it from the metadata through its own action (transports named by durl),
//! slices it without moving data, and computes the column means chunk by chunk with a
//! pool far smaller than the matrix, checking them against a local computation.
//! Finally it prints the pool's counters.
//!
//! ```text
//! cargo run --release -p scad-examples --bin column_means -- --rows 200000 --cols 64
//! ```

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use clap::Parser;
use ndarray::{s, Array1, Array2, Axis, Ix2};
use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::Action;
use scad_remote_array::{
    ArrayMeta, BufferPool, MemoryElements, Placement, RemoteArray, RemoteStore,
};

/// Compute column means of a remote matrix chunk by chunk.
#[derive(Debug, Parser)]
#[command(name = "column_means", about)]
struct Args {
    /// Rows of the matrix.
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Columns of the matrix.
    #[arg(long, default_value_t = 32)]
    cols: usize,
    /// Buffer pool size in KiB (the matrix may be far larger).
    #[arg(long, default_value_t = 2048)]
    pool_kib: usize,
    /// Rows per chunk.
    #[arg(long, default_value_t = 4096)]
    chunk: usize,
}

/// An element's store over the memory elements its action names.
fn store_for(action: &Action, pool_kib: usize) -> Result<Arc<RemoteStore>> {
    let elements = Arc::new(MemoryElements::from_action(action)?);
    let pool = BufferPool::builder(pool_kib << 10)
        .page_size(64 << 10)
        .read_ahead(4)
        .elements(elements)
        .build()?;
    Ok(Arc::new(RemoteStore::new(Arc::new(pool))))
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    ensure!(
        args.rows >= 2 && args.cols >= 1,
        "need at least 2 rows and 1 column"
    );
    let bytes = (args.rows * args.cols * 8) as u64;
    let size = bytes / 2 + (4 << 20);

    let servers: Vec<MemoryServer> = (0..2)
        .map(|_| MemoryServer::start("127.0.0.1:0", size, ServerConfig::default()))
        .collect::<Result<_, _>>()
        .context("starting embedded memory servers")?;
    let durls: Vec<String> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| format!("mem{i};rdma_tcp;url,{};", s.url()))
        .collect();

    // Element 1: write the matrix, striped over both memory elements in 256 KiB units.
    let writer = Action::new("writer");
    for d in &durls {
        writer.add_transport(d)?;
    }
    let store = store_for(&writer, args.pool_kib)?;
    let m = Array2::from_shape_fn((args.rows, args.cols), |(i, j)| {
        ((i * 7 + j * 13) % 1000) as f64 + j as f64
    });
    let t0 = Instant::now();
    let placement = Placement::striped(["mem0", "mem1"]).stripe_bytes(256 << 10);
    let remote = RemoteArray::from_array_with(&store, &m, &placement)?;
    let handoff = remote.meta().to_json()?;
    println!(
        "wrote {} x {} f64 ({:.1} MiB) in {} extents over 2 memory elements in {:.1} ms",
        args.rows,
        args.cols,
        bytes as f64 / (1 << 20) as f64,
        remote.extent_count(),
        t0.elapsed().as_secs_f64() * 1e3
    );

    // Element 2: open the matrix from its metadata through its own action and pool.
    let reader = Action::new("reader");
    for d in &durls {
        reader.add_transport(d)?;
    }
    let store = store_for(&reader, args.pool_kib)?;
    let meta = ArrayMeta::from_json(&handoff)?;
    let matrix = RemoteArray::<f64, Ix2>::from_meta(&store, &meta)?;
    let (lo, hi) = (args.rows / 10, args.rows - args.rows / 10);
    let part = matrix.slice(lo..hi)?; // a view: nothing moves

    let t0 = Instant::now();
    let mut sums = Array1::<f64>::zeros(args.cols);
    let mut chunks = 0;
    for chunk in part.chunks(args.chunk)? {
        let (_rows, data) = chunk?;
        sums += &data.sum_axis(Axis(0));
        chunks += 1;
    }
    let means = sums / part.rows() as f64;
    let elapsed = t0.elapsed();

    let expect = m
        .slice(s![lo..hi, ..])
        .mean_axis(Axis(0))
        .context("empty slice")?;
    let worst = (&means - &expect)
        .iter()
        .fold(0.0f64, |w, d| w.max(d.abs()));
    ensure!(
        worst < 1e-9,
        "column means differ from the local ones by {worst}"
    );

    let shown: Vec<String> = means.iter().take(6).map(|v| format!("{v:.3}")).collect();
    println!(
        "column means of rows {lo}..{hi} in {chunks} chunks of {} rows in {:.1} ms: [{}{}] (match the local computation)",
        args.chunk,
        elapsed.as_secs_f64() * 1e3,
        shown.join(", "),
        if args.cols > 6 { ", ..." } else { "" }
    );
    println!("{}", store.pool());
    for s in &servers {
        let st = s.stats();
        println!(
            "memory server {}: {} B read, {} B written",
            s.url(),
            st.bytes_read,
            st.bytes_written
        );
    }
    Ok(())
}
