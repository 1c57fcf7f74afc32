//! All 99 TPC-DS queries from their official SQL text through the query engine over
//! memory elements, on SF 0.01 data generated during the test run (cached under
//! data/tpcds), compared with DuckDB's answers by value, at two budgets that make
//! some spill. (Without a budget they run through the main job, tests/main_job.rs.)
//!
//! The guard against plans and spilling that blow up: each query's bytes moved and
//! spill files must stay within twice the figures committed in `tests/bounds.tsv`
//! (with a small floor; a larger one for spill files at the tightest budget, see
//! [`TIGHTEST_SPILL_FILES_FLOOR`]). These figures do not depend on the machine, so a change
//! that makes a query spill or read far more fails here, not only in a benchmark.
//! Every query must also end within its budget, with its spill files freed and
//! without waiting for them in vain (`QuerySession::release_timeouts`).
//! `SCAD_SET_BOUNDS=1` writes the file from this run's figures; re-set it only
//! with the reason in the commit message.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use scad_remote_frame::Budget;
use scad_tpcds::data::{generate, DataSet, GenerateOptions};
use scad_tpcds::engine::{official_queries, run_query, session};
use scad_tpcds::remote::{load_tables, Cluster, TransportKind};

fn data_set() -> &'static DataSet {
    static SET: OnceLock<DataSet> = OnceLock::new();
    SET.get_or_init(|| {
        let mut options = GenerateOptions::new(0.01);
        options.spread_warehouses = 5;
        generate(&options).unwrap_or_else(|e| panic!("cannot generate the SF 0.01 test data: {e}"))
    })
}

/// Two embedded tcp memory servers, small chunks.
fn cluster() -> Cluster {
    let mut c = Cluster::embedded(TransportKind::Tcp, 2, 256 << 20).unwrap();
    c.set_chunk_rows(4096);
    c
}

/// What one query moved at one budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Moved {
    bytes: u64,
    spill_files: u64,
}

/// A figure may grow to twice what was committed, and always to this floor.
const BYTES_FLOOR: u64 = 1 << 20;
const SPILL_FILES_FLOOR: u64 = 8;

/// The spill-file floor at the tightest budget ([`TIGHTEST_PERCENT`]). There, which
/// of the operators running at once gets the budget first depends on how their
/// threads interleave: q75's union branches hold two join builds of ~160 KB each
/// while the aggregate above them reads, or do not yet, and in the first case the
/// aggregate or a join spills a partition file each for a few KB: 3 files in most
/// runs, 7 to 93 in about one in five (under a CPU load, both before and after the
/// planner change of 2026-11-28; bytes moved within 15 %). A blow-up such as q24's
/// 139,014 files is still far beyond it, and the bytes bound is unchanged.
const TIGHTEST_SPILL_FILES_FLOOR: u64 = 128;

/// The tightest budget the guard runs at, in percent of the largest table.
const TIGHTEST_PERCENT: u32 = 2;

/// The most spill files a query may write at `pct` % given its committed `figure`.
fn spill_files_bound(pct: u32, figure: u64) -> u64 {
    let floor = if pct <= TIGHTEST_PERCENT {
        TIGHTEST_SPILL_FILES_FLOOR
    } else {
        SPILL_FILES_FLOOR
    };
    bound(figure, floor)
}

fn bound(figure: u64, floor: u64) -> u64 {
    (2 * figure).max(floor)
}

/// The committed figures: (budget in percent of the largest table, query) → moved.
fn bounds_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/bounds.tsv")
}

fn read_bounds() -> BTreeMap<(u32, String), Moved> {
    let path = bounds_path();
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (SCAD_SET_BOUNDS=1 writes it)", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 4, "{}: bad line {l:?}", path.display());
            let moved = Moved {
                bytes: f[2].parse().unwrap(),
                spill_files: f[3].parse().unwrap(),
            };
            ((f[0].parse().unwrap(), f[1].to_owned()), moved)
        })
        .collect()
}

