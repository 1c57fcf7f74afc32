//! A frame's statistics for DataFusion: per chunk (row count, null counts, the
//! minimum and maximum the writer kept), so that a scan skips the chunks a filter
//! excludes; and for the planner, the rows and bytes a scan reads.

use std::sync::Arc;

use arrow_schema::{DataType, SchemaRef};
use std::collections::HashSet;

use arrow_array::{ArrayRef, BooleanArray, UInt64Array};
use datafusion::common::pruning::PruningStatistics;
use datafusion::common::stats::Precision;
use datafusion::common::Column;
use datafusion::common::{ColumnStatistics, ScalarValue, Statistics};
use datafusion::physical_expr::utils::reassign_expr_columns;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;

use crate::meta::{chunk_column_bytes, ColumnStats, FrameMeta};

/// The statistics of every chunk of a frame, over all of its columns (`schema` is the
/// frame's whole schema, a computed row index included).
#[derive(Debug)]
pub(crate) struct ChunkStatistics {
    schema: SchemaRef,
    chunks: Vec<Arc<Statistics>>,
}

impl ChunkStatistics {
    pub(crate) fn new(schema: SchemaRef, meta: &FrameMeta) -> Self {
        let all: Vec<usize> = (0..schema.fields().len()).collect();
        let chunks = meta
            .chunks
            .iter()
            .map(|c| {
                let columns = schema
                    .fields()
                    .iter()
                    .zip(&c.columns)
                    .map(|(field, cc)| {
                        let (min, max) = cc
                            .stats
                            .as_ref()
                            .and_then(|s| bounds(s, field.data_type()))
                            .map_or((Precision::Absent, Precision::Absent), |(lo, hi)| {
                                (Precision::Exact(lo), Precision::Exact(hi))
                            });
                        ColumnStatistics::new_unknown()
                            .with_null_count(Precision::Exact(cc.null_count as usize))
                            .with_min_value(min)
                            .with_max_value(max)
                    })
                    .collect();
                Arc::new(Statistics {
                    num_rows: Precision::Exact(c.rows as usize),
                    total_byte_size: Precision::Exact(
                        chunk_column_bytes(&meta.schema, c, &all) as usize
                    ),
                    column_statistics: columns,
                })
            })
            .collect();
        ChunkStatistics { schema, chunks }
    }

    /// The chunks `predicate` (over the frame's schema) may hold rows of, in order:
    /// all of them when the predicate cannot be used for pruning.
    pub(crate) fn matching(&self, predicate: Option<Arc<dyn PhysicalExpr>>) -> Vec<usize> {
        let all = || (0..self.chunks.len()).collect();
        // By name: a filter pushed down to a scan names the scan's columns.
        let Some(predicate) = predicate.and_then(|p| reassign_expr_columns(p, &self.schema).ok())
        else {
            return all();
        };
        let pruning = PruningPredicateBuilder::new()
            .with_file_schema(self.schema.clone())
            .build(predicate);
        let Some(pruning) = pruning else {
            return all();
        };
        match pruning.prune(self) {
            Ok(keep) => keep
                .iter()
                .enumerate()
                .filter(|(_, k)| **k)
                .map(|(i, _)| i)
                .collect(),
            Err(e) => {
                tracing::debug!(error = %e, "chunk pruning failed; reading every chunk");
                all()
            }
        }
    }

    /// Chunks of the frame.
    pub(crate) fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// What the planner is told of `chunks` (of the frame `meta`) read for the
    /// projected `columns`: their exact row count and bytes in local memory. Not the
    /// bounds: DataFusion's filter estimates from them go badly wrong (at 150,000
    /// rows of prices from 0 to 1,000 it took `price > 10` to keep 974), and its
    /// join modes follow those estimates.
    pub(crate) fn for_planner(
        &self,
        meta: &FrameMeta,
        chunks: &[usize],
        columns: &[usize],
    ) -> Statistics {
        let picked = || chunks.iter().filter_map(|&i| meta.chunks.get(i));
        let rows: u64 = picked().map(|c| c.rows).sum();
        let bytes: u64 = picked()
            .map(|c| chunk_column_bytes(&meta.schema, c, columns))
            .sum();
        let schema = self
            .schema
            .project(columns)
            .unwrap_or_else(|_| (*self.schema).clone());
        Statistics::new_unknown(&schema)
            .with_num_rows(Precision::Exact(rows as usize))
            .with_total_byte_size(Precision::Exact(bytes as usize))
    }
}

