//! A query run as tasks that need not share a process: the driver
//! ([`QuerySession::run_distributed`]) cuts the query into stages, hands each ready
//! task to a [`TaskRunner`] as a self-contained [`TaskSpec`], at most `workers` at a
//! time, and reads the answer from the root stage's frames. A worker (a thread, a
//! process, a Ray task on another node) runs a spec with [`run_task`] over its own
//! registry of the same memory elements.
//!
//! Only metadata travels between driver and workers: the spec names the tables and
//! input frames by their metadata, the output is frame metadata again; the rows go
//! through the memory elements.
//!
//! Tasks allocate without coordinating: the driver reserves the free space above
//! its own allocations in every memory element for the query and cuts it into one
//! equal slot per task; a task's allocators are confined to its slot (its spill files
//! and its output live there). No allocator is shared or called remotely, so one-sided
//! transports stay one-sided, and whatever a task leaves behind — it failed, or was
//! killed — goes with the query's reservation, which the driver frees when the query
//! ends, on every path.

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use scad_remote_array::{AllocationState, MemoryElements, RemoteAllocator};
use serde::{Deserialize, Serialize};

use super::QuerySession;
use crate::budget::Budget;
use crate::env::FrameEnv;
use crate::error::{Error, Result};
use crate::frame::RemoteFrame;

/// Everything a worker needs to run one task of a query: the SQL, how the driver
/// plans it (budget, partitions, chunk rows), the tables and the task's inputs by
/// their frame metadata, and the slot of memory it may allocate in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// The query.
    pub sql: String,
    /// Stage number.
    pub stage: usize,
    /// Task number within the stage.
    pub task: usize,
    /// Local memory budget in bytes (None: unlimited).
    pub budget: Option<u64>,
    /// Partitions the plan uses (the driver's).
    pub partitions: usize,
    /// Rows per chunk of the frames it writes.
    pub chunk_rows: usize,
    /// Table name → frame metadata JSON.
    pub tables: BTreeMap<String, String>,
    /// Input stage → for each of its partitions, frame metadata JSON.
    pub inputs: BTreeMap<usize, Vec<Vec<String>>>,
    /// The allocators of the task's slot, one per memory element (None: allocate
    /// from the worker's registry as it is).
    pub region: Option<AllocationState>,
}

/// What a task wrote and did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskOutput {
    /// Stage number.
    pub stage: usize,
    /// Task number.
    pub task: usize,
    /// For each partition of the stage's output, the metadata JSON of the frames the
    /// task wrote for it.
    pub outputs: Vec<Vec<String>>,
    /// Seconds the task took in its worker (planning included).
    pub elapsed_s: f64,
    /// Rows it wrote.
    pub rows: usize,
    /// Bytes of frames it wrote.
    pub bytes_written: u64,
    /// Bytes it read from memory elements (tables and inputs).
    pub scan_bytes: u64,
    /// The most local memory its operators reserved at once.
    pub peak_local_bytes: u64,
    /// Spill files it wrote.
    pub spill_files: u64,
}

/// Runs tasks somewhere: in threads of this process, child processes, a cluster.
/// Called from several threads at once.
pub trait TaskRunner: Sync {
    /// Runs `spec` and returns what it wrote, or why it failed.
    ///
    /// # Errors
    /// Whatever the task or the runner met; the driver fails the query with it.
    fn run(&self, spec: &TaskSpec) -> Result<TaskOutput>;
}

