//! What our operators share: the parts every leaf (a scan, a stage input, a prepared
//! stream) implements the same way, the plan methods of an operator that runs a
//! DataFusion window's or sort's work in its place, the `with_new_children` of all of them,
//! taking the one child of an operator that has one, the properties of one that
//! passes rows on in no promised order, and the physical-optimizer step that swaps
//! one of ours in for each DataFusion operator of a kind.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::FieldRef;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::memory_pool::MemoryLimit;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode};
use datafusion::physical_plan::{ExecutionPlan, PlanProperties, ReplaceChildrenOptions};
use datafusion::prelude::SessionConfig;

/// Bytes a row of `fields` is estimated to take: a fixed-width column its width,
/// any other `variable_width` (what its estimate counts a string as).
pub(crate) fn estimated_row_width(fields: &[FieldRef], variable_width: usize) -> usize {
    fields
        .iter()
        .map(|f| f.data_type().primitive_width().unwrap_or(variable_width))
        .sum()
}

/// The one child in `children` of the operator `name` (for its `replace_children`).
pub(crate) fn only_child(
    name: &str,
    children: Vec<Arc<dyn ExecutionPlan>>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let [child] = <[_; 1]>::try_from(children).map_err(|c| {
        DataFusionError::Internal(format!("{name} takes one child, got {}", c.len()))
    })?;
    Ok(child)
}

/// The plan properties of an operator that passes on rows of `input` (all or some)
/// in no order it promises: the input's partitioning, emission and boundedness, with
/// no ordering or constants.
pub(crate) fn unordered_properties(input: &Arc<dyn ExecutionPlan>) -> Arc<PlanProperties> {
    let given = input.properties();
    Arc::new(PlanProperties::new(
        EquivalenceProperties::new(input.schema()),
        given.partitioning.clone(),
        given.emission_type,
        given.boundedness,
    ))
}

/// `wrapped` (the DataFusion operator one of ours runs in place of) with new
/// `children`, still of its type.
pub(crate) fn replace_wrapped_children<T: ExecutionPlan + Clone + 'static>(
    wrapped: &Arc<T>,
    children: Vec<Arc<dyn ExecutionPlan>>,
    options: ReplaceChildrenOptions,
) -> DfResult<T> {
    let replaced = Arc::clone(wrapped).replace_children(children, options)?;
    replaced.downcast_ref::<T>().cloned().ok_or_else(|| {
        DataFusionError::Internal(format!(
            "a {} with new children is no longer one",
            wrapped.name()
        ))
    })
}

/// Whether `plan` itself (not counting its inputs) holds memory beyond a batch at a
/// time: a join's build side, a final aggregate's groups, a sort's runs, a window's
/// partitions.
fn holds_memory_itself(plan: &dyn ExecutionPlan) -> bool {
    match plan.downcast_ref::<AggregateExec>() {
        // Partial aggregates emit early when memory runs short.
        Some(agg) => *agg.mode() != AggregateMode::Partial,
        None => matches!(
            plan.name(),
            "HashJoinExec"
                | "SpillingHashJoinExec"
                | "SortMergeJoinExec"
                | "NestedLoopJoinExec"
                | "CrossJoinExec"
                | "SymmetricHashJoinExec"
                | "SortExec"
                | "SpillingSortExec"
                | "SpillingAggregateExec"
                | "WindowAggExec"
                | "PartitionedWindowExec"
        ),
    }
}

/// Whether `plan` is a window whose input is a sort (of its partition keys, as the
/// planner puts one there): it holds one window partition at a time.
pub(crate) fn is_window_over_sort(plan: &dyn ExecutionPlan) -> bool {
    matches!(plan.name(), "WindowAggExec" | "PartitionedWindowExec")
        && plan
            .children()
            .first()
            .is_some_and(|c| matches!(c.name(), "SortExec" | "SpillingSortExec"))
}

/// Whether `plan` joins anywhere in it.
pub(crate) fn contains_join(plan: &dyn ExecutionPlan) -> bool {
    plan.name().contains("Join")
        || plan
            .children()
            .into_iter()
            .any(|c| contains_join(c.as_ref()))
}

