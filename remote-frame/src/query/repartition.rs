//! One writer per repartition under a budget.
//!
//! DataFusion 55's `RepartitionExec` sends a batch it cannot reserve memory for
//! through a spill pool shared by all its input partitions. When two inputs spill at
//! once the pool holds two open files, and its reader waits on the older one while
//! the batch it was told about sits in the newer; the inputs then wait for the
//! reader's channel to drain, and the query hangs with every thread parked
//! (apache/datafusion#24883, fixed after 55.2; q67 over two partitions hung about one
//! run in twenty). With one input partition, one task writes the pool, one file is
//! open at a time and the reader always reads the file being written. So under a
//! budget every repartition that keeps no order reads its input through a
//! `CoalescePartitionsExec`: the input's partitions still run at once (the merge runs
//! each in a task of its own), only the hashing of rows to their output partition
//! runs in one task. Order-keeping repartitions give each input a pool of its own and
//! are left as they are.

use std::sync::Arc;

use datafusion::common::Result as DfResult;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::ExecutionPlan;

use super::operator::replace_each;

/// `plan` with each repartition that keeps no order and reads several partitions
/// given their rows through one merge (see the module docs).
pub(crate) fn one_writer_each(plan: Arc<dyn ExecutionPlan>) -> DfResult<Arc<dyn ExecutionPlan>> {
    replace_each(plan, |repartition: &RepartitionExec| {
        let input = repartition.input();
        if repartition.preserve_order() || input.properties().partitioning.partition_count() < 2 {
            return Ok(None);
        }
        let merged: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(input.clone()));
        Ok(Some(Arc::new(RepartitionExec::try_new(
            merged,
            repartition.partitioning().clone(),
        )?) as _))
    })
}
