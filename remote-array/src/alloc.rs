//! Remote allocation: a bump allocator with a first-fit free list over one memory
//! element's address space.
//!
//! The allocator is plain data and serializes with serde, so an element can hand it
//! on (inside an [`AllocationState`]) and the next element allocates where this one
//! stopped, without overwriting what it left behind.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Default alignment of remote allocations, in bytes.
pub const DEFAULT_ALIGN: u64 = 4096;

/// A free range `[addr, addr + bytes)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreeRange {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub bytes: u64,
}

/// Hands out ranges of one memory element's address space.
///
/// Sizes are rounded up to the alignment. Freed ranges go to a free list (kept sorted
/// and coalesced); a freed range at the top lowers the bump pointer again.
///
/// # Example
/// ```
/// use scad_remote_array::RemoteAllocator;
///
/// let mut a = RemoteAllocator::new("mem0", 0..1 << 20, 4096)?;
/// let x = a.allocate(10_000)?; // 12 KiB after alignment
/// let y = a.allocate(4096)?;
/// a.free(x, 10_000)?;
/// assert_eq!(a.allocate(8192)?, x, "first fit reuses the freed range");
/// let json = serde_json::to_string(&a).unwrap();
/// let mut next: RemoteAllocator = serde_json::from_str(&json).unwrap();
/// next.validate()?;
/// assert!(next.allocate(8192)? > y, "the next element goes on where this one stopped");
/// # Ok::<(), scad_remote_array::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteAllocator {
    element: String,
    start: u64,
    end: u64,
    align: u64,
    next: u64,
    free: Vec<FreeRange>,
}

