//! [`RemoteFrame`]: a table in memory elements, and [`FrameWriter`], which makes one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arrow_array::{RecordBatch, RecordBatchOptions};
use arrow_schema::{Field, Schema as ArrowSchema, SchemaRef};
use datafusion::arrow::compute::concat_batches;
use scad_core::{ReadOp, WriteOp};

use crate::codec::{self, EncodedColumn};
use crate::env::FrameEnv;
use crate::error::{Error, Result};
use crate::meta::{
    chunk_column_bytes, BufferRef, ChunkMeta, ColumnChunk, ColumnMeta, FrameMeta, BUFFER_ALIGN,
    LAYOUT_VERSION,
};
use crate::seal::{self, SealImage, SEAL_BYTES};
use crate::sketch::DistinctSketch;

/// A table whose columns live in memory elements, chunk by chunk; see the crate docs.
///
/// Holds only metadata: reading any data goes over the transports. Cheap to clone;
/// clones are the same frame: once one frees it, every clone refuses to be used
/// ([`Error::Freed`]).
#[derive(Debug, Clone)]
pub struct RemoteFrame {
    env: FrameEnv,
    meta: Arc<FrameMeta>,
    state: Arc<FrameState>,
}

/// What the handles of one frame share.
#[derive(Debug)]
struct FrameState {
    /// What the frame's seal holds while the frame lives.
    seal: SealImage,
    /// Set once the frame was freed through any of the handles.
    freed: AtomicBool,
}

impl RemoteFrame {
    /// Opens a frame from its metadata, checking it, that the environment knows every
    /// memory element it names, and that memory still holds the frame: its seal and
    /// the head of every chunk (one small vectored read per memory element; see
    /// [`crate::seal`]).
    ///
    /// # Errors
    /// [`Error::Meta`] for inconsistent metadata (or metadata of version 1, written
    /// before frames were sealed); an unknown-element error; [`Error::Stale`] when
    /// the frame was freed, its memory reused or overwritten, or the metadata changed;
    /// transport errors.
    pub fn open(env: &FrameEnv, meta: FrameMeta) -> Result<Self> {
        meta.validate()?;
        let known = env.elements().names();
        let unknown = |what: String, element: &str| {
            Error::Meta(format!(
                "{what} lives on memory element {element:?}, which the environment does not have (it has: {})",
                known.join(", ")
            ))
        };
        for (k, c) in meta.chunks.iter().enumerate() {
            if !known.contains(&c.element) {
                return Err(unknown(format!("chunk {k}"), &c.element));
            }
        }
        if let Some(s) = meta.seal.as_ref().filter(|s| !known.contains(&s.element)) {
            return Err(unknown("the seal".into(), &s.element));
        }
        let image = seal::verify(env, &meta)?;
        Ok(Self::sealed(env.clone(), meta, image))
    }

    /// A handle of a frame whose seal holds `image`.
    fn sealed(env: FrameEnv, meta: FrameMeta, image: SealImage) -> Self {
        RemoteFrame {
            env,
            meta: Arc::new(meta),
            state: Arc::new(FrameState {
                seal: image,
                freed: AtomicBool::new(false),
            }),
        }
    }

    /// Opens a frame from metadata JSON (see [`FrameMeta::to_json`]), checking memory
    /// as [`RemoteFrame::open`] does.
    ///
    /// # Errors
    /// As [`FrameMeta::from_json`] and [`RemoteFrame::open`].
    pub fn from_json(env: &FrameEnv, json: &str) -> Result<Self> {
        Self::open(env, FrameMeta::from_json(json)?)
    }

    /// The same frame seen through another environment (another budget, say); freeing
    /// either handle frees both.
    pub fn with_env(&self, env: &FrameEnv) -> Self {
        RemoteFrame {
            env: env.clone(),
            meta: self.meta.clone(),
            state: self.state.clone(),
        }
    }

    /// Whether the frame was freed (through this handle or a clone of it).
    pub fn is_freed(&self) -> bool {
        self.state.freed.load(Ordering::Acquire)
    }

    /// How errors name the frame: its seal's nonce (as in its metadata), rows, chunks
    /// and where its seal lives.
    pub fn label(&self) -> String {
        seal::label(&self.meta)
    }

    /// [`Error::Freed`] if the frame was freed (no I/O).
    pub(crate) fn check_live(&self) -> Result<()> {
        if self.is_freed() {
            return Err(Error::Freed {
                frame: self.label(),
            });
        }
        Ok(())
    }

