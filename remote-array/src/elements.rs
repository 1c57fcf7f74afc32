//! [`MemoryElements`]: the memory elements one compute element reaches, by name,
//! each with its transport, size and allocator.
//!
//! This is the one registry of memory elements. A [`BufferPool`](crate::BufferPool)
//! caches pages over it, a [`RemoteStore`](crate::RemoteStore) places arrays on it,
//! and a frame environment reads and writes frames through it, so all of them see
//! one transport per name.

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use scad_core::{Action, Transport};

use crate::alloc::{AllocationState, RemoteAllocator, DEFAULT_ALIGN};
use crate::error::{Error, Result};

/// Names a memory element of one [`MemoryElements`]: its index in registration order.
/// Stable for the life of the registry (elements are never removed), and only
/// meaningful for the registry that returned it. The buffer pool keys its pages by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ElementId(pub(crate) u32);

impl ElementId {
    /// The index of the element in its registry, in registration order.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ElementId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One registered memory element.
#[derive(Debug)]
pub(crate) struct Element {
    pub(crate) name: String,
    pub(crate) id: ElementId,
    pub(crate) transport: Arc<dyn Transport>,
    /// Remote size, asked from the transport once, when registered.
    pub(crate) size: u64,
    alloc: Mutex<RemoteAllocator>,
}

/// The memory elements a compute element reaches: name, transport, size (asked from
/// the transport once) and a [`RemoteAllocator`] each. Names are unique; every
/// element gets a small stable [`ElementId`].
///
/// Arrays and frames refer to elements by name in their metadata, so data written by
/// one compute element can be opened by another whose registry names the same memory
/// elements (over whatever transports reach them there). Hand the allocators on with
/// [`MemoryElements::allocation_state`] and [`MemoryElements::resume_allocation`].
///
/// `Send + Sync`; share it as `Arc<MemoryElements>`.
///
/// # Example
/// ```
/// use std::sync::Arc;
/// use scad_core::transport::LocalTransport;
/// use scad_remote_array::{BufferPool, MemoryElements};
///
/// let elements = Arc::new(MemoryElements::new());
/// let mem = elements.add("mem0", Arc::new(LocalTransport::new(1 << 20)?))?;
/// assert!(elements.add("mem0", Arc::new(LocalTransport::new(1 << 20)?)).is_err());
/// let addr = elements.allocate("mem0", 10_000)?;
///
/// // A page cache over the same elements.
/// let pool = BufferPool::builder(1 << 16)
///     .page_size(4096)
///     .elements(Arc::clone(&elements))
///     .build()?;
/// pool.write(mem, addr, b"hello")?;
/// pool.flush()?;
/// let mut back = [0u8; 5];
/// elements.transport("mem0")?.read(addr, &mut back)?;
/// assert_eq!(&back, b"hello");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct MemoryElements {
    list: RwLock<Vec<Arc<Element>>>,
    align: u64,
}

impl Default for MemoryElements {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryElements {
    /// No elements yet; allocations aligned to 4 KiB.
    pub fn new() -> Self {
        Self::with_alignment(DEFAULT_ALIGN)
    }

    /// No elements yet; allocations aligned to `align` bytes (rounded up to a power of
    /// two, at least 8).
    pub fn with_alignment(align: u64) -> Self {
        MemoryElements {
            list: RwLock::new(Vec::new()),
            align: align
                .max(8)
                .checked_next_power_of_two()
                .unwrap_or(DEFAULT_ALIGN),
        }
    }

    /// The client transports of `action` as elements named after them (see
    /// [`MemoryElements::add_action`]), allocations aligned to 4 KiB.
    ///
    /// # Errors
    /// As [`MemoryElements::add_action`].
    pub fn from_action(action: &Action) -> Result<Self> {
        let elements = Self::new();
        elements.add_action(action)?;
        Ok(elements)
    }

    /// The alignment of every allocation, in bytes.
    pub fn alignment(&self) -> u64 {
        self.align
    }

