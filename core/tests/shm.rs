//! POSIX shared memory between threads and between two processes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use scad_core::transport::ShmTransport;
use scad_core::{Error, Transport};

fn unique(tag: &str) -> String {
    format!("test-{tag}-{}", std::process::id())
}

#[test]
fn two_handles_see_the_same_bytes() {
    let id = unique("handles");
    let a = ShmTransport::open(&id, 1 << 20).unwrap();
    assert!(a.created());
    let b = ShmTransport::open(&id, 1 << 20).unwrap();
    assert!(!b.created());
    a.write(12345, b"shared bytes").unwrap();
    let mut back = [0u8; 12];
    b.read(12345, &mut back).unwrap();
    assert_eq!(&back, b"shared bytes");
    assert!(b
        .read((1 << 20) - 4, &mut back)
        .unwrap_err()
        .is_out_of_range());
    assert!(
        matches!(ShmTransport::open(&id, 1 << 21), Err(Error::Shm { .. })),
        "size mismatch must be refused"
    );
    drop(b);
    drop(a);
    // The creator unlinked it: a new open creates a fresh zeroed segment.
    let c = ShmTransport::open(&id, 4096).unwrap();
    assert!(c.created());
    let mut z = [1u8; 4];
    c.read(0, &mut z).unwrap();
    assert_eq!(z, [0; 4]);
}

#[test]
fn bad_ids_and_sizes_are_refused() {
    assert!(matches!(
        ShmTransport::open("nul\0id", 4096),
        Err(Error::Shm { .. })
    ));
    assert!(matches!(
        ShmTransport::open(&unique("zero"), 0),
        Err(Error::Shm { .. })
    ));
    assert!(matches!(
        ShmTransport::open(&unique("huge"), u64::MAX),
        Err(Error::Shm { .. })
    ));
}

/// Run by `another_process_reads_and_writes` in a child process.
#[test]
#[ignore = "helper: run by another_process_reads_and_writes in a child process"]
fn child_process_entry() {
    let id = std::env::var("SCAD_SHM_CHILD_ID").expect("run by the parent test");
    let t = ShmTransport::open(&id, 1 << 16).unwrap();
    assert!(!t.created(), "the parent created the segment");
    let mut msg = [0u8; 11];
    t.read(100, &mut msg).unwrap();
    assert_eq!(&msg, b"from parent");
    t.write(200, b"from child").unwrap();
}

#[test]
fn another_process_reads_and_writes() {
    let id = unique("procs");
    let parent = ShmTransport::open(&id, 1 << 16).unwrap();
    parent.write(100, b"from parent").unwrap();
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry", "--ignored", "--quiet"])
        .env("SCAD_SHM_CHILD_ID", &id)
        .output()
        .unwrap();
    assert!(
        child.status.success(),
        "child process failed:\n{}{}",
        String::from_utf8_lossy(&child.stdout),
        String::from_utf8_lossy(&child.stderr)
    );
    let mut back = [0u8; 10];
    parent.read(200, &mut back).unwrap();
    assert_eq!(&back, b"from child");
}
