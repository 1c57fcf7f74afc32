//! `scad-soak`: a load and soak test of memory servers, bounded in clients, operations
//! and time, on loopback only.
//!
//! N clients, each on its own connection, do random reads and writes of random sizes
//! for T seconds:
//! - in a region of their own (disjoint): every write updates a local shadow copy, and
//!   every read's checksum must equal the checksum of the shadow's bytes;
//! - in a region all clients share: writes store self-checking 4 KiB records (header
//!   with writer, sequence, length and payload checksum), reads check that a slot is
//!   either never written or holds one whole record. Records are stripe-aligned, so
//!   this also checks that concurrent requests never tear each other's data.
//!
//! It reports operations, bytes, errors, checksum mismatches (must be 0), throughput
//! and latency percentiles, appends a JSON line to `--jsonl` and rewrites the Markdown
//! table `--md` from all lines there. `--transport local` runs the same mix against
//! in-process memory: the no-network reference for the same run.
//!
//! ```text
//! scad-soak --clients 16 --seconds 5                     # one embedded server
//! scad-soak --clients 16 --seconds 5 --server 127.0.0.1:2333 --server 127.0.0.1:2334
//! ```

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{LocalTransport, TcpOptions, TcpTransport};
use scad_core::Transport;
use serde::{Deserialize, Serialize};

/// Most clients one run may start.
const MAX_CLIENTS: usize = 256;
/// Longest run.
const MAX_SECONDS: u64 = 600;
/// Bytes of one shared record slot (stripe-aligned, one frame).
const SLOT: usize = 4096;
/// Bytes of a record header: magic, writer, sequence, payload length, checksum.
const RECORD_HEAD: usize = 8 + 4 + 4 + 4 + 8;
const RECORD_MAGIC: u64 = u64::from_le_bytes(*b"SCADSOAK");

/// What the clients talk to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    /// Memory servers over TCP (embedded, or given with --server).
    Tcp,
    /// In-process memory: the same workload without network or server.
    Local,
}

/// Load and soak test of Scad memory servers (loopback only, bounded).
#[derive(Debug, Parser)]
#[command(name = "scad-soak", version, about)]
struct Args {
    /// Concurrent clients, each with its own connection (at most 256).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds to run (at most 600).
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Operations per client at most (the run also ends after --seconds).
    #[arg(long, default_value_t = 1_000_000)]
    max_ops: u64,
    /// A running memory server to use (loopback addresses only); repeatable. Without
    /// it, --embedded servers are started in this process.
    #[arg(long = "server")]
    servers: Vec<String>,
    /// Embedded servers to start when no --server is given.
    #[arg(long, default_value_t = 1)]
    embedded: usize,
    /// Token to present to the servers.
    #[arg(long, env = "SCAD_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// What the clients talk to.
    #[arg(long, value_enum, default_value_t = Target::Tcp)]
    transport: Target,
    /// Bytes of each client's own region.
    #[arg(long, default_value_t = 1 << 20)]
    own_bytes: usize,
    /// Bytes of the region all clients share (a multiple of 4096).
    #[arg(long, default_value_t = 4 << 20)]
    shared_bytes: usize,
    /// Largest read or write in a client's own region.
    #[arg(long, default_value_t = 256 << 10)]
    max_io: usize,
    /// Fraction of operations on the shared region.
    #[arg(long, default_value_t = 0.3)]
    shared_fraction: f64,
    /// Fraction of operations that write.
    #[arg(long, default_value_t = 0.5)]
    write_fraction: f64,
    /// Random seed (runs with the same seed do the same operations per client).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Label of this run in the results.
    #[arg(long)]
    label: Option<String>,
    /// Append the result as one JSON line here.
    #[arg(long)]
    jsonl: Option<PathBuf>,
    /// Rewrite this Markdown table from every line of --jsonl.
    #[arg(long, requires = "jsonl")]
    md: Option<PathBuf>,
}

/// One run's result, as written to the JSON lines file.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Outcome {
    label: String,
    transport: String,
    servers: usize,
    clients: usize,
    seconds: f64,
    ops: u64,
    reads: u64,
    writes: u64,
    shared_ops: u64,
    bytes: u64,
    errors: u64,
    mismatches: u64,
    ops_per_s: f64,
    mib_per_s: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    #[serde(default)]
    load_avg_1m: f64,
    #[serde(default)]
    cores: usize,
}