/// Whether running `plan` holds memory beyond a batch at a time anywhere in it.
pub(crate) fn holds_memory(plan: &dyn ExecutionPlan) -> bool {
    memory_holders(plan) > 0
}

/// How many operators of `plan` hold memory (see [`holds_memory_itself`]).
pub(crate) fn memory_holders(plan: &dyn ExecutionPlan) -> usize {
    memory_holders_but(plan, &|_| false)
}

/// How many operators of `plan` hold memory, not counting those `skip` picks.
pub(crate) fn memory_holders_but(
    plan: &dyn ExecutionPlan,
    skip: &dyn Fn(&dyn ExecutionPlan) -> bool,
) -> usize {
    usize::from(holds_memory_itself(plan) && !skip(plan))
        + plan
            .children()
            .into_iter()
            .map(|c| memory_holders_but(c.as_ref(), skip))
            .sum::<usize>()
}

/// What an operator that holds memory may hold of its budget `share`. Half, so that
/// the operators feeding it, running beside it or waiting above it keep room; all but
/// an eighth when it is `sole`, the only one of its plan that holds memory: then
/// nothing else needs room but the batches passing through.
pub(crate) fn holder_cap(share: usize, sole: bool) -> usize {
    if sole {
        share - share / 8
    } else {
        share / 2
    }
}

/// The budget of `context`'s memory pool in bytes (`usize::MAX`: unlimited).
pub(crate) fn budget_bytes(context: &TaskContext) -> usize {
    match context.memory_pool().memory_limit() {
        MemoryLimit::Finite(bytes) => bytes,
        _ => usize::MAX,
    }
}

/// A task context like `context` (its task, session and functions) with `config` and
/// `runtime`: how an operator runs the plans inside it under a pool or options of
/// their own.
pub(crate) fn task_context_like(
    context: &TaskContext,
    config: SessionConfig,
    runtime: Arc<RuntimeEnv>,
) -> Arc<TaskContext> {
    Arc::new(TaskContext::new(
        context.task_id(),
        context.session_id(),
        config,
        context.scalar_functions().clone(),
        context.higher_order_functions().clone(),
        context.aggregate_functions().clone(),
        context.window_functions().clone(),
        runtime,
    ))
}

/// `f` applied to each of `exprs` in turn, until one asks to stop: what an operator's
/// `apply_expressions` does over the expressions it holds.
pub(crate) fn apply_each<E: std::borrow::Borrow<Arc<dyn PhysicalExpr>>>(
    exprs: impl IntoIterator<Item = E>,
    f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> DfResult<TreeNodeRecursion>,
) -> DfResult<TreeNodeRecursion> {
    for e in exprs {
        if f(e.borrow())? == TreeNodeRecursion::Stop {
            return Ok(TreeNodeRecursion::Stop);
        }
    }
    Ok(TreeNodeRecursion::Continue)
}

/// `plan` with every operator of type `T` for which `replace` gives a replacement
/// replaced by it (bottom-up, so a replacement's input is already final).
pub(crate) fn replace_each<T: ExecutionPlan + 'static>(
    plan: Arc<dyn ExecutionPlan>,
    replace: impl Fn(&T) -> DfResult<Option<Arc<dyn ExecutionPlan>>>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let replacement = match node.downcast_ref::<T>() {
            Some(op) => replace(op)?,
            None => None,
        };
        Ok(match replacement {
            Some(new) => Transformed::yes(new),
            None => Transformed::no(node),
        })
    })
    .map(|t| t.data)
}

/// Inside `impl ExecutionPlan for $ty`: `name`, `properties` (from a `properties`
/// field), `children` (none), `apply_expressions` (over the expressions of the
/// `Vec` field named, or none), and `replace_children` / `with_new_children`, which
/// accept no children.
macro_rules! leaf_plan_methods {
    ($name:literal) => {
        $crate::query::operator::leaf_plan_methods!(@leaf $name);

        fn apply_expressions(
            &self,
            _f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::common::Result<
                datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> datafusion::common::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
        }
    };
    ($name:literal, $exprs:ident) => {
        $crate::query::operator::leaf_plan_methods!(@leaf $name);

        fn apply_expressions(
            &self,
            f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::common::Result<
                datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> datafusion::common::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            $crate::query::operator::apply_each(&self.$exprs, f)
        }
    };
    (@leaf $name:literal) => {
        fn name(&self) -> &str {
            $name
        }

        fn properties(&self) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            &self.properties
        }

        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![]
        }

        fn replace_children(
            self: std::sync::Arc<Self>,
            children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
            _options: datafusion::physical_plan::ReplaceChildrenOptions,
        ) -> datafusion::common::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>
        {
            if children.is_empty() {
                Ok(self)
            } else {
                Err(datafusion::common::DataFusionError::Internal(
                    concat!($name, " is a leaf and takes no children").into(),
                ))
            }
        }

        $crate::query::operator::with_new_children_by_replace!();
    };
}