    /// Checks that the frame was not freed and that memory still holds it: one
    /// 64-byte read of its seal. Reads ([`RemoteFrame::to_record_batches`],
    /// [`RemoteFrame::record_batches`], query scans) do this before they start.
    ///
    /// # Errors
    /// [`Error::Freed`]; [`Error::Stale`] when the seal was zeroed (the frame was
    /// freed through another handle or process) or overwritten; transport errors.
    pub fn check_seal(&self) -> Result<()> {
        self.check_live()?;
        seal::check(&self.env, &self.meta, &self.state.seal)
    }

    /// The metadata.
    pub fn meta(&self) -> &FrameMeta {
        &self.meta
    }

    /// The metadata as JSON, to hand to the next compute element.
    ///
    /// # Errors
    /// [`Error::Freed`]; as [`FrameMeta::to_json`].
    pub fn to_json(&self) -> Result<String> {
        self.check_live()?;
        self.meta.to_json()
    }

    /// The environment the frame's kernels run in.
    pub fn env(&self) -> &FrameEnv {
        &self.env
    }

    /// Rows (no data is read).
    pub fn rows(&self) -> usize {
        self.meta.rows as usize
    }

    /// Row chunks.
    pub fn chunk_count(&self) -> usize {
        self.meta.chunks.len()
    }

    /// Column names (no data is read).
    pub fn column_names(&self) -> Vec<String> {
        self.meta.column_names()
    }

    /// The arrow-rs schema (no data is read); every column nullable.
    ///
    /// # Errors
    /// [`Error::Meta`] for a stored type arrow-rs cannot hold (a decimal wider than
    /// `Decimal128`).
    pub fn arrow_schema(&self) -> Result<SchemaRef> {
        self.arrow_schema_of(&(0..self.meta.schema.len()).collect::<Vec<_>>())
    }

    /// Bytes of all columns in local memory once read (packed values unpacked).
    pub fn data_bytes(&self) -> u64 {
        self.meta.data_bytes()
    }

    /// Bytes of all columns as stored in the memory elements: what writing or
    /// reading the whole frame moves.
    pub fn stored_bytes(&self) -> u64 {
        self.meta.stored_bytes()
    }

    /// Indices of the named columns.
    ///
    /// # Errors
    /// [`Error::UnknownColumn`].
    pub fn column_indices<S: AsRef<str>>(&self, names: &[S]) -> Result<Vec<usize>> {
        names
            .iter()
            .map(|n| self.meta.column_index(n.as_ref()))
            .collect()
    }

    /// Reads the whole frame as arrow-rs record batches, one per stored chunk (after
    /// [`RemoteFrame::check_seal`]).
    ///
    /// # Errors
    /// [`Error::Freed`], [`Error::Stale`]; transport errors; [`Error::Meta`] when the
    /// stored bytes do not form valid arrays.
    pub fn to_record_batches(&self) -> Result<Vec<RecordBatch>> {
        self.check_seal()?;
        let all: Vec<usize> = (0..self.meta.schema.len()).collect();
        self.read_chunks(&all, 0..self.meta.chunks.len())
    }

    /// Reads the named columns only, as arrow-rs record batches (one per stored chunk).
    ///
    /// # Errors
    /// As [`RemoteFrame::select_columns`].
    pub fn select_record_batches<S: AsRef<str>>(&self, names: &[S]) -> Result<Vec<RecordBatch>> {
        let cols = self.column_indices(names)?;
        self.check_seal()?;
        self.read_chunks(&cols, 0..self.meta.chunks.len())
    }

    /// As [`RemoteFrame::batches`], each batch as its chunks' arrow-rs record batches
    /// (of the schema [`RemoteFrame::arrow_schema_of`] gives).
    ///
    /// # Errors
    /// As [`RemoteFrame::batches`].
    pub fn record_batches<S: AsRef<str>>(
        &self,
        columns: Option<&[S]>,
        batch_bytes: u64,
    ) -> Result<Batches<Vec<RecordBatch>>> {
        self.batches_with(columns, batch_bytes, Self::read_chunks)
    }

