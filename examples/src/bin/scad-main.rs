//! The main job on the embedded default: memory elements inside this process, no
//! setup. It starts two TCP memory servers, adds them to an element's [`Action`] by
//! durl (one configured late, as the runtime does), plus an in-process and a
//! shared-memory element, moves a data set through every transport, verifies it, and
//! prints what moved where.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use clap::Parser;
use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::{Action, ReadOp};

/// Run the embedded Scad demo.
#[derive(Debug, Parser)]
#[command(name = "scad-main", about)]
struct Args {
    /// MiB of data to move through each memory element.
    #[arg(long, default_value_t = 64)]
    mib: usize,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    let bytes = args.mib << 20;
    ensure!(bytes > 0, "--mib must be at least 1");
    let size = (bytes + (1 << 20)) as u64;

    let servers: Vec<MemoryServer> = (0..2)
        .map(|_| MemoryServer::start("127.0.0.1:0", size, ServerConfig::default()))
        .collect::<Result<_, _>>()
        .context("starting embedded memory servers")?;
    let action = Arc::new(Action::new("scad-main"));
    action.add_transport(&format!("mem0;rdma_tcp;url,{};", servers[0].url()))?;
    // mem1 is added before its address is known and configured later, as the runtime does.
    action.add_transport("mem1;rdma_tcp;")?;
    action.add_transport(&format!("local;rdma_local;size,{size};"))?;
    action.add_transport(&format!(
        "shm;rdma_shm;size,{size};shm_id,scad-main-{};",
        std::process::id()
    ))?;
    let late = {
        let action = Arc::clone(&action);
        let url = servers[1].url();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            action.config_transport("mem1", &format!("mem1;rdma_tcp;url,{url};"))
        })
    };

    let data: Vec<u8> = (0..bytes)
        .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
        .collect();
    println!(
        "Scad embedded demo: {} MiB through each of {} memory elements\n",
        args.mib,
        action.names().len()
    );
    println!(
        "{:<8} {:<28} {:>12} {:>12} {:>14}",
        "element", "transport", "write MB/s", "read MB/s", "4 KiB pages/s"
    );
    for name in ["mem0", "mem1", "local", "shm"] {
        let ep = action.endpoint(name)?;
        let t = ep
            .transport()
            .with_context(|| format!("waiting for {name}"))?;
        let started = Instant::now();
        t.write(0, &data)?;
        let write_s = started.elapsed().as_secs_f64();
        let mut back = vec![0u8; bytes];
        let started = Instant::now();
        t.read(0, &mut back)?;
        let read_s = started.elapsed().as_secs_f64();
        ensure!(
            back == data,
            "{name}: data read back differs from data written"
        );
        // Vectored: every 16th page of the data set in one call.
        let pages: Vec<u64> = (0..(bytes / 4096) as u64).step_by(16).collect();
        let mut bufs = vec![[0u8; 4096]; pages.len()];
        let mut ops: Vec<ReadOp<'_>> = bufs
            .iter_mut()
            .zip(&pages)
            .map(|(b, &p)| ReadOp {
                addr: p * 4096,
                dst: &mut b[..],
            })
            .collect();
        let started = Instant::now();
        t.read_vectored(&mut ops)?;
        let pages_s = pages.len() as f64 / started.elapsed().as_secs_f64();
        for (b, &p) in bufs.iter().zip(&pages) {
            let at = (p * 4096) as usize;
            ensure!(b[..] == data[at..at + 4096], "{name}: page {p} differs");
        }
        println!(
            "{:<8} {:<28} {:>12.0} {:>12.0} {:>14.0}",
            name,
            t.describe(),
            bytes as f64 / write_s / 1e6,
            bytes as f64 / read_s / 1e6,
            pages_s
        );
    }
    late.join()
        .map_err(|_| anyhow::anyhow!("configuration thread panicked"))??;
    println!("\nall data verified; transport counters:");
    for name in action.names() {
        println!("  {name:<6} {}", action.endpoint(&name)?.stats());
    }
    for (i, s) in servers.iter().enumerate() {
        let st = s.stats();
        println!(
            "  server {i} at {}: {} connections, {} requests, {} B in, {} B out",
            s.url(),
            st.connections,
            st.requests,
            st.bytes_written,
            st.bytes_read
        );
    }
    action.terminate();
    for s in servers {
        s.shutdown();
    }
    Ok(())
}
