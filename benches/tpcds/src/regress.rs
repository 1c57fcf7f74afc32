//! A run of the main job compared with a committed baseline, query by query: the
//! guard that an engine change is measured before it lands.
//!
//! Both sides are the JSON lines `tpcds-main --json` writes. A query regressed when
//! it failed or differs where the baseline was equal, or when it took more than
//! [`SLOWER_RATIO`] times the baseline's time *and* more than [`SLOWER_SECS`] seconds
//! longer (small queries vary by 2x between runs of the same binary).
//!
//! Times are compared on the baseline's machine: when both runs timed DuckDB, this
//! run's times are scaled by how much faster DuckDB ran in the baseline (over the
//! queries both timed; see [`machine_factor`]). The same binary took 7.7 s on the
//! machine the baseline was made on and 14.7 s on another, with DuckDB 4.5 s and
//! 8.5 s: unscaled, eight unchanged queries were flagged.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

use crate::error::TpcdsError;
use crate::report::fmt_secs;

/// A query is slower when its time exceeds the baseline's by this factor...
pub const SLOWER_RATIO: f64 = 1.5;

/// ...and by this many seconds.
pub const SLOWER_SECS: f64 = 0.2;

/// One query of a main-job run, as `tpcds-main --json` writes it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct QueryResult {
    /// Query name (`q1` .. `q99`).
    pub name: String,
    /// Whether the answer equalled DuckDB's.
    pub equal: bool,
    /// Time of the query through the engine.
    pub secs: f64,
    /// DuckDB's time in memory in the same run, if timed.
    #[serde(default)]
    pub duckdb_secs: Option<f64>,
    /// Spill files written.
    #[serde(default)]
    pub spill_files: u64,
    /// Bytes moved between the compute element and memory elements.
    #[serde(default)]
    pub bytes_moved: u64,
}

/// Reads the JSON lines of a main-job run.
///
/// # Errors
/// [`TpcdsError::Io`] when the file cannot be read; [`TpcdsError::Invalid`] naming
/// the line that is not a query result.
pub fn read_results(path: &Path) -> Result<Vec<QueryResult>, TpcdsError> {
    let text = std::fs::read_to_string(path).map_err(|source| TpcdsError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse_results(&text).map_err(|e| TpcdsError::Invalid(format!("{}: {e}", path.display())))
}

/// Parses the JSON lines of a main-job run (blank lines skipped).
///
/// # Errors
/// A message naming the first line that is not a query result.
pub fn parse_results(text: &str) -> Result<Vec<QueryResult>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| format!("line {}: not a query result: {e}", i + 1))
        })
        .collect()
}

/// One query of a run beside its baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryChange {
    /// Query name.
    pub name: String,
    /// The baseline's result (`None`: not in the baseline).
    pub base: Option<QueryResult>,
    /// This run's result, its time scaled to the baseline's machine.
    pub new: QueryResult,
    /// Whether this is a regression (see the module docs).
    pub regressed: bool,
}

/// How much faster the baseline's machine ran DuckDB than this run's: DuckDB's total
/// time in `base` over its total in `new`, over the queries both timed (1 when either
/// timed none). This run's times multiplied by it are times on the baseline's machine.
pub fn machine_factor(base: &[QueryResult], new: &[QueryResult]) -> f64 {
    let by_name: BTreeMap<&str, &QueryResult> = base.iter().map(|r| (r.name.as_str(), r)).collect();
    let (base_duck, new_duck) = new
        .iter()
        .filter_map(|n| Some((by_name.get(n.name.as_str())?.duckdb_secs?, n.duckdb_secs?)))
        .fold((0.0, 0.0), |(b, n), (bd, nd)| (b + bd, n + nd));
    if base_duck > 0.0 && new_duck > 0.0 {
        base_duck / new_duck
    } else {
        1.0
    }
}

/// Every query of `new` beside its baseline, in `new`'s order, with `new`'s times
/// scaled to the baseline's machine (see [`machine_factor`]).
pub fn compare_runs(base: &[QueryResult], new: &[QueryResult]) -> Vec<QueryChange> {
    let factor = machine_factor(base, new);
    let by_name: BTreeMap<&str, &QueryResult> = base.iter().map(|r| (r.name.as_str(), r)).collect();
    new.iter()
        .map(|n| {
            let b = by_name.get(n.name.as_str()).copied();
            let mut scaled = n.clone();
            scaled.secs *= factor;
            let regressed = match b {
                Some(b) => {
                    (b.equal && !n.equal)
                        || (scaled.secs > SLOWER_RATIO * b.secs
                            && scaled.secs > b.secs + SLOWER_SECS)
                }
                None => !n.equal,
            };
            QueryChange {
                name: n.name.clone(),
                base: b.cloned(),
                new: scaled,
                regressed,
            }
        })
        .collect()
}