    fn batches_with<S: AsRef<str>, T: Send + 'static>(
        &self,
        columns: Option<&[S]>,
        batch_bytes: u64,
        read: ReadChunks<T>,
    ) -> Result<Batches<T>> {
        let cols = match columns {
            Some(names) => self.column_indices(names)?,
            None => (0..self.meta.schema.len()).collect(),
        };
        self.check_seal()?;
        Ok(Batches::new(self.clone(), cols, batch_bytes, read))
    }

    /// Gives the frame's remote memory back to the memory elements' allocators: checks
    /// the seal, zeroes it (so the metadata no longer opens anywhere), then frees the
    /// chunks and the seal. Every handle of the frame refuses later use.
    ///
    /// # Errors
    /// [`Error::Freed`] when the frame was already freed through this handle or a
    /// clone; [`Error::Stale`] when memory no longer holds the frame (freed through
    /// another handle); transport errors zeroing the seal (then nothing is freed);
    /// allocator errors (the first one; the other ranges are still freed).
    pub fn free(self) -> Result<()> {
        if self.state.freed.swap(true, Ordering::AcqRel) {
            return Err(Error::Freed {
                frame: self.label(),
            });
        }
        let cleared = seal::check(&self.env, &self.meta, &self.state.seal).and_then(|()| {
            self.meta
                .seal
                .as_ref()
                .map_or(Ok(()), |s| seal::clear(&self.env, s))
        });
        if let Err(e) = cleared {
            self.state.freed.store(false, Ordering::Release);
            return Err(e);
        }
        let elements = self.env.elements();
        let ranges = self
            .meta
            .chunks
            .iter()
            .filter(|c| c.bytes > 0)
            .map(|c| (&c.element, c.addr, c.bytes))
            .chain(
                self.meta
                    .seal
                    .iter()
                    .map(|s| (&s.element, s.addr, SEAL_BYTES)),
            );
        let mut first = None;
        for (element, addr, bytes) in ranges {
            if let Err(e) = elements.free(element, addr, bytes) {
                first.get_or_insert(Error::from(e));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// The arrow-rs schema of columns `cols` (schema indices, as
    /// [`RemoteFrame::column_indices`] gives them), every field nullable: what the
    /// record batches read of those columns carry.
    ///
    /// # Errors
    /// [`Error::Meta`] for a stored type arrow-rs cannot hold.
    pub fn arrow_schema_of(&self, cols: &[usize]) -> Result<SchemaRef> {
        let fields = cols
            .iter()
            .map(|&i| {
                let c = &self.meta.schema[i];
                Ok(Field::new(&c.name, c.dtype.arrow_type()?, true))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(ArrowSchema::new(fields)))
    }

    /// Reads chunks `range` of columns `cols` (schema indices): one record batch per
    /// chunk.
    pub(crate) fn read_chunks(
        &self,
        cols: &[usize],
        range: std::ops::Range<usize>,
    ) -> Result<Vec<RecordBatch>> {
        self.read_chunk_list(cols, &range.collect::<Vec<_>>())
    }

    /// Reads chunks `list` (indices, any order) of columns `cols` (schema indices):
    /// one record batch per chunk, in `list`'s order.
    pub(crate) fn read_chunk_list(
        &self,
        cols: &[usize],
        list: &[usize],
    ) -> Result<Vec<RecordBatch>> {
        let batch_schema = self.arrow_schema_of(cols)?;
        self.fetch_chunk_list(cols, list)?
            .into_iter()
            .map(|f| self.decode_fetched(f, cols, &batch_schema))
            .collect()
    }

    /// Reads chunks `list` (indices, any order) of columns `cols` (schema indices)
    /// as stored, one read per memory element, in `list`'s order: to decode with
    /// [`RemoteFrame::decode_fetched`] when wanted (a chunk stored takes a fraction
    /// of the memory it takes decoded).
    pub(crate) fn fetch_chunk_list(
        &self,
        cols: &[usize],
        list: &[usize],
    ) -> Result<Vec<FetchedChunk>> {
        self.check_live()?;
        let chunks = list
            .iter()
            .map(|&k| {
                self.meta.chunks.get(k).ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "chunk {k} of a frame of {} chunks",
                        self.meta.chunks.len()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let schema = &self.meta.schema;
        // Typed destinations for every buffer wanted.
        let mut dests: Vec<Vec<Vec<codec::Dest>>> = chunks
            .iter()
            .map(|ch| {
                cols.iter()
                    .map(|&i| {
                        codec::destinations(schema[i].dtype, ch.rows as usize, &ch.columns[i])
                    })
                    .collect()
            })
            .collect();
        // One vectored read per memory element, one element after another: a scan
        // reads its next group ahead while the operators above work on the last, and
        // on 2 cores a pool of threads reading the other elements at once (rayon's,
        // spinning between reads) made the SF 1 main job at 25 % 4.5 % slower.
        let mut by_element: Vec<(&str, Vec<ReadOp<'_>>)> = Vec::new();
        let mut total = 0u64;
        for (ch, cd) in chunks.iter().zip(dests.iter_mut()) {
            let slot = match by_element.iter().position(|(e, _)| *e == ch.element) {
                Some(s) => s,
                None => {
                    by_element.push((ch.element.as_str(), Vec::new()));
                    by_element.len() - 1
                }
            };
            for (&i, ds) in cols.iter().zip(cd.iter_mut()) {
                for (b, d) in ch.columns[i].buffers.iter().zip(ds.iter_mut()) {
                    let dst = d.bytes_mut();
                    if dst.is_empty() {
                        continue;
                    }
                    total += dst.len() as u64;
                    by_element[slot].1.push(ReadOp {
                        addr: ch.addr + b.offset,
                        dst,
                    });
                }
            }
        }
        let env = &self.env;
        let read_one = |(name, mut ops): (&str, Vec<ReadOp<'_>>)| -> Result<()> {
            let t = env.transport(name)?;
            let first = ops.first().map(|o| o.addr).unwrap_or(0);
            let len: u64 = ops.iter().map(|o| o.dst.len() as u64).sum();
            t.read_vectored(&mut ops)
                .map_err(|source| Error::Transport {
                    op: "read",
                    element: name.to_owned(),
                    addr: first,
                    len,
                    source: Box::new(source),
                })
        };
        by_element.into_iter().try_for_each(read_one)?;
        env.add_in(total);
        Ok(list
            .iter()
            .zip(dests)
            .map(|(&chunk, buffers)| FetchedChunk { chunk, buffers })
            .collect())
    }

    /// The record batch of a chunk fetched by [`RemoteFrame::fetch_chunk_list`] with
    /// columns `cols` (`schema`: [`RemoteFrame::arrow_schema_of`] them).
    ///
    /// # Errors
    /// [`Error::Meta`] for stored buffers that do not make their column's type.
    pub(crate) fn decode_fetched(
        &self,
        f: FetchedChunk,
        cols: &[usize],
        schema: &SchemaRef,
    ) -> Result<RecordBatch> {
        let ch = self.meta.chunks.get(f.chunk).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "chunk {} of a frame of {} chunks",
                f.chunk,
                self.meta.chunks.len()
            ))
        })?;
        let rows = ch.rows as usize;
        let arrays = cols
            .iter()
            .zip(f.buffers)
            .map(|(&i, ds)| {
                let c = &self.meta.schema[i];
                codec::decode(&c.name, c.dtype, rows, &ch.columns[i], ds)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new_with_options(
            schema.clone(),
            arrays,
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )?)
    }
}

/// A chunk's columns as stored, read by [`RemoteFrame::fetch_chunk_list`].
pub(crate) struct FetchedChunk {
    /// The chunk's index in its frame.
    chunk: usize,
    /// Per column read, its stored buffers.
    buffers: Vec<Vec<codec::Dest>>,
}

impl FetchedChunk {
    /// The chunk's index in its frame.
    pub(crate) fn chunk(&self) -> usize {
        self.chunk
    }
}

/// Batches of a frame; see [`RemoteFrame::batches`].
pub struct Batches<T> {
    frame: RemoteFrame,
    cols: Vec<usize>,
    groups: std::vec::IntoIter<std::ops::Range<usize>>,
    /// How a group of chunks is read (as a DataFrame, or as record batches).
    read: ReadChunks<T>,
    /// The batch being read ahead, and its bytes counted as held meanwhile.
    ahead: Option<(std::thread::JoinHandle<Result<T>>, crate::env::Held)>,
}

/// Reads chunks `range` of columns `cols` of a frame.
type ReadChunks<T> = fn(&RemoteFrame, &[usize], std::ops::Range<usize>) -> Result<T>;

impl<T: Send + 'static> Batches<T> {
    fn new(frame: RemoteFrame, cols: Vec<usize>, batch_bytes: u64, read: ReadChunks<T>) -> Self {
        let mut groups = Vec::new();
        let mut start = 0;
        let mut bytes = 0u64;
        for (k, c) in frame.meta.chunks.iter().enumerate() {
            let b = chunk_column_bytes(&frame.meta.schema, c, &cols);
            if k > start && bytes + b > batch_bytes {
                groups.push(start..k);
                start = k;
                bytes = 0;
            }
            bytes += b;
        }
        if start < frame.meta.chunks.len() {
            groups.push(start..frame.meta.chunks.len());
        }
        Batches {
            frame,
            cols,
            groups: groups.into_iter(),
            read,
            ahead: None,
        }
    }

    fn spawn_next(&mut self) {
        if let Some(g) = self.groups.next() {
            let bytes: u64 = self.frame.meta.chunks[g.clone()]
                .iter()
                .map(|c| chunk_column_bytes(&self.frame.meta.schema, c, &self.cols))
                .sum();
            let held = self.frame.env.hold(bytes);
            let f = self.frame.clone();
            let cols = self.cols.clone();
            let read = self.read;
            self.ahead = Some((std::thread::spawn(move || read(&f, &cols, g)), held));
        }
    }
}

impl<T: Send + 'static> Iterator for Batches<T> {
    type Item = Result<T>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ahead.is_none() {
            self.spawn_next();
        }
        let (h, held) = self.ahead.take()?;
        let out = h.join().unwrap_or_else(|_| {
            Err(Error::InvalidArgument(
                "the read-ahead thread panicked".into(),
            ))
        });
        drop(held); // the caller counts the batch it holds
        if out.is_ok() {
            self.spawn_next();
        }
        Some(out)
    }
}