fn write_bounds(figures: &BTreeMap<(u32, String), Moved>) {
    let mut text = String::from(
        "# Bytes moved and spill files per TPC-DS query at SF 0.01 (tests/engine.rs):\n\
         # percent of the largest table as budget, query, bytes moved, spill files.\n\
         # A run may reach twice these (with a floor); re-set only with a reason.\n",
    );
    for ((pct, q), m) in figures {
        text.push_str(&format!("{pct}\t{q}\t{}\t{}\n", m.bytes, m.spill_files));
    }
    std::fs::write(bounds_path(), text).unwrap();
}

/// Runs every official query at a budget of `pct` % of the largest table's bytes,
/// compares each answer with DuckDB's, checks the reserved peak against the budget
/// and that no spill memory is left behind; returns what each query moved.
fn run_all(pct: u32) -> BTreeMap<(u32, String), Moved> {
    let set = data_set();
    let cluster = cluster();
    let tables = load_tables(&cluster, set, None).unwrap();
    let largest = tables.largest_bytes();
    let budget = largest * u64::from(pct) / 100;
    let env = cluster.env().with_budget(Budget::bytes(budget).unwrap());
    let session = session(&env, &tables.open(&cluster).unwrap()).unwrap();
    let mut failures = Vec::new();
    let mut moved = BTreeMap::new();
    for q in official_queries() {
        let run = run_query(&session, set, &q).unwrap();
        match (run.stats, &run.error) {
            (Some(stats), None) => {
                assert!(
                    stats.peak_local_bytes <= budget,
                    "{q}: peak {} over the budget {budget}",
                    stats.peak_local_bytes
                );
                let m = Moved {
                    bytes: run.bytes_moved(),
                    spill_files: stats.spill_files,
                };
                moved.insert((pct, q.clone()), m);
            }
            (_, Some(e)) => {
                eprintln!("{q}: {e}");
                failures.push(q.clone());
            }
            (None, None) => unreachable!("a run without stats failed"),
        }
        assert_eq!(session.spill_bytes_held(), 0, "{q} left spill files behind");
        assert_eq!(
            session.release_timeouts(),
            0,
            "{q} still held memory after waiting for its release"
        );
    }
    assert!(
        failures.is_empty(),
        "{pct} %: {} queries differ: {failures:?}",
        failures.len()
    );
    moved
}

/// Every query's figures within the bounds; the queries over them.
fn over_bounds(
    measured: &BTreeMap<(u32, String), Moved>,
    bounds: &BTreeMap<(u32, String), Moved>,
) -> Vec<String> {
    let mut over = Vec::new();
    for (key, m) in measured {
        let Some(b) = bounds.get(key) else {
            over.push(format!("{}% {}: no committed figures", key.0, key.1));
            continue;
        };
        let max_bytes = bound(b.bytes, BYTES_FLOOR);
        let max_files = spill_files_bound(key.0, b.spill_files);
        if m.bytes > max_bytes || m.spill_files > max_files {
            over.push(format!(
                "{}% {}: moved {} bytes in {} spill files; committed {} in {} (bounds {max_bytes}, {max_files})",
                key.0, key.1, m.bytes, m.spill_files, b.bytes, b.spill_files
            ));
        }
    }
    over
}

