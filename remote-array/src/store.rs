//! [`RemoteStore`]: arrays' view of the memory elements an element can reach (a
//! [`MemoryElements`] registry) and the buffer pool in front of them.

use std::sync::Arc;

use crate::elements::{ElementId, MemoryElements};
use crate::error::{Error, Result};
use crate::pool::BufferPool;

/// Default stripe unit when an array is spread over several memory elements.
pub const DEFAULT_STRIPE_BYTES: u64 = 1 << 20;

/// A [`BufferPool`] and the [`MemoryElements`] it caches: where arrays are placed,
/// allocated and read through. Arrays refer to elements by name in their metadata, so
/// an array written by one compute element can be opened by another whose registry
/// names the same memory elements (over whatever transports reach them there).
///
/// The store keeps no elements of its own: register them with
/// [`RemoteStore::elements`] (the pool's registry), and allocate, free and hand on
/// allocation state there.
///
/// `Send + Sync`; arrays hold it in an `Arc`.
#[derive(Debug)]
pub struct RemoteStore {
    pool: Arc<BufferPool>,
}

/// One resolved memory element: its name, id and size.
#[derive(Debug, Clone)]
pub(crate) struct ElementRef {
    pub name: Arc<str>,
    pub id: ElementId,
    pub size: u64,
}

impl RemoteStore {
    /// A store over `pool` and the memory elements it caches
    /// ([`BufferPool::elements`]).
    pub fn new(pool: Arc<BufferPool>) -> Self {
        RemoteStore { pool }
    }

    /// The buffer pool every array of this store reads through.
    pub fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    /// The memory elements arrays are placed on (the pool's).
    pub fn elements(&self) -> &Arc<MemoryElements> {
        self.pool.elements()
    }

    pub(crate) fn element(&self, name: &str) -> Result<ElementRef> {
        let e = self.elements().find(name)?;
        Ok(ElementRef {
            name: Arc::from(e.name.as_str()),
            id: e.id,
            size: e.size,
        })
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
        let registry = self.elements();
        let names = if placement.elements.is_empty() {
            registry.names()
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
            match registry.allocate(&e.name, b) {
                Ok(addr) => bases.push((addr, b)),
                Err(err) => {
                    for (e, (addr, b)) in elements.iter().zip(&bases) {
                        // Best effort: these were just handed out, so freeing works.
                        let _ = registry.free(&e.name, *addr, *b);
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

    /// The elements named (empty: all of the store's, in registration order).
    pub fn elements(&self) -> &[String] {
        &self.elements
    }
}

#[cfg(test)]
mod tests {
    use scad_core::transport::LocalTransport;
    use scad_core::Transport;

    use super::*;
    use crate::RemoteArray;

    #[test]
    fn a_pool_and_a_store_over_one_registry_see_one_transport_per_name() {
        let elements = Arc::new(MemoryElements::new());
        let t: Arc<dyn Transport> = Arc::new(LocalTransport::new(1 << 20).expect("local"));
        elements.add("mem0", Arc::clone(&t)).expect("add");
        let pool = Arc::new(
            BufferPool::builder(1 << 16)
                .page_size(4096)
                .elements(Arc::clone(&elements))
                .build()
                .expect("pool"),
        );
        let store = Arc::new(RemoteStore::new(Arc::clone(&pool)));
        assert!(Arc::ptr_eq(store.elements(), &elements));
        assert!(Arc::ptr_eq(
            &store.elements().transport("mem0").expect("t"),
            &t
        ));
        // A second transport under the same name is refused, whoever asks.
        let other: Arc<dyn Transport> = Arc::new(LocalTransport::new(1 << 20).expect("local"));
        assert!(matches!(
            store.elements().add("mem0", other),
            Err(Error::DuplicateElement { .. })
        ));
        assert_eq!(elements.names(), ["mem0"]);

        // An array placed through the store allocates from the registry and lands in
        // the one transport, through the pool.
        let data = ndarray::Array2::from_shape_fn((100, 3), |(i, j)| (i * 3 + j) as u32);
        let before = elements.allocation_state();
        let arr = RemoteArray::from_array(&store, &data).expect("array");
        assert_ne!(elements.allocation_state(), before);
        arr.flush().expect("flush");
        let e = &arr.meta().extents[0];
        let mut raw = vec![0u8; e.bytes as usize];
        t.read(e.addr, &mut raw).expect("read");
        assert_eq!(
            raw,
            bytemuck::cast_slice::<u32, u8>(data.as_slice().expect("c order"))
        );
        // Elements added later are placed on too.
        elements
            .add(
                "mem1",
                Arc::new(LocalTransport::new(1 << 20).expect("local")),
            )
            .expect("add");
        let arr = RemoteArray::from_array_with(&store, &data, &Placement::on("mem1"))
            .expect("array on mem1");
        assert_eq!(arr.materialize().expect("read back"), data);
    }
}