/// The checksum of reads and records: FNV-1a-style over 8-byte words (then the tail
/// bytes), so checking a 256 KiB read costs far less than moving it.
fn checksum(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut words = bytes.chunks_exact(8);
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ bytes.len() as u64;
    for w in &mut words {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        h = (h ^ u64::from_le_bytes(word))
            .wrapping_mul(PRIME)
            .rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    h
}

/// The 1-minute load average at the start of the run (other work on the machine
/// skews every figure), or 0 where `/proc/loadavg` is missing.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

fn fill_random(rng: &mut SmallRng, buf: &mut [u8]) {
    rng.fill(buf);
}

/// A size from 1 to `max`, spread evenly over orders of magnitude.
fn random_len(rng: &mut SmallRng, max: usize) -> usize {
    let bits = usize::BITS - max.leading_zeros();
    let top = rng.gen_range(0..bits);
    rng.gen_range(1..=(1usize << top).min(max))
}

#[derive(Debug, Default)]
struct ClientResult {
    reads: u64,
    writes: u64,
    shared_ops: u64,
    bytes: u64,
    errors: u64,
    mismatches: u64,
    first_error: Option<String>,
    /// Latency of every operation, in tenths of a microsecond.
    latencies: Vec<u32>,
}

struct Client {
    id: u32,
    transport: Arc<dyn Transport>,
    /// Start of this client's own region.
    own_base: u64,
    shadow: Vec<u8>,
    shared_slots: usize,
    rng: SmallRng,
    seq: u32,
}

impl Client {
    fn run(mut self, args: &Args, deadline: Instant, progress: &AtomicU64) -> ClientResult {
        let mut r = ClientResult::default();
        let mut buf = vec![0u8; args.max_io.max(SLOT)];
        for _ in 0..args.max_ops {
            if Instant::now() >= deadline {
                break;
            }
            let shared = self.rng.gen_bool(args.shared_fraction);
            let write = self.rng.gen_bool(args.write_fraction);
            let started = Instant::now();
            let outcome = if shared {
                r.shared_ops += 1;
                self.shared_op(write, &mut buf)
            } else {
                self.own_op(write, args.max_io, &mut buf)
            };
            // Tenths of a microsecond: in-process operations take less than one.
            let tenths = (started.elapsed().as_nanos() / 100).min(u128::from(u32::MAX)) as u32;
            r.latencies.push(tenths);
            progress.fetch_add(1, Ordering::Relaxed);
            if write {
                r.writes += 1;
            } else {
                r.reads += 1;
            }
            match outcome {
                Ok((bytes, ok)) => {
                    r.bytes += bytes;
                    if !ok {
                        r.mismatches += 1;
                    }
                }
                Err(e) => {
                    r.errors += 1;
                    r.first_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
        r
    }

    /// A read or write in the client's own region; `Ok((bytes, checksum matched))`.
    fn own_op(
        &mut self,
        write: bool,
        max_io: usize,
        buf: &mut [u8],
    ) -> scad_core::Result<(u64, bool)> {
        let len = random_len(&mut self.rng, max_io.min(self.shadow.len()));
        let off = self.rng.gen_range(0..=self.shadow.len() - len);
        let addr = self.own_base + off as u64;
        let data = &mut buf[..len];
        if write {
            fill_random(&mut self.rng, data);
            self.transport.write(addr, data)?;
            // Only an acknowledged write changes what later reads must see.
            self.shadow[off..off + len].copy_from_slice(data);
            Ok((len as u64, true))
        } else {
            self.transport.read(addr, data)?;
            let ok = checksum(data) == checksum(&self.shadow[off..off + len]);
            Ok((len as u64, ok))
        }
    }

    /// A record write or check in the shared region.
    fn shared_op(&mut self, write: bool, buf: &mut [u8]) -> scad_core::Result<(u64, bool)> {
        let slot = self.rng.gen_range(0..self.shared_slots);
        let addr = (slot * SLOT) as u64;
        let rec = &mut buf[..SLOT];
        if write {
            self.seq = self.seq.wrapping_add(1);
            let len = self.rng.gen_range(0..=SLOT - RECORD_HEAD);
            rec.fill(0);
            fill_random(&mut self.rng, &mut rec[RECORD_HEAD..RECORD_HEAD + len]);
            let sum = checksum(&rec[RECORD_HEAD..RECORD_HEAD + len]);
            rec[..8].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
            rec[8..12].copy_from_slice(&self.id.to_le_bytes());
            rec[12..16].copy_from_slice(&self.seq.to_le_bytes());
            rec[16..20].copy_from_slice(&(len as u32).to_le_bytes());
            rec[20..28].copy_from_slice(&sum.to_le_bytes());
            self.transport.write(addr, rec)?;
            Ok((SLOT as u64, true))
        } else {
            self.transport.read(addr, rec)?;
            Ok((SLOT as u64, record_is_whole(rec)))
        }
    }
}

/// True for a never-written slot or one whole record.
fn record_is_whole(rec: &[u8]) -> bool {
    if rec.iter().all(|&b| b == 0) {
        return true;
    }
    let word = |r: std::ops::Range<usize>| {
        rec[r]
            .iter()
            .rev()
            .fold(0u64, |a, &b| a << 8 | u64::from(b))
    };
    let len = word(16..20) as usize;
    word(0..8) == RECORD_MAGIC
        && len <= SLOT - RECORD_HEAD
        && word(20..28) == checksum(&rec[RECORD_HEAD..RECORD_HEAD + len])
        && rec[RECORD_HEAD + len..].iter().all(|&b| b == 0)
}

/// The `p` quantile of latencies in tenths of a microsecond, in microseconds.
fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    f64::from(sorted[i.min(sorted.len() - 1)]) / 10.0
}

fn check_loopback(addr: &str) -> Result<()> {
    let resolved: Vec<_> = addr
        .to_socket_addrs()
        .with_context(|| format!("resolving {addr}"))?
        .collect();
    ensure!(!resolved.is_empty(), "{addr} resolves to nothing");
    if let Some(a) = resolved.iter().find(|a| !a.ip().is_loopback()) {
        bail!("{addr} resolves to {a}, which is not a loopback address: scad-soak runs on loopback only");
    }
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        (1..=MAX_CLIENTS).contains(&args.clients),
        "--clients must be 1 to {MAX_CLIENTS}"
    );
    ensure!(
        (1..=MAX_SECONDS).contains(&args.seconds),
        "--seconds must be 1 to {MAX_SECONDS}"
    );
    ensure!(
        args.shared_bytes >= SLOT && args.shared_bytes % SLOT == 0,
        "--shared-bytes must be a positive multiple of {SLOT}"
    );
    ensure!(
        args.own_bytes >= 1 && args.max_io >= 1,
        "--own-bytes and --max-io must be positive"
    );
    ensure!(
        (0.0..=1.0).contains(&args.shared_fraction) && (0.0..=1.0).contains(&args.write_fraction),
        "fractions must be between 0 and 1"
    );
    for s in &args.servers {
        check_loopback(s)?;
    }
    ensure!(
        (1..=16).contains(&args.embedded),
        "--embedded must be 1 to 16"
    );

    // Every server holds the shared region, then the own regions of its clients.
    let servers_n = match args.transport {
        Target::Local => 1,
        Target::Tcp if args.servers.is_empty() => args.embedded,
        Target::Tcp => args.servers.len(),
    };
    let per_server = args.clients.div_ceil(servers_n);
    let needed = (args.shared_bytes + per_server * args.own_bytes) as u64;
    let mut embedded = Vec::new();
    let addrs: Vec<String> = match args.transport {
        Target::Local => Vec::new(),
        Target::Tcp if args.servers.is_empty() => {
            for _ in 0..args.embedded {
                let s = MemoryServer::start("127.0.0.1:0", needed, ServerConfig::default())
                    .context("starting an embedded memory server")?;
                embedded.push(s);
            }
            embedded
                .iter()
                .map(|s| s.local_addr().to_string())
                .collect()
        }
        Target::Tcp => args.servers.clone(),
    };
    let local: Option<Arc<dyn Transport>> = match args.transport {
        Target::Local => Some(Arc::new(LocalTransport::new(needed)?)),
        Target::Tcp => None,
    };
    let options = TcpOptions {
        token: args.token.clone(),
        ..TcpOptions::default()
    };
    let mut clients = Vec::with_capacity(args.clients);
    for i in 0..args.clients {
        let transport: Arc<dyn Transport> = match &local {
            Some(t) => Arc::clone(t),
            None => {
                let addr = &addrs[i % servers_n];
                Arc::new(
                    TcpTransport::connect(addr, options.clone())
                        .with_context(|| format!("client {i} connecting to {addr}"))?,
                )
            }
        };
        let size = transport.remote_size()?;
        ensure!(
            size >= needed,
            "{} has {size} bytes; this run needs {needed}",
            transport.describe()
        );
        let own_base = (args.shared_bytes + (i / servers_n) * args.own_bytes) as u64;
        // Start from what is there (a given server may hold data from an earlier run).
        let mut shadow = vec![0u8; args.own_bytes];
        transport.read(own_base, &mut shadow)?;
        clients.push(Client {
            id: i as u32,
            transport,
            own_base,
            shadow,
            shared_slots: args.shared_bytes / SLOT,
            rng: SmallRng::seed_from_u64(args.seed.wrapping_mul(1_000_003).wrapping_add(i as u64)),
            seq: 0,
        });
    }

    let load = load_average();
    let progress = AtomicU64::new(0);
    let bar = ProgressBar::new(args.seconds);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {elapsed}/{len}s {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let results: Vec<ClientResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = clients
            .into_iter()
            .map(|c| {
                let (args, progress) = (&args, &progress);
                scope.spawn(move || c.run(args, deadline, progress))
            })
            .collect();
        while handles.iter().any(|h| !h.is_finished()) {
            bar.set_position(started.elapsed().as_secs());
            bar.set_message(format!("{} ops", progress.load(Ordering::Relaxed)));
            std::thread::sleep(Duration::from_millis(100));
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    bar.finish_and_clear();
    let elapsed = started.elapsed().as_secs_f64();

    let mut latencies: Vec<u32> = results
        .iter()
        .flat_map(|r| r.latencies.iter().copied())
        .collect();
    latencies.sort_unstable();
    let sum = |f: fn(&ClientResult) -> u64| results.iter().map(f).sum::<u64>();
    let (reads, writes) = (sum(|r| r.reads), sum(|r| r.writes));
    let bytes = sum(|r| r.bytes);
    let outcome = Outcome {
        label: args
            .label
            .clone()
            .unwrap_or_else(|| format!("{} clients", args.clients)),
        transport: match args.transport {
            Target::Tcp if args.servers.is_empty() => "tcp (embedded)".into(),
            Target::Tcp => "tcp".into(),
            Target::Local => "local".into(),
        },
        servers: servers_n,
        clients: args.clients,
        seconds: elapsed,
        ops: reads + writes,
        reads,
        writes,
        shared_ops: sum(|r| r.shared_ops),
        bytes,
        errors: sum(|r| r.errors),
        mismatches: sum(|r| r.mismatches),
        ops_per_s: (reads + writes) as f64 / elapsed,
        mib_per_s: bytes as f64 / elapsed / f64::from(1u32 << 20),
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        max_us: latencies.last().map_or(0.0, |&m| f64::from(m) / 10.0),
        load_avg_1m: load,
        cores: std::thread::available_parallelism().map_or(0, usize::from),
    };
    println!(
        "{}: {} clients on {} {} server(s), {:.1} s: {} ops ({} reads, {} writes, {} shared), {:.1} MiB/s, {:.0} ops/s, p50 {:.1} µs, p99 {:.1} µs, max {:.0} µs, errors {}, checksum mismatches {}",
        outcome.label,
        outcome.clients,
        outcome.servers,
        outcome.transport,
        outcome.seconds,
        outcome.ops,
        outcome.reads,
        outcome.writes,
        outcome.shared_ops,
        outcome.mib_per_s,
        outcome.ops_per_s,
        outcome.p50_us,
        outcome.p99_us,
        outcome.max_us,
        outcome.errors,
        outcome.mismatches
    );
    if let Some(e) = results.iter().find_map(|r| r.first_error.as_deref()) {
        println!("first error: {e}");
    }
    if let Some(path) = &args.jsonl {
        append_jsonl(path, &outcome)?;
        if let Some(md) = &args.md {
            write_md(path, md)?;
        }
    }
    drop(embedded);
    let verdict = outcome.mismatches == 0 && outcome.errors == 0;
    println!(
        "target: zero errors and zero checksum mismatches: {}",
        if verdict { "met" } else { "NOT met" }
    );
    if !verdict {
        std::process::exit(1);
    }
    Ok(())
}

fn append_jsonl(path: &Path, outcome: &Outcome) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    writeln!(f, "{}", serde_json::to_string(outcome)?)?;
    Ok(())
}

fn write_md(jsonl: &Path, md: &Path) -> Result<()> {
    let text = std::fs::read_to_string(jsonl)?;
    let rows: Vec<Outcome> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing {}", jsonl.display()))?;
    let mut out = String::from(
        "# Soak: random reads and writes with checksums\n\n\
         Produced by `scad-soak` (benches crate); each row is one run. Clients do \
         random reads and writes of 1 B to 256 KiB in regions of their own (checked \
         against a local shadow copy) and 4 KiB self-checking records in a region all \
         share (checked for torn records). `local` runs the same mix against in-process \
         memory: the no-network reference of the same machine and run. `load` is the \
         1-minute load average when the run started: other work on the machine skews \
         the figures.\n\n\
         | run | transport | servers | clients | seconds | ops | MiB moved | ops/s | MiB/s | p50 µs | p99 µs | max µs | errors | mismatches | cores | load |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:.1} | {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.0} | {} | {} | {} | {:.1} |",
            r.label,
            r.transport,
            r.servers,
            r.clients,
            r.seconds,
            r.ops,
            r.bytes as f64 / f64::from(1u32 << 20),
            r.ops_per_s,
            r.mib_per_s,
            r.p50_us,
            r.p99_us,
            r.max_us,
            r.errors,
            r.mismatches,
            r.cores,
            r.load_avg_1m
        );
    }
    std::fs::write(md, out).with_context(|| format!("writing {}", md.display()))
}
