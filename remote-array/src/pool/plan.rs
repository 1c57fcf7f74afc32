//! Cutting a request into page pieces, every range checked before anything moves.

use std::sync::Arc;

use super::pages::{page_len, split};
use super::table::PageKey;
use super::{BufferPool, ElementId, Entry};
use crate::error::{Error, Result};

/// One piece of a request: the part of one range that falls in one page.
#[derive(Debug, Clone, Copy)]
pub(super) struct Piece {
    pub(super) key: PageKey,
    pub(super) in_page: u32,
    pub(super) len: u32,
    /// Bytes of the page inside the remote space.
    pub(super) page_len: u32,
    /// Index of the request range and offset inside it.
    pub(super) seg: u32,
    pub(super) seg_off: usize,
}

/// A request cut into pieces.
pub(super) struct Plan {
    pub(super) pieces: Vec<Piece>,
    pub(super) entries: Vec<Arc<Entry>>,
    /// Per transport touched: (transport, first page, last page).
    pub(super) spans: Vec<(ElementId, u64, u64)>,
}

impl BufferPool {
    /// Cuts a request into page pieces, checking every range first.
    pub(super) fn plan(
        &self,
        ranges: impl Iterator<Item = (ElementId, u64, usize)>,
    ) -> Result<Plan> {
        let entries = self.entries();
        let mut pieces = Vec::new();
        let mut spans: Vec<(ElementId, u64, u64)> = Vec::new();
        for (seg, (t, addr, len)) in ranges.enumerate() {
            let e = entries.get(t.index()).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "memory element {t} is not registered with this pool's elements"
                ))
            })?;
            match addr.checked_add(len as u64) {
                Some(end) if end <= e.size => {}
                _ => {
                    return Err(Error::RemoteRange {
                        element: e.name.clone(),
                        addr,
                        len: len as u64,
                        size: e.size,
                    })
                }
            }
            if len == 0 {
                continue;
            }
            let seg = u32::try_from(seg).map_err(|_| {
                Error::InvalidArgument("more than 2^32 ranges in one request".into())
            })?;
            let first = addr / self.page_size as u64;
            let last = (addr + len as u64 - 1) / self.page_size as u64;
            match spans.iter_mut().find(|s| s.0 == t) {
                Some(s) => {
                    s.1 = s.1.min(first);
                    s.2 = s.2.max(last);
                }
                None => spans.push((t, first, last)),
            }
            pieces.extend(split(addr, len, self.page_size).map(|p| Piece {
                key: PageKey { t, page: p.page },
                in_page: p.in_page as u32,
                len: p.len as u32,
                page_len: page_len(p.page, self.page_size, e.size) as u32,
                seg,
                seg_off: p.range_off,
            }));
        }
        Ok(Plan {
            pieces,
            entries,
            spans,
        })
    }
}