    /// Registers memory element `name`, reached through `transport`, allocating from
    /// its whole address space. Asks the transport for its size once.
    ///
    /// # Errors
    /// [`Error::DuplicateElement`] if `name` is registered already (nothing changes);
    /// [`Error::Transport`] or [`Error::Timeout`] while asking for its size.
    pub fn add(&self, name: &str, transport: Arc<dyn Transport>) -> Result<ElementId> {
        self.refuse_duplicate(name)?;
        let size = size_of(name, transport.as_ref())?;
        self.insert(name, transport, size, 0..size)
    }

    /// Registers memory element `name`, allocating only from `range` of it (to share
    /// one element between compute elements, or to leave room for other data).
    ///
    /// # Errors
    /// [`Error::DuplicateElement`] if `name` is registered already (nothing changes);
    /// [`Error::RemoteRange`] if `range` does not fit the element;
    /// [`Error::InvalidArgument`] for an inverted range; [`Error::Transport`] or
    /// [`Error::Timeout`] while asking for its size.
    pub fn add_range(
        &self,
        name: &str,
        transport: Arc<dyn Transport>,
        range: Range<u64>,
    ) -> Result<ElementId> {
        self.refuse_duplicate(name)?;
        let size = size_of(name, transport.as_ref())?;
        self.insert(name, transport, size, range)
    }

    /// Registers every client transport of `action` as a memory element of the same
    /// name, waiting (up to the action's timeout) for transports still being
    /// configured. Server transports (the serving side of a memory element) are not
    /// elements this compute element reaches and are skipped. Returns the new ids in
    /// the action's name order.
    ///
    /// # Errors
    /// [`Error::DuplicateElement`] if one of the names is registered already (checked
    /// before anything is added); [`Error::Transport`] or [`Error::Timeout`] when a
    /// transport is not configured in time, was terminated, or cannot tell its size.
    /// Elements registered before such an error stay registered.
    pub fn add_action(&self, action: &Action) -> Result<Vec<ElementId>> {
        let names = action.client_names();
        for name in &names {
            self.refuse_duplicate(name)?;
        }
        names
            .iter()
            .map(|name| {
                let t = action
                    .endpoint(name)
                    .and_then(|ep| ep.transport())
                    .map_err(|e| Error::transport("configure", name, 0, 0, e))?;
                self.add(name, t)
            })
            .collect()
    }

    /// Names of the registered elements, in registration (id) order.
    pub fn names(&self) -> Vec<String> {
        self.list().iter().map(|e| e.name.clone()).collect()
    }

    /// Number of registered elements.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// True if no element is registered.
    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    /// True if an element is registered as `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.read().iter().any(|e| e.name == name)
    }

    /// The id of element `name`.
    ///
    /// # Errors
    /// [`Error::UnknownElement`], listing the registered names.
    pub fn id(&self, name: &str) -> Result<ElementId> {
        self.find(name).map(|e| e.id)
    }

    /// The name element `id` was registered under.
    pub fn name(&self, id: ElementId) -> Option<String> {
        self.get(id).map(|e| e.name.clone())
    }

    /// The transport of element `name`.
    ///
    /// # Errors
    /// [`Error::UnknownElement`], listing the registered names.
    pub fn transport(&self, name: &str) -> Result<Arc<dyn Transport>> {
        self.find(name).map(|e| Arc::clone(&e.transport))
    }