/// Runs `spec` in this process over `elements` (a registry of the same memory
/// elements the driver's tables live in, for this worker alone: its allocators are
/// confined to the spec's slot).
///
/// # Errors
/// [`Error::InvalidArgument`] for a malformed spec; frame, allocation and query errors
/// of the task.
pub fn run_task(elements: Arc<MemoryElements>, spec: &TaskSpec) -> Result<TaskOutput> {
    let start = Instant::now();
    if let Some(region) = &spec.region {
        elements.resume_allocation(region)?;
    }
    let budget = match spec.budget {
        Some(b) => Budget::bytes(b)?,
        None => Budget::Unlimited,
    };
    let env = FrameEnv::new(elements)
        .with_budget(budget)
        .with_chunk_rows(spec.chunk_rows);
    let session = QuerySession::with_partitions(&env, spec.partitions)?;
    for (name, meta) in &spec.tables {
        session.register(name, &RemoteFrame::from_json(&env, meta)?)?;
    }
    let inputs = spec
        .inputs
        .iter()
        .map(|(&id, parts)| {
            let frames = parts
                .iter()
                .map(|metas| {
                    metas
                        .iter()
                        .map(|m| RemoteFrame::from_json(&env, m))
                        .collect::<Result<Vec<_>>>()
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((id, frames))
        })
        .collect::<Result<BTreeMap<_, _>>>()?;
    let out = session.run_stage_task(&spec.sql, spec.stage, spec.task, &inputs)?;
    let outputs = out
        .frames
        .iter()
        .map(|part| part.iter().map(RemoteFrame::to_json).collect())
        .collect::<Result<Vec<Vec<String>>>>()?;
    Ok(TaskOutput {
        stage: spec.stage,
        task: spec.task,
        outputs,
        elapsed_s: start.elapsed().as_secs_f64(),
        rows: out.stats.rows,
        bytes_written: out.bytes_written,
        scan_bytes: out.stats.scan_bytes,
        peak_local_bytes: out.stats.peak_local_bytes,
        spill_files: out.stats.spill_files,
    })
}

/// A [`TaskRunner`] that runs every task in a thread of this process, each over a
/// registry of its own (as a separate process would), reaching the memory elements
/// through the transports of `elements`.
#[derive(Debug, Clone)]
pub struct ThreadRunner {
    transports: Vec<(String, Arc<dyn scad_core::Transport>)>,
    align: u64,
}

impl ThreadRunner {
    /// Workers reaching the memory elements of `elements` through its transports.
    ///
    /// # Errors
    /// [`Error::Array`] if an element vanished while listing them.
    pub fn new(elements: &MemoryElements) -> Result<Self> {
        let transports = elements
            .names()
            .into_iter()
            .map(|n| {
                let t = elements.transport(&n)?;
                Ok((n, t))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ThreadRunner {
            transports,
            align: elements.alignment(),
        })
    }
}

impl TaskRunner for ThreadRunner {
    fn run(&self, spec: &TaskSpec) -> Result<TaskOutput> {
        let elements = Arc::new(MemoryElements::with_alignment(self.align));
        for (name, transport) in &self.transports {
            elements.add(name, Arc::clone(transport))?;
        }
        run_task(elements, spec)
    }
}

/// A task as the driver saw it run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// What the worker reported.
    pub output: TaskOutput,
    /// When the driver handed it to the runner, since the query started.
    pub started_s: f64,
    /// When the runner returned, since the query started.
    pub ended_s: f64,
}

/// The answer of a distributed query and how its tasks ran.
#[derive(Debug, Clone)]
pub struct DistributedOutput {
    /// The answer's schema, as stage outputs store it: column names made unique
    /// (`name#2`), 8- and 16-bit integers widened to 32 bits.
    pub schema: SchemaRef,
    /// The answer, in order when `ordered`.
    pub batches: Vec<RecordBatch>,
    /// Whether the query orders its answer.
    pub ordered: bool,
    /// Every task, in the order they finished.
    pub tasks: Vec<TaskRecord>,
    /// Stages of the plan.
    pub stages: usize,
    /// Bytes the tasks of non-root stages wrote for their consumers.
    pub shuffle_bytes: u64,
    /// Wall time of the whole query.
    pub elapsed: Duration,
}

impl DistributedOutput {
    /// Rows of the answer.
    pub fn rows(&self) -> usize {
        self.batches.iter().map(RecordBatch::num_rows).sum()
    }
}

/// The memory a query's tasks allocate in: the free space above every element's
/// allocations, reserved in the driver's allocators until dropped.
struct QueryRegion<'a> {
    elements: &'a MemoryElements,
    /// (element, start, bytes) reserved.
    reserved: Vec<(String, u64, u64)>,
    slot_bytes: u64,
}

/// The smallest slot a task is given.
const MIN_SLOT_BYTES: u64 = 1 << 20;

impl<'a> QueryRegion<'a> {
    /// Reserves the space above each element's bump pointer for `slots` tasks.
    fn reserve(elements: &'a MemoryElements, slots: usize) -> Result<Self> {
        let align = elements.alignment();
        let mut region = QueryRegion {
            elements,
            reserved: Vec::new(),
            slot_bytes: u64::MAX,
        };
        for a in elements.allocation_state().allocators {
            let tail = a.range().end - a.high_water();
            let slot = (tail / slots.max(1) as u64) & !(align - 1);
            if slot < MIN_SLOT_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "memory element {:?} has {tail} bytes free above its allocations: too little for {slots} tasks of at least {MIN_SLOT_BYTES} bytes each",
                    a.element()
                )));
            }
            let bytes = slot * slots as u64;
            let start = elements.allocate(a.element(), bytes)?;
            region.reserved.push((a.element().to_owned(), start, bytes));
            region.slot_bytes = region.slot_bytes.min(slot);
        }
        Ok(region)
    }

    /// The allocators of slot `k`.
    fn slot(&self, k: usize) -> Result<AllocationState> {
        let allocators = self
            .reserved
            .iter()
            .map(|(name, start, _)| {
                let lo = start + k as u64 * self.slot_bytes;
                RemoteAllocator::new(name, lo..lo + self.slot_bytes, self.elements.alignment())
                    .map_err(Error::from)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(AllocationState { allocators })
    }
}

impl Drop for QueryRegion<'_> {
    fn drop(&mut self) {
        for (name, start, bytes) in &self.reserved {
            if let Err(e) = self.elements.free(name, *start, *bytes) {
                tracing::warn!(%e, element = %name, "freeing a distributed query's region");
            }
        }
    }
}

