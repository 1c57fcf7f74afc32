//! Copies between frames and callers' buffers.

use super::eviction::FrameId;
use super::pages::Span;
use super::plan::Plan;
use super::rounds::{Round, SlotKind};
use super::{BufferPool, PoolRead, PoolWrite};
use crate::error::{Error, Result};

impl BufferPool {
    pub(super) fn frame_off(&self, f: FrameId) -> usize {
        f as usize * self.page_size
    }

    /// Copies a read round's pieces out of their frames.
    pub(super) fn copy_out(
        &self,
        plan: &Plan,
        round: &Round<'_>,
        reads: &mut [PoolRead<'_>],
    ) -> Result<()> {
        for (k, p) in plan.pieces[round.start..round.end].iter().enumerate() {
            let slot = &round.slots[round.piece_slot[k] as usize];
            let off = self.frame_off(slot.frame) + p.in_page as usize;
            let g = self
                .buf
                .range(off, p.len as usize)
                .map_err(|source| Error::Frame {
                    source: Box::new(source),
                })?;
            let dst = &mut reads[p.seg as usize].dst;
            copy_bytes(&mut dst[p.seg_off..p.seg_off + p.len as usize], &g);
        }
        Ok(())
    }

    /// Copies a write round's pieces into their frames: those whose page was waited
    /// for (`waited`), or all the others.
    pub(super) fn copy_in(
        &self,
        plan: &Plan,
        round: &mut Round<'_>,
        writes: &[PoolWrite<'_>],
        waited: bool,
    ) -> Result<()> {
        for (k, p) in plan.pieces[round.start..round.end].iter().enumerate() {
            let slot = &mut round.slots[round.piece_slot[k] as usize];
            if slot.waited != waited || slot.kind == SlotKind::Dead {
                continue;
            }
            let off = self.frame_off(slot.frame) + p.in_page as usize;
            let mut g = self
                .buf
                .range_mut(off, p.len as usize)
                .map_err(|source| Error::Frame {
                    source: Box::new(source),
                })?;
            let src = writes[p.seg as usize].src;
            copy_bytes(&mut g, &src[p.seg_off..p.seg_off + p.len as usize]);
            let lo = p.in_page as usize;
            Span::merge(&mut slot.dirty, Span::new(lo, lo + p.len as usize));
        }
        Ok(())
    }
}

/// Copies `src` into `dst` (of the same length).
///
/// `memcpy` implementations that use `rep movsb` for mid-sized copies run several
/// times slower on some CPUs (AMD Zen among them) when the destination lies just after
/// the source modulo 4 KiB ("4K aliasing"). Frames are page aligned and large heap
/// buffers start 16 bytes into a page, so a pool hits exactly that case when copying
/// into a fresh `Vec`; there, copy in 512-byte pieces, which take the vector loop.
pub(super) fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    const PIECE: usize = 512;
    let rel = (dst.as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) % 4096;
    if (1..64).contains(&rel) && src.len() > PIECE {
        for (d, s) in dst.chunks_mut(PIECE).zip(src.chunks(PIECE)) {
            d.copy_from_slice(s);
        }
    } else {
        dst.copy_from_slice(src);
    }
}
