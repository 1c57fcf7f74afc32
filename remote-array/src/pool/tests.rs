//! Unit tests of the pool against in-process transports, including one that fails on
//! demand.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use scad_core::transport::LocalTransport;
use scad_core::{ReadOp, Transport, TransportStats};

use super::*;

/// A local transport that can be told to fail, to test error paths.
#[derive(Debug)]
struct Flaky {
    inner: LocalTransport,
    fail_reads: AtomicBool,
    fail_writes: AtomicBool,
    /// Vectored reads that succeed before every further one fails.
    reads_left: AtomicUsize,
}

impl Flaky {
    fn new(size: u64) -> Arc<Self> {
        Arc::new(Flaky {
            inner: LocalTransport::new(size).unwrap(),
            fail_reads: AtomicBool::new(false),
            fail_writes: AtomicBool::new(false),
            reads_left: AtomicUsize::new(usize::MAX),
        })
    }
}

fn broken() -> scad_core::Error {
    scad_core::Error::Terminated {
        name: "flaky".into(),
    }
}

impl Transport for Flaky {
    fn describe(&self) -> String {
        "flaky".into()
    }
    fn remote_size(&self) -> scad_core::Result<u64> {
        self.inner.remote_size()
    }
    fn read(&self, addr: u64, dst: &mut [u8]) -> scad_core::Result<()> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(broken());
        }
        self.inner.read(addr, dst)
    }
    fn write(&self, addr: u64, src: &[u8]) -> scad_core::Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) {
            return Err(broken());
        }
        self.inner.write(addr, src)
    }
    fn read_vectored(&self, ops: &mut [ReadOp<'_>]) -> scad_core::Result<()> {
        if self.fail_reads.load(Ordering::SeqCst) {
            return Err(broken());
        }
        if self.reads_left.fetch_sub(1, Ordering::SeqCst) == 0 {
            self.reads_left.store(0, Ordering::SeqCst);
            return Err(broken());
        }
        self.inner.read_vectored(ops)
    }
    fn stats(&self) -> TransportStats {
        self.inner.stats()
    }
}

