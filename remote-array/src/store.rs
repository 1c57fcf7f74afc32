//! [`RemoteStore`]: the named memory elements an element can reach, their allocators,
//! and the buffer pool in front of them.

use std::sync::{Arc, Mutex, PoisonError, RwLock};

use scad_core::Transport;

use crate::alloc::{AllocationState, RemoteAllocator, DEFAULT_ALIGN};
use crate::error::{Error, Result};
use crate::pool::{BufferPool, TransportId};

/// Default stripe unit when an array is spread over several memory elements.
pub const DEFAULT_STRIPE_BYTES: u64 = 1 << 20;

#[derive(Debug)]
struct Element {
    name: String,
    id: TransportId,
    size: u64,
    alloc: Mutex<RemoteAllocator>,
}

/// Memory elements by name, each with its allocator, behind one shared
/// [`BufferPool`]. Arrays refer to elements by name in their metadata, so an array
/// written by one compute element can be opened by another whose store names the
/// same memory elements (over whatever transports reach them there).
///
/// `Send + Sync`; arrays hold it in an `Arc`.
#[derive(Debug)]
pub struct RemoteStore {
    pool: Arc<BufferPool>,
    elements: RwLock<Vec<Arc<Element>>>,
    align: u64,
}

/// One resolved memory element: its name and pool transport.
#[derive(Debug, Clone)]
pub(crate) struct ElementRef {
    pub name: Arc<str>,
    pub id: TransportId,
    pub size: u64,
}

impl RemoteStore {
    /// A store with no elements over `pool`, aligning allocations to 4 KiB.
    pub fn new(pool: Arc<BufferPool>) -> Self {
        Self::with_alignment(pool, DEFAULT_ALIGN)
    }

    /// A store whose allocations are aligned to `align` bytes (rounded up to a power
    /// of two, at least 8).
    pub fn with_alignment(pool: Arc<BufferPool>, align: u64) -> Self {
        RemoteStore {
            pool,
            elements: RwLock::new(Vec::new()),
            align: align
                .max(8)
                .checked_next_power_of_two()
                .unwrap_or(DEFAULT_ALIGN),
        }
    }

    /// The buffer pool every array of this store reads through.
    pub fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    /// Registers memory element `name`, reached through `transport`, allocating from
    /// its whole address space.
    ///
    /// # Errors
    /// [`Error::DuplicateElement`]; transport errors while asking for its size.
    pub fn add_element(&self, name: &str, transport: Arc<dyn Transport>) -> Result<()> {
        let size = transport
            .remote_size()
            .map_err(|e| Error::transport("size", name, 0, 0, e))?;
        self.add_element_range(name, transport, 0..size)
    }

    /// Registers memory element `name`, allocating only from `range` of it (to share
    /// one element between stores, or to leave room for other data). If the pool
    /// already has a transport registered under `name` (a pool shared by several
    /// stores), that transport is used and `transport` is dropped.
    ///
    /// # Errors
    /// [`Error::DuplicateElement`]; [`Error::RemoteRange`] if `range` does not fit the
    /// element; transport errors while asking for its size.
    pub fn add_element_range(
        &self,
        name: &str,
        transport: Arc<dyn Transport>,
        range: std::ops::Range<u64>,
    ) -> Result<()> {
        let mut elements = self
            .elements
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if elements.iter().any(|e| e.name == name) {
            return Err(Error::DuplicateElement {
                name: name.to_owned(),
            });
        }
        let alloc = RemoteAllocator::new(name, range.clone(), self.align)?;
        let id = match self.pool.find_transport(name) {
            Some(id) => id,
            None => self.pool.add_transport(name, transport)?,
        };
        let size = self.pool.transport_size(id).unwrap_or(0);
        if range.end > size {
            return Err(Error::RemoteRange {
                element: name.to_owned(),
                addr: range.start,
                len: range.end - range.start,
                size,
            });
        }
        elements.push(Arc::new(Element {
            name: name.to_owned(),
            id,
            size,
            alloc: Mutex::new(alloc),
        }));
        Ok(())
    }

    /// Names of the registered elements, in registration order.
    pub fn element_names(&self) -> Vec<String> {
        self.list().iter().map(|e| e.name.clone()).collect()
    }