impl QuerySession {
    /// Runs `sql` as tasks on `runner`, at most `workers` at once: every task of a
    /// stage as soon as the stages it reads are done (so independent stages run at the
    /// same time), each allocating in a slot of its own of the memory above this
    /// session's allocations. Returns the answer, read back here, and the task log.
    /// Everything the tasks allocated is free again when this returns, on error too.
    ///
    /// # Errors
    /// [`Error::TaskFailed`] naming the first task that failed (the others still
    /// running are waited for; none is started after it); [`Error::InvalidArgument`]
    /// when the memory elements have too little room for the query's tasks; planning
    /// errors as [`QuerySession::sql`].
    pub fn run_distributed(
        &self,
        sql: &str,
        runner: &dyn TaskRunner,
        workers: usize,
    ) -> Result<DistributedOutput> {
        let start = Instant::now();
        let workers = workers.max(1);
        let (plan, stored_schema) = self.stage_plan(sql)?;
        let tables = self
            .tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(name, frame)| Ok((name.clone(), frame.to_json()?)))
            .collect::<Result<BTreeMap<_, _>>>()?;
        let slots: usize = plan.stages.iter().map(|s| s.tasks).sum();
        let region = QueryRegion::reserve(self.env().elements(), slots)?;
        let first_slot: Vec<usize> = plan
            .stages
            .iter()
            .scan(0, |next, s| {
                let first = *next;
                *next += s.tasks;
                Some(first)
            })
            .collect();
        let spec_of = |stage: usize, task: usize, outputs: &BTreeMap<usize, Vec<Vec<String>>>| {
            let s = &plan.stages[stage];
            Ok::<_, Error>(TaskSpec {
                sql: sql.to_owned(),
                stage,
                task,
                budget: self.env().budget().limit(),
                partitions: self.partitions(),
                chunk_rows: self.env().chunk_rows(),
                tables: tables.clone(),
                inputs: s
                    .inputs
                    .iter()
                    .map(|i| (*i, outputs.get(i).cloned().unwrap_or_default()))
                    .collect(),
                region: Some(region.slot(first_slot[stage] + task)?),
            })
        };

