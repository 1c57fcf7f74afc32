//! Page arithmetic: which pages a byte range touches, and how long a page is at the
//! end of a remote address space.

/// One page's share of a byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PagePiece {
    /// Page number (`addr / page_size`).
    pub page: u64,
    /// Offset of the piece inside the page.
    pub in_page: usize,
    /// Length of the piece.
    pub len: usize,
    /// Offset of the piece inside the range.
    pub range_off: usize,
}

/// The pieces of `[addr, addr + len)` cut at page boundaries, in address order.
/// `page_size` must be a power of two.
pub(crate) fn split(addr: u64, len: usize, page_size: usize) -> impl Iterator<Item = PagePiece> {
    let ps = page_size as u64;
    let mut pos = 0usize;
    std::iter::from_fn(move || {
        if pos >= len {
            return None;
        }
        let a = addr + pos as u64;
        let page = a / ps;
        let in_page = (a % ps) as usize;
        let n = (page_size - in_page).min(len - pos);
        let piece = PagePiece {
            page,
            in_page,
            len: n,
            range_off: pos,
        };
        pos += n;
        Some(piece)
    })
}

/// Bytes of page `page` that lie inside a remote space of `remote_size` bytes (the
/// last page of a space whose size is not a multiple of the page size is short).
pub(crate) fn page_len(page: u64, page_size: usize, remote_size: u64) -> usize {
    let start = page.saturating_mul(page_size as u64);
    remote_size.saturating_sub(start).min(page_size as u64) as usize
}

/// Number of pages a remote space of `remote_size` bytes has.
pub(crate) fn page_count(page_size: usize, remote_size: u64) -> u64 {
    remote_size.div_ceil(page_size as u64)
}

/// A byte span inside one page, for dirty tracking: `[lo, hi)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub lo: u32,
    pub hi: u32,
}

impl Span {
    pub fn new(lo: usize, hi: usize) -> Self {
        Span {
            lo: lo as u32,
            hi: hi as u32,
        }
    }

    /// The smallest span covering both.
    pub fn union(self, other: Span) -> Span {
        Span {
            lo: self.lo.min(other.lo),
            hi: self.hi.max(other.hi),
        }
    }

    /// Merges `other` into an optional span.
    pub fn merge(into: &mut Option<Span>, other: Span) {
        *into = Some(match *into {
            Some(s) => s.union(other),
            None => other,
        });
    }

    pub fn len(self) -> usize {
        (self.hi - self.lo) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn split_mid_page_and_boundaries() {
        let pieces: Vec<_> = split(100, 300, 128).collect();
        assert_eq!(
            pieces,
            vec![
                PagePiece {
                    page: 0,
                    in_page: 100,
                    len: 28,
                    range_off: 0
                },
                PagePiece {
                    page: 1,
                    in_page: 0,
                    len: 128,
                    range_off: 28
                },
                PagePiece {
                    page: 2,
                    in_page: 0,
                    len: 128,
                    range_off: 156
                },
                PagePiece {
                    page: 3,
                    in_page: 0,
                    len: 16,
                    range_off: 284
                },
            ]
        );
        assert_eq!(split(256, 128, 128).count(), 1, "exactly one aligned page");
        assert_eq!(split(5, 0, 128).count(), 0, "empty range has no pieces");
    }

    #[test]
    fn short_last_page() {
        assert_eq!(page_len(0, 4096, 10_000), 4096);
        assert_eq!(page_len(2, 4096, 10_000), 10_000 - 8192);
        assert_eq!(page_len(3, 4096, 10_000), 0);
        assert_eq!(page_len(u64::MAX, 4096, 10_000), 0);
        assert_eq!(page_count(4096, 10_000), 3);
        assert_eq!(page_count(4096, 8192), 2);
    }

    #[test]
    fn spans_merge() {
        let mut s = None;
        Span::merge(&mut s, Span::new(10, 20));
        Span::merge(&mut s, Span::new(5, 12));
        assert_eq!(s, Some(Span::new(5, 20)));
        assert_eq!(Span::new(5, 20).len(), 15);
    }

    proptest! {
        #[test]
        fn split_covers_range_exactly(addr in 0u64..1 << 40, len in 0usize..100_000, shift in 6u32..16) {
            let ps = 1usize << shift;
            let mut expect_off = 0;
            for p in split(addr, len, ps) {
                prop_assert_eq!(p.range_off, expect_off);
                prop_assert!(p.len > 0 && p.in_page + p.len <= ps);
                prop_assert_eq!(p.page * ps as u64 + p.in_page as u64, addr + p.range_off as u64);
                expect_off += p.len;
            }
            prop_assert_eq!(expect_off, len);
        }
    }
}
