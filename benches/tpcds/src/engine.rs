//! TPC-DS on the query engine: the official query text (as DuckDB's `tpcds_queries()`
//! gives it, saved beside each reference answer) run by
//! [`scad_remote_frame::QuerySession`] over tables in memory elements, each answer
//! compared with DuckDB's by value.

use std::collections::BTreeMap;
use std::time::Instant;

use datafusion::arrow::compute::concat_batches;
use scad_remote_frame::{FrameEnv, QuerySession, QueryStats, RemoteFrame};

use crate::compare::compare_values;
use crate::data::DataSet;
use crate::error::TpcdsError;

/// The 99 official query names, `q1` to `q99`.
pub fn official_queries() -> Vec<String> {
    (1..=99).map(|n| format!("q{n}")).collect()
}

/// Query names from a command line: `1`, `q16`, `Q94` (each 1..=99), in the order
/// given, duplicates dropped.
///
/// # Errors
/// [`TpcdsError::UnknownQuery`] naming the first that is not a TPC-DS query.
pub fn parse_queries<S: AsRef<str>>(items: &[S]) -> Result<Vec<String>, TpcdsError> {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        let text = item.as_ref().trim();
        let digits = text
            .strip_prefix('q')
            .or_else(|| text.strip_prefix('Q'))
            .unwrap_or(text);
        let n: u32 = digits
            .parse()
            .ok()
            .filter(|n| (1..=99).contains(n))
            .ok_or_else(|| TpcdsError::UnknownQuery(text.to_string()))?;
        let name = format!("q{n}");
        if !out.contains(&name) {
            out.push(name);
        }
    }
    Ok(out)
}

/// The number of a query name (`q16` → 16).
///
/// # Errors
/// [`TpcdsError::UnknownQuery`].
pub fn query_number(name: &str) -> Result<u32, TpcdsError> {
    parse_queries(&[name])?
        .first()
        .and_then(|q| q[1..].parse().ok())
        .ok_or_else(|| TpcdsError::UnknownQuery(name.to_string()))
}

/// The SQL text of `query` (`q1`..`q99`).
///
/// # Errors
/// [`TpcdsError::DataMissing`] when the data set has no such reference.
pub fn query_sql(set: &DataSet, query: &str) -> Result<String, TpcdsError> {
    let path = set.root.join("reference").join(format!("{query}.sql"));
    std::fs::read_to_string(&path).map_err(|_| TpcdsError::DataMissing {
        path,
        hint: "rerun benches/tpcds/gen_data.py to write the reference answers".into(),
    })
}

/// A session over `env` with every frame registered under its table name.
///
/// # Errors
/// Errors of [`QuerySession::new`] and [`QuerySession::register`].
pub fn session(
    env: &FrameEnv,
    frames: &BTreeMap<String, RemoteFrame>,
) -> Result<QuerySession, TpcdsError> {
    session_with_partitions(env, frames, None)
}

/// As [`session`], with `partitions` partitions per query (`None`: the session's
/// choice for its budget and cores).
///
/// # Errors
/// As [`session`].
pub fn session_with_partitions(
    env: &FrameEnv,
    frames: &BTreeMap<String, RemoteFrame>,
    partitions: Option<usize>,
) -> Result<QuerySession, TpcdsError> {
    let wrap = |e| TpcdsError::Frame {
        what: "starting a query session".into(),
        source: Box::new(e),
    };
    let s = match partitions {
        Some(p) => QuerySession::with_partitions(env, p),
        None => QuerySession::new(env),
    }
    .map_err(wrap)?;
    for (name, frame) in frames {
        s.register(name, frame).map_err(wrap)?;
    }
    Ok(s)
}

/// One query's run: its answer checked against DuckDB's, or why it failed.
#[derive(Debug, Clone)]
pub struct QueryRun {
    /// Query name (`q1`).
    pub query: String,
    /// Wall time, planning and execution (and, for the stage-per-process mode,
    /// starting the processes), not the comparison.
    pub secs: f64,
    /// The engine's statistics (`None` when the query failed); for a run stage by
    /// stage, summed over the stages (the peak: the highest stage's).
    pub stats: Option<QueryStats>,
    /// Bytes of stage outputs handed from one stage process to the next through
    /// memory elements (0 in one process).
    pub handoff_bytes: u64,
    /// `None` if the answer equals DuckDB's; else the failure or the difference.
    pub error: Option<String>,
}

impl QueryRun {
    /// Whether the answer equals DuckDB's.
    pub fn equal(&self) -> bool {
        self.error.is_none()
    }

    /// Every byte moved between compute and memory elements: scans, spills and
    /// handoffs.
    pub fn bytes_moved(&self) -> u64 {
        self.stats.map_or(0, |s| s.bytes_moved()) + self.handoff_bytes
    }
}

/// Runs `query` in `session` and compares its answer with the data set's reference.
///
/// # Errors
/// Only a missing query text or reference; the query's own failures and differences
/// are reported in [`QueryRun::error`].
pub fn run_query(
    session: &QuerySession,
    set: &DataSet,
    query: &str,
) -> Result<QueryRun, TpcdsError> {
    let sql = query_sql(set, query)?;
    let reference = set.reference(query)?;
    let start = Instant::now();
    let outcome = session.sql(&sql);
    let secs = start.elapsed().as_secs_f64();
    let (stats, error) = match outcome {
        Ok(out) => {
            let checked = concat_batches(out.schema(), out.batches())
                .map_err(|e| e.to_string())
                .and_then(|answer| {
                    compare_values(&answer, &reference, out.ordered()).map_err(|e| e.to_string())
                });
            (Some(*out.stats()), checked.err())
        }
        Err(e) => (None, Some(e.to_string())),
    };
    Ok(QueryRun {
        query: query.to_string(),
        secs,
        stats,
        handoff_bytes: 0,
        error,
    })
}

/// Runs `query` `runs` times (at least once) through [`run_query`], stopping after a
/// run that fails or differs from DuckDB's answer: the runs made, in order (a
/// failing one last).
///
/// # Errors
/// As [`run_query`].
pub fn run_query_times(
    session: &QuerySession,
    set: &DataSet,
    query: &str,
    runs: usize,
) -> Result<Vec<QueryRun>, TpcdsError> {
    let mut done = Vec::with_capacity(runs.max(1));
    while done.len() < runs.max(1) {
        let run = run_query(session, set, query)?;
        let failed = run.error.is_some();
        done.push(run);
        if failed {
            break;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_lists_parse_numbers_and_names() {
        assert_eq!(
            parse_queries(&["1", "q16", "Q94", " 95 ", "q1"]).unwrap(),
            ["q1", "q16", "q94", "q95"]
        );
        assert_eq!(query_number("q72").unwrap(), 72);
        for bad in ["0", "100", "q", "x1", "q1a", ""] {
            let err = parse_queries(&[bad]).unwrap_err();
            assert!(err.to_string().contains("1 to 99"), "{bad}: {err}");
        }
        assert_eq!(official_queries().len(), 99);
    }
}