/// Inside `impl ExecutionPlan for $ty`: `with_new_children` as `replace_children` with
/// the properties recomputed (what every operator of ours does).
macro_rules! with_new_children_by_replace {
    () => {
        fn with_new_children(
            self: std::sync::Arc<Self>,
            children: Vec<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>,
        ) -> datafusion::common::Result<std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>>
        {
            self.replace_children(
                children,
                datafusion::physical_plan::ReplaceChildrenOptions::new(
                    datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
                ),
            )
        }
    };
}

/// Inside `impl ExecutionPlan for $ty` of an operator that runs in place of the
/// DataFusion operator in its field `$window` (a window or a sort): everything about
/// the plan (properties, the child, expressions, input requirements, statistics) is
/// that operator's.
macro_rules! wrapped_plan_methods {
    ($window:ident) => {
        fn properties(&self) -> &std::sync::Arc<datafusion::physical_plan::PlanProperties> {
            self.$window.properties()
        }

        fn children(&self) -> Vec<&std::sync::Arc<dyn datafusion::physical_plan::ExecutionPlan>> {
            vec![self.$window.input()]
        }

        fn apply_expressions(
            &self,
            f: &mut dyn FnMut(
                &std::sync::Arc<dyn datafusion::physical_expr::PhysicalExpr>,
            ) -> datafusion::common::Result<
                datafusion::common::tree_node::TreeNodeRecursion,
            >,
        ) -> datafusion::common::Result<datafusion::common::tree_node::TreeNodeRecursion> {
            self.$window.apply_expressions(f)
        }

        fn maintains_input_order(&self) -> Vec<bool> {
            self.$window.maintains_input_order()
        }

        fn required_input_ordering(
            &self,
        ) -> Vec<Option<datafusion::physical_expr::OrderingRequirements>> {
            self.$window.required_input_ordering()
        }

        fn input_distribution_requirements(
            &self,
        ) -> datafusion::physical_plan::InputDistributionRequirements {
            self.$window.input_distribution_requirements()
        }

        fn child_stats_requests(
            &self,
            partition: Option<usize>,
        ) -> Vec<datafusion::physical_plan::statistics::ChildStats> {
            self.$window.child_stats_requests(partition)
        }

        fn statistics_from_inputs(
            &self,
            input_stats: &[std::sync::Arc<datafusion::common::Statistics>],
            args: &datafusion::physical_plan::statistics::StatisticsArgs,
        ) -> datafusion::common::Result<std::sync::Arc<datafusion::common::Statistics>> {
            self.$window.statistics_from_inputs(input_stats, args)
        }

        fn cardinality_effect(
            &self,
        ) -> datafusion::physical_plan::execution_plan::CardinalityEffect {
            self.$window.cardinality_effect()
        }
    };
}

pub(crate) use leaf_plan_methods;
pub(crate) use with_new_children_by_replace;
pub(crate) use wrapped_plan_methods;

/// The first `rows` rows of `input`.
pub(crate) fn limit_rows<S>(
    input: S,
    rows: usize,
) -> impl futures::Stream<Item = DfResult<RecordBatch>>
where
    S: futures::Stream<Item = DfResult<RecordBatch>>,
{
    use futures::StreamExt;
    input.scan(rows, |left, batch| {
        let out = match batch {
            Ok(_) if *left == 0 => None,
            Ok(b) => {
                let take = b.num_rows().min(*left);
                *left -= take;
                Some(Ok(b.slice(0, take)))
            }
            Err(e) => Some(Err(e)),
        };
        futures::future::ready(out)
    })
}