/// A Markdown table of `changes`: totals over the queries both runs have, every
/// regression, and the `slowest` slowest queries of the new run.
pub fn comparison_table(changes: &[QueryChange], slowest: usize) -> String {
    let both: Vec<&QueryChange> = changes.iter().filter(|c| c.base.is_some()).collect();
    let base_total: f64 = both
        .iter()
        .filter_map(|c| c.base.as_ref())
        .map(|b| b.secs)
        .sum();
    let new_total: f64 = both.iter().map(|c| c.new.secs).sum();
    let spill = |rs: &mut dyn Iterator<Item = &QueryResult>| rs.map(|r| r.spill_files).sum::<u64>();
    let base_spill = spill(&mut both.iter().filter_map(|c| c.base.as_ref()));
    let new_spill = spill(&mut both.iter().map(|c| &c.new));
    let mut shown: Vec<&QueryChange> = changes.iter().filter(|c| c.regressed).collect();
    let mut by_time: Vec<&QueryChange> = changes.iter().collect();
    by_time.sort_by(|a, b| b.new.secs.total_cmp(&a.new.secs));
    for c in by_time.into_iter().take(slowest) {
        if !shown.iter().any(|s| s.name == c.name) {
            shown.push(c);
        }
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| query | baseline | this run (on the baseline's machine) | ratio | spill files (baseline → now) | |\n|---|---:|---:|---:|---:|---|"
    );
    let _ = writeln!(
        out,
        "| all {} | {} | {} | {:.2}x | {} → {} | |",
        both.len(),
        fmt_secs(base_total),
        fmt_secs(new_total),
        new_total / base_total.max(f64::MIN_POSITIVE),
        base_spill,
        new_spill
    );
    for c in shown {
        let (base_secs, ratio, base_spill) = match &c.base {
            Some(b) => (
                fmt_secs(b.secs),
                format!("{:.2}x", c.new.secs / b.secs.max(f64::MIN_POSITIVE)),
                b.spill_files.to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let mark = match (c.regressed, c.new.equal) {
            (true, false) => "REGRESSED (not equal)",
            (true, true) => "REGRESSED",
            (false, false) => "not equal",
            (false, true) => "",
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} → {} | {} |",
            c.name,
            base_secs,
            fmt_secs(c.new.secs),
            ratio,
            base_spill,
            c.new.spill_files,
            mark
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(name: &str, secs: f64, equal: bool) -> QueryResult {
        QueryResult {
            name: name.into(),
            equal,
            secs,
            duckdb_secs: None,
            spill_files: 0,
            bytes_moved: 0,
        }
    }

    #[test]
    fn a_query_regresses_when_much_slower_by_a_noticeable_time_or_no_longer_equal() {
        let base = [
            result("q1", 1.0, true),
            result("q2", 0.05, true),
            result("q3", 1.0, true),
            result("q4", 1.0, true),
            result("q5", 1.0, false),
        ];
        let new = [
            result("q1", 1.6, true),  // 1.6x and +0.6 s
            result("q2", 0.2, true),  // 4x but +0.15 s: noise
            result("q3", 1.45, true), // +0.45 s but 1.45x
            result("q4", 0.5, false), // faster, but wrong now
            result("q5", 1.0, false), // was wrong already
            result("q6", 9.0, true),  // not in the baseline
        ];
        let changes = compare_runs(&base, &new);
        let regressed: Vec<&str> = changes
            .iter()
            .filter(|c| c.regressed)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(regressed, ["q1", "q4"]);
        let table = comparison_table(&changes, 1);
        assert!(
            table.contains("| all 5 | 4.05 s | 4.75 s | 1.17x"),
            "{table}"
        );
        assert!(
            table.contains("| q1 | 1.00 s | 1.60 s | 1.60x | 0 → 0 | REGRESSED |"),
            "{table}"
        );
        // The slowest query of the run is listed too.
        assert!(table.contains("| q6 | - | 9.00 s |"), "{table}");
        assert!(!table.contains("| q3 |"), "{table}");
    }

    #[test]
    fn times_are_scaled_by_how_fast_duckdb_ran_on_each_machine() {
        let timed = |name: &str, secs: f64, duck: f64| QueryResult {
            duckdb_secs: Some(duck),
            ..result(name, secs, true)
        };
        let base = [timed("q1", 1.0, 0.5), timed("q2", 0.5, 0.5)];
        // A machine twice as slow: DuckDB 2.0 s instead of 1.0 s.
        let slower = [timed("q1", 2.0, 1.0), timed("q2", 2.2, 1.0)];
        assert_eq!(machine_factor(&base, &slower), 0.5);
        let changes = compare_runs(&base, &slower);
        // q1 took as long as before there; q2 2.2x (1.1 s on the baseline's machine).
        let regressed: Vec<&str> = changes
            .iter()
            .filter(|c| c.regressed)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(regressed, ["q2"]);
        assert_eq!(changes[0].new.secs, 1.0);
        // Without DuckDB's times, times are compared as they are.
        assert_eq!(machine_factor(&base, &[result("q1", 2.0, true)]), 1.0);
    }

    #[test]
    fn results_parse_from_the_main_jobs_json_lines_and_bad_lines_are_named() {
        let text = r#"{"query":1,"name":"q1","equal":true,"secs":0.5,"duckdb_secs":0.1,"spill_files":3,"bytes_moved":10}

{"query":2,"name":"q2","equal":false,"secs":1.5,"duckdb_secs":null}"#;
        let rs = parse_results(text).unwrap();
        assert_eq!(rs.len(), 2);
        assert_eq!(rs[0].spill_files, 3);
        assert_eq!(rs[1].duckdb_secs, None);
        let err = parse_results("{\"name\":\"q1\"}\nnot json").unwrap_err();
        assert!(err.starts_with("line 1:"), "{err}");
    }
}
