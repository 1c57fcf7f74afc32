//! Least-recently-used eviction over an intrusive doubly linked list of frames.

use super::{Eviction, FrameId};

const NIL: u32 = u32::MAX;

/// Frames ordered by last use: `head` is the most recent, `tail` the least.
#[derive(Debug)]
pub(crate) struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    linked: Vec<bool>,
    head: u32,
    tail: u32,
}

impl Lru {
    pub(crate) fn new(frames: usize) -> Self {
        Lru {
            prev: vec![NIL; frames],
            next: vec![NIL; frames],
            linked: vec![false; frames],
            head: NIL,
            tail: NIL,
        }
    }

    fn unlink(&mut self, f: u32) {
        let i = f as usize;
        if !self.linked[i] {
            return;
        }
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.linked[i] = false;
    }

    fn push_front(&mut self, f: u32) {
        let i = f as usize;
        self.prev[i] = NIL;
        self.next[i] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = f;
        }
        self.head = f;
        if self.tail == NIL {
            self.tail = f;
        }
        self.linked[i] = true;
    }
}

impl Eviction for Lru {
    fn inserted(&mut self, frame: FrameId) {
        self.unlink(frame);
        self.push_front(frame);
    }

    fn accessed(&mut self, frame: FrameId) {
        if self.linked[frame as usize] {
            self.unlink(frame);
            self.push_front(frame);
        }
    }

    fn removed(&mut self, frame: FrameId) {
        self.unlink(frame);
    }

    fn victim(&mut self, evictable: &mut dyn FnMut(FrameId) -> bool) -> Option<FrameId> {
        let mut f = self.tail;
        while f != NIL {
            if evictable(f) {
                self.unlink(f);
                return Some(f);
            }
            f = self.prev[f as usize];
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recent_goes_first() {
        let mut l = Lru::new(4);
        for f in 0..4 {
            l.inserted(f);
        }
        l.accessed(0);
        l.accessed(2);
        // Recency, oldest first: 1, 3, 0, 2.
        assert_eq!(l.victim(&mut |_| true), Some(1));
        assert_eq!(l.victim(&mut |_| true), Some(3));
        assert_eq!(l.victim(&mut |_| true), Some(0));
        assert_eq!(l.victim(&mut |_| true), Some(2));
        assert_eq!(l.victim(&mut |_| true), None);
    }

    #[test]
    fn pinned_and_removed_frames_are_skipped() {
        let mut l = Lru::new(3);
        for f in 0..3 {
            l.inserted(f);
        }
        assert_eq!(l.victim(&mut |f| f != 0), Some(1), "0 is pinned");
        l.removed(2);
        assert_eq!(l.victim(&mut |f| f != 0), None);
        assert_eq!(l.victim(&mut |_| true), Some(0));
        l.accessed(0); // not tracked: ignored
        assert_eq!(l.victim(&mut |_| true), None);
    }
}