impl RemoteAllocator {
    /// An allocator over `range` of memory element `element`, aligning every
    /// allocation to `align` bytes (a power of two).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an alignment that is not a power of two or an
    /// inverted range.
    pub fn new(element: &str, range: Range<u64>, align: u64) -> Result<Self> {
        if !align.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "alignment {align} is not a power of two"
            )));
        }
        if range.start > range.end {
            return Err(Error::InvalidArgument(format!(
                "allocator range {range:?} of {element:?} is inverted"
            )));
        }
        let start = round_up(range.start, align)
            .unwrap_or(range.end)
            .min(range.end);
        Ok(RemoteAllocator {
            element: element.to_owned(),
            start,
            end: range.end,
            align,
            next: start,
            free: Vec::new(),
        })
    }

    /// The memory element this allocator serves.
    pub fn element(&self) -> &str {
        &self.element
    }

    /// The managed address range.
    pub fn range(&self) -> Range<u64> {
        self.start..self.end
    }

    /// The bump pointer: every address at or above it is free.
    pub fn high_water(&self) -> u64 {
        self.next
    }

    /// Bytes free in all free ranges and above the bump pointer together.
    pub fn available(&self) -> u64 {
        (self.end - self.next) + self.free.iter().map(|f| f.bytes).sum::<u64>()
    }

    /// The largest contiguous free range.
    pub fn largest_free(&self) -> u64 {
        self.free
            .iter()
            .map(|f| f.bytes)
            .chain(std::iter::once(self.end - self.next))
            .max()
            .unwrap_or(0)
    }

    /// Hands out `bytes` bytes (rounded up to the alignment) and returns the address.
    /// A zero-byte request returns the bump pointer and changes nothing.
    ///
    /// # Errors
    /// [`Error::OutOfRemoteMemory`] naming the element, the size asked and the space
    /// left when no free range fits.
    pub fn allocate(&mut self, bytes: u64) -> Result<u64> {
        if bytes == 0 {
            return Ok(self.next);
        }
        let need = round_up(bytes, self.align).ok_or_else(|| self.no_room(u64::MAX))?;
        if let Some(i) = self.free.iter().position(|f| f.bytes >= need) {
            let f = &mut self.free[i];
            let addr = f.addr;
            f.addr += need;
            f.bytes -= need;
            if f.bytes == 0 {
                self.free.remove(i);
            }
            return Ok(addr);
        }
        if self.end - self.next < need {
            return Err(self.no_room(need));
        }
        let addr = self.next;
        self.next += need;
        Ok(addr)
    }

    fn no_room(&self, asked: u64) -> Error {
        Error::OutOfRemoteMemory {
            element: self.element.clone(),
            asked,
            left: self.available(),
            largest: self.largest_free(),
        }
    }

    /// Gives back a range handed out by [`RemoteAllocator::allocate`] (`bytes` as
    /// asked; it is rounded up the same way).
    ///
    /// # Errors
    /// [`Error::BadFree`] for a range that is misaligned, outside what was handed out,
    /// or overlaps a free range (a double free).
    pub fn free(&mut self, addr: u64, bytes: u64) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let bad = |reason: &str| Error::BadFree {
            element: self.element.clone(),
            addr,
            len: bytes,
            reason: reason.to_owned(),
        };
        let len = round_up(bytes, self.align).ok_or_else(|| bad("the length overflows"))?;
        if addr % self.align != 0 {
            return Err(bad("the address is not aligned as allocations are"));
        }
        let end = addr
            .checked_add(len)
            .ok_or_else(|| bad("the range overflows"))?;
        if addr < self.start || end > self.next {
            return Err(bad("the range was never handed out"));
        }
        let i = self.free.partition_point(|f| f.addr < addr);
        let overlaps_prev = i > 0 && self.free[i - 1].addr + self.free[i - 1].bytes > addr;
        let overlaps_next = i < self.free.len() && self.free[i].addr < end;
        if overlaps_prev || overlaps_next {
            return Err(bad("the range is already free (double free)"));
        }
        self.free.insert(i, FreeRange { addr, bytes: len });
        // Coalesce with the neighbours.
        if i + 1 < self.free.len()
            && self.free[i].addr + self.free[i].bytes == self.free[i + 1].addr
        {
            self.free[i].bytes += self.free[i + 1].bytes;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].addr + self.free[i - 1].bytes == self.free[i].addr {
            self.free[i - 1].bytes += self.free[i].bytes;
            self.free.remove(i);
        }
        // A free range at the top goes back to the bump space.
        if let Some(last) = self.free.last().copied() {
            if last.addr + last.bytes == self.next {
                self.next = last.addr;
                self.free.pop();
            }
        }
        Ok(())
    }

    /// Checks a deserialized allocator for consistency.
    ///
    /// # Errors
    /// [`Error::Meta`] describing the first inconsistency.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| {
            Err(Error::Meta(format!(
                "allocator state of {:?}: {what}",
                self.element
            )))
        };
        if !self.align.is_power_of_two() {
            return bad(format!("alignment {} is not a power of two", self.align));
        }
        if !(self.start <= self.next && self.next <= self.end) {
            return bad(format!(
                "bump pointer {:#x} outside {:#x}..{:#x}",
                self.next, self.start, self.end
            ));
        }
        let mut prev_end = self.start;
        for f in &self.free {
            let end = f.addr.checked_add(f.bytes);
            if f.bytes == 0 || f.addr < prev_end || end.is_none_or(|e| e > self.next) {
                return bad(format!(
                    "free range {:#x}+{} is empty, unsorted, overlapping or above the bump pointer",
                    f.addr, f.bytes
                ));
            }
            prev_end = f.addr + f.bytes;
        }
        Ok(())
    }
}

fn round_up(v: u64, align: u64) -> Option<u64> {
    Some(v.checked_add(align - 1)? & !(align - 1))
}

/// The allocators of every memory element of a [`crate::RemoteStore`], to hand to the
/// next element (see [`crate::MemoryElements::allocation_state`] and
/// [`crate::MemoryElements::resume_allocation`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationState {
    /// One allocator per memory element.
    pub allocators: Vec<RemoteAllocator>,
}

