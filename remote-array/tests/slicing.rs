//! Slices (at page boundaries and mid-page), concatenation, out-of-range requests, and
//! property tests of both against plain ndarray.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns unwrap too

mod common;

use common::{env, Backend, Setup, BACKENDS};
use ndarray::{concatenate, s, Array2, Axis};
use proptest::prelude::*;
use scad_remote_array::{Error, Placement, RemoteArray};

fn matrix(rows: usize, cols: usize) -> Array2<u32> {
    Array2::from_shape_fn((rows, cols), |(i, j)| (i * 1000 + j) as u32)
}

#[test]
fn slices_at_page_boundaries_and_mid_page() {
    for backend in BACKENDS {
        let env = env(backend, Setup::default()); // 256 B pages
                                                  // 16 B rows: 16 rows per page. Single element, so addresses are predictable.
        let a = matrix(200, 4);
        let remote = RemoteArray::from_array_with(&env.store, &a, &Placement::on("mem0")).unwrap();
        let base = remote.meta().extents[0].addr;
        assert_eq!(base % 256, 0, "allocations here are page aligned");
        for (lo, hi) in [
            (0, 16),
            (16, 32),
            (15, 17),
            (16, 17),
            (7, 9),
            (0, 200),
            (199, 200),
            (33, 150),
            (5, 5),
        ] {
            let v = remote.slice(lo..hi).unwrap();
            assert_eq!(v.rows(), hi - lo);
            assert_eq!(
                v.materialize().unwrap(),
                a.slice(s![lo..hi, ..]),
                "{backend:?} {lo}..{hi}"
            );
            // Slices of slices, and ranges of slices.
            if hi - lo > 2 {
                let inner = v.slice(1..hi - lo - 1).unwrap();
                assert_eq!(
                    inner.materialize().unwrap(),
                    a.slice(s![lo + 1..hi - 1, ..])
                );
                assert_eq!(
                    v.materialize_range(1..=1).unwrap(),
                    a.slice(s![lo + 1..lo + 2, ..])
                );
            }
        }
        // A slice is a view: no data moved, same remote bytes.
        let v = remote.slice(16..32).unwrap();
        assert_eq!(v.meta().extents[0].addr, base + 16 * 16);
    }
}

