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

use super::{QuerySession, StagePlan};
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
    /// The allocators of the task's slot, one per memory element: the task
    /// allocates nowhere else.
    pub region: AllocationState,
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
    /// Bytes of frames it wrote, as stored.
    pub bytes_written: u64,
    /// Bytes it read from memory elements (tables and inputs).
    pub scan_bytes: u64,
    /// The most local memory its operators reserved at once.
    pub peak_local_bytes: u64,
    /// Spill files it wrote.
    pub spill_files: u64,
    /// Bytes it spilled to memory elements.
    pub spill_bytes_written: u64,
    /// Bytes of spill files it read back.
    pub spill_bytes_read: u64,
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
/// [`Error::InvalidArgument`] for a malformed spec (no chunk rows, a slot that leaves
/// out one of the registry's elements); frame, allocation and query errors of the
/// task.
pub fn run_task(elements: Arc<MemoryElements>, spec: &TaskSpec) -> Result<TaskOutput> {
    let start = Instant::now();
    if spec.chunk_rows == 0 {
        return Err(Error::InvalidArgument(
            "a task spec needs chunk_rows of at least 1".into(),
        ));
    }
    // An element left out would allocate from its start, over the tables.
    if let Some(missing) = elements
        .names()
        .into_iter()
        .find(|n| !spec.region.allocators.iter().any(|a| a.element() == n))
    {
        return Err(Error::InvalidArgument(format!(
            "the task's memory slot leaves out memory element {missing:?}"
        )));
    }
    elements.resume_allocation(&spec.region)?;
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
        spill_bytes_written: out.stats.spill_bytes_written,
        spill_bytes_read: out.stats.spill_bytes_read,
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
struct QueryRegion {
    elements: Arc<MemoryElements>,
    /// (element, start, bytes) reserved.
    reserved: Vec<(String, u64, u64)>,
    slot_bytes: u64,
}

/// The smallest slot a task is given.
const MIN_SLOT_BYTES: u64 = 1 << 20;

impl QueryRegion {
    /// Reserves `slots` equal slots above each element's bump pointer: each as large
    /// as the free space allows, at most `slot_cap` bytes (None: no cap, the whole
    /// free space is taken).
    fn reserve(
        elements: &Arc<MemoryElements>,
        slots: usize,
        slot_cap: Option<u64>,
    ) -> Result<Self> {
        let align = elements.alignment();
        let mut region = QueryRegion {
            elements: Arc::clone(elements),
            reserved: Vec::new(),
            slot_bytes: u64::MAX,
        };
        for a in elements.allocation_state().allocators {
            let tail = a.range().end - a.high_water();
            let fits = tail / slots.max(1) as u64;
            let (slot, too_small) = match slot_cap {
                Some(cap) => (
                    cap.next_multiple_of(align),
                    fits < cap.next_multiple_of(align),
                ),
                None => (fits & !(align - 1), fits < MIN_SLOT_BYTES),
            };
            if too_small {
                return Err(Error::InvalidArgument(format!(
                    "memory element {:?} has {tail} bytes free above its allocations: too little for {slots} tasks of {} bytes each",
                    a.element(),
                    slot_cap.unwrap_or(MIN_SLOT_BYTES)
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

impl Drop for QueryRegion {
    fn drop(&mut self) {
        for (name, start, bytes) in &self.reserved {
            if let Err(e) = self.elements.free(name, *start, *bytes) {
                tracing::warn!(%e, element = %name, "freeing a distributed query's region");
            }
        }
    }
}

/// A query being run as tasks, driven from outside: hand out the specs of ready
/// tasks ([`DistributedQuery::next_task`]), report each task's end
/// ([`DistributedQuery::task_done`], [`DistributedQuery::task_failed`]), and read the
/// answer when every task is done ([`DistributedQuery::finish`]). A stage's tasks
/// become ready when the stages it reads are done. Holds the query's memory
/// reservation: dropping it (finished, failed or abandoned) frees everything the
/// tasks allocated.
pub struct DistributedQuery {
    env: FrameEnv,
    sql: String,
    plan: StagePlan,
    stored_schema: SchemaRef,
    tables: BTreeMap<String, String>,
    partitions: usize,
    first_slot: Vec<usize>,
    region: QueryRegion,
    /// Stage → partition → frames, for finished stages.
    outputs: BTreeMap<usize, Vec<Vec<String>>>,
    /// Stage → task → its record in `log`, once done.
    done: Vec<Vec<Option<usize>>>,
    started: Vec<bool>,
    ready: VecDeque<(usize, usize)>,
    running: usize,
    log: Vec<TaskRecord>,
    failure: Option<Error>,
    start: Instant,
}

impl std::fmt::Debug for DistributedQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedQuery")
            .field("stages", &self.plan.stages.len())
            .field("running", &self.running)
            .field("finished", &self.log.len())
            .finish()
    }
}

impl DistributedQuery {
    /// Plans `sql` in `session` and reserves memory for its tasks: one slot per task
    /// in every memory element, of `slot_bytes` each (None: the free space above the
    /// session's allocations shared out equally).
    ///
    /// # Errors
    /// Planning errors as [`QuerySession::sql`]; [`Error::InvalidArgument`] when the
    /// memory elements have too little room for the query's tasks.
    pub fn new(session: &QuerySession, sql: &str, slot_bytes: Option<u64>) -> Result<Self> {
        let (plan, stored_schema) = session.stage_plan(sql)?;
        let tables = session
            .tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(name, frame)| Ok((name.clone(), frame.to_json()?)))
            .collect::<Result<BTreeMap<_, _>>>()?;
        let slots: usize = plan.stages.iter().map(|s| s.tasks).sum();
        let region = QueryRegion::reserve(session.env().elements(), slots, slot_bytes)?;
        let first_slot = plan
            .stages
            .iter()
            .scan(0, |next, s| {
                let first = *next;
                *next += s.tasks;
                Some(first)
            })
            .collect();
        let mut query = DistributedQuery {
            env: session.env().clone(),
            sql: sql.to_owned(),
            done: plan.stages.iter().map(|s| vec![None; s.tasks]).collect(),
            started: vec![false; plan.stages.len()],
            plan,
            stored_schema,
            tables,
            partitions: session.partitions(),
            first_slot,
            region,
            outputs: BTreeMap::new(),
            ready: VecDeque::new(),
            running: 0,
            log: Vec::new(),
            failure: None,
            start: Instant::now(),
        };
        query.release_ready();
        Ok(query)
    }

    /// The query's stages.
    pub fn plan(&self) -> &StagePlan {
        &self.plan
    }

    /// The tables every task reads (name → frame metadata JSON), as in its spec.
    pub fn tables(&self) -> &BTreeMap<String, String> {
        &self.tables
    }

    /// Seconds since the query started (the clock of [`TaskRecord`]).
    pub fn clock(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Makes the tasks of every stage whose inputs are all done ready.
    fn release_ready(&mut self) {
        for s in &self.plan.stages {
            if !self.started[s.id] && s.inputs.iter().all(|i| self.outputs.contains_key(i)) {
                self.started[s.id] = true;
                self.ready.extend((0..s.tasks).map(|t| (s.id, t)));
            }
        }
    }

    /// The spec of a task ready to run (it counts as running from now on), or None
    /// while none is ready (all running tasks must end first) or after a failure.
    ///
    /// # Errors
    /// [`Error::Array`] if a slot's allocators cannot be made.
    pub fn next_task(&mut self) -> Result<Option<TaskSpec>> {
        if self.failure.is_some() {
            return Ok(None);
        }
        let Some((stage, task)) = self.ready.pop_front() else {
            return Ok(None);
        };
        let s = &self.plan.stages[stage];
        let spec = TaskSpec {
            sql: self.sql.clone(),
            stage,
            task,
            budget: self.env.budget().limit(),
            partitions: self.partitions,
            chunk_rows: self.env.chunk_rows(),
            tables: self.tables.clone(),
            inputs: s
                .inputs
                .iter()
                .map(|i| (*i, self.outputs.get(i).cloned().unwrap_or_default()))
                .collect(),
            region: self.region.slot(self.first_slot[stage] + task)?,
        };
        self.running += 1;
        Ok(Some(spec))
    }

    /// Tasks handed out and not yet reported.
    pub fn running(&self) -> usize {
        self.running
    }

    /// Whether every task is done (the answer can be read) or the query failed and
    /// no task is running any more.
    pub fn is_over(&self) -> bool {
        self.running == 0 && (self.failure.is_some() || self.ready.is_empty())
    }

    /// Reports that a task handed out at `started_s` (on [`DistributedQuery::clock`])
    /// finished with `output`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a task that was not handed out or reported twice.
    pub fn task_done(&mut self, output: TaskOutput, started_s: f64) -> Result<()> {
        let (stage, task) = (output.stage, output.task);
        let slot = self
            .done
            .get_mut(stage)
            .and_then(|d| d.get_mut(task))
            .filter(|d| d.is_none())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "stage {stage} task {task} is not a running task of this query"
                ))
            })?;
        *slot = Some(self.log.len());
        self.running = self.running.saturating_sub(1);
        self.log.push(TaskRecord {
            output,
            started_s,
            ended_s: self.clock(),
        });
        if self.done[stage].iter().all(Option::is_some) {
            let mut parts = vec![Vec::new(); self.plan.stages[stage].partitions];
            for &k in self.done[stage].iter().flatten() {
                for (q, metas) in self.log[k].output.outputs.iter().enumerate() {
                    if let Some(p) = parts.get_mut(q) {
                        p.extend(metas.iter().cloned());
                    }
                }
            }
            self.outputs.insert(stage, parts);
            self.release_ready();
        }
        Ok(())
    }

    /// Reports that task `task` of stage `stage` failed with `error`: no task is
    /// handed out after this; the query fails with the first failure reported.
    pub fn task_failed(&mut self, stage: usize, task: usize, error: Error) {
        self.running = self.running.saturating_sub(1);
        self.failure.get_or_insert(match error {
            e @ Error::TaskFailed { .. } => e,
            other => Error::TaskFailed {
                stage,
                task,
                message: other.to_string(),
            },
        });
    }

    /// The answer, read from the root stage's frames, and the task log; frees the
    /// query's memory.
    ///
    /// # Errors
    /// The first task failure; [`Error::InvalidArgument`] while tasks are still to
    /// run; errors reading the answer.
    pub fn finish(mut self) -> Result<DistributedOutput> {
        if let Some(e) = self.failure.take() {
            return Err(e);
        }
        let root = self.plan.stages.len() - 1;
        let answer = self.outputs.get(&root).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the query is not done: {} task(s) running, {} ready",
                self.running,
                self.ready.len()
            ))
        })?;
        let mut batches = Vec::new();
        for meta in answer.iter().flatten() {
            batches.extend(RemoteFrame::from_json(&self.env, meta)?.to_record_batches()?);
        }
        let schema = batches
            .first()
            .map_or_else(|| self.stored_schema.clone(), RecordBatch::schema);
        let shuffle_bytes = self
            .log
            .iter()
            .filter(|r| r.output.stage != root)
            .map(|r| r.output.bytes_written)
            .sum();
        Ok(DistributedOutput {
            schema,
            batches,
            ordered: self.plan.ordered,
            stages: self.plan.stages.len(),
            shuffle_bytes,
            elapsed: self.start.elapsed(),
            tasks: std::mem::take(&mut self.log),
        })
    }
}

