//! # transport-bench — latency and throughput of the scad-core transports
//!
//! Measures reads and writes of 4 KiB, 64 KiB, 1 MiB and 64 MiB on the `local`, `shm`
//! and `tcp` transports (tcp against an in-process memory server on 127.0.0.1:0), and
//! the vectored read of 256 scattered 4 KiB pages in one call. In the same run it
//! measures the baselines the targets of `BENCHMARKS.md` are stated against: Redis
//! `GET`/`SET` of the same sizes (against a `redis-server` it starts itself, if one is
//! on `PATH`), a plain request/response TCP stream over loopback, and `memcpy`.
//!
//! ```text
//! cargo run --release -p scad-benches --bin transport-bench -- [--quick] [--out DIR]
//! ```
//!
//! Every read lands in a page-aligned buffer (as a registered buffer is), and again,
//! as `read_dst16`, in a buffer 16 bytes into a page (as a large `Vec<u8>` from
//! `malloc` is): on some CPUs the copy speed depends on it (see `buf.rs`).
//!
//! Writes `transport.jsonl` (one object per row), `transport.md` (tables and targets)
//! and `transport.png` (throughput against size) into `DIR` (default
//! `benches/results`); `--quick` (a CI smoke run of well under a minute) writes
//! `transport-quick.*` instead, so it never overwrites the results of a full run.

mod buf;
mod measure;
mod redis;
mod report;
mod stream;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use scad_core::server::{MemoryServer, ServerConfig};
use scad_core::transport::{LocalTransport, ShmTransport, TcpOptions, TcpTransport};
use scad_core::{ReadOp, Transport};

use buf::PlacedBuf;
use measure::Case;
use redis::RespClient;
use report::{Row, Target};
use scad_core::redis_server::{self, RedisServer};
use stream::StreamPair;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// Transfer sizes measured for every transport.
const SIZES: [usize; 4] = [4 * KIB, 64 * KIB, MIB, 64 * MIB];
/// Size of every served region: room for the largest transfer and the vectored pages.
const REGION: u64 = 128 * MIB as u64;
/// Pages of the vectored read.
const PAGES: usize = 256;
/// Size of one page of the vectored read.
const PAGE: usize = 4 * KIB;
/// Distance between the vectored read's pages: every other page, so they are scattered.
const PAGE_STRIDE: usize = 2 * PAGE;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    version,
    about = "Latency and throughput of the scad-core transports against Redis, plain TCP and memcpy"
)]
struct Args {
    /// Short smoke run (well under a minute) for CI; writes transport-quick.* files.
    #[arg(long)]
    quick: bool,
    /// Directory for the results files.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    out: PathBuf,
}

/// How long and how often to measure.
#[derive(Debug, Clone, Copy)]
struct Mode {
    name: &'static str,
    /// Interleaved rounds over the cases of one size.
    rounds: usize,
    /// Time budget of one case over all rounds.
    budget: Duration,
    /// Samples every case takes in every round, whatever the budget.
    min_samples: usize,
    /// Cap on operations of one case per size (4 KiB, 64 KiB, 1 MiB, 64 MiB).
    max_ops: [usize; 4],
}

impl Mode {
    const FULL: Mode = Mode {
        name: "full",
        rounds: 5,
        budget: Duration::from_millis(2500),
        min_samples: 3,
        max_ops: [50_000, 10_000, 1_000, 60],
    };
    const QUICK: Mode = Mode {
        name: "quick",
        rounds: 2,
        budget: Duration::from_millis(150),
        min_samples: 1,
        max_ops: [4_000, 1_000, 100, 6],
    };

    fn max_ops(&self, size: usize) -> usize {
        SIZES
            .iter()
            .position(|&s| s == size)
            .map_or(self.max_ops[0], |i| self.max_ops[i])
    }
}

