//! Generated TPC-DS data sets: running the Python generator, reading the manifest,
//! loading tables from Parquet and reading DuckDB's reference answers.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{make_view, Array, ArrayRef, AsArray, StringViewArray};
use datafusion::arrow::buffer::{Buffer, ScalarBuffer};
use datafusion::arrow::compute::{cast, concat_batches};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::RecordBatch;
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use serde::Deserialize;

use crate::error::TpcdsError;

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

    /// Reads `table` (only `columns` if given, in that order) from Parquet: one record
    /// batch per row group (one empty batch for a file without rows), string columns as
    /// [`compact_strings`] lays them out.
    ///
    /// # Errors
    /// [`TpcdsError::DataMissing`] for an unknown table or column, [`TpcdsError::Parquet`]
    /// for a bad file.
    pub fn read_table(
        &self,
        table: &str,
        columns: Option<&[&str]>,
    ) -> Result<Vec<RecordBatch>, TpcdsError> {
        if !self.manifest.tables.contains_key(table) {
            return Err(TpcdsError::DataMissing {
                path: self.parquet_path(table),
                hint: format!("no table {table} in the manifest"),
            });
        }
        read_parquet(&self.parquet_path(table), columns)
    }

    /// DuckDB's answer to `query`, as one record batch.
    ///
    /// # Errors
    /// [`TpcdsError::DataMissing`] if the reference was not generated; as
    /// [`DataSet::read_table`].
    pub fn reference(&self, query: &str) -> Result<RecordBatch, TpcdsError> {
        let path = self.reference_path(query);
        if !path.exists() {
            return Err(TpcdsError::DataMissing {
                path,
                hint: "rerun benches/tpcds/gen_data.py to write the reference answers".into(),
            });
        }
        let parts = read_parquet(&path, None)?;
        let schema = parts
            .first()
            .map(RecordBatch::schema)
            .unwrap_or_else(|| Arc::new(Schema::empty()));
        concat_batches(&schema, &parts).map_err(|source| TpcdsError::Arrow {
            context: format!("gathering {}", path.display()),
            source,
        })
    }
}

/// The Parquet file at `path` (only `columns`, in that order, if given): one record
/// batch per row group, or one empty batch if it has none.
fn read_parquet(path: &Path, columns: Option<&[&str]>) -> Result<Vec<RecordBatch>, TpcdsError> {
    let parquet_err = |source| TpcdsError::Parquet {
        path: path.to_path_buf(),
        source,
    };
    let arrow_err = |source| TpcdsError::Arrow {
        context: format!("reading {}", path.display()),
        source,
    };
    let file = File::open(path).map_err(|source| TpcdsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(parquet_err)?;
    let file_schema = meta.schema().clone();
    // Indices of the wanted columns in the file, in the order wanted.
    let wanted: Vec<usize> = match columns {
        None => (0..file_schema.fields().len()).collect(),
        Some(names) => names
            .iter()
            .map(|n| {
                file_schema
                    .index_of(n)
                    .map_err(|_| TpcdsError::DataMissing {
                        path: path.to_path_buf(),
                        hint: format!("no column {n}"),
                    })
            })
            .collect::<Result<_, _>>()?,
    };
    let mut sorted = wanted.clone();
    sorted.sort_unstable();
    sorted.dedup();
    // The reader gives the projected columns in file order; `order` picks them out in
    // the order wanted.
    let order: Vec<usize> = wanted
        .iter()
        .filter_map(|w| sorted.iter().position(|s| s == w))
        .collect();
    let mask = ProjectionMask::roots(meta.parquet_schema(), sorted.iter().copied());
    let projected = Arc::new(file_schema.project(&wanted).map_err(arrow_err)?);
    let row_groups = meta.metadata().row_groups().to_vec();
    let mut out = Vec::with_capacity(row_groups.len().max(1));
    for (r, group) in row_groups.iter().enumerate() {
        let rows = usize::try_from(group.num_rows()).unwrap_or(0);
        let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(
            file.try_clone().map_err(|source| TpcdsError::Io {
                path: path.to_path_buf(),
                source,
            })?,
            meta.clone(),
        )
        .with_projection(mask.clone())
        .with_row_groups(vec![r])
        .with_batch_size(rows.max(1))
        .build()
        .map_err(parquet_err)?;
        let parts = reader
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| parquet_err(e.into()))?;
        let read_schema = parts
            .first()
            .map(RecordBatch::schema)
            .unwrap_or_else(|| projected.clone());
        let batch = concat_batches(&read_schema, &parts)
            .and_then(|b| b.project(&order))
            .map_err(arrow_err)?;
        // Whether each column's chunk in this row group is dictionary-encoded.
        let dictionary: Vec<bool> = wanted
            .iter()
            .map(|&c| {
                group
                    .columns()
                    .get(c)
                    .is_some_and(|m| m.dictionary_page_offset().is_some())
            })
            .collect();
        out.push(compact_strings(&batch, &dictionary).map_err(arrow_err)?);
    }
    if out.is_empty() {
        let empty = RecordBatch::new_empty(projected);
        out.push(compact_strings(&empty, &[]).map_err(arrow_err)?);
    }
    Ok(out)
}