impl QuerySession {
    /// Runs `sql` as tasks on `runner`, at most `workers` at once, in threads of this
    /// process that call the runner (see [`DistributedQuery`]: stages run as soon as
    /// their inputs are done, each task in a memory slot of its own). Returns the
    /// answer, read back here, and the task log. Everything the tasks allocated is
    /// free again when this returns, on error too.
    ///
    /// # Errors
    /// [`Error::TaskFailed`] naming the first task that failed (the others still
    /// running are waited for; none is started after it); as
    /// [`DistributedQuery::new`].
    pub fn run_distributed(
        &self,
        sql: &str,
        runner: &dyn TaskRunner,
        workers: usize,
    ) -> Result<DistributedOutput> {
        let workers = workers.max(1);
        let mut query = DistributedQuery::new(self, sql, None)?;
        std::thread::scope(|scope| {
            let (tx, rx) = mpsc::channel();
            loop {
                while query.running() < workers {
                    match query.next_task() {
                        Ok(Some(spec)) => {
                            let tx = tx.clone();
                            let began = query.clock();
                            scope.spawn(move || {
                                let result = runner.run(&spec);
                                // The driver waits for every running task: it is
                                // there to receive.
                                let _ = tx.send((spec.stage, spec.task, began, result));
                            });
                        }
                        Ok(None) => break,
                        Err(e) => {
                            query.task_failed(0, 0, e);
                            break;
                        }
                    }
                }
                if query.running() == 0 {
                    break;
                }
                let Ok((stage, task, began, result)) = rx.recv() else {
                    break;
                };
                let reported = match result {
                    Ok(out) => query.task_done(out, began),
                    Err(e) => {
                        query.task_failed(stage, task, e);
                        Ok(())
                    }
                };
                if let Err(e) = reported {
                    query.task_failed(stage, task, e);
                }
            }
        });
        query.finish()
    }
}