#[test]
fn all_99_queries_equal_duckdb_and_move_no_more_than_committed_at_three_budgets() {
    // 10 % of the largest table (2.4 MB at SF 0.01): hash joins, aggregates (q67's
    // ROLLUP) and sorts of several queries outgrow it and spill to the memory
    // elements; 25 %: fewer; 2 % (473 KB), where operators DataFusion runs as they
    // are must not fail: its ordered final aggregate did (q78 here, as q4 and q11
    // at SF 1 and 16 MiB) while partials sorted only on constants ran ordered over
    // one partition and finals so sorted were not made unordered (checked: with
    // both undone, this test fails on q78).
    let mut measured = run_all(10);
    measured.extend(run_all(25));
    measured.extend(run_all(TIGHTEST_PERCENT));
    // The guard must see spilling: 4 queries at 10 % (q4, q11, q23, q75; q59's
    // join spilled 2 files too until a join split its build side 16 ways rather
    // than 64 when it is estimated small: now it fits) and 16 at 2 %.
    let spilled = |pct: u32| {
        measured
            .iter()
            .filter(|(key, m)| key.0 == pct && m.spill_files > 0)
            .count()
    };
    eprintln!(
        "queries spilled: {} at 10 %, {} at {TIGHTEST_PERCENT} %",
        spilled(10),
        spilled(TIGHTEST_PERCENT)
    );
    assert!(spilled(10) >= 4, "too few queries spilled at 10 %");
    assert!(
        spilled(TIGHTEST_PERCENT) >= 12,
        "too few queries spilled at {TIGHTEST_PERCENT} %"
    );
    if std::env::var_os("SCAD_SET_BOUNDS").is_some() {
        write_bounds(&measured);
        return;
    }
    let over = over_bounds(&measured, &read_bounds());
    assert!(
        over.is_empty(),
        "{} queries moved more than the committed bounds (tests/bounds.tsv):\n{}",
        over.len(),
        over.join("\n")
    );
}

#[test]
fn a_query_moving_far_more_than_committed_is_caught() {
    let key = (10, "q24".to_owned());
    let committed = Moved {
        bytes: 10 << 20,
        spill_files: 20,
    };
    let bounds = BTreeMap::from([(key.clone(), committed)]);
    let within = Moved {
        bytes: 20 << 20,
        spill_files: 40,
    };
    assert!(over_bounds(&BTreeMap::from([(key.clone(), within)]), &bounds).is_empty());
    // q24's regression at SF 1 wrote 139,014 spill files where it had written none.
    let blown = Moved {
        bytes: 20 << 20,
        spill_files: 139_014,
    };
    let over = over_bounds(&BTreeMap::from([(key.clone(), blown)]), &bounds);
    assert_eq!(over.len(), 1);
    assert!(over[0].contains("q24"), "{over:?}");
    // A query that never spilled may start to, a little.
    let none = BTreeMap::from([(
        key.clone(),
        Moved {
            bytes: 0,
            spill_files: 0,
        },
    )]);
    let small = Moved {
        bytes: BYTES_FLOOR,
        spill_files: SPILL_FILES_FLOOR,
    };
    assert!(over_bounds(&BTreeMap::from([(key.clone(), small)]), &none).is_empty());
    let more = Moved {
        bytes: BYTES_FLOOR,
        spill_files: SPILL_FILES_FLOOR + 1,
    };
    assert_eq!(over_bounds(&BTreeMap::from([(key, more)]), &none).len(), 1);
    // At the tightest budget a query may write the files the interleaving of its
    // branches decides (q75: 3 committed, 93 seen), but not a blow-up.
    let tightest = (TIGHTEST_PERCENT, "q75".to_owned());
    let q75 = BTreeMap::from([(
        tightest.clone(),
        Moved {
            bytes: 2_257_848,
            spill_files: 3,
        },
    )]);
    let interleaved = Moved {
        bytes: 2_600_000,
        spill_files: 93,
    };
    assert!(over_bounds(&BTreeMap::from([(tightest.clone(), interleaved)]), &q75).is_empty());
    let over = over_bounds(&BTreeMap::from([(tightest.clone(), blown)]), &q75);
    assert_eq!(over.len(), 1, "{over:?}");
    let more_bytes = Moved {
        bytes: 5_000_000,
        spill_files: 3,
    };
    assert_eq!(
        over_bounds(&BTreeMap::from([(tightest, more_bytes)]), &q75).len(),
        1
    );
}
