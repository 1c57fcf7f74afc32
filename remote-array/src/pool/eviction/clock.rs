//! CLOCK (second chance) eviction.

use super::{Eviction, FrameId};

/// Reference bits swept by a hand.
#[derive(Debug)]
pub(crate) struct Clock {
    tracked: Vec<bool>,
    referenced: Vec<bool>,
    hand: usize,
}

impl Clock {
    pub(crate) fn new(frames: usize) -> Self {
        Clock {
            tracked: vec![false; frames],
            referenced: vec![false; frames],
            hand: 0,
        }
    }
}

impl Eviction for Clock {
    fn inserted(&mut self, frame: FrameId) {
        self.tracked[frame as usize] = true;
        self.referenced[frame as usize] = true;
    }

    fn accessed(&mut self, frame: FrameId) {
        self.referenced[frame as usize] = true;
    }

    fn removed(&mut self, frame: FrameId) {
        self.tracked[frame as usize] = false;
        self.referenced[frame as usize] = false;
    }

    fn victim(&mut self, evictable: &mut dyn FnMut(FrameId) -> bool) -> Option<FrameId> {
        let n = self.tracked.len();
        // Two full sweeps: the first may only clear reference bits.
        for _ in 0..2 * n + 1 {
            let f = self.hand;
            self.hand = (self.hand + 1) % n.max(1);
            if !self.tracked[f] || !evictable(f as FrameId) {
                continue;
            }
            if self.referenced[f] {
                self.referenced[f] = false;
                continue;
            }
            self.tracked[f] = false;
            return Some(f as FrameId);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_chance_order() {
        let mut c = Clock::new(4);
        for f in 0..4 {
            c.inserted(f);
        }
        // All referenced: the first sweep clears bits, then frame 0 goes.
        assert_eq!(c.victim(&mut |_| true), Some(0));
        // Touch 1: it survives the next round, 2 goes.
        c.accessed(1);
        assert_eq!(c.victim(&mut |_| true), Some(2));
        assert_eq!(c.victim(&mut |_| true), Some(3));
        assert_eq!(c.victim(&mut |_| true), Some(1));
        assert_eq!(c.victim(&mut |_| true), None, "nothing tracked any more");
    }

    #[test]
    fn pinned_frames_are_skipped() {
        let mut c = Clock::new(3);
        for f in 0..3 {
            c.inserted(f);
        }
        assert_eq!(c.victim(&mut |f| f == 2), Some(2));
        assert_eq!(c.victim(&mut |_| false), None);
        c.removed(0);
        assert_eq!(c.victim(&mut |_| true), Some(1));
    }
}
