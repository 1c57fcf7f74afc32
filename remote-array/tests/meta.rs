//! Metadata through JSON, rejection of corrupted metadata, and allocation handed from
//! one compute element to the next.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns unwrap too

mod common;

use common::{env, reopen, Backend, Setup};
use ndarray::{Array2, Array3, Ix2, Ix3};
use scad_remote_array::{AllocationState, ArrayMeta, Error, Placement, RemoteArray};

fn sample() -> Array2<f32> {
    Array2::from_shape_fn((40, 5), |(i, j)| i as f32 + j as f32 / 10.0)
}

#[test]
fn metadata_round_trips_through_json_to_another_element() {
    let env = env(Backend::Tcp, Setup::default());
    let a = sample();
    let remote = RemoteArray::from_array(&env.store, &a).unwrap();
    let json = remote.slice(5..35).unwrap().meta().to_json().unwrap();
    assert!(json.contains("\"dtype\":\"f32\""), "{json}");

    // A later element: its own pool and connections, the same memory elements.
    let next = reopen(&env, Setup::default());
    let meta = ArrayMeta::from_json(&json).unwrap();
    let opened = RemoteArray::<f32, Ix2>::from_meta(&next, &meta).unwrap();
    assert_eq!(
        opened.materialize().unwrap(),
        a.slice(ndarray::s![5..35, ..])
    );
}

#[test]
fn rows_of_bytes_retyped_as_python_writes_them_open_with_their_element_type() {
    // The Python binding writes every array as rows of bytes and names what they
    // hold with `retyped`; Rust then opens it as a typed array, and Python opens
    // Rust's typed arrays as rows of bytes.
    let env = env(Backend::Tcp, Setup::default());
    let a = sample().mapv(f64::from);
    let bytes = Array2::from_shape_vec(
        (40, 5 * 8),
        bytemuck::cast_slice::<f64, u8>(a.as_slice().unwrap()).to_vec(),
    )
    .unwrap();
    let raw = RemoteArray::from_array(&env.store, &bytes).unwrap();
    raw.flush().unwrap();
    let typed = raw.meta().retyped("f64", &[40, 5]).unwrap();
    let json = typed.to_json().unwrap();
    assert!(
        json.contains("\"dtype\":\"f64\",\"item_size\":8,\"shape\":[40,5]"),
        "{json}"
    );
    let next = reopen(&env, Setup::default());
    let opened =
        RemoteArray::<f64, Ix2>::from_meta(&next, &ArrayMeta::from_json(&json).unwrap()).unwrap();
    assert_eq!(opened.materialize().unwrap(), a);
    let back =
        RemoteArray::<u8, Ix2>::from_meta(&next, &opened.meta().as_byte_rows().unwrap()).unwrap();
    assert_eq!(back.materialize().unwrap(), bytes);
    assert!(matches!(
        RemoteArray::<i64, Ix2>::from_meta(&next, &typed),
        Err(Error::TypeMismatch { .. })
    ));
}

#[test]
fn corrupted_metadata_is_rejected_with_clear_errors() {
    let env = env(Backend::Local, Setup::default());
    let remote = RemoteArray::from_array(&env.store, &sample()).unwrap();
    let good = remote.meta();
    let open = |m: &ArrayMeta| RemoteArray::<f32, Ix2>::from_meta(&env.store, m);

    let mut m = good.clone();
    m.dtype = "i32".into();
    let e = open(&m).unwrap_err();
    assert!(matches!(e, Error::TypeMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("i32") && e.to_string().contains("f32"),
        "{e}"
    );
    assert!(matches!(
        RemoteArray::<f64, Ix2>::from_meta(&env.store, &good),
        Err(Error::TypeMismatch { .. })
    ));

    let mut m = good.clone();
    m.shape = vec![41, 5];
    let e = open(&m).unwrap_err();
    assert!(matches!(e, Error::Shape(_)), "{e}");
    assert!(e.to_string().contains("extents hold"), "{e}");

    assert!(matches!(
        RemoteArray::<f32, Ix3>::from_meta(&env.store, &good),
        Err(Error::Shape(_))
    ));

    let mut m = good.clone();
    m.extents[0].transport = "mem9".into();
    let e = open(&m).unwrap_err();
    assert!(
        matches!(&e, Error::UnknownElement { name, .. } if name == "mem9"),
        "{e}"
    );
    assert!(e.to_string().contains("mem0, mem1"), "{e}");

    let mut m = good.clone();
    m.extents[0].addr = (1 << 20) - 4;
    assert!(matches!(open(&m), Err(Error::RemoteRange { .. })));

    let json = good.to_json().unwrap();
    assert!(matches!(
        ArrayMeta::from_json(&json[..json.len() - 3]),
        Err(Error::MetaJson(_))
    ));
    assert!(matches!(
        ArrayMeta::from_json(&json.replace("\"item_size\":4", "\"item_size\":0")),
        Err(Error::Meta(_))
    ));
    assert!(matches!(
        ArrayMeta::from_json(&json.replace("\"shape\":[40,5]", "\"shape\":[40,6]")),
        Err(Error::Shape(_))
    ));
    assert!(open(&good).is_ok());
}

#[test]
fn allocation_continues_where_the_previous_element_stopped() {
    let env = env(Backend::Tcp, Setup::default());
    let first = RemoteArray::from_array(&env.store, &sample()).unwrap();
    let handoff = env.store.elements().allocation_state().to_json().unwrap();
    let meta_json = first.meta().to_json().unwrap();

    let next = reopen(&env, Setup::default());
    next.elements()
        .resume_allocation(&AllocationState::from_json(&handoff).unwrap())
        .unwrap();
    let b = Array3::from_shape_fn((10, 4, 3), |(i, j, k)| (i * 100 + j * 10 + k) as u64);
    let second = RemoteArray::from_array(&next, &b).unwrap();
    // The new array does not overlap the old one, so both read back intact.
    let old = RemoteArray::<f32, Ix2>::from_meta(&next, &ArrayMeta::from_json(&meta_json).unwrap())
        .unwrap();
    assert_eq!(old.materialize().unwrap(), sample());
    assert_eq!(second.materialize().unwrap(), b);
    for (e1, e2) in first
        .meta()
        .extents
        .iter()
        .zip(second.meta().extents.iter())
    {
        if e1.transport == e2.transport {
            assert!(e2.addr >= e1.addr + e1.bytes || e2.addr + e2.bytes <= e1.addr);
        }
    }
}

#[test]
fn allocation_that_does_not_fit_names_element_size_and_space_left() {
    let env = env(
        Backend::Local,
        Setup {
            element_bytes: 64 * 1024,
            ..Setup::default()
        },
    );
    let e =
        RemoteArray::<u8, _>::empty(&env.store, (100_000, 1), &Placement::on("mem1")).unwrap_err();
    match &e {
        Error::OutOfRemoteMemory {
            element,
            asked,
            left,
            ..
        } => {
            assert_eq!(element, "mem1");
            assert_eq!(*asked, 100_032);
            assert_eq!(*left, 65_536);
        }
        other => panic!("{other}"),
    }
    // A striped allocation that fails on its second element gives back the first.
    let before = env.store.elements().allocation_state();
    assert!(RemoteArray::<u8, _>::empty(&env.store, (120_000, 1), &Placement::all()).is_err());
    assert_eq!(env.store.elements().allocation_state(), before);
    assert!(matches!(
        RemoteArray::<u8, _>::empty(&env.store, (10, 1), &Placement::on("nope")),
        Err(Error::UnknownElement { .. })
    ));
}
