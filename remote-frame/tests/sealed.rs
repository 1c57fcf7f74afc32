//! Frame seals: a freed handle refuses every use, metadata of a freed or reused frame
//! is refused instead of read (in this process, through a second environment, and in
//! a child process over tcp), tampered metadata is refused, freeing twice changes
//! nothing, version 1 metadata fails naming its version, and a failed write leaves
//! nothing allocated.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{available, env, Backend};
use polars::prelude::*;
use scad_core::transport::{LocalTransport, TcpOptions, TcpTransport};
use scad_remote_array::MemoryElements;
use scad_remote_frame::query::expr as q;
use scad_remote_frame::{
    Budget, Error, FrameEnv, FrameMeta, FrameWriter, JoinType, QuerySession, RemoteFrame,
};

/// `a` = 1..=n: sums to n(n+1)/2.
fn table(n: i64) -> DataFrame {
    df!("a" => (1..=n).collect::<Vec<i64>>()).unwrap()
}

/// Same shape as [`table`], other values: sums to 7000 for n = 100.
fn other_table(n: i64) -> DataFrame {
    df!("a" => vec![7000 / n; n as usize]).unwrap()
}

fn sum_of(df: &DataFrame) -> i64 {
    df.column("a")
        .unwrap()
        .as_materialized_series()
        .sum::<i64>()
        .unwrap()
}

fn sql_sum(env: &FrameEnv, frame: &RemoteFrame) -> scad_remote_frame::Result<i64> {
    let s = QuerySession::new(env)?;
    s.register("t", frame)?;
    let out = s.sql("SELECT sum(a) s FROM t")?.to_polars()?;
    Ok(out.column("s").unwrap().i64().unwrap().get(0).unwrap())
}

fn is_freed(r: &scad_remote_frame::Result<impl std::fmt::Debug>, nonce: &str) -> bool {
    matches!(r, Err(Error::Freed { frame }) if frame.contains(nonce))
}

fn nonce_of(frame: &RemoteFrame) -> String {
    format!("{:016x}", frame.meta().seal.as_ref().unwrap().nonce)
}

#[test]
fn a_freed_handle_refuses_every_use_and_never_reads_the_next_frame() {
    let e = env(Backend::Tcp, 16 << 20);
    // One element, so that the next frame reuses the freed memory exactly.
    let env = e.env.with_elements(["mem0"]);
    let rf = RemoteFrame::from_polars(&env, &table(100)).unwrap();
    assert_eq!(sql_sum(&env, &rf).unwrap(), 5050);
    let clone = rf.clone();
    let other_env = rf.with_env(&env.with_budget(Budget::bytes(1 << 20).unwrap()));
    let json = rf.to_json().unwrap();
    let nonce = nonce_of(&rf);
    let session = QuerySession::new(&env).unwrap();
    session.register("t", &rf).unwrap();
    let (chunk, seal) = (rf.meta().chunks[0].addr, rf.meta().seal.clone().unwrap());

    rf.free().unwrap();
    let new = RemoteFrame::from_polars(&env, &other_table(100)).unwrap();
    assert_eq!(
        (
            new.meta().chunks[0].addr,
            new.meta().seal.as_ref().unwrap().addr
        ),
        (chunk, seal.addr),
        "the new frame reuses the freed memory"
    );
    assert_eq!(sql_sum(&env, &new).unwrap(), 7000);

    for h in [&clone, &other_env] {
        assert!(h.is_freed());
        assert!(is_freed(&h.to_polars(), &nonce), "{:?}", h.to_polars());
        assert!(is_freed(&h.select_columns(&["a"]), &nonce));
        assert!(is_freed(
            &h.batches::<&str>(None, 1 << 20).map(drop),
            &nonce
        ));
        assert!(is_freed(&h.to_record_batches(), &nonce));
        assert!(is_freed(&h.to_json(), &nonce));
        assert!(is_freed(&h.check_seal(), &nonce));
        assert!(is_freed(&h.filter(q::col("a").gt(q::lit(1))), &nonce));
        assert!(is_freed(
            &h.group_by(&["a"], [q::count(q::col("a"))]),
            &nonce
        ));
        assert!(is_freed(&sql_sum(&env, h), &nonce));
        // Freeing twice is refused before the allocators are touched.
        let before = env.elements().allocation_state();
        assert!(is_freed(&h.clone().free(), &nonce));
        assert_eq!(env.elements().allocation_state(), before);
    }
    // A session that registered the frame before it was freed refuses to scan it.
    let err = session.sql("SELECT sum(a) s FROM t").unwrap_err();
    assert!(
        matches!(&err, Error::Freed { frame } if frame.contains(&nonce)),
        "{err}"
    );
    // Its metadata opens nowhere: the seal's memory holds the new frame's seal.
    let err = RemoteFrame::from_json(&env, &json).unwrap_err();
    assert!(
        matches!(&err, Error::Stale { frame, reason } if frame.contains(&nonce) && reason.contains("another frame")),
        "{err}"
    );
    // The new frame is untouched.
    assert_eq!(sum_of(&new.to_polars().unwrap()), 7000);
    new.free().unwrap();
}