        // Stage → partition → frames, filled as tasks finish (in task order).
        let mut outputs: BTreeMap<usize, Vec<Vec<String>>> = BTreeMap::new();
        let mut done: Vec<Vec<Option<TaskOutput>>> =
            plan.stages.iter().map(|s| vec![None; s.tasks]).collect();
        let mut complete = vec![false; plan.stages.len()];
        let mut started = vec![false; plan.stages.len()];
        let mut ready: VecDeque<(usize, usize)> = VecDeque::new();
        let mut log = Vec::new();
        let mut failure: Option<Error> = None;
        let release = |ready: &mut VecDeque<(usize, usize)>,
                       started: &mut Vec<bool>,
                       complete: &Vec<bool>| {
            for s in &plan.stages {
                if !started[s.id] && s.inputs.iter().all(|&i| complete[i]) {
                    started[s.id] = true;
                    ready.extend((0..s.tasks).map(|t| (s.id, t)));
                }
            }
        };
        release(&mut ready, &mut started, &complete);
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel();
            let mut running = 0;
            loop {
                while failure.is_none() && running < workers {
                    let Some((stage, task)) = ready.pop_front() else {
                        break;
                    };
                    match spec_of(stage, task, &outputs) {
                        Ok(spec) => {
                            let tx = tx.clone();
                            let began = start.elapsed().as_secs_f64();
                            running += 1;
                            scope.spawn(move || {
                                let result = runner.run(&spec);
                                // The driver waits for every running task; it is
                                // there to receive.
                                let _ = tx.send((stage, task, began, result));
                            });
                        }
                        Err(e) => failure = Some(e),
                    }
                }
                if running == 0 {
                    break;
                }
                let Ok((stage, task, began, result)) = rx.recv() else {
                    break;
                };
                running -= 1;
                match result {
                    Ok(out) => {
                        log.push(TaskRecord {
                            output: out.clone(),
                            started_s: began,
                            ended_s: start.elapsed().as_secs_f64(),
                        });
                        done[stage][task] = Some(out);
                        if done[stage].iter().all(Option::is_some) {
                            let mut parts = vec![Vec::new(); plan.stages[stage].partitions];
                            for out in done[stage].iter().flatten() {
                                for (q, metas) in out.outputs.iter().enumerate() {
                                    if let Some(p) = parts.get_mut(q) {
                                        p.extend(metas.iter().cloned());
                                    }
                                }
                            }
                            outputs.insert(stage, parts);
                            complete[stage] = true;
                            release(&mut ready, &mut started, &complete);
                        }
                    }
                    Err(e) => {
                        failure.get_or_insert(match e {
                            e @ Error::TaskFailed { .. } => e,
                            other => Error::TaskFailed {
                                stage,
                                task,
                                message: other.to_string(),
                            },
                        });
                    }
                }
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        let root = plan.stages.len() - 1;
        let mut batches = Vec::new();
        for meta in outputs.get(&root).into_iter().flatten().flatten() {
            batches.extend(RemoteFrame::from_json(self.env(), meta)?.to_record_batches()?);
        }
        drop(region);
        let schema = batches.first().map_or(stored_schema, RecordBatch::schema);
        let shuffle_bytes = log
            .iter()
            .filter(|r| r.output.stage != root)
            .map(|r| r.output.bytes_written)
            .sum();
        Ok(DistributedOutput {
            schema,
            batches,
            ordered: plan.ordered,
            tasks: log,
            stages: plan.stages.len(),
            shuffle_bytes,
            elapsed: start.elapsed(),
        })
    }
}
