//! Spill files in memory elements: DataFusion's spilling operators (sort, aggregate,
//! sort-merge join, ...) write their runs through a [`TempFileFactory`]; this one puts
//! them into the query's memory elements instead of local disk. A spill file is a list
//! of remote blocks, freed when the last reference to the file drops, on every path.

use std::io::{Read, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arrow_array::{Array, RecordBatch, StringViewArray};
use arrow_schema::{DataType, SchemaRef};
use bytes::{Buf, Bytes};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::execution::spill_file::{SpillFile, SpillWriter, TempFileFactory};
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::{Stream, StreamExt, TryStreamExt};

use crate::budget::Budget;
use crate::env::FrameEnv;
use crate::views::check_string_views;

/// The most bytes a spill writer gathers locally before writing them as one remote
/// block.
const BLOCK_BYTES: usize = 1 << 20;

/// The least: smaller blocks cost a remote write each for little.
const MIN_BLOCK_BYTES: usize = 16 << 10;

/// Bytes a spill writer gathers before writing a block, under `budget`: a hybrid
/// hash join writes up to 64 files at once (a side's spilled partitions; the build
/// side's are finished before the probe side's open), whose blocks together stay
/// within a quarter of the budget. Smaller blocks cost a remote write and read each
/// (a group-by spilling most of its input took 1.5x as long with 16 KiB blocks as
/// with 64 KiB).
fn block_bytes(budget: Budget) -> usize {
    spill_block_bytes(
        budget
            .limit()
            .map_or(usize::MAX, |l| usize::try_from(l).unwrap_or(usize::MAX)),
    )
}

/// [`block_bytes`] of a budget of `limit` bytes (`usize::MAX`: unlimited): what a
/// spill file's reader holds besides the batch it decodes.
pub(crate) fn spill_block_bytes(limit: usize) -> usize {
    if limit == usize::MAX {
        return BLOCK_BYTES;
    }
    (limit / 256).clamp(MIN_BLOCK_BYTES, BLOCK_BYTES)
}

/// Counters of one query's spilling.
#[derive(Debug, Default)]
pub(crate) struct SpillCounters {
    pub(crate) files: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) bytes_read: AtomicU64,
    /// Remote bytes held by spill files now.
    pub(crate) live_bytes: AtomicU64,
}

/// Makes spill files in the memory elements of a [`FrameEnv`].
#[derive(Debug)]
pub(crate) struct RemoteSpillFactory {
    env: FrameEnv,
    counters: Arc<SpillCounters>,
    block_bytes: usize,
}

impl RemoteSpillFactory {
    pub(crate) fn new(env: FrameEnv, counters: Arc<SpillCounters>) -> Self {
        let block_bytes = block_bytes(env.budget());
        RemoteSpillFactory {
            env,
            counters,
            block_bytes,
        }
    }

    /// A spill file whose writers gather `block_bytes` before writing a block (at
    /// least the session's block, at most [`BLOCK_BYTES`]): an operator that writes
    /// few files at once can hold larger blocks within the same bound, each a round
    /// trip less (query-bench's group-by at 25 %, 8 files at once: 0.113-0.122 s with
    /// 63 KiB blocks, 0.090-0.105 s with 250 KiB).
    pub(crate) fn create_file(&self, description: &str, block_bytes: usize) -> Arc<dyn SpillFile> {
        self.counters.files.fetch_add(1, Ordering::Relaxed);
        Arc::new(RemoteSpillFile {
            inner: Arc::new(SpillBlocks {
                env: self.env.clone(),
                description: description.to_owned(),
                blocks: Mutex::new(Vec::new()),
                counters: self.counters.clone(),
                block_bytes: block_bytes.clamp(self.block_bytes, BLOCK_BYTES.max(self.block_bytes)),
            }),
        })
    }
}

impl TempFileFactory for RemoteSpillFactory {
    fn create_temp_file(&self, description: &str) -> DfResult<Arc<dyn SpillFile>> {
        Ok(self.create_file(description, self.block_bytes))
    }
}

/// One block of a spill file in remote memory.
#[derive(Debug, Clone)]
struct Block {
    element: String,
    addr: u64,
    len: u64,
}