#[test]
fn metadata_of_a_freed_frame_is_refused_until_and_after_its_memory_is_reused() {
    let e = env(Backend::Local, 16 << 20);
    let env = e.env.with_chunk_rows(40);
    let before = available(&env);
    let rf = RemoteFrame::from_polars(&env, &table(100)).unwrap();
    assert_eq!(rf.chunk_count(), 3);
    let json = rf.to_json().unwrap();
    // Another handle of the same frame, opened from its metadata, reads it.
    let opened = RemoteFrame::from_json(&env, &json).unwrap();
    assert_eq!(sum_of(&opened.to_polars().unwrap()), 5050);
    assert!(!opened.is_freed());

    rf.free().unwrap();
    assert_eq!(available(&env), before, "the frame and its seal were freed");
    let freed = |r: scad_remote_frame::Result<()>| matches!(&r, Err(Error::Stale { reason, .. }) if reason.contains("freed"));
    assert!(freed(RemoteFrame::from_json(&env, &json).map(drop)));
    // The handle opened before (it does not share the freed flag) checks the seal
    // before it reads, scans, or frees.
    assert!(!opened.is_freed());
    assert!(freed(opened.to_polars().map(drop)));
    assert!(freed(opened.batches::<&str>(None, 1 << 20).map(drop)));
    assert!(freed(sql_sum(&env, &opened).map(drop)));
    // Every verb too.
    assert!(freed(opened.filter(q::col("a").gt(q::lit(1))).map(drop)));
    assert!(freed(
        opened.group_by(&["a"], [q::count(q::col("a"))]).map(drop)
    ));
    assert!(freed(opened.distinct::<&str>(None).map(drop)));
    assert!(freed(
        opened.sort(vec![q::col("a").sort(true, false)]).map(drop)
    ));
    assert!(freed(opened.limit(5).map(drop)));
    let live = RemoteFrame::from_polars(&env, &table(3)).unwrap();
    for join in [
        opened.join(&live, ["a"], ["a"], JoinType::Inner),
        live.join(&opened, ["a"], ["a"], JoinType::LeftSemi),
    ] {
        assert!(freed(join.map(drop)));
    }
    live.free().unwrap();
    let state = env.elements().allocation_state();
    assert!(freed(opened.clone().free()));
    assert_eq!(
        env.elements().allocation_state(),
        state,
        "nothing freed twice"
    );

    // The memory is reused by frames of other shapes: still refused.
    let a = RemoteFrame::from_polars(&env.with_chunk_rows(7), &other_table(100)).unwrap();
    let b = RemoteFrame::from_polars(&env, &table(300)).unwrap();
    assert!(RemoteFrame::from_json(&env, &json).is_err());
    assert!(opened.to_polars().is_err());
    assert!(sql_sum(&env, &opened).is_err());
    a.free().unwrap();
    b.free().unwrap();
    assert_eq!(available(&env), before);
}

#[test]
fn a_scan_checks_the_seal_of_a_frame_freed_by_another_handle() {
    let e = env(Backend::Tcp, 16 << 20);
    let env = e.env.with_elements(["mem0"]).with_chunk_rows(30);
    let rf = RemoteFrame::from_polars(&env, &table(100)).unwrap();
    let opened = RemoteFrame::from_json(&env, &rf.to_json().unwrap()).unwrap();
    let session = QuerySession::new(&env).unwrap();
    session.register("t", &opened).unwrap();
    let run = || session.sql("SELECT sum(a) s FROM t");
    assert_eq!(run().unwrap().rows(), 1);
    rf.free().unwrap();
    let new = RemoteFrame::from_polars(&env, &other_table(100)).unwrap();
    let err = run().unwrap_err();
    assert!(matches!(err, Error::Stale { .. }), "{err}");
    assert!(err.to_string().contains(&nonce_of(&opened)), "{err}");
    new.free().unwrap();
}

