//! Round trips of every primitive element type in 1 to 4 dimensions, over local and
//! tcp memory elements, striped and not.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns unwrap too

mod common;

use common::{env, Setup, BACKENDS};
use ndarray::{Array, ArrayD, Dimension, IxDyn, ShapeBuilder};
use scad_remote_array::{Placement, RemoteArray};

trait Gen: bytemuck::Pod + PartialEq + std::fmt::Debug + Send + Sync {
    fn gen(i: usize) -> Self;
}

macro_rules! gen_int {
    ($($t:ty),*) => {$(
        impl Gen for $t {
            fn gen(i: usize) -> Self {
                (i as $t).wrapping_mul(97).wrapping_add(13)
            }
        }
    )*};
}
gen_int!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize);

impl Gen for f32 {
    fn gen(i: usize) -> Self {
        i as f32 * 0.25 - 100.0
    }
}
impl Gen for f64 {
    fn gen(i: usize) -> Self {
        i as f64 * -1.5e-3 + 7.0
    }
}

fn check_shape<T: Gen, D: Dimension>(env: &common::Env, shape: D, placement: &Placement) {
    let mut k = 0;
    let a = Array::from_shape_simple_fn(shape, || {
        k += 1;
        T::gen(k)
    });
    let remote = RemoteArray::from_array_with(&env.store, &a, placement).unwrap();
    assert_eq!(remote.shape(), a.shape());
    assert_eq!(
        remote.materialize().unwrap(),
        a,
        "{:?} {}",
        env.backend,
        std::any::type_name::<T>()
    );
    // Through metadata, as another element would open it.
    let meta = remote.meta();
    let again = RemoteArray::<T, D>::from_meta(&env.store, &meta).unwrap();
    assert_eq!(again.materialize().unwrap(), a);
    // A dynamic-dimension view of the same bytes.
    let dynamic = RemoteArray::<T, IxDyn>::from_meta(&env.store, &meta).unwrap();
    let back: ArrayD<T> = dynamic.materialize().unwrap();
    assert_eq!(back, a.clone().into_dyn());
}

fn check_type<T: Gen>() {
    for backend in BACKENDS {
        let env = env(backend, Setup::default());
        let striped = Placement::striped(["mem0", "mem1"]).stripe_bytes(300);
        let single = Placement::on("mem1");
        for p in [&striped, &single] {
            check_shape::<T, _>(&env, ndarray::Ix1(1037), p);
            check_shape::<T, _>(&env, ndarray::Ix2(37, 13), p);
            check_shape::<T, _>(&env, ndarray::Ix3(7, 5, 11), p);
            check_shape::<T, _>(&env, ndarray::Ix4(3, 4, 5, 6), p);
        }
        // Empty arrays: no rows, and rows of nothing.
        check_shape::<T, _>(&env, ndarray::Ix2(0, 3), &striped);
        check_shape::<T, _>(&env, ndarray::Ix2(3, 0), &striped);
        let usage = env.store.pool().usage();
        assert_eq!(usage.pinned, 0, "{usage}");
    }
}

macro_rules! type_tests {
    ($($name:ident: $t:ty),* $(,)?) => {$(
        #[test]
        fn $name() {
            check_type::<$t>();
        }
    )*};
}

type_tests!(
    round_trip_u8: u8,
    round_trip_i8: i8,
    round_trip_u16: u16,
    round_trip_i16: i16,
    round_trip_u32: u32,
    round_trip_i32: i32,
    round_trip_u64: u64,
    round_trip_i64: i64,
    round_trip_u128: u128,
    round_trip_i128: i128,
    round_trip_usize: usize,
    round_trip_isize: isize,
    round_trip_f32: f32,
    round_trip_f64: f64,
);

#[test]
fn non_standard_layouts_are_written_in_logical_order() {
    let env = env(common::Backend::Local, Setup::default());
    let f = Array::from_shape_fn((20, 7).f(), |(i, j)| (i * 7 + j) as u32);
    let remote = RemoteArray::from_array(&env.store, &f).unwrap();
    assert_eq!(remote.materialize().unwrap(), f);
    let t = f.t();
    let remote = RemoteArray::from_array(&env.store, &t).unwrap();
    assert_eq!(remote.materialize().unwrap(), t);
}

#[test]
fn striping_spreads_extents_round_robin() {
    let env = env(common::Backend::Local, Setup::default());
    let a = Array::from_shape_fn((100, 4), |(i, j)| (i * 4 + j) as u16); // 8 B rows
    let p = Placement::striped(["mem0", "mem1"]).stripe_bytes(100); // 12 rows = 96 B
    let remote = RemoteArray::from_array_with(&env.store, &a, &p).unwrap();
    let meta = remote.meta();
    assert_eq!(meta.extents.len(), 9, "{meta:?}");
    for (i, e) in meta.extents.iter().enumerate() {
        assert_eq!(e.transport, format!("mem{}", i % 2));
        assert_eq!(e.bytes, if i < 8 { 96 } else { 800 - 8 * 96 });
    }
    assert_eq!(remote.materialize().unwrap(), a);
}