/// The blocks of one spill file; frees them when dropped.
#[derive(Debug)]
struct SpillBlocks {
    env: FrameEnv,
    description: String,
    blocks: Mutex<Vec<Block>>,
    counters: Arc<SpillCounters>,
    /// Bytes a writer gathers before writing a block.
    block_bytes: usize,
}

impl SpillBlocks {
    fn blocks(&self) -> Vec<Block> {
        self.blocks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Writes `data` as a new block on the next memory element.
    fn append(&self, data: &[u8]) -> DfResult<()> {
        let element = self.env.next_element().map_err(external)?;
        let len = data.len() as u64;
        let addr = self
            .env
            .elements()
            .allocate(&element, len)
            .map_err(|e| self.error("allocating a spill block", e))?;
        let written = self.env.transport(&element).and_then(|t| {
            t.write(addr, data)
                .map_err(|source| crate::Error::Transport {
                    op: "write",
                    element: element.clone(),
                    addr,
                    len,
                    source: Box::new(source),
                })
        });
        if let Err(e) = written {
            // The block never became part of the file: give it back now.
            let _ = self.env.elements().free(&element, addr, len);
            return Err(self.error("writing a spill block", e));
        }
        self.counters
            .bytes_written
            .fetch_add(len, Ordering::Relaxed);
        self.counters.live_bytes.fetch_add(len, Ordering::Relaxed);
        self.blocks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Block { element, addr, len });
        Ok(())
    }

    fn read(&self, b: &Block) -> DfResult<Bytes> {
        let mut buf = vec![0u8; b.len as usize];
        self.env
            .transport(&b.element)
            .and_then(|t| {
                t.read(b.addr, &mut buf)
                    .map_err(|source| crate::Error::Transport {
                        op: "read",
                        element: b.element.clone(),
                        addr: b.addr,
                        len: b.len,
                        source: Box::new(source),
                    })
            })
            .map_err(|e| self.error("reading a spill block", e))?;
        self.counters.bytes_read.fetch_add(b.len, Ordering::Relaxed);
        Ok(Bytes::from(buf))
    }

    fn error(&self, what: &str, e: impl Into<crate::Error>) -> DataFusionError {
        let e: crate::Error = e.into();
        DataFusionError::Execution(format!(
            "{what} of spill file {:?} in memory elements: {e}",
            self.description
        ))
    }
}