impl<T> Drop for Batches<T> {
    fn drop(&mut self) {
        if let Some((h, _held)) = self.ahead.take() {
            let _ = h.join();
        }
    }
}

/// Writes record batches chunk by chunk into a new
/// [`RemoteFrame`].
pub struct FrameWriter {
    env: FrameEnv,
    schema: Option<Vec<ColumnMeta>>,
    chunks: Vec<ChunkMeta>,
    rows: u64,
    /// Small pushes gathered until they make a whole chunk (see
    /// [`FrameWriter::coalescing`]), their rows and bytes, and those bytes counted as
    /// held.
    pending: Option<(Vec<RecordBatch>, usize, u64, crate::env::Held)>,
    coalesce: bool,
    /// Fingerprints of the written chunks' heads (see [`crate::seal`]).
    heads: Vec<u64>,
    /// The distinct values of each column written so far.
    distinct: Vec<DistinctSketch>,
}

impl FrameWriter {
    /// A writer whose schema is that of the first batch pushed.
    pub fn new(env: &FrameEnv) -> Self {
        FrameWriter {
            env: env.clone(),
            schema: None,
            chunks: Vec::new(),
            rows: 0,
            pending: None,
            coalesce: false,
            heads: Vec::new(),
            distinct: Vec::new(),
        }
    }