/// Everything the cases share: the transports, the servers and the data.
struct Env {
    /// Deterministic bytes every region holds at its start, and every write stores
    /// (page-aligned, like the regions).
    pattern: Arc<PlacedBuf>,
    local: Arc<LocalTransport>,
    shm: Arc<ShmTransport>,
    tcp: Arc<TcpTransport>,
    /// Kept alive for `tcp`.
    _server: MemoryServer,
    redis: Option<RedisServer>,
    /// Why the Redis rows are missing, if they are.
    redis_note: Option<String>,
    /// One-sided RDMA to an in-process RDMA server, when built with `rdma` and a device
    /// exists.
    rdma: Option<RdmaRows>,
    /// Why the RDMA rows are missing, if they are.
    rdma_note: Option<String>,
}

/// The RDMA client and the server it reads from (kept alive together).
struct RdmaRows {
    transport: Arc<dyn Transport>,
    _server: Box<dyn std::any::Any>,
}

/// Starts an RDMA memory server on the first device and connects to it, or says why not.
#[cfg(feature = "rdma")]
fn rdma_rows(pattern: &[u8]) -> Result<std::result::Result<RdmaRows, String>> {
    use scad_core::rdma::{list_devices, RdmaOptions, RdmaServer, RdmaServerConfig, RdmaTransport};
    let devices = list_devices().context("cannot list RDMA devices")?;
    if devices.is_empty() {
        return Ok(Err(
            "no RDMA device on this machine: rdma rows skipped".to_owned()
        ));
    }
    let server = RdmaServer::start("127.0.0.1:0", REGION, RdmaServerConfig::default())
        .context("cannot start the in-process RDMA memory server")?;
    server.region().write(0, pattern)?;
    let transport =
        RdmaTransport::connect(&server.local_addr().to_string(), RdmaOptions::default())
            .context("cannot connect to the in-process RDMA memory server")?;
    Ok(Ok(RdmaRows {
        transport: Arc::new(transport),
        _server: Box::new(server),
    }))
}

#[cfg(not(feature = "rdma"))]
fn rdma_rows(_pattern: &[u8]) -> Result<std::result::Result<RdmaRows, String>> {
    Ok(Err(
        "built without the `rdma` feature: rdma rows skipped \
            (add --features rdma on a machine with an RDMA device)"
            .to_owned(),
    ))
}

impl Env {
    fn setup() -> Result<Self> {
        let max = *SIZES.iter().max().unwrap_or(&MIB);
        let pattern: Vec<u8> = (0..max.max(PAGES * PAGE_STRIDE))
            .map(|i| (i.wrapping_mul(131).wrapping_add(i >> 12) % 251) as u8)
            .collect();
        let pattern = Arc::new(PlacedBuf::copy_of(&pattern, 0));

        let local =
            Arc::new(LocalTransport::new(REGION).context("cannot allocate the local region")?);
        local.write(0, &pattern)?;

        let shm_id = format!("transport-bench-{}", std::process::id());
        let shm =
            Arc::new(ShmTransport::open(&shm_id, REGION).context("cannot open the shm segment")?);
        shm.write(0, &pattern)?;

        let server = MemoryServer::start("127.0.0.1:0", REGION, ServerConfig::default())
            .context("cannot start the in-process memory server")?;
        server.region().write(0, &pattern)?;
        let tcp = Arc::new(
            TcpTransport::connect(&server.local_addr().to_string(), TcpOptions::default())
                .context("cannot connect to the in-process memory server")?,
        );

        // Values up to 512 MiB in one command and query buffers to match.
        let redis_args = [
            "--proto-max-bulk-len",
            "512mb",
            "--client-query-buffer-limit",
            "1gb",
        ];
        let (redis, redis_note) = match redis_server::find_binary() {
            None => (
                None,
                Some("redis-server not found on PATH: Redis rows skipped".to_owned()),
            ),
            Some(bin) => match RedisServer::start_binary(&bin, &redis_args) {
                Ok(r) => (Some(r), None),
                Err(e) => (
                    None,
                    Some(format!(
                        "redis-server could not be started ({:#}): Redis rows skipped",
                        anyhow::Error::from(e)
                    )),
                ),
            },
        };
        let (rdma, rdma_note) = match rdma_rows(&pattern)? {
            Ok(rows) => (Some(rows), None),
            Err(note) => (None, Some(note)),
        };
        Ok(Env {
            pattern,
            local,
            shm,
            tcp,
            _server: server,
            redis,
            redis_note,
            rdma,
            rdma_note,
        })
    }