#[test]
fn tampered_or_overwritten_frames_are_refused() {
    let e = env(Backend::Local, 16 << 20);
    let env = e.env.with_chunk_rows(40);
    let df = common::fact(3, 100, 10);
    let rf = RemoteFrame::from_polars(&env, &df).unwrap();
    let meta = rf.meta().clone();
    let open = |m: &FrameMeta| RemoteFrame::open(&env, m.clone());
    let stale = |m: &FrameMeta, needle: &str| {
        let err = open(m).unwrap_err();
        assert!(
            matches!(&err, Error::Stale { reason, .. } if reason.contains(needle)),
            "{err} lacks {needle:?}"
        );
    };
    let mut m = meta.clone();
    m.seal.as_mut().unwrap().nonce ^= 2;
    stale(&m, "another frame");
    // Rows moved between chunks (the total kept): the buffers no longer fit.
    let mut m = meta.clone();
    m.rows += 1;
    assert!(matches!(open(&m), Err(Error::Meta(_))));
    // A chunk's bounds changed (a query would skip rows): the seal covers them.
    let mut m = meta.clone();
    m.chunks[0].columns[0].stats = None;
    stale(&m, "other metadata");
    // A chunk pointed at another chunk's memory.
    let mut m = meta.clone();
    assert_eq!(m.chunks[0].element, m.chunks[2].element);
    m.chunks[0].addr = m.chunks[2].addr;
    stale(&m, "other metadata");
    // The seal moved elsewhere: no seal there.
    let mut m = meta.clone();
    m.seal.as_mut().unwrap().addr += 4096;
    stale(&m, "no seal");
    // A chunk head mismatch.
    let mut m = meta.clone();
    m.seal.as_mut().unwrap().chunk_heads[1] ^= 1;
    stale(&m, "chunk 1");
    let mut m = meta.clone();
    m.seal.as_mut().unwrap().chunk_heads.pop();
    assert!(matches!(open(&m), Err(Error::Meta(_))));
    assert_eq!(open(&meta).unwrap().to_polars().unwrap().height(), 100);

    // A chunk overwritten while the seal stayed (memory written by someone who did
    // not know the frame).
    let c = &meta.chunks[2];
    let t = env.elements().transport(&c.element).unwrap();
    t.write(c.addr, &[0xAB; 8]).unwrap();
    stale(&meta, "chunk 2 at");
    rf.free().unwrap();
}

#[test]
fn freeing_twice_is_an_error_and_leaves_the_allocators_alone() {
    let e = env(Backend::Local, 16 << 20);
    let env = &e.env;
    let before = available(env);
    let rf = RemoteFrame::from_polars(env, &table(10)).unwrap();
    let clone = rf.clone();
    rf.free().unwrap();
    assert_eq!(available(env), before);
    let state = env.elements().allocation_state();
    let err = clone.clone().free().unwrap_err();
    assert!(matches!(err, Error::Freed { .. }), "{err}");
    assert!(err.to_string().contains("was freed"), "{err}");
    assert_eq!(env.elements().allocation_state(), state);
    // Freed memory handed to another frame: still not freed again.
    let other = RemoteFrame::from_polars(env, &table(10)).unwrap();
    let state = env.elements().allocation_state();
    let err = clone.free().unwrap_err();
    assert!(matches!(err, Error::Freed { .. }), "{err}");
    assert_eq!(env.elements().allocation_state(), state);
    assert_eq!(sum_of(&other.to_polars().unwrap()), 55);
    other.free().unwrap();
    assert_eq!(available(env), before);
}

#[test]
fn version_1_metadata_fails_naming_its_version() {
    let e = env(Backend::Local, 4 << 20);
    let rf = RemoteFrame::from_polars(&e.env, &table(10)).unwrap();
    let mut old: serde_json::Value = serde_json::from_str(&rf.to_json().unwrap()).unwrap();
    old["version"] = 1.into();
    old.as_object_mut().unwrap().remove("seal");
    let err = RemoteFrame::from_json(&e.env, &old.to_string()).unwrap_err();
    assert!(matches!(err, Error::Meta(_)), "{err}");
    assert!(err.to_string().contains("version 1"), "{err}");
    assert!(err.to_string().contains("sealed"), "{err}");
    // Current metadata with its seal removed is refused too.
    let mut unsealed: serde_json::Value = serde_json::from_str(&rf.to_json().unwrap()).unwrap();
    unsealed.as_object_mut().unwrap().remove("seal");
    let err = RemoteFrame::from_json(&e.env, &unsealed.to_string()).unwrap_err();
    assert!(err.to_string().contains("without its seal"), "{err}");
    rf.free().unwrap();
}