    /// Gathers pushes smaller than a chunk locally until they fill one, so a
    /// selective filter does not leave many tiny chunks behind (the gathered rows
    /// count against the budget).
    pub fn coalescing(mut self) -> Self {
        self.coalesce = true;
        self
    }

    /// A writer for the given arrow-rs schema (so an empty result keeps its columns).
    ///
    /// # Errors
    /// [`Error::UnsupportedType`].
    pub fn with_arrow_schema(env: &FrameEnv, schema: &ArrowSchema) -> Result<Self> {
        let mut w = Self::new(env);
        w.schema = Some(schema_meta(schema)?);
        Ok(w)
    }

    /// Rows pushed so far.
    pub fn rows(&self) -> u64 {
        self.rows
            + self
                .pending
                .as_ref()
                .map_or(0, |(_, rows, _, _)| *rows as u64)
    }

    /// Appends a record batch, cut into chunks of the env's chunk size.
    ///
    /// # Errors
    /// [`Error::UnknownColumn`] / [`Error::TypeMismatch`] when the batch does not
    /// match the schema; [`Error::UnsupportedType`]; allocation and transport errors.
    pub fn push_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        self.check_schema(batch.schema_ref())?;
        let step = self.env.chunk_rows();
        if self.coalesce {
            let rows = batch.num_rows();
            if rows == 0 {
                return Ok(());
            }
            // The rows' own bytes: a batch that is a slice of a larger one would
            // report the whole buffers it shares.
            let bytes = sliced_bytes(batch)?;
            let gathered = match self.pending.take() {
                Some((mut p, n, b, held)) => {
                    p.push(batch.clone());
                    Some((p, n + rows, b + bytes, held))
                }
                None if rows < step => Some((vec![batch.clone()], rows, bytes, self.env.hold(0))),
                None => None,
            };
            match gathered {
                Some((p, n, b, mut held)) if n < step => {
                    held.set(b);
                    self.pending = Some((p, n, b, held));
                    return Ok(());
                }
                Some((p, _, _, _held)) => {
                    let whole = concat_batches(batch.schema_ref(), &p)?;
                    return self.write_rows(&whole);
                }
                None => {}
            }
        }
        self.write_rows(batch)
    }

    /// Sets the schema from the first batch, or checks a batch against it.
    fn check_schema(&mut self, schema: &ArrowSchema) -> Result<()> {
        let meta = schema_meta(schema)?;
        match &self.schema {
            None => {
                self.schema = Some(meta);
                Ok(())
            }
            Some(s) => check_same_schema(s, &meta),
        }
    }

    fn write_rows(&mut self, batch: &RecordBatch) -> Result<()> {
        let step = self.env.chunk_rows();
        let mut off = 0;
        while off < batch.num_rows() {
            let len = step.min(batch.num_rows() - off);
            self.write_chunk(&batch.slice(off, len))?;
            off += len;
        }
        Ok(())
    }

    fn write_chunk(&mut self, batch: &RecordBatch) -> Result<()> {
        self.distinct
            .resize_with(batch.num_columns(), DistinctSketch::default);
        for (sketch, array) in self.distinct.iter_mut().zip(batch.columns()) {
            sketch.add_array(array)?;
        }
        let encoded = batch
            .columns()
            .iter()
            .zip(batch.schema_ref().fields())
            .map(|(a, f)| EncodedColumn::new(f.name(), a))
            .collect::<Result<Vec<_>>>()?;
        let mut columns = Vec::with_capacity(encoded.len());
        let mut pieces: Vec<(u64, &[u8])> = Vec::new();
        let mut offset = 0u64;
        for e in &encoded {
            let mut buffers = Vec::new();
            for b in e.buffers() {
                buffers.push(BufferRef {
                    offset,
                    len: b.len() as u64,
                });
                pieces.push((offset, b));
                offset = (offset + b.len() as u64).next_multiple_of(BUFFER_ALIGN);
            }
            columns.push(ColumnChunk {
                null_count: e.null_count,
                buffers,
                stats: e.stats.clone(),
                packing: e.packing,
                dictionary: e.dictionary,
            });
        }
        let element = self.env.next_element()?;
        let bytes = offset;
        let addr = self.env.elements().allocate(&element, bytes)?;
        let ops: Vec<WriteOp<'_>> = pieces
            .iter()
            .filter(|(_, b)| !b.is_empty())
            .map(|&(o, src)| WriteOp {
                addr: addr + o,
                src,
            })
            .collect();
        if !ops.is_empty() {
            let t = self.env.transport(&element)?;
            if let Err(source) = t.write_vectored(&ops) {
                let _ = self.env.elements().free(&element, addr, bytes);
                return Err(Error::Transport {
                    op: "write",
                    element,
                    addr,
                    len: bytes,
                    source: Box::new(source),
                });
            }
        }
        self.env
            .add_out(pieces.iter().map(|(_, b)| b.len() as u64).sum());
        self.rows += batch.num_rows() as u64;
        self.heads.push(seal::head_of(pieces.iter().copied()));
        self.chunks.push(ChunkMeta {
            rows: batch.num_rows() as u64,
            element,
            addr,
            bytes,
            columns,
        });
        Ok(())
    }

    /// The frame written, sealed: its seal is allocated on the element of its first
    /// chunk (for a frame without chunks, the first element the env places frames on).
    /// A writer dropped without finishing, or whose `finish` fails, frees every
    /// chunk it wrote.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if nothing was pushed and no schema was given;
    /// allocation and transport errors writing the last rows or the seal.
    pub fn finish(mut self) -> Result<RemoteFrame> {
        if let Some((p, _, _, _held)) = self.pending.take() {
            if let Some(first) = p.first() {
                let whole = concat_batches(first.schema_ref(), &p)?;
                self.write_rows(&whole)?;
            }
        }
        let schema = self.schema.take().ok_or_else(|| {
            Error::InvalidArgument("a frame writer finished without a schema or any data".into())
        })?;
        let element = match self.chunks.first() {
            Some(c) => c.element.clone(),
            None => self.env.first_element()?,
        };
        let mut meta = FrameMeta {
            version: LAYOUT_VERSION,
            schema,
            rows: self.rows,
            chunks: std::mem::take(&mut self.chunks),
            seal: None,
            distinct: None,
        };
        // A frame without rows has no sketches to keep: each counts nothing.
        let mut distinct = std::mem::take(&mut self.distinct);
        distinct.resize_with(meta.schema.len(), DistinctSketch::default);
        meta.distinct = Some(distinct);
        let heads = std::mem::take(&mut self.heads);
        match seal::write(&self.env, &mut meta, element, heads) {
            Ok(image) => Ok(RemoteFrame::sealed(self.env.clone(), meta, image)),
            Err(e) => {
                self.chunks = meta.chunks; // freed on drop
                Err(e)
            }
        }
    }
}

