//! Helpers of the main job and the benchmark: DuckDB's timings (from
//! `benches/tpcds/gen_data.py --bench`, run now on the same data). The private
//! `redis-server` of the Redis-backed runs is [`scad_core::redis_server::RedisServer`].

use std::path::PathBuf;
use std::process::Command;

use serde::Deserialize;

use crate::data::{generator_script, repo_root, DataSet};

use super::error::RemoteError;

/// DuckDB's time for one query, measured by `gen_data.py --bench`.
#[derive(Debug, Clone, Deserialize)]
pub struct DuckDbTiming {
    /// Query name (`q1`, ...).
    pub query: String,
    /// Seconds to load the tables from Parquet into DuckDB (in memory), or to create
    /// views over the Parquet files (with a memory limit).
    pub load_s: f64,
    /// Median query time in seconds (`None` if DuckDB failed).
    #[serde(default)]
    pub query_s_median: Option<f64>,
    /// Fastest run.
    #[serde(default)]
    pub query_s_min: Option<f64>,
    /// Slowest run.
    #[serde(default)]
    pub query_s_max: Option<f64>,
    /// DuckDB's threads.
    pub threads: u64,
    /// Why DuckDB could not finish the query (e.g. out of memory under a limit).
    #[serde(default)]
    pub error: Option<String>,
}

/// Runs `benches/tpcds/gen_data.py --bench` for the data set `set` on `queries` with `repeats` timed runs
/// each (after a warm-up run): DuckDB in memory, or under `memory_limit` (e.g.
/// `25MB`) reading the Parquet files; load time apart from query time.
///
/// # Errors
/// [`RemoteError::Invalid`] if the venv is missing or the script fails.
pub fn duckdb_timings(
    set: &DataSet,
    queries: &[String],
    repeats: usize,
    memory_limit: Option<&str>,
) -> Result<Vec<DuckDbTiming>, RemoteError> {
    let root = repo_root();
    let python = root.join(".venv").join("bin").join("python");
    if !python.exists() {
        return Err(RemoteError::Invalid(format!(
            "{} not found: run `bash scripts/setup.sh` first",
            python.display()
        )));
    }
    let json: PathBuf =
        std::env::temp_dir().join(format!("tpcds-duckdb-{}.json", std::process::id()));
    let mut cmd = Command::new(&python);
    cmd.arg(generator_script())
        .args([
            "--sf",
            &set.manifest.sf.to_string(),
            "--no-text",
            "--quiet",
            "--bench",
        ])
        .args([
            "--spread-warehouses",
            &set.manifest.spread_warehouses.to_string(),
        ])
        .args(["--repeats", &repeats.max(1).to_string()])
        .args(["--queries", &queries.join(",")])
        .arg("--out")
        .arg(root.join("data").join("tpcds"))
        .arg("--bench-json")
        .arg(&json);
    if let Some(limit) = memory_limit {
        cmd.args(["--memory-limit", limit]);
    }
    let out = cmd
        .output()
        .map_err(|e| RemoteError::Invalid(format!("running gen_data.py --bench: {e}")))?;
    if !out.status.success() {
        return Err(RemoteError::Invalid(format!(
            "gen_data.py --bench failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    let text = std::fs::read_to_string(&json)
        .map_err(|e| RemoteError::Invalid(format!("reading {}: {e}", json.display())))?;
    let _ = std::fs::remove_file(&json);
    serde_json::from_str(&text).map_err(|source| RemoteError::BadJson {
        context: "gen_data.py --bench-json".into(),
        source,
    })
}
