//! Runs the TPC-DS pipelines one step per process, the way elements run on a cluster:
//! every process connects to the same memory servers, reads its inputs' handoff JSON
//! files (metadata of frames in memory elements) and writes its own.
//!
//! ```text
//! memory_server 7000 & memory_server 7001 &
//! S=127.0.0.1:7000,127.0.0.1:7001
//! tpcds-step load   --servers $S --data data/tpcds/sf0.1 --queries q1 --dir run/
//! tpcds-step run    --servers $S --query q1 --step dates_in_year --dir run/
//! tpcds-step run    --servers $S --query q1 --step returns_in_year --dir run/
//! ...                                           (every step of `tpcds-step steps --query q1`)
//! tpcds-step result --servers $S --query q1 --dir run/ --data data/tpcds/sf0.1
//! ```
//!
//! `load` writes `DIR/tables.json`; `run` reads the tables from there and each parent
//! step's handoff from `DIR/<parent>.json` (or from `--input PARENT=FILE`), moves its
//! allocators past every frame handed on in `DIR` (so it overwrites none of them), and
//! writes `DIR/<step>.json`, printing its report as one JSON line. Frames stay in the
//! memory servers until they are stopped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use scad_tpcds::compare::compare;
use scad_tpcds::data::{generate, DataSet, GenerateOptions};
use scad_tpcds::pipeline::Source;
use scad_tpcds::remote::{
    load_tables, parse_budget, tables_for, Cluster, Handoff, RemotePipeline, TableHandoffs,
};

/// Command-line options.
#[derive(Debug, Parser)]
#[command(about = "One TPC-DS pipeline step per process over running memory servers")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Load the base tables of the queries into the memory servers; writes DIR/tables.json.
    Load {
        /// Memory servers, HOST:PORT,... (element memI = the I-th).
        #[arg(long, value_delimiter = ',', required = true)]
        servers: Vec<String>,
        /// A generated data set directory (with manifest.json).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Or generate (or reuse) this scale factor.
        #[arg(long)]
        sf: Option<f64>,
        /// Queries whose tables to load.
        #[arg(long, value_delimiter = ',', required = true)]
        queries: Vec<String>,
        /// Rows per stored chunk.
        #[arg(long)]
        chunk_rows: Option<usize>,
        /// Run directory for the handoff files.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Print the steps of a query in run order with their parents.
    Steps {
        /// Query name.
        #[arg(long)]
        query: String,
    },
    /// Run one step; writes DIR/<step>.json.
    Run {
        /// Memory servers, HOST:PORT,... (same order as for `load`).
        #[arg(long, value_delimiter = ',', required = true)]
        servers: Vec<String>,
        /// Query name.
        #[arg(long)]
        query: String,
        /// Step name.
        #[arg(long)]
        step: String,
        /// Run directory.
        #[arg(long)]
        dir: PathBuf,
        /// Local memory budget: bytes (64M) or a percentage of the largest table (25%).
        #[arg(long, default_value = "25%")]
        budget: String,
        /// Read parent step PARENT's handoff from FILE instead of DIR/PARENT.json.
        #[arg(long = "input", value_name = "PARENT=FILE")]
        inputs: Vec<String>,
        /// Rows per stored chunk of the result.
        #[arg(long)]
        chunk_rows: Option<usize>,
    },
    /// Print the last step's result; with --data, compare it with DuckDB's reference.
    Result {
        /// Memory servers, HOST:PORT,...
        #[arg(long, value_delimiter = ',', required = true)]
        servers: Vec<String>,
        /// Query name.
        #[arg(long)]
        query: String,
        /// Run directory.
        #[arg(long)]
        dir: PathBuf,
        /// Data set whose reference answer to compare with.
        #[arg(long)]
        data: Option<PathBuf>,
    },
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(())
}

fn tables(dir: &Path) -> Result<TableHandoffs> {
    let path = dir.join("tables.json");
    serde_json::from_str(&read(&path)?).with_context(|| format!("parsing {}", path.display()))
}