impl Drop for FrameWriter {
    /// Frees the chunks of a frame that was not finished.
    fn drop(&mut self) {
        for c in self.chunks.drain(..).filter(|c| c.bytes > 0) {
            if let Err(e) = self.env.elements().free(&c.element, c.addr, c.bytes) {
                tracing::warn!(%e, element = %c.element, addr = c.addr, "freeing a chunk of an unfinished frame");
            }
        }
    }
}

/// Bytes of `batch`'s rows (its slice of the buffers it points into).
fn sliced_bytes(batch: &RecordBatch) -> Result<u64> {
    let mut bytes = 0u64;
    for c in batch.columns() {
        bytes += c.to_data().get_slice_memory_size()? as u64;
    }
    Ok(bytes)
}

pub(crate) fn schema_meta(schema: &ArrowSchema) -> Result<Vec<ColumnMeta>> {
    schema
        .fields()
        .iter()
        .map(|f| {
            Ok(ColumnMeta {
                name: f.name().clone(),
                dtype: codec::column_type(f.name(), f.data_type())?,
            })
        })
        .collect()
}

fn check_same_schema(want: &[ColumnMeta], got: &[ColumnMeta]) -> Result<()> {
    for g in got {
        match want.iter().find(|w| w.name == g.name) {
            None => {
                return Err(Error::UnknownColumn {
                    name: g.name.clone(),
                    known: want
                        .iter()
                        .map(|w| w.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
            }
            Some(w) if w.dtype != g.dtype => {
                return Err(Error::TypeMismatch {
                    column: g.name.clone(),
                    expected: w.dtype.to_string(),
                    found: g.dtype.to_string(),
                })
            }
            Some(_) => {}
        }
    }
    if want.len() != got.len() || want.iter().zip(got).any(|(w, g)| w.name != g.name) {
        return Err(Error::InvalidArgument(format!(
            "columns [{}] do not match the frame's [{}]",
            got.iter()
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            want.iter()
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(())
}

/// Polars `DataFrame`s in and out (feature `polars`): converted at the edge through
/// the Arrow C data interface, sharing buffers. Nothing on the query path uses them.
#[cfg(feature = "polars")]
mod polars_edge {
    use std::sync::Arc;

    use arrow_array::RecordBatch;
    use arrow_schema::{Field, Schema as ArrowSchema, SchemaRef};
    use polars::prelude::{DataFrame, Schema};

    use super::{schema_meta, Batches, FrameWriter, RemoteFrame};
    use crate::env::FrameEnv;
    use crate::error::Result;
    use crate::interop;

    impl RemoteFrame {
        /// Writes `df` to the env's memory elements in chunks of
        /// [`FrameEnv::chunk_rows`] rows.
        ///
        /// # Errors
        /// [`Error::UnsupportedType`] for a column type this crate cannot store;
        /// allocation and transport errors.
        pub fn from_polars(env: &FrameEnv, df: &DataFrame) -> Result<Self> {
            let _t = env.timer();
            let mut w = FrameWriter::new(env);
            w.push(df)?;
            w.finish()
        }

        /// The Polars schema (no data is read): Polars' reading of the Arrow types.
        ///
        /// # Errors
        /// As [`RemoteFrame::arrow_schema`]; [`Error::Polars`].
        pub fn schema(&self) -> Result<Schema> {
            let empty = RecordBatch::new_empty(self.arrow_schema()?);
            Ok(interop::from_record_batches(&[empty])?
                .schema()
                .as_ref()
                .clone())
        }

        /// Reads the whole frame (after [`RemoteFrame::check_seal`]).
        ///
        /// # Errors
        /// [`Error::Freed`], [`Error::Stale`]; transport errors; [`Error::Meta`] when the
        /// stored bytes do not form valid arrays.
        pub fn to_polars(&self) -> Result<DataFrame> {
            self.check_seal()?;
            let all: Vec<usize> = (0..self.meta.schema.len()).collect();
            self.polars_chunks(&all, 0..self.meta.chunks.len())
        }

        /// Reads the named columns only (a projection: other columns are not moved).
        ///
        /// # Errors
        /// [`Error::UnknownColumn`], and as [`RemoteFrame::to_polars`].
        pub fn select_columns<S: AsRef<str>>(&self, names: &[S]) -> Result<DataFrame> {
            let cols = self.column_indices(names)?;
            self.check_seal()?;
            self.polars_chunks(&cols, 0..self.meta.chunks.len())
        }

        /// Chunks `range` of columns `cols` as one DataFrame (one Polars chunk per stored
        /// chunk; the arrays are shared, not copied).
        pub(crate) fn polars_chunks(
            &self,
            cols: &[usize],
            range: std::ops::Range<usize>,
        ) -> Result<DataFrame> {
            let mut batches = self.read_chunks(cols, range)?;
            if batches.is_empty() {
                batches.push(RecordBatch::new_empty(self.arrow_schema_of(cols)?));
            }
            interop::from_record_batches(&batches)
        }

        /// Streams the named columns (all if `columns` is `None`) as batches of whole
        /// chunks holding about `batch_bytes` bytes each (at least one chunk per batch).
        /// The next batch is fetched while the caller works on the current one.
        ///
        /// # Errors
        /// [`Error::UnknownColumn`]; as [`RemoteFrame::check_seal`]; each batch may fail as
        /// [`RemoteFrame::to_polars`].
        pub fn batches<S: AsRef<str>>(
            &self,
            columns: Option<&[S]>,
            batch_bytes: u64,
        ) -> Result<Batches<DataFrame>> {
            self.batches_with(columns, batch_bytes, Self::polars_chunks)
        }

        /// Applies `f` to every batch (a Polars lazy frame of a few chunks) and writes
        /// the results to a new frame: any row-wise Polars query streams through memory
        /// this way, a batch of about a quarter of the budget (at most 64 MiB) at a time.
        ///
        /// # Errors
        /// Polars errors from `f`; transport and allocation errors.
        pub fn map_batches<F>(&self, f: F) -> Result<RemoteFrame>
        where
            F: Fn(polars::prelude::LazyFrame) -> polars::prelude::LazyFrame,
        {
            use polars::prelude::IntoLazy;
            const STREAM_CAP: u64 = 64 << 20;
            let env = self.env();
            let _t = env.timer();
            let budget = env.budget().limit().unwrap_or(u64::MAX);
            let batch_bytes = (budget / 4).clamp(1, STREAM_CAP);
            let mut w = FrameWriter::new(env).coalescing();
            for b in self.batches::<&str>(None, batch_bytes)? {
                let b = b?;
                let read = b.estimated_size() as u64;
                let mut held = env.hold(read);
                let out = f(b.lazy()).collect()?;
                held.set(read + out.estimated_size() as u64);
                w.push(&out)?;
            }
            if w.rows() == 0 {
                let all: Vec<usize> = (0..self.meta.schema.len()).collect();
                let out = f(self.polars_chunks(&all, 0..0)?.lazy()).collect()?;
                w.push(&out)?;
            }
            w.finish()
        }
    }

    impl FrameWriter {
        /// A writer for the given Polars schema (so an empty result keeps its columns).
        ///
        /// # Errors
        /// [`Error::UnsupportedType`].
        pub fn with_schema(env: &FrameEnv, schema: &Schema) -> Result<Self> {
            let empty = DataFrame::empty_with_schema(schema);
            let mut w = Self::new(env);
            w.schema = Some(schema_meta(polars_arrow_schema(&empty)?.as_ref())?);
            Ok(w)
        }

        /// Appends a Polars DataFrame, cut into chunks of the env's chunk size.
        ///
        /// # Errors
        /// As [`FrameWriter::push_batch`].
        pub fn push(&mut self, df: &DataFrame) -> Result<()> {
            if df.height() == 0 {
                // Nothing to write, but the columns say what the frame holds.
                let schema = polars_arrow_schema(df)?;
                return self.check_schema(&schema);
            }
            let step = self.env.chunk_rows();
            let mut off = 0;
            while off < df.height() {
                let len = step.min(df.height() - off);
                // One Polars chunk per slice, so it becomes one record batch (one copy
                // only where the slice spans several chunks).
                let mut slice = df.slice(off as i64, len);
                slice.rechunk_mut();
                for batch in interop::to_record_batches(&slice)? {
                    self.push_batch(&batch)?;
                }
                off += len;
            }
            Ok(())
        }
    }

    /// The arrow-rs schema Polars exports `df`'s columns as.
    fn polars_arrow_schema(df: &DataFrame) -> Result<SchemaRef> {
        let empty = df.clear();
        match interop::to_record_batches(&empty)?.first() {
            Some(b) => Ok(b.schema()),
            None => Ok(Arc::new(ArrowSchema::new(
                empty
                    .get_column_names()
                    .iter()
                    .map(|n| Field::new(n.as_str(), arrow_schema::DataType::Null, true))
                    .collect::<Vec<_>>(),
            ))),
        }
    }
}