    /// All cases of one transfer size.
    fn cases(&self, size: usize) -> Result<Vec<Case>> {
        let p = &self.pattern;
        let mut cases = vec![memcpy_case(p, size, 0), memcpy_case(p, size, VEC_OFFSET)];
        let transports: [(&'static str, Arc<dyn Transport>); 3] = [
            ("local", self.local.clone()),
            ("shm", self.shm.clone()),
            ("tcp", self.tcp.clone()),
        ];
        for (name, t) in &transports {
            cases.push(read_case(name, Arc::clone(t), size, p, 0));
            cases.push(read_case(name, Arc::clone(t), size, p, VEC_OFFSET));
            cases.push(write_case(name, Arc::clone(t), size, p));
        }
        cases.push(stream_read_case(size, p, 0)?);
        cases.push(stream_read_case(size, p, VEC_OFFSET)?);
        cases.push(stream_write_case(size, p)?);
        if let Some(redis) = &self.redis {
            cases.push(redis_get_case(redis, size, p)?);
            cases.push(redis_set_case(redis, size, p)?);
        }
        if let Some(rdma) = &self.rdma {
            let t = &rdma.transport;
            cases.push(read_case("rdma", Arc::clone(t), size, p, 0));
            cases.push(write_case("rdma", Arc::clone(t), size, p));
            if size == 4 * KIB {
                // The size the original's paper reports its READ latency for.
                cases.push(read_case("rdma", Arc::clone(t), RDMA_PAPER_SIZE, p, 0));
            }
            if size == PAGES * PAGE {
                cases.push(vectored_case("rdma", Arc::clone(t), p));
            }
        }
        if size == PAGES * PAGE {
            for (name, t) in &transports {
                cases.push(vectored_case(name, Arc::clone(t), p));
            }
        }
        Ok(cases)
    }
}

/// Size of the one-sided READ whose latency the original's paper reports.
const RDMA_PAPER_SIZE: usize = 2 * KIB;
/// That latency, in µs (BENCHMARKS.md); the target is within 1.5× of it.
const RDMA_PAPER_US: f64 = 3.2;

/// Where a `Vec<u8>` from `malloc` starts within its page (for large sizes).
const VEC_OFFSET: usize = 16;

/// The operation name of a read into a buffer `offset` bytes into a page.
fn placed(op: &'static str, offset: usize) -> &'static str {
    match (op, offset) {
        (_, 0) => op,
        ("copy", _) => "copy_dst16",
        _ => "read_dst16",
    }
}

fn memcpy_case(pattern: &Arc<PlacedBuf>, size: usize, offset: usize) -> Case {
    let src = Arc::clone(pattern);
    let mut dst = PlacedBuf::filled(size, offset, 0xa5);
    Case::new("memcpy", placed("copy", offset), size, move || {
        dst.copy_from_slice(&src[..size]);
        std::hint::black_box(&mut dst);
        Ok(())
    })
}

fn read_case(
    name: &'static str,
    t: Arc<dyn Transport>,
    size: usize,
    pattern: &Arc<PlacedBuf>,
    offset: usize,
) -> Case {
    let expected = Arc::clone(pattern);
    let mut dst = PlacedBuf::filled(size, offset, 0xa5);
    let mut verified = false;
    Case::new(name, placed("read", offset), size, move || {
        t.read(0, &mut dst)?;
        if !verified {
            ensure!(
                dst[..] == expected[..size],
                "{name} read returned wrong bytes"
            );
            verified = true;
        }
        Ok(())
    })
}

fn write_case(
    name: &'static str,
    t: Arc<dyn Transport>,
    size: usize,
    pattern: &Arc<PlacedBuf>,
) -> Case {
    // The same bytes the region already holds, so reads stay verifiable.
    let src = PlacedBuf::copy_of(&pattern[..size], 0);
    Case::new(name, "write", size, move || {
        t.write(0, &src)?;
        Ok(())
    })
}

fn vectored_case(name: &'static str, t: Arc<dyn Transport>, pattern: &Arc<PlacedBuf>) -> Case {
    let expected = Arc::clone(pattern);
    let mut dst = PlacedBuf::filled(PAGES * PAGE, 0, 0xa5);
    let mut verified = false;
    Case::new(name, "read_vectored", PAGES * PAGE, move || {
        {
            let mut ops: Vec<ReadOp<'_>> = dst
                .chunks_mut(PAGE)
                .enumerate()
                .map(|(i, d)| ReadOp {
                    addr: (i * PAGE_STRIDE) as u64,
                    dst: d,
                })
                .collect();
            t.read_vectored(&mut ops)?;
        }
        if !verified {
            for (i, page) in dst.chunks(PAGE).enumerate() {
                let at = i * PAGE_STRIDE;
                ensure!(
                    page == &expected[at..at + PAGE],
                    "{name} vectored read returned wrong bytes in page {i}"
                );
            }
            verified = true;
        }
        Ok(())
    })
}

fn stream_read_case(size: usize, pattern: &Arc<PlacedBuf>, offset: usize) -> Result<Case> {
    let mut pair = StreamPair::start(Arc::clone(pattern), 1)?;
    let expected = Arc::clone(pattern);
    let mut dst = PlacedBuf::filled(size, offset, 0xa5);
    let mut verified = false;
    Ok(Case::new(
        "tcp-stream",
        placed("read", offset),
        size,
        move || {
            pair.read(&mut dst)?;
            if !verified {
                ensure!(
                    dst[..] == expected[..size],
                    "plain TCP read returned wrong bytes"
                );
                verified = true;
            }
            Ok(())
        },
    ))
}

fn stream_write_case(size: usize, pattern: &Arc<PlacedBuf>) -> Result<Case> {
    let mut pair = StreamPair::start(Arc::new(PlacedBuf::filled(0, 0, 0)), size)?;
    let src = PlacedBuf::copy_of(&pattern[..size], 0);
    Ok(Case::new("tcp-stream", "write", size, move || {
        pair.write(&src)
    }))
}

fn redis_key(size: usize) -> Vec<u8> {
    format!("scad-bench:{size}").into_bytes()
}

fn redis_get_case(redis: &RedisServer, size: usize, pattern: &Arc<PlacedBuf>) -> Result<Case> {
    let mut client = RespClient::connect(redis.addr())?;
    let key = redis_key(size);
    client.set(&key, &pattern[..size])?;
    let expected = Arc::clone(pattern);
    let mut dst = PlacedBuf::filled(size, 0, 0xa5);
    let mut verified = false;
    Ok(Case::new("redis", "get", size, move || {
        client.get_into(&key, &mut dst)?;
        if !verified {
            ensure!(
                dst[..] == expected[..size],
                "redis GET returned wrong bytes"
            );
            verified = true;
        }
        Ok(())
    }))
}

fn redis_set_case(redis: &RedisServer, size: usize, pattern: &Arc<PlacedBuf>) -> Result<Case> {
    let mut client = RespClient::connect(redis.addr())?;
    let key = redis_key(size);
    let src = PlacedBuf::copy_of(&pattern[..size], 0);
    Ok(Case::new("redis", "set", size, move || {
        client.set(&key, &src)
    }))
}

/// Which row a row is compared with (same size), if any.
fn baseline_of(transport: &str, op: &str) -> Option<(&'static str, &'static str)> {
    match (transport, op) {
        ("local" | "shm", _) | ("memcpy", "copy_dst16") => Some(("memcpy", "copy")),
        ("tcp", "read_dst16") => Some(("tcp-stream", "read_dst16")),
        ("tcp" | "redis", "read" | "get" | "read_vectored") => Some(("tcp-stream", "read")),
        ("tcp" | "redis", "write" | "set") => Some(("tcp-stream", "write")),
        _ => None,
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mode = if args.quick { Mode::QUICK } else { Mode::FULL };
    let started = Instant::now();

    eprintln!(
        "transport-bench ({} mode): setting up regions, servers and redis ...",
        mode.name
    );
    let env = Env::setup()?;
    for note in [&env.redis_note, &env.rdma_note].into_iter().flatten() {
        eprintln!("note: {note}");
    }

    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40.cyan/blue}] {pos}/{len} {msg}")
            .context("bad progress bar template")?
            .progress_chars("=> "),
    );
    let mut rows: Vec<Row> = Vec::new();
    for &size in &SIZES {
        let mut cases = env.cases(size).with_context(|| {
            format!(
                "cannot set up the cases of {}",
                scad_core::fmt::bytes_exact(size as u64)
            )
        })?;
        bar.inc_length((cases.len() * (mode.rounds + 1)) as u64);
        for case in &mut cases {
            bar.set_message(format!(
                "warm-up {} {} {}",
                case.transport,
                case.op,
                scad_core::fmt::bytes_exact(size as u64)
            ));
            case.warm_up()
                .with_context(|| format!("{} {} of {} failed", case.transport, case.op, size))?;
            bar.inc(1);
        }
        let per_round = mode.budget / mode.rounds as u32;
        for round in 0..mode.rounds {
            for case in &mut cases {
                bar.set_message(format!(
                    "round {}/{} {} {} {}",
                    round + 1,
                    mode.rounds,
                    case.transport,
                    case.op,
                    scad_core::fmt::bytes_exact(size as u64)
                ));
                let max_samples =
                    (mode.max_ops(size) / mode.rounds / case.batch).max(mode.min_samples);
                case.round(per_round, mode.min_samples, max_samples)
                    .with_context(|| {
                        format!("{} {} of {} failed", case.transport, case.op, size)
                    })?;
                bar.inc(1);
            }
        }
        for case in &cases {
            let row = Row::new(
                case.transport,
                case.op,
                case.size,
                mode.name,
                &case.summary(),
            );
            bar.suspend(|| eprintln!("{}", row.one_line()));
            rows.push(row);
        }
    }
    bar.finish_and_clear();
    report::attach_baselines(&mut rows, baseline_of);
    let targets = targets(&rows, env.redis_note.as_deref(), env.rdma_note.as_deref());

