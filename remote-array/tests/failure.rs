//! A memory server that goes away mid-use: errors, never hangs, and leaves the pool
//! consistent.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns unwrap too

mod common;

use std::time::{Duration, Instant};

use common::{env, Backend, Setup};
use ndarray::Array2;
use scad_remote_array::RemoteArray;

#[test]
fn server_shut_down_mid_fetch_is_an_error_not_a_hang() {
    let setup = Setup {
        elements: 2,
        element_bytes: 8 << 20,
        pool_bytes: 64 * 1024,
        page: 4096,
        ..Setup::default()
    };
    let mut env = env(Backend::Tcp, setup);
    let a = Array2::from_shape_fn((4096, 128), |(i, j)| (i + j) as f32); // 2 MiB, striped
    let remote = RemoteArray::from_array(&env.store, &a).unwrap();
    let pool = env.store.pool().clone();

    let server = env.servers.remove(1);
    let stop = server.shutdown_handle();
    let started = Instant::now();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        stop.shutdown();
        server.shutdown();
    });
    // Keep materializing (each pass streams 2 MiB through a 64 KiB pool) until the
    // server's disappearance shows up.
    let err = loop {
        match remote.materialize() {
            Ok(got) => assert_eq!(got, a),
            Err(e) => break e,
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never failed");
    };
    killer.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(err.is_transport(), "{err}");
    assert!(err.to_string().contains("mem1"), "{err}");
    let u = pool.usage();
    assert_eq!(u.pinned, 0, "{u}");

    // The other element still answers; the dead one keeps failing fast.
    let t0 = Instant::now();
    assert!(remote.materialize().is_err());
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(pool.usage().pinned, 0);
}

#[test]
fn server_gone_before_a_write_back_keeps_the_data_dirty() {
    let mut env = env(
        Backend::Tcp,
        Setup {
            elements: 1,
            ..Setup::default()
        },
    );
    let a = Array2::from_elem((16, 16), 3u8);
    let remote = RemoteArray::from_array(&env.store, &a).unwrap();
    remote
        .write_range(0, &Array2::from_elem((4, 16), 9u8))
        .unwrap();
    let dirty = env.store.pool().usage().dirty;
    assert!(dirty > 0);
    env.servers.remove(0).shutdown();
    let t0 = Instant::now();
    let err = remote.flush().unwrap_err();
    assert!(err.is_transport(), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(
        env.store.pool().usage().dirty,
        dirty,
        "nothing is lost from the pool"
    );
    // Cached pages still read.
    assert_eq!(
        remote.materialize_range(0..4).unwrap(),
        Array2::from_elem((4, 16), 9u8)
    );
}