/// Every step handoff in the run directory (to allocate past them).
fn handed_on(dir: &Path) -> Result<Vec<Handoff>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name == "tables.json" || !name.ends_with(".json") {
            continue;
        }
        out.push(Handoff::from_json(
            &read(&path)?,
            &path.display().to_string(),
        )?);
    }
    Ok(out)
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Load {
            servers,
            data,
            sf,
            queries,
            chunk_rows,
            dir,
        } => {
            let set = match (data, sf) {
                (Some(d), _) => DataSet::open(d)?,
                (None, Some(sf)) => generate(&GenerateOptions::new(sf))?,
                (None, None) => bail!("give --data DIR or --sf SF"),
            };
            let mut cluster = Cluster::connect_tcp(&servers)?;
            if let Some(r) = chunk_rows {
                cluster.set_chunk_rows(r);
            }
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let loaded = load_tables(&cluster, &set, &tables_for(&queries)?)?;
            write_atomic(&dir.join("tables.json"), &serde_json::to_string(&loaded)?)?;
            println!(
                "{}",
                serde_json::json!({"tables": loaded.tables.len(), "load_s": loaded.load_secs, "largest_bytes": loaded.largest_bytes()})
            );
        }
        Command::Steps { query } => {
            let p = RemotePipeline::for_query(&query)?;
            for s in &p.pipeline.steps {
                let parents: Vec<&str> = s
                    .inputs
                    .iter()
                    .filter_map(|(_, src)| match src {
                        Source::Step(p) => Some(*p),
                        Source::Table { .. } => None,
                    })
                    .collect();
                println!("{} {}", s.name, parents.join(","));
            }
        }
        Command::Run {
            servers,
            query,
            step,
            dir,
            budget,
            inputs,
            chunk_rows,
        } => {
            let pipeline = RemotePipeline::for_query(&query)?;
            let def = pipeline.step(&step)?;
            let mut cluster = Cluster::connect_tcp(&servers)?;
            if let Some(r) = chunk_rows {
                cluster.set_chunk_rows(r);
            }
            let tables = tables(&dir)?;
            let mut overrides: HashMap<String, PathBuf> = HashMap::new();
            for i in &inputs {
                let (k, v) = i
                    .split_once('=')
                    .with_context(|| format!("--input {i:?}: expected PARENT=FILE"))?;
                overrides.insert(k.to_string(), PathBuf::from(v));
            }
            let mut parents = HashMap::new();
            for (_, src) in &def.inputs {
                if let Source::Step(p) = src {
                    let path = overrides
                        .remove(*p)
                        .unwrap_or_else(|| dir.join(format!("{p}.json")));
                    parents.insert((*p).to_string(), read(&path)?);
                }
            }
            if let Some(k) = overrides.keys().next() {
                bail!("--input {k}=...: step {step} has no parent step {k}");
            }
            let mut keep: Vec<Handoff> = handed_on(&dir)?;
            keep.extend(tables.tables.values().cloned());
            cluster.reserve_past(&keep.iter().collect::<Vec<_>>())?;
            let budget = parse_budget(&budget, tables.largest_bytes())?;
            let (handoff, report) =
                pipeline.run_step(&cluster, &step, &tables, &parents, budget)?;
            write_atomic(&dir.join(format!("{step}.json")), &handoff.to_json()?)?;
            println!("{}", serde_json::to_string(&report)?);
        }
        Command::Result {
            servers,
            query,
            dir,
            data,
        } => {
            let pipeline = RemotePipeline::for_query(&query)?;
            let last = pipeline
                .pipeline
                .steps
                .last()
                .map(|s| s.name)
                .context("the pipeline has no steps")?;
            let cluster = Cluster::connect_tcp(&servers)?;
            let path = dir.join(format!("{last}.json"));
            let h = Handoff::from_json(&read(&path)?, &path.display().to_string())?;
            let df = h
                .open(&cluster, cluster.env(), &format!("{query} result"))?
                .to_polars()?;
            println!("{df}");
            if let Some(d) = data {
                let set = DataSet::open(d)?;
                compare(&df, &set.reference(&query)?, pipeline.row_order())?;
                println!("{query}: equals DuckDB's reference");
            }
        }
    }
    Ok(())
}