fn pool(capacity: usize, page: usize, policy: EvictionPolicy) -> BufferPool {
    BufferPool::builder(capacity)
        .page_size(page)
        .policy(policy)
        .read_ahead(0)
        .build()
        .unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn builder_rejects_bad_settings() {
    assert!(matches!(
        BufferPool::builder(1 << 20).page_size(1000).build(),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        BufferPool::builder(100).page_size(4096).build(),
        Err(Error::Config(_))
    ));
    let p = BufferPool::builder(10_000).page_size(4096).build().unwrap();
    assert_eq!((p.frames(), p.capacity()), (2, 8192));
}

#[test]
fn misses_of_one_request_are_fetched_in_one_call() {
    let p = pool(64 * 1024, 1024, EvictionPolicy::Clock);
    let local = Arc::new(LocalTransport::new(1 << 20).unwrap());
    let data = pattern(10_000, 3);
    local.write(500, &data).unwrap();
    let t = p.elements().add("m", local.clone()).unwrap();
    let before = local.stats();
    let mut back = vec![0u8; data.len()];
    p.read(t, 500, &mut back).unwrap();
    assert_eq!(back, data);
    let s = p.stats();
    assert_eq!(s.misses, 11, "bytes 500..10500 touch pages 0..=10: {s}");
    assert_eq!(s.fetch_calls, 1);
    assert!(local.stats().bytes_read - before.bytes_read >= 10_000);
    // Again: all hits, no transport traffic.
    p.read(t, 500, &mut back).unwrap();
    assert_eq!(p.stats().hits, 11);
    assert_eq!(p.stats().fetch_calls, 1);
}

#[test]
fn eviction_writes_dirty_pages_back() {
    for policy in [EvictionPolicy::Clock, EvictionPolicy::Lru] {
        let p = pool(4 * 256, 256, policy);
        let local = Arc::new(LocalTransport::new(64 * 1024).unwrap());
        let t = p.elements().add("m", local.clone()).unwrap();
        let data = pattern(16 * 256 + 77, 9);
        p.write(t, 100, &data).unwrap();
        let s = p.stats();
        assert!(s.evictions >= 12 && s.write_backs >= 12, "{policy}: {s}");
        let mut back = vec![0u8; data.len()];
        p.read(t, 100, &mut back).unwrap();
        assert_eq!(back, data, "{policy}");
        p.flush().unwrap();
        assert_eq!(p.usage().dirty, 0);
        let mut direct = vec![0u8; data.len()];
        local.read(100, &mut direct).unwrap();
        assert_eq!(
            direct, data,
            "{policy}: remote memory has every byte after flush"
        );
        assert_eq!(p.usage().pinned, 0);
    }
}

#[test]
fn only_the_dirty_span_is_written_back() {
    let p = pool(2 * 256, 256, EvictionPolicy::Lru);
    let local = Arc::new(LocalTransport::new(4096).unwrap());
    let t = p.elements().add("m", local.clone()).unwrap();
    p.read(t, 0, &mut [0u8; 256]).unwrap();
    // Someone else changes byte 200 of page 0 behind the pool's back.
    local.write(200, &[7]).unwrap();
    p.write(t, 10, &[1, 2, 3]).unwrap();
    p.flush().unwrap();
    let mut b = [0u8; 256];
    local.read(0, &mut b).unwrap();
    assert_eq!(&b[10..13], &[1, 2, 3]);
    assert_eq!(
        b[200], 7,
        "bytes outside the written span are not overwritten"
    );
    assert_eq!(p.stats().bytes_out, 3);
}

#[test]
fn request_larger_than_pool_streams() {
    let p = pool(3 * 512, 512, EvictionPolicy::Clock);
    let local = Arc::new(LocalTransport::new(1 << 20).unwrap());
    let data = pattern(200_000, 1);
    local.write(0, &data).unwrap();
    let t = p.elements().add("m", local).unwrap();
    let mut back = vec![0u8; data.len()];
    p.read(t, 0, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(p.usage().pinned, 0);
    assert!(p.usage().used <= 3);
}

#[test]
fn a_single_frame_is_enough() {
    for policy in [EvictionPolicy::Clock, EvictionPolicy::Lru] {
        let p = pool(256, 256, policy);
        let local = Arc::new(LocalTransport::new(1 << 16).unwrap());
        let t = p.elements().add("m", local).unwrap();
        let data = pattern(5000, 2);
        p.write(t, 33, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        p.read(t, 33, &mut back).unwrap();
        assert_eq!(back, data, "{policy}");
        assert_eq!(p.usage().pinned, 0);
    }
}

#[test]
fn several_transports_in_one_request() {
    let p = pool(64 * 1024, 1024, EvictionPolicy::Clock);
    let a = Arc::new(LocalTransport::new(1 << 16).unwrap());
    let b = Arc::new(LocalTransport::new(1 << 16).unwrap());
    a.write(0, &pattern(5000, 1)).unwrap();
    b.write(0, &pattern(5000, 2)).unwrap();
    let ta = p.elements().add("a", a).unwrap();
    let tb = p.elements().add("b", b).unwrap();
    assert!(matches!(
        p.elements()
            .add("a", Arc::new(LocalTransport::new(1).unwrap())),
        Err(Error::DuplicateElement { .. })
    ));
    let (mut x, mut y) = (vec![0u8; 5000], vec![0u8; 5000]);
    p.read_many(&mut [
        PoolRead {
            transport: ta,
            addr: 0,
            dst: &mut x,
        },
        PoolRead {
            transport: tb,
            addr: 0,
            dst: &mut y,
        },
    ])
    .unwrap();
    assert_eq!((x, y), (pattern(5000, 1), pattern(5000, 2)));
    assert_eq!(p.stats().fetch_calls, 2, "one vectored call per transport");
    assert_eq!(p.elements().id("b").unwrap(), tb);
    assert_eq!(p.elements().names(), vec!["a", "b"]);
}

#[test]
fn out_of_range_and_unknown_transport() {
    let p = pool(4096, 1024, EvictionPolicy::Clock);
    let t = p
        .elements()
        .add("m", Arc::new(LocalTransport::new(5000).unwrap()))
        .unwrap();
    let err = p.read(t, 4990, &mut [0u8; 20]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::RemoteRange {
                addr: 4990,
                len: 20,
                size: 5000,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("\"m\""), "{err}");
    assert!(p.read(ElementId(9), 0, &mut [0u8; 1]).is_err());
    // The short last page reads fine.
    p.read(t, 4990, &mut [0u8; 10]).unwrap();
}

#[test]
fn sequential_reads_trigger_read_ahead() {
    let p = BufferPool::builder(64 * 1024)
        .page_size(1024)
        .read_ahead(4)
        .build()
        .unwrap();
    let t = p
        .elements()
        .add("m", Arc::new(LocalTransport::new(1 << 20).unwrap()))
        .unwrap();
    let mut b = [0u8; 1024];
    for page in 0..12u64 {
        p.read(t, page * 1024, &mut b).unwrap();
    }
    let s = p.stats();
    assert!(s.read_ahead_pages >= 8, "{s}");
    assert!(s.read_ahead_hits >= 8, "{s}");
    assert!(s.fetch_calls <= 4, "{s}");
}

#[test]
fn failed_fetch_releases_pins_and_keeps_pool_usable() {
    let p = pool(8 * 256, 256, EvictionPolicy::Clock);
    let flaky = Flaky::new(1 << 16);
    let t = p.elements().add("flaky", flaky.clone()).unwrap();
    flaky.fail_reads.store(true, Ordering::SeqCst);
    let err = p.read(t, 0, &mut vec![0u8; 5000]).unwrap_err();
    assert!(err.is_transport(), "{err}");
    assert!(err.to_string().contains("flaky"), "{err}");
    let u = p.usage();
    assert_eq!((u.pinned, u.used), (0, 0), "{u}");
    flaky.fail_reads.store(false, Ordering::SeqCst);
    p.read(t, 0, &mut vec![0u8; 5000]).unwrap();
    assert_eq!(p.usage().pinned, 0);
}

#[test]
fn failure_in_a_later_round_of_a_streaming_read() {
    // 4 frames, 2-page rounds: a 20-page read runs on the fetch helper thread.
    let p = pool(4 * 256, 256, EvictionPolicy::Clock);
    let flaky = Flaky::new(1 << 16);
    let t = p.elements().add("flaky", flaky.clone()).unwrap();
    for ok_rounds in [0, 1, 2, 5] {
        flaky.reads_left.store(ok_rounds, Ordering::SeqCst);
        let err = p.read(t, 0, &mut vec![0u8; 20 * 256]).unwrap_err();
        assert!(err.is_transport(), "{err}");
        let u = p.usage();
        assert_eq!(u.pinned, 0, "after {ok_rounds} good rounds: {u}");
    }
    flaky.reads_left.store(usize::MAX, Ordering::SeqCst);
    let data = pattern(20 * 256, 4);
    flaky.inner.write(0, &data).unwrap();
    p.invalidate(t).unwrap();
    let mut back = vec![0u8; data.len()];
    p.read(t, 0, &mut back).unwrap();
    assert_eq!(back, data);
}

#[test]
fn failed_write_back_loses_nothing() {
    let p = pool(2 * 256, 256, EvictionPolicy::Lru);
    let flaky = Flaky::new(1 << 16);
    let t = p.elements().add("flaky", flaky.clone()).unwrap();
    let data = pattern(512, 5);
    p.write(t, 0, &data).unwrap(); // fills both frames, dirty
    flaky.fail_writes.store(true, Ordering::SeqCst);
    // Reading elsewhere needs a victim, whose write-back fails.
    assert!(p.read(t, 4096, &mut [0u8; 10]).is_err());
    assert!(p.flush().is_err());
    assert_eq!(p.usage().dirty, 2);
    assert_eq!(p.usage().pinned, 0);
    flaky.fail_writes.store(false, Ordering::SeqCst);
    p.flush().unwrap();
    let mut direct = vec![0u8; 512];
    flaky.inner.read(0, &mut direct).unwrap();
    assert_eq!(direct, data);
}

#[test]
fn invalidate_refetches() {
    let p = pool(8 * 256, 256, EvictionPolicy::Clock);
    let local = Arc::new(LocalTransport::new(4096).unwrap());
    let t = p.elements().add("m", local.clone()).unwrap();
    let mut b = [0u8; 4];
    p.read(t, 0, &mut b).unwrap();
    local.write(0, &[9, 9, 9, 9]).unwrap();
    p.read(t, 0, &mut b).unwrap();
    assert_eq!(b, [0; 4], "cached");
    p.invalidate(t).unwrap();
    p.read(t, 0, &mut b).unwrap();
    assert_eq!(b, [9; 4]);
}

#[test]
fn concurrent_stress_keeps_data_and_pins_consistent() {
    let p = Arc::new(pool(16 * 256, 256, EvictionPolicy::Clock));
    let local = Arc::new(LocalTransport::new(1 << 16).unwrap());
    let t = p.elements().add("m", local).unwrap();
    // Each thread owns a disjoint 4 KiB region and checks what it wrote.
    std::thread::scope(|s| {
        for k in 0..4u8 {
            let p = &p;
            s.spawn(move || {
                let base = k as u64 * 4096;
                for round in 0..30u8 {
                    let data = pattern(3000, k.wrapping_mul(17).wrapping_add(round));
                    p.write(t, base + 7, &data).unwrap();
                    let mut back = vec![0u8; 3000];
                    p.read(t, base + 7, &mut back).unwrap();
                    assert_eq!(back, data);
                }
            });
        }
    });
    let u = p.usage();
    assert_eq!(u.pinned, 0, "{u}");
    assert!(p.stats().evictions > 0);
}

#[test]
fn read_direct_sees_what_read_sees_and_caches_nothing() {
    let pool = BufferPool::builder(16 * 4096)
        .page_size(4096)
        .read_ahead(0)
        .build()
        .unwrap();
    let local = Arc::new(LocalTransport::new(1 << 20).unwrap());
    let t = pool.elements().add("m", local.clone()).unwrap();
    // Remote memory holds one pattern; the pool holds newer, dirty bytes for a few
    // pages in the middle (partial pages too), not yet written back.
    let old: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    local.write(0, &old).unwrap();
    pool.write(t, 10_000, &[0xEE; 9000]).unwrap();
    pool.read(t, 100_000, &mut [0u8; 100]).unwrap(); // a clean cached page
    let used = pool.usage().used;
    let before = pool.stats();

    let mut direct = vec![0u8; 200_000];
    pool.read_direct(t, 3, &mut direct).unwrap();
    let mut through = vec![0u8; 200_000];
    pool.read(t, 3, &mut through).unwrap();
    assert!(
        direct == through,
        "read_direct must return what read returns"
    );
    assert_eq!(&direct[10_000 - 3..19_000 - 3], &[0xEE; 9000][..]);
    assert_eq!(direct[9_996], old[9_999]);

    let s = pool.stats().since(&before);
    assert_eq!(s.bytes_direct, 200_000);
    let after_direct_usage = used; // read() above may have cached more; check direct alone:
    let fresh = BufferPool::builder(16 * 4096)
        .page_size(4096)
        .build()
        .unwrap();
    let ft = fresh.elements().add("m", local.clone()).unwrap();
    fresh.read_direct(ft, 0, &mut direct).unwrap();
    assert_eq!(fresh.usage().used, 0, "nothing is cached by read_direct");
    assert!(after_direct_usage > 0);
    // Out of range is refused before anything moves; empty reads are fine.
    assert!(matches!(
        pool.read_direct(t, (1 << 20) - 10, &mut [0u8; 11]),
        Err(Error::RemoteRange { .. })
    ));
    pool.read_direct(t, 1 << 20, &mut []).unwrap();
    assert_eq!(pool.usage().pinned, 0);
}

#[test]
fn read_direct_fails_cleanly_when_the_transport_fails() {
    let pool = BufferPool::builder(8 * 4096)
        .page_size(4096)
        .build()
        .unwrap();
    let flaky = Flaky::new(1 << 20);
    let t = pool.elements().add("f", flaky.clone()).unwrap();
    pool.write(t, 0, &[1u8; 5000]).unwrap(); // pinned during the direct read
    flaky.fail_reads.store(true, Ordering::SeqCst);
    let err = pool.read_direct(t, 0, &mut [0u8; 20_000]).unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err}");
    assert_eq!(pool.usage().pinned, 0, "no page stays pinned");
    flaky.fail_reads.store(false, Ordering::SeqCst);
    let mut back = [0u8; 5000];
    pool.read_direct(t, 0, &mut back).unwrap();
    assert_eq!(back, [1u8; 5000]);
}

/// A writer's own completed writes are always visible to its direct reads, even while
/// another thread's reads keep evicting (writing back) its dirty pages.
#[test]
fn read_direct_sees_completed_writes_while_other_threads_evict() {
    let pool = Arc::new(
        BufferPool::builder(8 * 4096)
            .page_size(4096)
            .read_ahead(2)
            .build()
            .unwrap(),
    );
    let t = pool
        .elements()
        .add("m", Arc::new(LocalTransport::new(4 << 20).unwrap()))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let evictor = {
        let (pool, stop) = (Arc::clone(&pool), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 3 * 4096];
            let mut off = 0u64;
            while !stop.load(Ordering::SeqCst) {
                pool.read(t, (1 << 20) + off, &mut buf).unwrap();
                off = (off + 3 * 4096) % (2 << 20);
            }
        })
    };
    for round in 0..300u32 {
        let v = (round % 250) as u8 + 1;
        let start = u64::from(round % 7) * 1000;
        let data = vec![v; 5 * 4096 + 123];
        pool.write(t, start, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        pool.read_direct(t, start, &mut back).unwrap();
        assert!(back == data, "round {round}");
    }
    stop.store(true, Ordering::SeqCst);
    evictor.join().unwrap();
    assert_eq!(pool.usage().pinned, 0);
}

#[test]
fn elements_registered_after_the_pool_are_cached_and_read_ahead() {
    let elements = Arc::new(MemoryElements::new());
    let p = BufferPool::builder(64 * 1024)
        .page_size(1024)
        .read_ahead(4)
        .elements(Arc::clone(&elements))
        .build()
        .unwrap();
    assert!(Arc::ptr_eq(p.elements(), &elements));
    let a = elements
        .add("a", Arc::new(LocalTransport::new(1 << 16).unwrap()))
        .unwrap();
    p.write(a, 0, &pattern(3000, 7)).unwrap();
    // Registered after the pool was built and after it served requests.
    let late = Arc::new(LocalTransport::new(1 << 16).unwrap());
    late.write(0, &pattern(16 * 1024, 9)).unwrap();
    let b = elements.add("b", late).unwrap();
    let mut page = [0u8; 1024];
    for i in 0..4u64 {
        p.read(b, i * 1024, &mut page).unwrap();
        assert_eq!(page[..], pattern(16 * 1024, 9)[i as usize * 1024..][..1024]);
    }
    assert!(p.stats().read_ahead_pages > 0, "{}", p.stats());
    let mut back = vec![0u8; 3000];
    p.read(a, 0, &mut back).unwrap();
    assert_eq!(back, pattern(3000, 7));
}

#[test]
fn write_direct_is_one_transport_write_and_leaves_the_pool_as_write_would() {
    let pool = BufferPool::builder(16 * 4096)
        .page_size(4096)
        .read_ahead(0)
        .build()
        .unwrap();
    let remote = Arc::new(LocalTransport::new(1 << 20).unwrap());
    let t = pool.elements().add("m", remote.clone()).unwrap();
    let old = pattern(256 * 1024, 3);
    remote.write(0, &old).unwrap();
    // The pool holds: dirty bytes inside the range (superseded), a page the write covers
    // only partly with dirty bytes outside it (must survive), a clean cached page, and a
    // dirty page after the range (untouched).
    pool.write(t, 20_000, &[0xAA; 5000]).unwrap();
    pool.write(t, 4096 + 100, &[0xBB; 50]).unwrap();
    pool.read(t, 60_000, &mut [0u8; 10]).unwrap();
    pool.write(t, 150_000, &[0xCC; 100]).unwrap();
    let before = pool.stats();
    let remote_before = remote.stats();

    let data = pattern(100_000, 7);
    pool.write_direct(t, 4096 + 1000, &data).unwrap();

    let s = pool.stats().since(&before);
    let r = remote.stats();
    assert_eq!(
        r.write_ops - remote_before.write_ops,
        1,
        "one transport write: {s}"
    );
    assert_eq!(
        s.hits, 1,
        "only the partly covered dirty page went through the pool: {s}"
    );
    assert_eq!(s.bytes_direct_out, 100_000);
    assert_eq!(s.evictions, 0, "nothing was evicted: {s}");
    assert_eq!(s.misses, 0, "no page was fetched or claimed: {s}");
    // Everything reads back as after a pool write, through the pool and remotely.
    let mut want = old.clone();
    want[20_000..25_000].fill(0xAA);
    want[4096 + 100..4096 + 150].fill(0xBB);
    want[150_000..150_100].fill(0xCC);
    want[4096 + 1000..4096 + 1000 + 100_000].copy_from_slice(&data);
    let mut back = vec![0u8; 200_000];
    pool.read(t, 0, &mut back).unwrap();
    assert!(
        back == want[..200_000],
        "reads through the pool see the direct write"
    );
    pool.flush().unwrap();
    let mut remote_back = vec![0u8; 200_000];
    remote.read(0, &mut remote_back).unwrap();
    assert!(
        remote_back == want[..200_000],
        "no stale page was written back over it"
    );
    assert_eq!(pool.usage().pinned, 0);
    // Bad ranges are refused before anything moves; empty writes are fine.
    let r = remote.stats();
    assert!(matches!(
        pool.write_direct(t, (1 << 20) - 10, &[1u8; 11]),
        Err(Error::RemoteRange { .. })
    ));
    pool.write_direct(t, 1 << 20, &[]).unwrap();
    assert_eq!(remote.stats().write_ops, r.write_ops);
}

#[test]
fn write_direct_of_a_large_array_caches_nothing_and_writes_nothing_back() {
    let pool = BufferPool::builder(8 * 4096)
        .page_size(4096)
        .build()
        .unwrap();
    let remote = Arc::new(LocalTransport::new(4 << 20).unwrap());
    let t = pool.elements().add("m", remote.clone()).unwrap();
    let data = pattern(3 << 20, 5);
    pool.write_direct(t, 123, &data).unwrap();
    pool.flush().unwrap();
    let s = pool.stats();
    assert_eq!((s.write_backs, s.evictions, s.misses), (0, 0, 0), "{s}");
    assert_eq!(s.bytes_out, 3 << 20);
    assert_eq!(pool.usage().used, 0, "nothing is cached by write_direct");
    assert_eq!(remote.stats().write_ops, 1, "one transport call");
    let mut back = vec![0u8; data.len()];
    pool.read_direct(t, 123, &mut back).unwrap();
    assert!(back == data);
}

#[test]
fn write_direct_fails_cleanly_when_the_transport_fails() {
    let pool = BufferPool::builder(8 * 4096)
        .page_size(4096)
        .build()
        .unwrap();
    let flaky = Flaky::new(1 << 20);
    let t = pool.elements().add("f", flaky.clone()).unwrap();
    flaky.fail_writes.store(true, Ordering::SeqCst);
    let err = pool.write_direct(t, 0, &[1u8; 20_000]).unwrap_err();
    assert!(matches!(err, Error::Transport { .. }), "{err}");
    assert_eq!(pool.usage().pinned, 0, "no page stays pinned");
    flaky.fail_writes.store(false, Ordering::SeqCst);
    pool.write_direct(t, 0, &[2u8; 20_000]).unwrap();
    let mut back = [0u8; 20_000];
    pool.read(t, 0, &mut back).unwrap();
    assert_eq!(back, [2u8; 20_000]);
}

/// Direct writes interleaved with another thread's reads and writes of the same pages
/// (which keep caching and evicting them): after every direct write returns, reads
/// through the pool and from remote memory (after a flush) see its bytes.
#[test]
fn write_direct_is_seen_while_other_threads_cache_and_evict_the_same_pages() {
    let pool = Arc::new(
        BufferPool::builder(8 * 4096)
            .page_size(4096)
            .read_ahead(2)
            .build()
            .unwrap(),
    );
    let remote = Arc::new(LocalTransport::new(1 << 20).unwrap());
    let t = pool.elements().add("m", remote.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let other = {
        let (pool, stop) = (Arc::clone(&pool), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 3 * 4096];
            let mut off = 0u64;
            while !stop.load(Ordering::SeqCst) {
                // Reads of the pages the direct writes go to, and writes far from them.
                pool.read(t, off % (40 * 1024), &mut buf).unwrap();
                pool.write(t, (512 << 10) + off, &buf[..1000]).unwrap();
                off = (off + 5000) % (256 << 10);
            }
        })
    };
    for round in 0..300u32 {
        let v = (round % 250) as u8 + 1;
        let start = u64::from(round % 7) * 1000;
        let data = vec![v; 5 * 4096 + 123];
        pool.write_direct(t, start, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        pool.read(t, start, &mut back).unwrap();
        assert!(back == data, "round {round}: a read through the pool");
    }
    stop.store(true, Ordering::SeqCst);
    other.join().unwrap();
    pool.flush().unwrap();
    let mut back = vec![0u8; 5 * 4096 + 123];
    remote.read(5000, &mut back).unwrap(); // round 299 wrote at 5000
    let last = (299 % 250) as u8 + 1;
    assert!(
        back.iter().all(|&b| b == last),
        "remote memory holds the last direct write"
    );
    assert_eq!(pool.usage().pinned, 0);
}
