//! Transport I/O: fetches and write-backs grouped per transport into vectored calls,
//! adjacent pieces merged, the transports run in parallel.

use std::sync::Arc;

use scad_core::{ReadOp, WriteOp};

use super::eviction::FrameId;
use super::pages::page_len;
use super::stats;
use super::table::{Dirty, PageKey};
use super::{BufferPool, ElementId, Entry};
use crate::error::{Error, Result};

impl BufferPool {
    /// Fetches pages into their frames: one vectored read per transport, transports
    /// in parallel. Returns the transports whose fetch failed and the first error.
    pub(super) fn fetch(
        &self,
        entries: &[Arc<Entry>],
        pages: &[(FrameId, PageKey)],
    ) -> (Vec<ElementId>, Option<Error>) {
        let groups = group_by_transport(pages.iter().map(|&(f, key)| {
            let len = page_len(key.page, self.page_size, entries[key.t.index()].size);
            (
                key.t,
                key.page * self.page_size as u64,
                self.frame_off(f),
                len,
            )
        }));
        self.run_groups(entries, groups, "fetch", |entry, items| {
            let ranges: Vec<(usize, usize)> = items.iter().map(|i| (i.1, i.2)).collect();
            let mut guards = self
                .buf
                .ranges_mut(&ranges)
                .map_err(|source| Error::Frame {
                    source: Box::new(source),
                })?;
            let mut ops: Vec<ReadOp<'_>> = guards
                .iter_mut()
                .zip(items)
                .map(|(g, i)| ReadOp {
                    addr: i.0,
                    dst: &mut g[..],
                })
                .collect();
            entry.transport.read_vectored(&mut ops)?;
            let bytes: usize = items.iter().map(|i| i.2).sum();
            stats::Counters::add(&self.counters.bytes_in, bytes as u64);
            stats::Counters::add(&self.counters.fetch_calls, 1);
            Ok(())
        })
    }

    /// Writes dirty spans back: one vectored write per transport, transports in
    /// parallel. Returns the transports whose write-back failed and the first error.
    pub(super) fn write_back(
        &self,
        entries: &[Arc<Entry>],
        dirty: &[Dirty],
    ) -> (Vec<ElementId>, Option<Error>) {
        let groups = group_by_transport(dirty.iter().map(|d| {
            let lo = d.span.lo as usize;
            (
                d.key.t,
                d.key.page * self.page_size as u64 + lo as u64,
                self.frame_off(d.frame) + lo,
                d.span.len(),
            )
        }));
        let (failed, err) = self.run_groups(entries, groups, "write-back", |entry, items| {
            let guards = items
                .iter()
                .map(|i| self.buf.range(i.1, i.2))
                .collect::<scad_core::Result<Vec<_>>>()
                .map_err(|source| Error::Frame {
                    source: Box::new(source),
                })?;
            let ops: Vec<WriteOp<'_>> = guards
                .iter()
                .zip(items)
                .map(|(g, i)| WriteOp {
                    addr: i.0,
                    src: &g[..],
                })
                .collect();
            entry.transport.write_vectored(&ops)?;
            let bytes: usize = items.iter().map(|i| i.2).sum();
            stats::Counters::add(&self.counters.bytes_out, bytes as u64);
            Ok(())
        });
        let pages = dirty.iter().filter(|d| !failed.contains(&d.key.t)).count();
        stats::Counters::add(&self.counters.write_backs, pages as u64);
        (failed, err)
    }

    /// Runs `op` for each transport's group, in parallel when there are several.
    fn run_groups(
        &self,
        entries: &[Arc<Entry>],
        groups: Vec<(ElementId, Vec<Item>)>,
        what: &'static str,
        op: impl Fn(&Entry, &[Item]) -> std::result::Result<(), GroupError> + Sync,
    ) -> (Vec<ElementId>, Option<Error>) {
        let run = |(t, items): &(ElementId, Vec<Item>)| -> Result<()> {
            let entry = &entries[t.index()];
            op(entry, items).map_err(|e| match e {
                GroupError::Pool(e) => e,
                GroupError::Core(source) => {
                    let addr = items.first().map_or(0, |i| i.0);
                    let len: usize = items.iter().map(|i| i.2).sum();
                    Error::transport(what, &entry.name, addr, len as u64, source)
                }
            })
        };
        let results: Vec<Result<()>> = if groups.len() <= 1 {
            groups.iter().map(run).collect()
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = groups[1..]
                    .iter()
                    .map(|g| {
                        std::thread::Builder::new()
                            .name("scad-pool-io".into())
                            .spawn_scoped(s, move || run(g))
                            .map_err(|_| g)
                    })
                    .collect();
                let mut out = vec![run(&groups[0])];
                for h in handles {
                    out.push(match h {
                        Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                        Err(g) => run(g),
                    });
                }
                out
            })
        };
        let mut failed = Vec::new();
        let mut first = None;
        for (g, r) in groups.iter().zip(results) {
            if let Err(e) = r {
                failed.push(g.0);
                first.get_or_insert(e);
            }
        }
        (failed, first)
    }
}

/// (remote address, frame offset, length) of one page transfer.
type Item = (u64, usize, usize);

/// Error of one transport group: already a pool error, or a transport error to wrap.
enum GroupError {
    Pool(Error),
    Core(scad_core::Error),
}

impl From<Error> for GroupError {
    fn from(e: Error) -> Self {
        GroupError::Pool(e)
    }
}

impl From<scad_core::Error> for GroupError {
    fn from(e: scad_core::Error) -> Self {
        GroupError::Core(e)
    }
}

/// Groups transfers by transport, each group sorted by remote address.
fn group_by_transport(
    items: impl Iterator<Item = (ElementId, u64, usize, usize)>,
) -> Vec<(ElementId, Vec<Item>)> {
    let mut groups: Vec<(ElementId, Vec<Item>)> = Vec::new();
    for (t, addr, off, len) in items {
        match groups.iter_mut().find(|g| g.0 == t) {
            Some(g) => g.1.push((addr, off, len)),
            None => groups.push((t, vec![(addr, off, len)])),
        }
    }
    for g in &mut groups {
        g.1.sort_unstable_by_key(|i| i.0);
        g.1 = coalesce(&g.1);
    }
    groups
}

/// Merges transfers that are adjacent both remotely and in the frames (consecutive
/// pages in consecutive frames, as a sequential scan usually gets them) into one, so
/// the transport moves fewer, larger pieces.
fn coalesce(items: &[Item]) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::with_capacity(items.len());
    for &(addr, off, len) in items {
        match out.last_mut() {
            Some(last) if last.0 + last.2 as u64 == addr && last.1 + last.2 == off => last.2 += len,
            _ => out.push((addr, off, len)),
        }
    }
    out
}