    let stem = if args.quick {
        "transport-quick"
    } else {
        "transport"
    };
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let meta = report::Meta {
        mode: mode.name,
        command: format!(
            "cargo run --release -p scad-benches --bin transport-bench{}",
            if args.quick { " -- --quick" } else { "" }
        ),
        redis: env
            .redis
            .as_ref()
            .map(|r| r.version().to_owned())
            .or_else(|| env.redis_note.clone())
            .unwrap_or_default(),
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        rounds: mode.rounds,
        elapsed: started.elapsed(),
    };
    let jsonl = args.out.join(format!("{stem}.jsonl"));
    report::write_jsonl(&jsonl, &rows)?;
    let md = args.out.join(format!("{stem}.md"));
    let table = report::markdown(&meta, &rows, &targets);
    std::fs::write(&md, &table).with_context(|| format!("cannot write {}", md.display()))?;
    let png = args.out.join(format!("{stem}.png"));
    report::chart(&png, &rows).with_context(|| format!("cannot draw {}", png.display()))?;

    println!("{table}");
    println!(
        "wrote {}, {} and {} in {:.0} s",
        jsonl.display(),
        md.display(),
        png.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The targets of BENCHMARKS.md, evaluated on this run's rows.
fn targets(rows: &[Row], redis_note: Option<&str>, rdma_note: Option<&str>) -> Vec<Target> {
    let find = |t: &str, op: &str, size: usize| {
        rows.iter()
            .find(|r| r.transport == t && r.op == op && r.size == size)
    };
    let mut out = Vec::new();

    // Latency: lower is better, so the ratio must stay under the bound.
    let tcp = find("tcp", "read", 4 * KIB);
    let redis = find("redis", "get", 4 * KIB);
    out.push(match (tcp, redis) {
        (Some(t), Some(r)) => Target::at_most(
            "tcp read 4 KiB, median latency",
            format!("{:.1} µs", t.median_us),
            "Redis GET 4 KiB",
            format!("{:.1} µs", r.median_us),
            t.median_us / r.median_us,
            0.5,
        ),
        _ => Target::skipped(
            "tcp read 4 KiB, median latency",
            "Redis GET 4 KiB",
            redis_note.unwrap_or("rows missing"),
            "≤ 0.5×",
        ),
    });

    let throughput =
        |what: &str, row: Option<&Row>, base_what: &str, base: Option<&Row>, bound: f64| match (
            row, base,
        ) {
            (Some(r), Some(b)) => Target::at_least(
                what,
                format!("{:.2} GB/s", r.gbps),
                base_what,
                format!("{:.2} GB/s", b.gbps),
                r.gbps / b.gbps,
                bound,
            ),
            _ => Target::skipped(what, base_what, "rows missing", &format!("≥ {bound}×")),
        };
    for (op, how) in [("read", ""), ("read_dst16", ", dst at page offset 16")] {
        for size in [MIB, 64 * MIB] {
            out.push(throughput(
                &format!(
                    "tcp read {}{how}, throughput",
                    scad_core::fmt::bytes_exact(size as u64)
                ),
                find("tcp", op, size),
                &format!(
                    "plain TCP stream {}{how}",
                    scad_core::fmt::bytes_exact(size as u64)
                ),
                find("tcp-stream", op, size),
                0.8,
            ));
        }
    }
    out.push(match find("tcp", "read_vectored", PAGES * PAGE) {
        Some(r) => Target::absolute("tcp vectored read 256 × 4 KiB, throughput", r.gbps, 1.0),
        None => Target::skipped(
            "tcp vectored read 256 × 4 KiB",
            "—",
            "row missing",
            "≥ 1 GB/s",
        ),
    });
    for (op, how) in [("read", ""), ("read_dst16", ", dst at page offset 16")] {
        for (name, bound) in [("local", 0.9), ("shm", 0.8)] {
            out.push(throughput(
                &format!("{name} read 64 MiB{how}, throughput"),
                find(name, op, 64 * MIB),
                "memcpy 64 MiB",
                find("memcpy", "copy", 64 * MIB),
                bound,
            ));
        }
    }
    let rdma_what = "rdma READ 2 KiB, median latency";
    let rdma_base = "the original's one-sided READ 2 KiB (paper)";
    out.push(match find("rdma", "read", RDMA_PAPER_SIZE) {
        Some(r) => Target::at_most(
            rdma_what,
            format!("{:.1} µs", r.median_us),
            rdma_base,
            format!("{RDMA_PAPER_US:.1} µs"),
            r.median_us / RDMA_PAPER_US,
            1.5,
        ),
        None => Target::skipped(
            rdma_what,
            rdma_base,
            rdma_note.unwrap_or("row missing"),
            "≤ 1.5×",
        ),
    });
    out
}
