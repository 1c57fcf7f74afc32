//! Base tables loaded into memory elements, each handed on as a [`Handoff`].

use std::collections::BTreeMap;
use std::time::Instant;

use scad_remote_frame::RemoteFrame;
use serde::{Deserialize, Serialize};

use crate::data::DataSet;

use super::cluster::Cluster;
use super::error::{FrameContext, RemoteError};
use super::handoff::Handoff;

/// Base tables loaded into memory elements: one handoff per table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TableHandoffs {
    /// Handoff per table name.
    pub tables: BTreeMap<String, Handoff>,
    /// Wall time of loading (Parquet read + writing to memory elements).
    pub load_secs: f64,
}

impl TableHandoffs {
    /// Bytes of the largest loaded table (the budget's reference).
    pub fn largest_bytes(&self) -> u64 {
        self.tables
            .values()
            .map(|h| h.frame.data_bytes())
            .max()
            .unwrap_or(0)
    }

    /// Bytes of all tables.
    pub fn total_bytes(&self) -> u64 {
        self.tables.values().map(|h| h.frame.data_bytes()).sum()
    }

    /// Opens every table (after checking its seal) in the cluster's env.
    ///
    /// # Errors
    /// [`RemoteError::Stale`] for a table whose memory no longer holds it; transport
    /// errors.
    pub fn open(&self, cluster: &Cluster) -> Result<BTreeMap<String, RemoteFrame>, RemoteError> {
        self.tables
            .iter()
            .map(|(name, h)| {
                let frame = h.open(cluster.env(), &format!("table {name}"))?;
                Ok((name.clone(), frame))
            })
            .collect()
    }

    /// Frees every table.
    ///
    /// # Errors
    /// Transport and allocator errors.
    pub fn free(&self, cluster: &Cluster) -> Result<(), RemoteError> {
        self.tables.values().try_for_each(|h| h.free(cluster))
    }
}

/// Reads every table of the data set (or only `only`, if given) from its Parquet file
/// and writes it to the cluster's memory elements.
///
/// # Errors
/// Data set errors (an unknown table among `only`); allocation and transport errors.
pub fn load_tables(
    cluster: &Cluster,
    set: &DataSet,
    only: Option<&[&str]>,
) -> Result<TableHandoffs, RemoteError> {
    let start = Instant::now();
    let names: Vec<String> = match only {
        Some(names) => names.iter().map(|s| (*s).to_string()).collect(),
        None => set.manifest.tables.keys().cloned().collect(),
    };
    let mut out = BTreeMap::new();
    for table in names {
        let df = set.read_table(&table, None)?;
        let frame = RemoteFrame::from_polars(cluster.env(), &df)
            .frame_ctx(|| format!("writing table {table} to memory elements"))?;
        drop(df);
        let handoff = Handoff::new(&format!("table/{table}"), &frame);
        out.insert(table, handoff);
    }
    Ok(TableHandoffs {
        tables: out,
        load_secs: start.elapsed().as_secs_f64(),
    })
}