impl AllocationState {
    /// The state as JSON.
    ///
    /// # Errors
    /// [`Error::MetaJson`] (only if serde fails, which plain data does not).
    pub fn to_json(&self) -> Result<String> {
        serde_json::to_string(self).map_err(Error::MetaJson)
    }

    /// Parses and validates a state printed by [`AllocationState::to_json`].
    ///
    /// # Errors
    /// [`Error::MetaJson`] for malformed JSON, [`Error::Meta`] for an inconsistent state.
    pub fn from_json(json: &str) -> Result<Self> {
        let s: AllocationState = serde_json::from_str(json).map_err(Error::MetaJson)?;
        s.allocators
            .iter()
            .try_for_each(RemoteAllocator::validate)?;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bump_free_list_and_coalescing() {
        let mut a = RemoteAllocator::new("m", 100..100_000, 64).unwrap();
        assert_eq!(a.range(), 128..100_000, "start is aligned up");
        let x = a.allocate(100).unwrap();
        let y = a.allocate(64).unwrap();
        let z = a.allocate(1).unwrap();
        assert_eq!((x, y, z), (128, 256, 320));
        a.free(y, 64).unwrap();
        a.free(x, 100).unwrap();
        assert_eq!(
            a.free,
            vec![FreeRange {
                addr: 128,
                bytes: 192
            }],
            "neighbours coalesce"
        );
        a.free(z, 1).unwrap();
        assert!(
            a.free.is_empty(),
            "everything free: bump pointer back at start"
        );
        assert_eq!(a.high_water(), 128);
    }

    #[test]
    fn bad_frees_are_refused() {
        let mut a = RemoteAllocator::new("m", 0..4096, 64).unwrap();
        let x = a.allocate(64).unwrap();
        let _y = a.allocate(64).unwrap();
        a.free(x, 64).unwrap();
        assert!(
            matches!(a.free(x, 64), Err(Error::BadFree { .. })),
            "double free"
        );
        assert!(
            matches!(a.free(3, 64), Err(Error::BadFree { .. })),
            "misaligned"
        );
        assert!(
            matches!(a.free(1024, 64), Err(Error::BadFree { .. })),
            "never handed out"
        );
    }

    #[test]
    fn out_of_memory_names_element_size_and_space_left() {
        let mut a = RemoteAllocator::new("mem7", 0..10_000, 1024).unwrap();
        a.allocate(4096).unwrap();
        let e = a.allocate(8000).unwrap_err();
        match &e {
            Error::OutOfRemoteMemory {
                element,
                asked,
                left,
                largest,
            } => {
                assert_eq!(element, "mem7");
                assert_eq!(
                    (*asked, *left, *largest),
                    (8192, 10_000 - 4096, 10_000 - 4096)
                );
            }
            other => panic!("{other}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("mem7") && msg.contains("8192") && msg.contains("5904"),
            "{msg}"
        );
        assert!(a.allocate(u64::MAX).is_err());
    }

    #[test]
    fn state_round_trips_and_is_validated() {
        let mut a = RemoteAllocator::new("m", 0..1 << 20, 4096).unwrap();
        let x = a.allocate(5000).unwrap();
        a.allocate(5000).unwrap();
        a.free(x, 5000).unwrap();
        let state = AllocationState {
            allocators: vec![a.clone()],
        };
        let back = AllocationState::from_json(&state.to_json().unwrap()).unwrap();
        assert_eq!(back, state);
        let corrupt = state
            .to_json()
            .unwrap()
            .replace("\"next\":16384", "\"next\":99999999");
        assert!(matches!(
            AllocationState::from_json(&corrupt),
            Err(Error::Meta(_))
        ));
        assert!(matches!(
            AllocationState::from_json("{\"allocators\": 3}"),
            Err(Error::MetaJson(_))
        ));
    }
}
