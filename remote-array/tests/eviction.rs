//! Arrays larger than the pool: eviction of dirty pages, streaming materialization,
//! chunked iteration with bounded memory, and parallel map/reduce.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns unwrap too

mod common;

use common::{env, Setup, BACKENDS};
use ndarray::{s, Array1, Array2, Axis};
use scad_remote_array::{EvictionPolicy, Placement, RemoteArray};

#[test]
fn dirty_pages_written_before_eviction_read_back_after() {
    for backend in BACKENDS {
        for policy in [EvictionPolicy::Clock, EvictionPolicy::Lru] {
            let setup = Setup {
                policy,
                pool_bytes: 4 * 1024,
                ..Setup::default()
            };
            let env = env(backend, setup);
            let pool = env.store.pool();
            let a = Array2::from_shape_fn((64, 16), |(i, j)| (i * 16 + j) as f32); // 4 KiB
            let remote = RemoteArray::from_array(&env.store, &a).unwrap();
            // Dirty a few rows, then push them out of the pool by reading something else.
            let patch = Array2::from_elem((3, 16), -1.0f32);
            remote.write_range(10, &patch).unwrap();
            assert!(pool.usage().dirty > 0);
            let other = Array2::from_shape_fn((256, 16), |(i, _)| i as f32);
            let other = RemoteArray::from_array(&env.store, &other).unwrap();
            let before = pool.stats();
            other.materialize().unwrap();
            let after = pool.stats().since(&before);
            assert!(after.evictions > 0, "{backend:?} {policy}: {after}");
            assert_eq!(pool.usage().dirty, 0, "the dirty pages were evicted");
            let mut expect = a.clone();
            expect.slice_mut(s![10..13, ..]).fill(-1.0);
            assert_eq!(
                remote.materialize().unwrap(),
                expect,
                "{backend:?} {policy}"
            );
            assert!(pool.stats().write_backs > 0);
            assert_eq!(pool.usage().pinned, 0);
        }
    }
}

#[test]
fn materialize_and_iterate_four_times_the_pool() {
    for backend in BACKENDS {
        let setup = Setup {
            pool_bytes: 16 * 1024,
            page: 512,
            read_ahead: 4,
            ..Setup::default()
        };
        let env = env(backend, setup);
        let pool = env.store.pool();
        let cap = pool.capacity();
        // 4x the pool: 64 KiB of f64 in rows of 32 values.
        let rows = 4 * cap / (32 * 8);
        let a = Array2::from_shape_fn((rows, 32), |(i, j)| (i * 32 + j) as f64);
        let remote = RemoteArray::from_array(&env.store, &a).unwrap();
        assert_eq!(remote.byte_len() as usize, 4 * cap);
        assert_eq!(remote.materialize().unwrap(), a, "{backend:?}");

        let before = pool.stats();
        let mut means = Array1::<f64>::zeros(32);
        let mut seen = 0;
        for chunk in remote.chunks(20).unwrap() {
            let (r, data) = chunk.unwrap();
            assert_eq!(r.start, seen);
            seen = r.end;
            means += &data.sum_axis(Axis(0));
            let u = pool.usage();
            assert!(u.used <= u.frames, "{u}");
        }
        assert_eq!(seen, rows);
        // The iterator is gone, and with it its prefetch thread: nothing is pinned.
        assert_eq!(pool.usage().pinned, 0);
        means /= rows as f64;
        let expect = a.mean_axis(Axis(0)).unwrap();
        assert!((&means - &expect).iter().all(|d| d.abs() < 1e-9));
        let s = pool.stats().since(&before);
        assert!(s.evictions > 0, "{s}");
        assert!(s.bytes_in >= remote.byte_len() / 2, "{s}");
        assert!(
            s.read_ahead_pages > 0,
            "chunks prefetch their successor: {s}"
        );
    }
}

#[test]
fn parallel_map_and_reduce_over_chunks() {
    for backend in BACKENDS {
        let env = env(backend, Setup::default());
        let a = Array2::from_shape_fn((500, 6), |(i, j)| (i * 6 + j) as i64);
        let remote = RemoteArray::from_array(&env.store, &a).unwrap();
        let sums = remote.map_chunks(64, |r, c| (r, c.sum())).unwrap();
        assert_eq!(sums.len(), 8);
        for (r, sum) in &sums {
            assert_eq!(*sum, a.slice(s![r.clone(), ..]).sum());
        }
        let total = remote
            .slice(100..)
            .unwrap()
            .reduce_chunks(37, || 0i64, |_, c| c.sum(), |x, y| x + y)
            .unwrap();
        assert_eq!(total, a.slice(s![100.., ..]).sum());
        // A mapped array written back to remote memory, of another type and width.
        let doubled = remote
            .map_to_remote(50, &Placement::on("mem1"), |c| {
                c.map(|v| *v as f64 * 2.0).slice(s![.., ..3]).to_owned()
            })
            .unwrap();
        assert_eq!(doubled.shape(), &[500, 3]);
        let expect = a.map(|v| *v as f64 * 2.0).slice(s![.., ..3]).to_owned();
        assert_eq!(doubled.materialize().unwrap(), expect);
        assert_eq!(env.store.pool().usage().pinned, 0);
    }
}

#[test]
fn pool_stats_print_readably() {
    let env = env(common::Backend::Local, Setup::default());
    let a = Array2::from_shape_fn((100, 10), |(i, j)| (i + j) as u8);
    let remote = RemoteArray::from_array(&env.store, &a).unwrap();
    remote.materialize().unwrap();
    remote.materialize().unwrap();
    let text = env.store.pool().to_string();
    for word in [
        "hits",
        "misses",
        "read-ahead",
        "evictions",
        "write-backs",
        "in ",
        "out ",
    ] {
        assert!(text.contains(word), "{text}");
    }
}