    /// The remote size of element `name` in bytes, as it was when registered.
    ///
    /// # Errors
    /// [`Error::UnknownElement`], listing the registered names.
    pub fn size(&self, name: &str) -> Result<u64> {
        self.find(name).map(|e| e.size)
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

    /// Gives back a range allocated on element `name`. Pages of the range cached by a
    /// buffer pool stay there until evicted; their contents no longer matter.
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
    /// [`Error::UnknownElement`] for an element this registry lacks, [`Error::Meta`]
    /// for an inconsistent state, [`Error::RemoteRange`] for one that exceeds the
    /// element. Nothing changes on error.
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

    // ----- crate internals -------------------------------------------------------

    /// A snapshot of the elements, in id order (index = id).
    pub(crate) fn list(&self) -> Vec<Arc<Element>> {
        self.read().clone()
    }

    /// Element `id`.
    pub(crate) fn get(&self, id: ElementId) -> Option<Arc<Element>> {
        self.read().get(id.index()).cloned()
    }

    /// Element `name`, or [`Error::UnknownElement`] listing the registered names.
    pub(crate) fn find(&self, name: &str) -> Result<Arc<Element>> {
        let list = self.read();
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

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<Element>>> {
        self.list.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn refuse_duplicate(&self, name: &str) -> Result<()> {
        if self.contains(name) {
            return Err(Error::DuplicateElement {
                name: name.to_owned(),
            });
        }
        Ok(())
    }

    /// Adds an element of known `size`, allocating from `range`; checks the name again
    /// under the write lock (the size was asked without it).
    fn insert(
        &self,
        name: &str,
        transport: Arc<dyn Transport>,
        size: u64,
        range: Range<u64>,
    ) -> Result<ElementId> {
        let alloc = RemoteAllocator::new(name, range.clone(), self.align)?;
        if range.end > size {
            return Err(Error::RemoteRange {
                element: name.to_owned(),
                addr: range.start,
                len: range.end - range.start,
                size,
            });
        }
        let mut list = self.list.write().unwrap_or_else(PoisonError::into_inner);
        if list.iter().any(|e| e.name == name) {
            return Err(Error::DuplicateElement {
                name: name.to_owned(),
            });
        }
        let index = u32::try_from(list.len())
            .map_err(|_| Error::InvalidArgument("more than 2^32 memory elements".into()))?;
        let id = ElementId(index);
        list.push(Arc::new(Element {
            name: name.to_owned(),
            id,
            transport,
            size,
            alloc: Mutex::new(alloc),
        }));
        Ok(id)
    }
}

fn size_of(name: &str, transport: &dyn Transport) -> Result<u64> {
    transport
        .remote_size()
        .map_err(|e| Error::transport("size", name, 0, 0, e))
}

#[cfg(test)]
mod tests {
    use scad_core::transport::LocalTransport;

    use super::*;

    fn local(bytes: u64) -> Arc<dyn Transport> {
        Arc::new(LocalTransport::new(bytes).expect("local transport"))
    }

    #[test]
    fn ids_follow_registration_order() {
        let m = MemoryElements::new();
        assert!(m.is_empty());
        let a = m.add("a", local(1 << 16)).unwrap();
        let b = m.add_range("b", local(1 << 16), 4096..8192).unwrap();
        assert_eq!((a.index(), b.index()), (0, 1));
        assert_eq!(m.names(), ["a", "b"]);
        assert_eq!(m.len(), 2);
        assert_eq!(m.id("b").unwrap(), b);
        assert_eq!(m.name(a).as_deref(), Some("a"));
        assert_eq!(m.size("b").unwrap(), 1 << 16);
        assert!(m.contains("a") && !m.contains("c"));
        assert_eq!(b.to_string(), "#1");
    }

    #[test]
    fn a_name_registered_twice_is_refused_and_nothing_changes() {
        let m = MemoryElements::new();
        let first = local(1 << 16);
        m.add("mem", Arc::clone(&first)).unwrap();
        let addr = m.allocate("mem", 100).unwrap();
        let before = m.allocation_state();
        for err in [
            m.add("mem", local(1 << 20)).unwrap_err(),
            m.add_range("mem", local(1 << 20), 0..4096).unwrap_err(),
        ] {
            assert!(
                matches!(&err, Error::DuplicateElement { name } if name == "mem"),
                "{err}"
            );
        }
        assert_eq!(m.names(), ["mem"]);
        assert_eq!(m.size("mem").unwrap(), 1 << 16);
        assert!(Arc::ptr_eq(&m.transport("mem").unwrap(), &first));
        assert_eq!(m.allocation_state(), before);
        m.free("mem", addr, 100).unwrap();
    }

    #[test]
    fn an_unknown_name_lists_the_known_ones() {
        let m = MemoryElements::new();
        m.add("mem0", local(1 << 16)).unwrap();
        m.add("mem1", local(1 << 16)).unwrap();
        for err in [
            m.transport("nope").map(drop).unwrap_err(),
            m.size("nope").map(drop).unwrap_err(),
            m.id("nope").map(drop).unwrap_err(),
            m.allocate("nope", 1).map(drop).unwrap_err(),
            m.free("nope", 0, 1).unwrap_err(),
        ] {
            match &err {
                Error::UnknownElement { name, known } => {
                    assert_eq!(name, "nope");
                    assert_eq!(known, "mem0, mem1");
                }
                other => panic!("unexpected {other}"),
            }
            assert!(err.to_string().contains("mem0, mem1"), "{err}");
        }
    }

    #[test]
    fn a_range_must_fit_the_element() {
        let m = MemoryElements::new();
        let err = m.add_range("mem", local(4096), 0..8192).unwrap_err();
        assert!(
            matches!(err, Error::RemoteRange { size: 4096, .. }),
            "{err}"
        );
        assert!(m.is_empty());
    }

    #[test]
    fn allocations_are_aligned_and_stay_in_range() {
        let m = MemoryElements::with_alignment(100); // rounded up to 128
        assert_eq!(m.alignment(), 128);
        m.add_range("mem", local(1 << 16), 1000..8192).unwrap();
        let a = m.allocate("mem", 10).unwrap();
        let b = m.allocate("mem", 10).unwrap();
        assert_eq!((a % 128, b % 128), (0, 0));
        assert!(a >= 1000 && b >= a + 10);
        assert!(m.allocate("mem", 1 << 20).is_err());
    }

    #[test]
    fn allocate_free_and_resume_round_trip() {
        let m = MemoryElements::new();
        m.add("mem0", local(1 << 20)).unwrap();
        m.add("mem1", local(1 << 20)).unwrap();
        let a = m.allocate("mem0", 10_000).unwrap();
        let b = m.allocate("mem0", 5_000).unwrap();
        m.allocate("mem1", 4096).unwrap();
        m.free("mem0", a, 10_000).unwrap();
        let state = m.allocation_state();
        let json = state.to_json().unwrap();

        // The next compute element: same names, fresh allocators, resumed.
        let next = MemoryElements::new();
        next.add("mem0", local(1 << 20)).unwrap();
        next.add("mem1", local(1 << 20)).unwrap();
        next.resume_allocation(&AllocationState::from_json(&json).unwrap())
            .unwrap();
        assert_eq!(next.allocation_state(), state);
        // The freed range is handed out again, the live one is not.
        let again = next.allocate("mem0", 10_000).unwrap();
        assert_eq!(again, a);
        assert!(next.free("mem0", b, 5_000).is_ok());
        assert!(next.free("mem0", b, 5_000).is_err());
    }

    #[test]
    fn resume_changes_nothing_on_error() {
        let m = MemoryElements::new();
        m.add("mem0", local(1 << 20)).unwrap();
        let mut state = m.allocation_state();
        let mut other = RemoteAllocator::new("elsewhere", 0..4096, 4096).unwrap();
        other.allocate(10).unwrap();
        state.allocators.push(other);
        let before = m.allocation_state();
        let err = m.resume_allocation(&state).unwrap_err();
        assert!(matches!(err, Error::UnknownElement { .. }), "{err}");
        assert_eq!(m.allocation_state(), before);
        let too_big = AllocationState {
            allocators: vec![RemoteAllocator::new("mem0", 0..(2 << 20), 4096).unwrap()],
        };
        let err = m.resume_allocation(&too_big).unwrap_err();
        assert!(matches!(err, Error::RemoteRange { .. }), "{err}");
    }

    #[test]
    fn elements_come_from_an_action() {
        let action = Action::new("test");
        action.add_transport("a;rdma_local;size,4096;").unwrap();
        action.add_transport("b;rdma_local;size,8192;").unwrap();
        action
            .add_transport("srv;rdma_tcp_server;url,tcp://*:0;size,4096;")
            .unwrap();
        let m = MemoryElements::from_action(&action).unwrap();
        assert_eq!(m.names(), ["a", "b"]);
        assert_eq!(m.size("b").unwrap(), 8192);
        // The action's own transport object, not a second connection.
        let t = action.endpoint("a").unwrap().transport().unwrap();
        assert!(Arc::ptr_eq(&m.transport("a").unwrap(), &t));
        // Adding the same action again is refused before anything is added.
        let err = m.add_action(&action).unwrap_err();
        assert!(matches!(err, Error::DuplicateElement { .. }), "{err}");
        assert_eq!(m.len(), 2);
    }
}