#[test]
fn out_of_range_slices_and_materializations_are_errors() {
    let env = env(Backend::Local, Setup::default());
    let remote = RemoteArray::from_array(&env.store, &matrix(10, 3)).unwrap();
    let err = remote.slice(5..11).unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                what: "slice",
                start: 5,
                end: 11,
                rows: 10
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("10 rows"), "{err}");
    #[allow(clippy::reversed_empty_ranges)]
    let inverted = remote.slice(6..4);
    assert!(matches!(inverted, Err(Error::OutOfRange { .. })));
    assert!(matches!(
        remote.materialize_range(9..12),
        Err(Error::OutOfRange {
            what: "materialize",
            ..
        })
    ));
    assert!(matches!(
        remote.slice(2..4).unwrap().materialize_range(0..3),
        Err(Error::OutOfRange { rows: 2, .. })
    ));
    assert!(matches!(
        remote.write_range(8, &matrix(3, 3)),
        Err(Error::OutOfRange { what: "write", .. })
    ));
    assert!(matches!(
        remote.write_range(0, &matrix(3, 4)),
        Err(Error::Shape(_))
    ));
    let mut small = vec![0u32; 5];
    assert!(matches!(
        remote.read_into(0..2, &mut small),
        Err(Error::Shape(_))
    ));
    assert!(remote.chunks(0).is_err());
    // Zero-dimensional data has no row axis.
    let dynamic =
        RemoteArray::<u32, ndarray::IxDyn>::from_meta(&env.store, &remote.meta()).unwrap();
    let scalar = ndarray::arr0(1u32).into_dyn();
    assert!(matches!(
        dynamic.write_range(0, &scalar),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        RemoteArray::<u32, _>::empty(&env.store, ndarray::IxDyn(&[]), &Placement::all()),
        Err(Error::Shape(_))
    ));
    assert!(matches!(
        RemoteArray::<(), _>::empty(&env.store, (3, 3), &Placement::all()),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(env.store.pool().usage().pinned, 0);
}

#[test]
fn concatenation_along_axis_0() {
    for backend in BACKENDS {
        let env = env(backend, Setup::default());
        let a = matrix(30, 5);
        let b = matrix(7, 5) + 7;
        let ra = RemoteArray::from_array(&env.store, &a).unwrap();
        let rb = RemoteArray::from_array_with(&env.store, &b, &Placement::on("mem1")).unwrap();
        let c = RemoteArray::concat(&[&ra.slice(3..20).unwrap(), &rb, &ra]).unwrap();
        let expect = concatenate(Axis(0), &[a.slice(s![3..20, ..]), b.view(), a.view()]).unwrap();
        assert_eq!(c.materialize().unwrap(), expect);
        assert_eq!(
            c.slice(10..40).unwrap().materialize().unwrap(),
            expect.slice(s![10..40, ..])
        );
        // Metadata-level concatenation agrees.
        let meta = scad_remote_array::ArrayMeta::concat(&[
            ra.slice(3..20).unwrap().meta(),
            rb.meta(),
            ra.meta(),
        ])
        .unwrap();
        assert_eq!(meta, c.meta());
        let wide = RemoteArray::from_array(&env.store, &matrix(2, 6)).unwrap();
        assert!(matches!(
            RemoteArray::concat(&[&ra, &wide]),
            Err(Error::Shape(_))
        ));
        assert!(RemoteArray::<u32, ndarray::Ix2>::concat(&[]).is_err());
    }
}

#[test]
fn write_range_into_a_slice_and_read_back() {
    for backend in BACKENDS {
        let env = env(backend, Setup::default());
        let remote = RemoteArray::<u32, _>::empty(&env.store, (50, 3), &Placement::all()).unwrap();
        let a = matrix(50, 3);
        remote.write_range(0, &a).unwrap();
        let patch = Array2::from_elem((5, 3), 7u32);
        remote
            .slice(20..30)
            .unwrap()
            .write_range(3, &patch)
            .unwrap();
        let mut expect = a.clone();
        expect.slice_mut(s![23..28, ..]).fill(7);
        assert_eq!(remote.materialize().unwrap(), expect);
        remote.flush().unwrap();
        assert_eq!(env.store.pool().usage().dirty, 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn slicing_matches_ndarray(
        rows in 0usize..120,
        cols in 1usize..9,
        cuts in proptest::collection::vec((0usize..130, 0usize..130), 1..4),
        stripe in 1u64..400,
    ) {
        let env = env(Backend::Local, Setup { page: 64, pool_bytes: 1024, ..Setup::default() });
        let a = Array2::from_shape_fn((rows, cols), |(i, j)| (i * 31 + j) as i64 - 50);
        let p = Placement::striped(["mem0", "mem1"]).stripe_bytes(stripe);
        let remote = RemoteArray::from_array_with(&env.store, &a, &p).unwrap();
        let mut view = remote.clone();
        let mut local = a.clone();
        for (x, y) in cuts {
            let (lo, hi) = (x.min(y), x.max(y));
            let got = view.slice(lo..hi);
            if hi > local.nrows() {
                prop_assert!(matches!(got, Err(Error::OutOfRange { .. })), "expected out of range");
                continue;
            }
            view = got.unwrap();
            local = local.slice(s![lo..hi, ..]).to_owned();
            prop_assert_eq!(view.materialize().unwrap(), local.clone());
        }
    }

    #[test]
    fn concatenation_matches_ndarray(
        parts in proptest::collection::vec((0usize..40, 0usize..40, 0usize..40), 1..5),
        cols in 1usize..6,
    ) {
        let env = env(Backend::Local, Setup { page: 64, pool_bytes: 1024, ..Setup::default() });
        let mut remotes = Vec::new();
        let mut locals = Vec::new();
        for (k, (rows, x, y)) in parts.into_iter().enumerate() {
            let a = Array2::from_shape_fn((rows, cols), |(i, j)| (k * 10_000 + i * 10 + j) as u16);
            let (lo, hi) = (x.min(y).min(rows), x.max(y).min(rows));
            let p = Placement::on(if k % 2 == 0 { "mem0" } else { "mem1" });
            remotes.push(RemoteArray::from_array_with(&env.store, &a, &p).unwrap().slice(lo..hi).unwrap());
            locals.push(a.slice(s![lo..hi, ..]).to_owned());
        }
        let refs: Vec<_> = remotes.iter().collect();
        let c = RemoteArray::concat(&refs).unwrap();
        let views: Vec<_> = locals.iter().map(|a| a.view()).collect();
        let expect = concatenate(Axis(0), &views).unwrap();
        prop_assert_eq!(c.materialize().unwrap(), expect.clone());
        let n = expect.nrows();
        prop_assert_eq!(c.materialize_range(n / 3..n).unwrap(), expect.slice(s![n / 3..n, ..]).to_owned());
    }
}
