//! The `memory_server` command (feature `cli`): its command line ([`Args`]) and [`run`], shared by the
//! Rust binary and the `memory_server` console script of the Python wheel.
//!
//! Compatible with the original command line (port defaults to 2333, implementation to
//! `tcp`), with options for the size, bind address, token and limits. Stops cleanly on
//! SIGINT or SIGTERM. Prints `listening on HOST:PORT` on stdout once it accepts
//! connections, so scripts can start it on port 0 and read the port.

use std::io::Write;
use std::time::Duration;

use crate::server::{MemoryServer, RegionGrant, ServerConfig};
use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Which transport the server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Impl {
    /// The TCP wire protocol (durl `rdma_tcp`).
    Tcp,
    /// One-sided RDMA (durl `rdma_uverbs`; needs the `rdma` feature and a device).
    Rdma,
}

/// Serve one memory element's address space.
#[derive(Debug, Parser)]
#[command(name = "memory_server", version, about)]
pub struct Args {
    /// TCP port to listen on (0 picks a free one).
    #[arg(default_value_t = 2333)]
    pub port: u16,
    /// Transport implementation.
    #[arg(value_enum, default_value_t = Impl::Tcp, name = "IMPL")]
    pub implementation: Impl,
    /// Bytes of the address space (suffixes K, M, G accepted, powers of 1024).
    #[arg(long, default_value = "1G", value_parser = parse_size)]
    pub size: u64,
    /// Address to bind. Without a token the server serves only clients on this host
    /// whatever the address (protected mode; see --token and --unprotected).
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: String,
    /// Shared secret clients must present (also read from SCAD_TOKEN). With a token the
    /// server serves clients on other hosts too.
    #[arg(long, env = "SCAD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Serve clients on other hosts without a token: anyone who can reach the port may
    /// read and write all of this server's memory (also SCAD_UNPROTECTED=1). Without it
    /// and without a token, clients not on this host are refused (protected mode).
    #[arg(
        long,
        env = "SCAD_UNPROTECTED",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub unprotected: bool,
    /// Connections served at once.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Largest frame in bytes.
    #[arg(long, default_value_t = crate::protocol::DEFAULT_MAX_FRAME)]
    pub max_frame: u32,
    /// Seconds a connection may stay idle between requests (0: forever).
    #[arg(long, default_value_t = 600)]
    pub idle_timeout: u64,
    /// Seconds a started frame (or a new connection's hello) may take to arrive
    /// whole, and a reply to be taken (0: forever).
    #[arg(long, default_value_t = 30)]
    pub request_timeout: u64,
    /// Bytes all connections together may have in flight (suffixes K, M, G).
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    pub max_in_flight: u64,
    /// Milliseconds a request waits for in-flight budget before it is refused as busy.
    #[arg(long, default_value_t = 5000)]
    pub in_flight_wait_ms: u64,
    /// A region with its own token, NAME:OFFSET:LEN:TOKEN (offset and length with
    /// optional K/M/G suffixes); repeatable. A client presenting the token sees only
    /// that region, addressed from 0. Command lines are visible to other users: prefer
    /// --regions-file for real tokens.
    #[arg(long = "region", value_name = "NAME:OFFSET:LEN:TOKEN")]
    pub regions: Vec<String>,
    /// A file with one NAME:OFFSET:LEN:TOKEN region per line (# starts a comment).
    #[arg(long)]
    pub regions_file: Option<std::path::PathBuf>,
    /// List RDMA devices and exit.
    #[arg(long)]
    pub list_devices: bool,
    /// RDMA device (default: the first one found).
    #[arg(long)]
    pub device: Option<String>,
    /// RDMA device port.
    #[arg(long, default_value_t = 1)]
    pub rdma_port: u8,
    /// RDMA GID table index.
    #[arg(long, default_value_t = 0)]
    pub gid_index: u8,
}

/// Parses a byte count with an optional K/M/G/T suffix (powers of 1024); zero is refused.
///
/// # Errors
/// A message naming what is wrong.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let size = crate::server::parse_bytes(s)?;
    if size == 0 {
        return Err("size must be greater than 0".into());
    }
    Ok(size)
}

