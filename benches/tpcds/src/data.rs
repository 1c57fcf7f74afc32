//! Generated TPC-DS data sets: running the Python generator, reading the manifest,
//! loading tables from Parquet and reading DuckDB's reference answers.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use polars::prelude::*;
use serde::Deserialize;

use crate::error::{PolarsContext, TpcdsError};

/// The repository root (the workspace's, above this crate's directory), where `.venv`
/// and `data/` live.
pub fn repo_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir
        .ancestors()
        .find(|d| d.join("Cargo.lock").exists())
        .unwrap_or(crate_dir)
        .to_path_buf()
}

/// The data generator, `benches/tpcds/gen_data.py`.
pub fn generator_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("gen_data.py")
}

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// Scale factor.
    pub sf: f64,
    /// Test data only: spread the catalog and web sales' warehouse keys over this many
    /// warehouses (0 = the generator's data unchanged). Below SF 1 dsdgen makes one
    /// warehouse, so queries 16, 94 and 95 would match nothing.
    pub spread_warehouses: u32,
    /// Also write the `|`-delimited text files.
    pub text: bool,
    /// Root of the data sets (`<repo>/data/tpcds` by default).
    pub out: PathBuf,
}

impl GenerateOptions {
    /// Options for scale factor `sf`, Parquet only, under `<repo>/data/tpcds`.
    pub fn new(sf: f64) -> Self {
        GenerateOptions {
            sf,
            spread_warehouses: 0,
            text: false,
            out: repo_root().join("data").join("tpcds"),
        }
    }
}

/// One reference answer listed in the manifest.
#[derive(Debug, Clone, Deserialize)]
pub struct ReferenceInfo {
    /// Rows of DuckDB's answer.
    pub rows: u64,
    /// Column names.
    pub columns: Vec<String>,
    /// DuckDB's column types.
    pub types: Vec<String>,
}

/// `manifest.json` of a data set, written by `benches/tpcds/gen_data.py`.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    /// Scale factor.
    pub sf: f64,
    /// See [`GenerateOptions::spread_warehouses`].
    #[serde(default)]
    pub spread_warehouses: u32,
    /// Versions of the generator packages.
    pub generator: BTreeMap<String, String>,
    /// Row count per table.
    pub tables: BTreeMap<String, u64>,
    /// Reference answers by query name.
    #[serde(default)]
    pub references: BTreeMap<String, ReferenceInfo>,
}

/// A generated data set on disk.
#[derive(Debug, Clone)]
pub struct DataSet {
    /// Its directory (`.../sf<SF>[-wh<N>]`).
    pub root: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
}

/// Runs `benches/tpcds/gen_data.py` in the repository's `.venv` (it reuses cached data) and
/// opens the data set.
///
/// # Errors
/// [`TpcdsError::Generator`] if `.venv` is missing (the message says how to create it)
/// or the generator fails; errors of [`DataSet::open`].
pub fn generate(options: &GenerateOptions) -> Result<DataSet, TpcdsError> {
    let root = repo_root();
    let python = root.join(".venv").join("bin").join("python");
    if !python.exists() {
        return Err(TpcdsError::Generator(format!(
            "{} not found: the TPC-DS generator runs in the repository's Python venv; create it with \
             `bash scripts/setup.sh` (or `python3 -m venv .venv && .venv/bin/pip install -r benches/tpcds/requirements.txt`) \
             in {}",
            python.display(),
            root.display()
        )));
    }
    if options.sf.is_nan() || options.sf <= 0.0 {
        return Err(TpcdsError::Generator(format!(
            "scale factor must be positive, got {}",
            options.sf
        )));
    }
    let mut cmd = Command::new(&python);
    cmd.arg(generator_script())
        .arg("--sf")
        .arg(options.sf.to_string())
        .arg("--out")
        .arg(&options.out)
        .arg("--quiet");
    if options.spread_warehouses > 0 {
        cmd.arg("--spread-warehouses")
            .arg(options.spread_warehouses.to_string());
    }
    if !options.text {
        cmd.arg("--no-text");
    }
    let output = cmd
        .output()
        .map_err(|e| TpcdsError::Generator(format!("running {}: {e}", python.display())))?;
    if !output.status.success() {
        return Err(TpcdsError::Generator(format!(
            "gen_data.py exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    // The script prints the data set's directory as its last line.
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| TpcdsError::Generator("gen_data.py printed no data directory".into()))?;
    DataSet::open(dir.trim())
}

impl DataSet {
    /// Opens the data set in `root` (a directory with `manifest.json`).
    ///
    /// # Errors
    /// [`TpcdsError::DataMissing`] without a manifest, [`TpcdsError::Manifest`] if it is
    /// malformed.
    pub fn open(root: impl Into<PathBuf>) -> Result<DataSet, TpcdsError> {
        let root = root.into();
        let path = root.join("manifest.json");
        let text = std::fs::read_to_string(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => TpcdsError::DataMissing {
                path: path.clone(),
                hint: "generate it with `.venv/bin/python benches/tpcds/gen_data.py --sf <SF>`"
                    .into(),
            },
            _ => TpcdsError::Io {
                path: path.clone(),
                source: e,
            },
        })?;
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| TpcdsError::Manifest {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if manifest.tables.is_empty() {
            return Err(TpcdsError::Manifest {
                path,
                message: "no tables".into(),
            });
        }
        Ok(DataSet { root, manifest })
    }

    /// Path of a table's Parquet file.
    pub fn parquet_path(&self, table: &str) -> PathBuf {
        self.root.join("parquet").join(format!("{table}.parquet"))
    }

    /// Path of a reference answer's Parquet file.
    pub fn reference_path(&self, query: &str) -> PathBuf {
        self.root.join("reference").join(format!("{query}.parquet"))
    }

    /// Reads `table` (only `columns` if given) from Parquet.
    ///
    /// # Errors
    /// [`TpcdsError::DataMissing`] for an unknown table, Polars errors for bad files or
    /// unknown columns.
    pub fn read_table(
        &self,
        table: &str,
        columns: Option<&[&str]>,
    ) -> Result<DataFrame, TpcdsError> {
        if !self.manifest.tables.contains_key(table) {
            return Err(TpcdsError::DataMissing {
                path: self.parquet_path(table),
                hint: format!("no table {table} in the manifest"),
            });
        }
        read_parquet(
            &self.parquet_path(table),
            columns.map(|c| c.iter().map(|s| s.to_string()).collect()),
        )
    }

    /// DuckDB's answer to `query`.
    ///
    /// # Errors
    /// [`TpcdsError::DataMissing`] if the reference was not generated.
    pub fn reference(&self, query: &str) -> Result<DataFrame, TpcdsError> {
        let path = self.reference_path(query);
        if !path.exists() {
            return Err(TpcdsError::DataMissing {
                path,
                hint: "rerun benches/tpcds/gen_data.py to write the reference answers".into(),
            });
        }
        read_parquet(&path, None)
    }
}

fn read_parquet(path: &Path, columns: Option<Vec<String>>) -> Result<DataFrame, TpcdsError> {
    let file = File::open(path).map_err(|source| TpcdsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    ParquetReader::new(file)
        .with_columns(columns)
        .finish()
        .context(format!("reading {}", path.display()))
}
