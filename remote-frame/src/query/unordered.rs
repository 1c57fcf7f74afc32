//! Partial aggregates over keys that are only "sorted" because they are constant.
//!
//! DataFusion runs an aggregate whose input is sorted on some of its grouping keys in
//! an ordered mode, and an ordered partial aggregate never skips aggregation, even
//! when it does not reduce its input at all. A filter such as `d_year = 2000` makes
//! `d_year` a constant, and a constant counts as sorted: q78's three partial
//! aggregates grouped by (year, item, customer) hashed 500 k rows into 500 k groups
//! each. [`UnorderedPartials`] gives such a partial aggregate its input through
//! [`UnorderedExec`], which passes the rows on and promises no order, so the aggregate
//! runs unordered and its probe skips aggregating once it sees that nothing reduces.

use std::fmt;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::Result as DfResult;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, InputOrderMode,
    PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
};

use super::operator::{only_child, replace_each, unordered_properties};

/// Gives each partial aggregate whose only sorted grouping keys are constants an
/// unordered input (see the module docs; a physical optimizer rule).
#[derive(Debug, Default)]
pub(crate) struct UnorderedPartials;

impl PhysicalOptimizerRule for UnorderedPartials {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        _config: &ConfigOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        replace_each(plan, |agg: &AggregateExec| {
            if *agg.mode() != AggregateMode::Partial || !sorted_only_by_constants(agg) {
                return Ok(None);
            }
            let input: Arc<dyn ExecutionPlan> = Arc::new(UnorderedExec::new(agg.input().clone()));
            let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
            Ok(Some(
                Arc::new(agg.clone()).replace_children(vec![input], options)?,
            ))
        })
    }

    fn name(&self) -> &str {
        "scad_unordered_partials"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether `agg` runs ordered only because the grouping keys it is sorted on are
/// constant in its input.
pub(crate) fn sorted_only_by_constants(agg: &AggregateExec) -> bool {
    let keys = agg.group_expr().expr();
    let sorted: Vec<usize> = match agg.input_order_mode() {
        InputOrderMode::Linear => return false,
        InputOrderMode::PartiallySorted(indices) => indices.clone(),
        InputOrderMode::Sorted => (0..keys.len()).collect(),
    };
    let properties = &agg.input().properties().eq_properties;
    !sorted.is_empty()
        && sorted.iter().all(|&i| {
            keys.get(i)
                .is_some_and(|(e, _)| properties.is_expr_constant(e).is_some())
        })
}

/// Its input's rows as they come, with no order or constants promised.
#[derive(Debug)]
pub(crate) struct UnorderedExec {
    input: Arc<dyn ExecutionPlan>,
    properties: Arc<PlanProperties>,
}

impl UnorderedExec {
    pub(crate) fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        let properties = unordered_properties(&input);
        UnorderedExec { input, properties }
    }
}

impl DisplayAs for UnorderedExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "UnorderedExec")
    }
}

impl ExecutionPlan for UnorderedExec {
    fn name(&self) -> &str {
        "UnorderedExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
    ) -> DfResult<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let input = only_child("UnorderedExec", children)?;
        Ok(Arc::new(UnorderedExec::new(input)))
    }

    super::operator::with_new_children_by_replace!();

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }
}