/// The chunks as pruning containers. (DataFusion's `PrunableStatistics` gives up on a
/// column when a chunk lacks its bounds, as an all-null chunk does; here such a
/// chunk's bound is a null of the column's type, which keeps the chunk.)
impl PruningStatistics for ChunkStatistics {
    fn min_values(&self, column: &Column) -> Option<ArrayRef> {
        self.bounds_of(column, |c| &c.min_value)
    }

    fn max_values(&self, column: &Column) -> Option<ArrayRef> {
        self.bounds_of(column, |c| &c.max_value)
    }

    fn num_containers(&self) -> usize {
        self.chunks.len()
    }

    fn null_counts(&self, column: &Column) -> Option<ArrayRef> {
        let index = self.schema.index_of(column.name()).ok()?;
        let counts: UInt64Array = self
            .chunks
            .iter()
            .map(|s| {
                s.column_statistics
                    .get(index)
                    .and_then(|c| c.null_count.get_value())
                    .map(|&n| n as u64)
            })
            .collect();
        Some(Arc::new(counts))
    }

    fn row_counts(&self) -> Option<ArrayRef> {
        let rows: UInt64Array = self
            .chunks
            .iter()
            .map(|s| s.num_rows.get_value().map(|&n| n as u64))
            .collect();
        Some(Arc::new(rows))
    }

    fn contained(&self, _column: &Column, _values: &HashSet<ScalarValue>) -> Option<BooleanArray> {
        None
    }
}

impl ChunkStatistics {
    fn bounds_of(
        &self,
        column: &Column,
        bound: impl Fn(&ColumnStatistics) -> &Precision<ScalarValue>,
    ) -> Option<ArrayRef> {
        let index = self.schema.index_of(column.name()).ok()?;
        let null = ScalarValue::try_from(self.schema.field(index).data_type()).ok()?;
        let values = self
            .chunks
            .iter()
            .map(|s| match s.column_statistics.get(index).map(&bound) {
                Some(Precision::Exact(v)) => v.clone(),
                _ => null.clone(),
            });
        ScalarValue::iter_to_array(values).ok()
    }
}

/// A chunk's minimum and maximum as values of `dtype` (`None` when the stored values
/// are not of that type).
fn bounds(stats: &ColumnStats, dtype: &DataType) -> Option<(ScalarValue, ScalarValue)> {
    Some((scalar(&stats.min, dtype)?, scalar(&stats.max, dtype)?))
}

fn scalar(v: &serde_json::Value, dtype: &DataType) -> Option<ScalarValue> {
    use serde_json::Value;
    Some(match (dtype, v) {
        (DataType::Boolean, Value::Bool(b)) => ScalarValue::Boolean(Some(*b)),
        (DataType::Int8, Value::Number(n)) => ScalarValue::Int8(Some(n.as_i64()?.try_into().ok()?)),
        (DataType::Int16, Value::Number(n)) => {
            ScalarValue::Int16(Some(n.as_i64()?.try_into().ok()?))
        }
        (DataType::Int32, Value::Number(n)) => {
            ScalarValue::Int32(Some(n.as_i64()?.try_into().ok()?))
        }
        (DataType::Int64, Value::Number(n)) => ScalarValue::Int64(Some(n.as_i64()?)),
        (DataType::UInt8, Value::Number(n)) => {
            ScalarValue::UInt8(Some(n.as_u64()?.try_into().ok()?))
        }
        (DataType::UInt16, Value::Number(n)) => {
            ScalarValue::UInt16(Some(n.as_u64()?.try_into().ok()?))
        }
        (DataType::UInt32, Value::Number(n)) => {
            ScalarValue::UInt32(Some(n.as_u64()?.try_into().ok()?))
        }
        (DataType::UInt64, Value::Number(n)) => ScalarValue::UInt64(Some(n.as_u64()?)),
        // Stored from an f32, so exact.
        (DataType::Float32, Value::Number(n)) => ScalarValue::Float32(Some(n.as_f64()? as f32)),
        (DataType::Float64, Value::Number(n)) => ScalarValue::Float64(Some(n.as_f64()?)),
        (DataType::Date32, Value::Number(n)) => {
            ScalarValue::Date32(Some(n.as_i64()?.try_into().ok()?))
        }
        (DataType::Decimal128(p, s), Value::String(unscaled)) => {
            ScalarValue::Decimal128(Some(unscaled.parse().ok()?), *p, *s)
        }
        (DataType::Utf8View, Value::String(s)) => ScalarValue::Utf8View(Some(s.clone())),
        _ => return None,
    })
}