#[test]
fn a_failed_write_leaves_nothing_allocated() {
    let elements = Arc::new(MemoryElements::with_alignment(64));
    elements
        .add("mem0", Arc::new(LocalTransport::new(64 << 10).unwrap()))
        .unwrap();
    let env = FrameEnv::new(elements).with_chunk_rows(1000);
    let before = available(&env);
    // Chunks fit until the element is full: the chunks written are freed.
    let err = RemoteFrame::from_polars(&env, &table(100_000)).unwrap_err();
    assert!(matches!(err, Error::Array(_)), "{err}");
    assert_eq!(available(&env), before);
    // A writer dropped before it finishes frees its chunks.
    let mut w = FrameWriter::new(&env);
    w.push(&table(3000)).unwrap();
    assert!(available(&env) < before);
    drop(w);
    assert_eq!(available(&env), before);
    // The chunks fit but the seal does not: nothing stays allocated.
    let probe = RemoteFrame::from_polars(&env, &table(1000)).unwrap();
    let chunk = probe.meta().chunks[0].bytes;
    probe.free().unwrap();
    let filler = env.elements().allocate("mem0", before - chunk).unwrap();
    let err = RemoteFrame::from_polars(&env, &table(1000)).unwrap_err();
    assert!(err.to_string().contains("mem0"), "{err}");
    // No room even for the seal of an empty frame.
    let empty = FrameWriter::with_schema(&env, table(1).schema()).unwrap();
    env.elements().free("mem0", filler, before - chunk).unwrap();
    let filler = env.elements().allocate("mem0", before).unwrap();
    assert!(empty.finish().is_err());
    env.elements().free("mem0", filler, before).unwrap();
    assert_eq!(available(&env), before);
}

/// Set in the child process of [`another_process_refuses_metadata_of_a_freed_frame`]:
/// the servers' addresses and the metadata JSON to open.
const CHILD_SERVERS: &str = "SCAD_SEALED_TEST_SERVERS";
const CHILD_META: &str = "SCAD_SEALED_TEST_META";

/// The child: opens the metadata over its own connections and prints the sum of
/// column `a`, or the error's variant and message.
#[test]
fn child_opens_metadata() {
    let (Ok(servers), Ok(meta)) = (std::env::var(CHILD_SERVERS), std::env::var(CHILD_META)) else {
        return; // only as a child process
    };
    let elements = Arc::new(MemoryElements::with_alignment(64));
    for (i, addr) in servers.split(',').enumerate() {
        let t = TcpTransport::connect(
            addr,
            TcpOptions {
                timeout: Duration::from_secs(5),
                connect_timeout: Duration::from_secs(5),
                ..TcpOptions::default()
            },
        )
        .unwrap();
        elements.add(&format!("mem{i}"), Arc::new(t)).unwrap();
    }
    let env = FrameEnv::new(elements);
    let outcome = RemoteFrame::from_json(&env, &meta).and_then(|f| f.to_polars());
    match outcome {
        Ok(df) => println!("CHILD sum {}", sum_of(&df)),
        Err(e @ Error::Stale { .. }) => println!("CHILD stale {e}"),
        Err(e) => println!("CHILD error {e}"),
    }
}

fn run_child(servers: &str, meta: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_opens_metadata",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_SERVERS, servers)
        .env(CHILD_META, meta)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .find_map(|l| l.split_once("CHILD ").map(|(_, r)| r.to_owned()))
        .unwrap_or_else(|| panic!("the child printed no outcome: {stdout}"))
}

#[test]
fn another_process_refuses_metadata_of_a_freed_frame() {
    let e = env(Backend::Tcp, 16 << 20);
    let servers: Vec<String> = e
        .servers
        .iter()
        .map(|s| s.local_addr().to_string())
        .collect();
    let servers = servers.join(",");
    let env = e.env.with_elements(["mem0"]);
    let rf = RemoteFrame::from_polars(&env, &table(100)).unwrap();
    let json = rf.to_json().unwrap();
    assert_eq!(run_child(&servers, &json), "sum 5050");
    rf.free().unwrap();
    let out = run_child(&servers, &json);
    assert!(out.starts_with("stale") && out.contains("freed"), "{out}");
    let new = RemoteFrame::from_polars(&env, &other_table(100)).unwrap();
    let out = run_child(&servers, &json);
    assert!(
        out.starts_with("stale") && out.contains("another frame"),
        "{out}"
    );
    assert_eq!(run_child(&servers, &new.to_json().unwrap()), "sum 7000");

    // A second environment over its own connections to the same servers (its own
    // allocators, as another process has): the same.
    let elements = Arc::new(MemoryElements::with_alignment(64));
    for (i, addr) in servers.split(',').enumerate() {
        let t = TcpTransport::connect(addr, TcpOptions::default()).unwrap();
        elements.add(&format!("mem{i}"), Arc::new(t)).unwrap();
    }
    let second = FrameEnv::new(elements);
    let err = RemoteFrame::from_json(&second, &json).unwrap_err();
    assert!(matches!(err, Error::Stale { .. }), "{err}");
    let opened = RemoteFrame::from_json(&second, &new.to_json().unwrap()).unwrap();
    new.free().unwrap();
    assert!(matches!(opened.to_polars(), Err(Error::Stale { .. })));
}