impl Drop for SpillBlocks {
    fn drop(&mut self) {
        let blocks = std::mem::take(
            self.blocks
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for b in blocks {
            self.counters.live_bytes.fetch_sub(b.len, Ordering::Relaxed);
            if let Err(e) = self.env.elements().free(&b.element, b.addr, b.len) {
                tracing::warn!(element = %b.element, addr = b.addr, len = b.len, error = %e,
                    "could not free a spill block");
            }
        }
    }
}

fn external(e: crate::Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// A spill file held in memory elements.
#[derive(Debug)]
struct RemoteSpillFile {
    inner: Arc<SpillBlocks>,
}

impl SpillFile for RemoteSpillFile {
    fn size(&self) -> Option<u64> {
        Some(self.inner.blocks().iter().map(|b| b.len).sum())
    }

    fn read_stream(&self) -> DfResult<Pin<Box<dyn Stream<Item = DfResult<Bytes>> + Send>>> {
        // Blocks are looked up as the reader gets to them, not listed up front: a
        // repartition's spill pool reads a file while it is still being written,
        // polling for the next batch only once that batch was flushed. A block is
        // read on the polling thread, as writers write theirs: handing each read to
        // a blocking thread cost two thread switches per block, a fifth of the CPU
        // of a query spilling 100 KiB blocks (q67 at 25 MiB: 2.74 s -> 2.37 s).
        let inner = self.inner.clone();
        let mut next = 0usize;
        let blocks = std::iter::from_fn(move || {
            let block = inner
                .blocks
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(next)
                .cloned()?;
            next += 1;
            Some(inner.read(&block))
        });
        Ok(Box::pin(futures::stream::iter(blocks)))
    }

    fn open_writer(&self) -> DfResult<Box<dyn SpillWriter>> {
        Ok(Box::new(RemoteSpillWriter {
            inner: self.inner.clone(),
            buf: Vec::with_capacity(self.inner.block_bytes),
        }))
    }
}

/// Appends to a [`RemoteSpillFile`] block by block.
struct RemoteSpillWriter {
    inner: Arc<SpillBlocks>,
    buf: Vec<u8>,
}

impl RemoteSpillWriter {
    fn flush_block(&mut self) -> DfResult<()> {
        if !self.buf.is_empty() {
            self.inner.append(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }
}

impl Write for RemoteSpillWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let block = self.inner.block_bytes;
        let room = block - self.buf.len();
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == block {
            self.flush_block().map_err(std::io::Error::other)?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Readers of a file still being written (repartition's spill pool) read
        // after a flush, so a flush writes the partial block.
        self.flush_block().map_err(std::io::Error::other)
    }
}

impl SpillWriter for RemoteSpillWriter {
    fn finish(&mut self) -> DfResult<()> {
        self.flush_block()
    }
}

/// The record batches of `file`, a spill file this process wrote through a
/// [`SpillManager`](datafusion::physical_plan::spill::SpillManager) (an Arrow IPC
/// stream of `schema`).
///
/// Memory elements are not trusted, so what is read back is validated in full, but
/// not the way DataFusion's reader does it: Arrow's `StreamDecoder` drops the
/// skip-validation setting DataFusion gives it and validates every string view's
/// UTF-8 on its own (9 % of q67's time at 25 MiB). This reader decodes without
/// validation and then checks each batch ([`checked`]): string views as
/// [`crate::views`] checks frames read back (each data buffer's UTF-8 once, then
/// each view's bounds), everything else with Arrow's full validation. The blocks
/// are read on the polling thread, as [`RemoteSpillFile::read_stream`] reads them.
pub(crate) fn read_spilled(
    file: Arc<dyn SpillFile>,
    schema: SchemaRef,
) -> DfResult<SendableRecordBatchStream> {
    let blocks = BlockReader {
        blocks: file.read_stream()?,
        current: Bytes::new(),
    };
    // Opened on the first poll: opening reads the stream's schema message.
    let batches = futures::stream::once(async move {
        let reader = StreamReader::try_new(blocks, None)?;
        // SAFETY: every batch the reader decodes goes through `checked`, which
        // validates it in full before anything reads its values.
        let reader = unsafe { reader.with_skip_validation(true) };
        Ok::<_, DataFusionError>(futures::stream::iter(
            reader.map(|batch| batch.map_err(DataFusionError::from).and_then(checked)),
        ))
    })
    .try_flatten();
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, batches)))
}

/// `batch` if each of its arrays is valid (see [`read_spilled`]).
fn checked(batch: RecordBatch) -> DfResult<RecordBatch> {
    for column in batch.columns() {
        let data = column.to_data();
        if data.data_type() == &DataType::Utf8View {
            data.validate()?;
            check_string_views(&StringViewArray::from(data)).map_err(|e| {
                DataFusionError::Execution(format!(
                    "a spilled string column is malformed (a view outside its buffers, or not UTF-8): {e}"
                ))
            })?;
        } else {
            data.validate_full()?;
        }
    }
    Ok(batch)
}

/// The blocks of a spill file as one byte stream (see [`read_spilled`]).
struct BlockReader {
    blocks: Pin<Box<dyn Stream<Item = DfResult<Bytes>> + Send>>,
    current: Bytes,
}

impl Read for BlockReader {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            // Ready at once: a remote spill file reads each block as it is polled.
            match futures::executor::block_on(self.blocks.next()) {
                Some(Ok(block)) => self.current = block,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.current.len());
        out[..n].copy_from_slice(&self.current[..n]);
        self.current.advance(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use datafusion::execution::spill_file::TempFileFactory;
    use futures::StreamExt;
    use scad_core::transport::LocalTransport;
    use scad_remote_array::MemoryElements;

    use super::*;

    fn env() -> FrameEnv {
        let elements = Arc::new(MemoryElements::new());
        elements
            .add("mem0", Arc::new(LocalTransport::new(16 << 20).unwrap()))
            .unwrap();
        FrameEnv::new(elements)
    }

    #[test]
    fn blocks_shrink_with_the_budget() {
        let bytes = |b: u64| Budget::bytes(b).unwrap();
        assert_eq!(block_bytes(Budget::Unlimited), BLOCK_BYTES);
        assert_eq!(block_bytes(bytes(64 << 20)), 256 << 10);
        assert_eq!(block_bytes(bytes(1 << 20)), MIN_BLOCK_BYTES);
        // A join's 64 writers' blocks take at most a quarter of a budget that is
        // not tiny.
        for budget in [4u64 << 20, 25 << 20, 200 << 20] {
            assert!(64 * block_bytes(bytes(budget)) as u64 <= budget / 4);
        }
    }

    #[test]
    fn a_file_created_with_its_own_block_size_writes_blocks_of_it() {
        let counters = Arc::new(SpillCounters::default());
        let factory = RemoteSpillFactory {
            block_bytes: 64 << 10,
            ..RemoteSpillFactory::new(env(), counters.clone())
        };
        let blocks_of = |block_bytes: usize| {
            let file = factory.create_file("test", block_bytes);
            let mut writer = file.open_writer().unwrap();
            writer.write_all(&vec![1u8; 3 << 20]).unwrap();
            writer.finish().unwrap();
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let sizes: Vec<usize> = rt.block_on(async {
                let mut reader = file.read_stream().unwrap();
                let mut sizes = Vec::new();
                while let Some(block) = reader.next().await {
                    sizes.push(block.unwrap().len());
                }
                sizes
            });
            assert_eq!(sizes.iter().sum::<usize>(), 3 << 20);
            sizes.len()
        };
        assert_eq!(blocks_of(256 << 10), 12);
        // Never smaller than the session's blocks, nor larger than the most.
        assert_eq!(blocks_of(1), 48);
        assert_eq!(blocks_of(usize::MAX), 3);
        assert_eq!(
            counters.live_bytes.load(Ordering::Relaxed),
            0,
            "blocks not freed"
        );
    }

    #[test]
    fn a_reader_sees_what_is_flushed_after_it_started() {
        // A repartition's spill pool opens the reader while the file is still being
        // written and polls it for each batch once that batch was flushed.
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let counters = Arc::new(SpillCounters::default());
        let factory = RemoteSpillFactory::new(env(), counters.clone());
        let file = factory.create_temp_file("test").unwrap();
        let mut writer = file.open_writer().unwrap();
        writer.write_all(b"first ").unwrap();
        writer.flush().unwrap();
        let mut reader = file.read_stream().unwrap();
        let first = rt.block_on(reader.next()).unwrap().unwrap();
        assert_eq!(&first[..], b"first ");
        // Written after the reader started: still read, in order.
        writer.write_all(&vec![7u8; BLOCK_BYTES + 10]).unwrap();
        writer.write_all(b"last").unwrap();
        writer.finish().unwrap();
        let rest: Vec<u8> = rt.block_on(async {
            let mut out = Vec::new();
            while let Some(chunk) = reader.next().await {
                out.extend_from_slice(&chunk.unwrap());
            }
            out
        });
        assert_eq!(rest.len(), BLOCK_BYTES + 14);
        assert!(rest.ends_with(b"last"));
        assert_eq!(file.size(), Some(6 + BLOCK_BYTES as u64 + 14));
        drop((reader, writer, file));
        assert_eq!(
            counters.live_bytes.load(Ordering::Relaxed),
            0,
            "blocks not freed"
        );
    }

    #[tokio::test]
    async fn spilled_batches_read_back_as_written() {
        use arrow_array::{Int64Array, StringViewArray};
        use arrow_schema::{Field, Schema};
        use datafusion::execution::disk_manager::DiskManagerBuilder;
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, SpillMetrics};
        use datafusion::physical_plan::spill::SpillManager;

        let counters = Arc::new(SpillCounters::default());
        let factory = Arc::new(RemoteSpillFactory::new(env(), counters.clone()));
        let runtime = RuntimeEnvBuilder::new()
            .with_disk_manager_builder(
                DiskManagerBuilder::default()
                    .with_temp_file_factory(factory)
                    .with_max_temp_directory_size(u64::MAX),
            )
            .build_arc()
            .unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("s", DataType::Utf8View, true),
        ]));
        let spill = SpillManager::new(
            runtime,
            SpillMetrics::new(&ExecutionPlanMetricsSet::new(), 0),
            schema.clone(),
        );
        // Strings long enough to live in data buffers, and a null.
        let batches: Vec<RecordBatch> = (0..3)
            .map(|b| {
                let keys = Int64Array::from_iter_values((0..1000).map(|i| b * 1000 + i));
                let strings = StringViewArray::from_iter((0..1000).map(|i| {
                    (i % 7 != 0).then(|| format!("a string longer than twelve bytes {b} {i}"))
                }));
                RecordBatch::try_new(schema.clone(), vec![Arc::new(keys), Arc::new(strings)])
                    .unwrap()
            })
            .collect();
        let file = spill
            .spill_record_batch_and_finish(&batches, "test")
            .unwrap()
            .unwrap();
        let read: Vec<RecordBatch> = read_spilled(file, schema.clone())
            .unwrap()
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<DfResult<_>>()
            .unwrap();
        assert_eq!(read, batches);
        drop(read);
        assert_eq!(
            counters.live_bytes.load(Ordering::Relaxed),
            0,
            "blocks not freed"
        );
    }

    #[test]
    fn a_string_view_outside_its_buffers_is_an_error() {
        use arrow_buffer::{Buffer, ScalarBuffer};
        use arrow_data::ByteView;
        use arrow_schema::{Field, Schema};

        let data = Buffer::from(b"twenty bytes of text".as_slice());
        // A 16-byte string at `offset`, its prefix the data's there (or zeros).
        let view = |offset: u32| {
            let at = (offset as usize).min(20);
            let mut prefix = [0u8; 4];
            let take = (20 - at).min(4);
            prefix[..take].copy_from_slice(&data.as_slice()[at..at + take]);
            ByteView::new(16, &prefix).with_offset(offset).as_u128()
        };
        let schema = Arc::new(Schema::new(vec![Field::new(
            "s",
            DataType::Utf8View,
            false,
        )]));
        let batch = |offset: u32| {
            // SAFETY: built unchecked on purpose: the check under test must reject
            // it before anything reads the out-of-bounds view.
            let strings = unsafe {
                StringViewArray::new_unchecked(
                    ScalarBuffer::from(vec![view(offset)]),
                    vec![data.clone()],
                    None,
                )
            };
            RecordBatch::try_new(schema.clone(), vec![Arc::new(strings)]).unwrap()
        };
        assert!(checked(batch(4)).is_ok());
        let err = checked(batch(8)).unwrap_err();
        assert!(err.to_string().contains("outside its buffers"), "{err}");
        // The same view inside a struct column is found too.
        let nested = |offset: u32| {
            let inner = batch(offset).column(0).clone();
            let field = Arc::new(Field::new("s", DataType::Utf8View, false));
            let structs = arrow_array::StructArray::from(vec![(field, inner)]);
            let schema = Schema::new(vec![Field::new("t", structs.data_type().clone(), false)]);
            RecordBatch::try_new(Arc::new(schema), vec![Arc::new(structs)]).unwrap()
        };
        assert!(checked(nested(4)).is_ok());
        assert!(checked(nested(8)).is_err());
        // In bounds but not UTF-8: memory elements are not trusted.
        let bytes = Buffer::from([0xffu8; 16].as_slice());
        // SAFETY: as above, invalid on purpose for the check to reject.
        let strings = unsafe {
            StringViewArray::new_unchecked(
                ScalarBuffer::from(vec![ByteView::new(16, &[0xff; 4]).as_u128()]),
                vec![bytes],
                None,
            )
        };
        let invalid = RecordBatch::try_new(schema.clone(), vec![Arc::new(strings)]).unwrap();
        assert!(checked(invalid).is_err());
    }
}