/// Runs what `args` asks for: lists RDMA devices, or serves one memory element (tcp or
/// rdma), printing `listening on ADDR` on stdout once it accepts connections, until
/// SIGINT or SIGTERM.
///
/// # Errors
/// Bad regions, a server that cannot start, signal handlers that cannot be installed.
pub fn run(args: &Args) -> Result<()> {
    if args.list_devices {
        return list_devices();
    }
    if args.implementation == Impl::Rdma {
        return serve_rdma(args);
    }
    let config = ServerConfig {
        token: args.token.clone(),
        regions: regions(args)?,
        max_frame: args.max_frame,
        max_connections: args.max_connections,
        max_in_flight: args.max_in_flight,
        in_flight_wait: Duration::from_millis(args.in_flight_wait_ms),
        idle_timeout: (args.idle_timeout > 0).then(|| Duration::from_secs(args.idle_timeout)),
        request_timeout: (args.request_timeout > 0)
            .then(|| Duration::from_secs(args.request_timeout)),
        unprotected: args.unprotected,
    };
    let bind = bind_addr(args);
    let server = MemoryServer::start(&bind, args.size, config)
        .with_context(|| format!("starting the memory server on {bind}"))?;
    let stop = server.shutdown_handle();
    serve_until_signal(
        server.local_addr(),
        move || stop.shutdown(),
        move || server.wait(),
    )
}

/// The regions of `--region` and `--regions-file`.
fn regions(args: &Args) -> Result<Vec<RegionGrant>> {
    let mut specs: Vec<(String, String)> = args
        .regions
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("--region #{}", i + 1), s.clone()))
        .collect();
    if let Some(path) = &args.regions_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the regions file {}", path.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if !line.is_empty() && !line.starts_with('#') {
                specs.push((format!("{}:{}", path.display(), n + 1), line.to_owned()));
            }
        }
    }
    specs
        .iter()
        .map(|(at, spec)| RegionGrant::parse(spec).with_context(|| format!("region at {at}")))
        .collect()
}

fn bind_addr(args: &Args) -> String {
    if args.bind.contains(':') {
        format!("[{}]:{}", args.bind, args.port)
    } else {
        format!("{}:{}", args.bind, args.port)
    }
}

/// Announces `addr` on stdout and serves (`wait`) until the first SIGINT or SIGTERM
/// calls `stop`.
fn serve_until_signal(
    addr: std::net::SocketAddr,
    stop: impl FnOnce() + Send + 'static,
    wait: impl FnOnce(),
) -> Result<()> {
    let mut signals = Signals::new([SIGINT, SIGTERM]).context("installing signal handlers")?;
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            tracing::info!(signal = sig, "stopping");
            stop();
        }
    });
    println!("listening on {addr}");
    std::io::stdout().flush().context("writing to stdout")?;
    wait();
    Ok(())
}

#[cfg(feature = "rdma")]
fn list_devices() -> Result<()> {
    let devices = crate::rdma::list_devices().context("listing RDMA devices")?;
    if devices.is_empty() {
        println!("no RDMA devices found on this host");
    }
    for d in &devices {
        println!("{d}");
    }
    Ok(())
}

#[cfg(not(feature = "rdma"))]
fn list_devices() -> Result<()> {
    println!("no RDMA support: this memory_server was built without the `rdma` feature");
    Ok(())
}

#[cfg(feature = "rdma")]
fn serve_rdma(args: &Args) -> Result<()> {
    use crate::rdma::{RdmaServer, RdmaServerConfig};
    let config = RdmaServerConfig {
        token: args.token.clone(),
        device: args.device.clone(),
        port: args.rdma_port,
        gid_index: args.gid_index,
        max_connections: args.max_connections,
        unprotected: args.unprotected,
        ..RdmaServerConfig::default()
    };
    let bind = bind_addr(args);
    let server = RdmaServer::start(&bind, args.size, config)
        .with_context(|| format!("starting the RDMA memory server on {bind}"))?;
    let stop = server.shutdown_handle();
    serve_until_signal(
        server.local_addr(),
        move || stop.shutdown(),
        move || server.wait(),
    )
}

#[cfg(not(feature = "rdma"))]
fn serve_rdma(_args: &Args) -> Result<()> {
    anyhow::bail!("the rdma implementation needs a memory_server built with the `rdma` feature")
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_with_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert!(parse_size("").is_err());
    }
}
