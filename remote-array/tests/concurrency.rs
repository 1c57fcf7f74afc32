//! Concurrent readers and a writer on disjoint ranges of one array, through one pool.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns unwrap too

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use common::{env, Setup, BACKENDS};
use ndarray::{s, Array2};
use scad_remote_array::RemoteArray;

#[test]
fn concurrent_readers_and_a_writer_on_disjoint_ranges() {
    for backend in BACKENDS {
        let setup = Setup {
            pool_bytes: 6 * 1024, // much smaller than the array: constant eviction
            ..Setup::default()
        };
        let env = env(backend, setup);
        let rows = 400;
        let a = Array2::from_shape_fn((rows, 8), |(i, j)| (i * 8 + j) as u32); // 32 B rows
        let remote = RemoteArray::from_array(&env.store, &a).unwrap();
        let (read_part, write_part) = (remote.slice(0..300).unwrap(), remote.slice(300..).unwrap());
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            for k in 0..3usize {
                let (view, a, done) = (&read_part, &a, &done);
                s.spawn(move || {
                    let mut n = 0;
                    while !done.load(Ordering::Relaxed) || n < 3 {
                        let lo = (k * 37 + n * 53) % 250;
                        let got = view.materialize_range(lo..lo + 50).unwrap();
                        assert_eq!(got, a.slice(s![lo..lo + 50, ..]));
                        n += 1;
                    }
                });
            }
            s.spawn(|| {
                // Stops the readers even if an assertion below fails.
                struct Done<'a>(&'a AtomicBool);
                impl Drop for Done<'_> {
                    fn drop(&mut self) {
                        self.0.store(true, Ordering::Relaxed);
                    }
                }
                let _done = Done(&done);
                for round in 0..20u32 {
                    let v = Array2::from_elem((100, 8), round);
                    write_part.write_range(0, &v).unwrap();
                    assert_eq!(write_part.materialize().unwrap(), v);
                }
            });
        });
        remote.flush().unwrap();
        let mut expect = a.clone();
        expect.slice_mut(s![300.., ..]).fill(19);
        assert_eq!(remote.materialize().unwrap(), expect, "{backend:?}");
        let pool = env.store.pool();
        assert_eq!(pool.usage().pinned, 0);
        assert!(pool.stats().evictions > 0);
    }
}

#[test]
fn parallel_chunk_readers_share_the_pool() {
    let env = env(
        common::Backend::Tcp,
        Setup {
            pool_bytes: 4096,
            ..Setup::default()
        },
    );
    let a = Array2::from_shape_fn((1000, 4), |(i, j)| (i * 4 + j) as f64);
    let remote = RemoteArray::from_array(&env.store, &a).unwrap();
    // More rayon tasks than the pool has room for at once: rounds stream and wait.
    let sums = remote.map_chunks(25, |_, c| c.sum()).unwrap();
    assert!((sums.iter().sum::<f64>() - a.sum()).abs() < 1e-6);
    assert_eq!(env.store.pool().usage().pinned, 0);
}