/// The batch (one row group) with every string column as string views laid out as
/// Polars reads them, so the frames written from it (and the bytes a scan moves) are
/// the same: one data buffer per column holding only the values longer than a view's
/// 12 inline bytes — each distinct value once where the column chunk is
/// dictionary-encoded (`dictionary[k]`), every value in row order where it is plain.
/// (A cast from `Utf8` would keep every value's bytes, short ones included.)
fn compact_strings(batch: &RecordBatch, dictionary: &[bool]) -> Result<RecordBatch, ArrowError> {
    let schema = batch.schema();
    let mut fields = Vec::with_capacity(batch.num_columns());
    let mut columns = Vec::with_capacity(batch.num_columns());
    for (k, (field, column)) in schema.fields().iter().zip(batch.columns()).enumerate() {
        let column = match column.data_type() {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
                let views = cast(column, &DataType::Utf8View)?;
                let dedup = dictionary.get(k).copied().unwrap_or(false);
                Arc::new(string_views(views.as_string_view(), dedup)?) as ArrayRef
            }
            _ => column.clone(),
        };
        fields.push(
            field
                .as_ref()
                .clone()
                .with_data_type(column.data_type().clone()),
        );
        columns.push(column);
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
}

/// `values` with one data buffer (possibly empty) of the values longer than 12 bytes:
/// each distinct one once if `dedup`, else each in row order.
fn string_views(values: &StringViewArray, dedup: bool) -> Result<StringViewArray, ArrowError> {
    const INLINE: usize = 12;
    let mut data: Vec<u8> = Vec::new();
    let mut placed: HashMap<&str, u32> = HashMap::new();
    let mut views: Vec<u128> = Vec::with_capacity(values.len());
    let offset_of = |len: usize| {
        u32::try_from(len).map_err(|_| {
            ArrowError::ComputeError("a string column over 4 GiB in one row group".into())
        })
    };
    for v in values.iter() {
        let Some(s) = v else {
            views.push(0);
            continue;
        };
        if s.len() <= INLINE {
            views.push(make_view(s.as_bytes(), 0, 0));
            continue;
        }
        let at = match placed.get(s) {
            Some(&at) if dedup => at,
            _ => {
                let at = offset_of(data.len())?;
                data.extend_from_slice(s.as_bytes());
                if dedup {
                    placed.insert(s, at);
                }
                at
            }
        };
        views.push(make_view(s.as_bytes(), 0, at));
    }
    StringViewArray::try_new(
        ScalarBuffer::from(views),
        vec![Buffer::from_vec(data)],
        values.nulls().cloned(),
    )
}
