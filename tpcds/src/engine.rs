//! TPC-DS on the query engine: the official query text (as DuckDB's `tpcds_queries()`
//! gives it, saved beside each reference answer) run by
//! [`scad_remote_frame::QuerySession`] over tables loaded into memory elements.

use std::collections::BTreeMap;

use scad_remote_frame::{FrameEnv, QuerySession, RemoteFrame};

use crate::data::DataSet;
use crate::error::TpcdsError;

/// The 99 official query names, `q1` to `q99`.
pub fn official_queries() -> Vec<String> {
    (1..=99).map(|n| format!("q{n}")).collect()
}

/// The SQL text of `query` (`q1`..`q99`, or a test variant such as `q16_wide`).
///
/// # Errors
/// [`TpcdsError::DataMissing`] when the data set has no such reference.
pub fn query_sql(set: &DataSet, query: &str) -> Result<String, TpcdsError> {
    let path = set.root.join("reference").join(format!("{query}.sql"));
    std::fs::read_to_string(&path).map_err(|_| TpcdsError::DataMissing {
        path,
        hint: "rerun tpcds/gen_data.py to write the reference answers".into(),
    })
}

/// Loads every table of the data set into memory elements as RemoteFrames.
///
/// # Errors
/// Errors reading the Parquet files or writing the frames.
pub fn load_frames(
    env: &FrameEnv,
    set: &DataSet,
) -> Result<BTreeMap<String, RemoteFrame>, TpcdsError> {
    let mut out = BTreeMap::new();
    for table in set.manifest.tables.keys() {
        let df = set.read_table(table, None)?;
        let frame = RemoteFrame::from_polars(env, &df).map_err(|e| TpcdsError::Frame {
            what: format!("loading table {table}"),
            source: Box::new(e),
        })?;
        out.insert(table.clone(), frame);
    }
    Ok(out)
}

/// A session over `env` with every frame registered under its table name.
///
/// # Errors
/// Errors of [`QuerySession::new`] and [`QuerySession::register`].
pub fn session(
    env: &FrameEnv,
    frames: &BTreeMap<String, RemoteFrame>,
) -> Result<QuerySession, TpcdsError> {
    let wrap = |e| TpcdsError::Frame {
        what: "starting a query session".into(),
        source: Box::new(e),
    };
    let s = QuerySession::new(env).map_err(wrap)?;
    for (name, frame) in frames {
        s.register(name, frame).map_err(wrap)?;
    }
    Ok(s)
}