    fn list(&self) -> Vec<Arc<Element>> {
        self.elements
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn find(&self, name: &str) -> Result<Arc<Element>> {
        let list = self.list();
        list.iter()
            .find(|e| e.name == name)
            .cloned()
            .ok_or_else(|| Error::UnknownElement {
                name: name.to_owned(),
                known: list
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    pub(crate) fn element(&self, name: &str) -> Result<ElementRef> {
        let e = self.find(name)?;
        Ok(ElementRef {
            name: Arc::from(e.name.as_str()),
            id: e.id,
            size: e.size,
        })
    }

    /// Allocates `bytes` bytes on element `name` and returns the address.
    ///
    /// # Errors
    /// [`Error::UnknownElement`], [`Error::OutOfRemoteMemory`].
    pub fn allocate(&self, name: &str, bytes: u64) -> Result<u64> {
        let e = self.find(name)?;
        let mut a = e.alloc.lock().unwrap_or_else(PoisonError::into_inner);
        a.allocate(bytes)
    }

    /// Gives back a range allocated on element `name`. Cached pages of the range stay
    /// in the pool until evicted; their contents no longer matter.
    ///
    /// # Errors
    /// [`Error::UnknownElement`], [`Error::BadFree`].
    pub fn free(&self, name: &str, addr: u64, bytes: u64) -> Result<()> {
        let e = self.find(name)?;
        let mut a = e.alloc.lock().unwrap_or_else(PoisonError::into_inner);
        a.free(addr, bytes)
    }

    /// A copy of every element's allocator, to hand to the next compute element so it
    /// allocates where this one stopped.
    pub fn allocation_state(&self) -> AllocationState {
        AllocationState {
            allocators: self
                .list()
                .iter()
                .map(|e| {
                    e.alloc
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .clone()
                })
                .collect(),
        }
    }

    /// Replaces the allocators of the elements named in `state` by the states an
    /// earlier compute element handed on. Elements not named keep theirs.
    ///
    /// # Errors
    /// [`Error::UnknownElement`] for an element this store lacks, [`Error::Meta`] for
    /// an inconsistent state, [`Error::RemoteRange`] for one that exceeds the element.
    /// Nothing changes on error.
    pub fn resume_allocation(&self, state: &AllocationState) -> Result<()> {
        let mut targets = Vec::new();
        for a in &state.allocators {
            a.validate()?;
            let e = self.find(a.element())?;
            let r = a.range();
            if r.end > e.size {
                return Err(Error::RemoteRange {
                    element: e.name.clone(),
                    addr: r.start,
                    len: r.end - r.start,
                    size: e.size,
                });
            }
            targets.push((e, a.clone()));
        }
        for (e, a) in targets {
            *e.alloc.lock().unwrap_or_else(PoisonError::into_inner) = a;
        }
        Ok(())
    }

    /// Writes every dirty page of the pool back (see [`BufferPool::flush`]).
    ///
    /// # Errors
    /// As [`BufferPool::flush`].
    pub fn flush(&self) -> Result<()> {
        self.pool.flush()
    }

    /// Allocates the extents of `bytes` bytes laid out by `placement` in units of
    /// `row_bytes`. On error, whatever was allocated is freed again.
    pub(crate) fn allocate_extents(
        &self,
        placement: &Placement,
        bytes: u64,
        row_bytes: u64,
    ) -> Result<Vec<(ElementRef, u64, u64)>> {
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let names = if placement.elements.is_empty() {
            self.element_names()
        } else {
            placement.elements.clone()
        };
        if names.is_empty() {
            return Err(Error::InvalidArgument(
                "the store has no memory elements to place an array on".into(),
            ));
        }
        let elements = names
            .iter()
            .map(|n| self.element(n))
            .collect::<Result<Vec<_>>>()?;
        let n = elements.len() as u64;
        let row = row_bytes.max(1);
        let unit = if n == 1 {
            bytes
        } else {
            (placement.stripe_bytes / row).max(1) * row
        };
        let units = bytes.div_ceil(unit);
        // Bytes each element holds: its round-robin share of the units.
        let share = |k: u64| -> u64 {
            (0..units)
                .skip(k as usize)
                .step_by(n as usize)
                .map(|i| unit.min(bytes - i * unit))
                .sum()
        };
        let mut bases = Vec::with_capacity(elements.len());
        for (k, e) in elements.iter().enumerate() {
            let b = share(k as u64);
            match self.allocate(&e.name, b) {
                Ok(addr) => bases.push((addr, b)),
                Err(err) => {
                    for (e, (addr, b)) in elements.iter().zip(&bases) {
                        // Best effort: these were just handed out, so freeing works.
                        let _ = self.free(&e.name, *addr, *b);
                    }
                    return Err(err);
                }
            }
        }
        let mut extents: Vec<(ElementRef, u64, u64)> = Vec::with_capacity(units as usize);
        for i in 0..units {
            let k = (i % n) as usize;
            let addr = bases[k].0 + (i / n) * unit;
            let len = unit.min(bytes - i * unit);
            match extents.last_mut() {
                Some(last) if last.0.id == elements[k].id && last.1 + last.2 == addr => {
                    last.2 += len
                }
                _ => extents.push((elements[k].clone(), addr, len)),
            }
        }
        Ok(extents)
    }
}

/// Where a new array goes: which memory elements, and in what stripe unit.
///
/// The array's bytes are cut into stripe units (a whole number of rows, about
/// `stripe_bytes` each) dealt round-robin over the elements, so reading a range of
/// rows fetches from all elements in parallel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    elements: Vec<String>,
    stripe_bytes: u64,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            elements: Vec::new(),
            stripe_bytes: DEFAULT_STRIPE_BYTES,
        }
    }
}

impl Placement {
    /// Striped over every element of the store (the default).
    pub fn all() -> Self {
        Self::default()
    }

    /// All on one element.
    pub fn on(element: &str) -> Self {
        Placement {
            elements: vec![element.to_owned()],
            ..Self::default()
        }
    }

    /// Striped over the named elements, in this order.
    pub fn striped<I, S>(elements: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Placement {
            elements: elements.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Sets the stripe unit (rounded to whole rows, at least one row).
    pub fn stripe_bytes(mut self, bytes: u64) -> Self {
        self.stripe_bytes = bytes.max(1);
        self
    }

    /// The elements named (empty: all of the store's).
    pub fn elements(&self) -> &[String] {
        &self.elements
    }
}
