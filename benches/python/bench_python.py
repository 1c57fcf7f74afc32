"""Benchmarks of the Python wheel, each beside a baseline measured in the same run.

1. ``disaggrt`` write + materialize of 256 MiB of float32 through the Python API
   (``remote_array(pool, input_ndarray=...)``, ``get_array_metadata()``,
   ``materialize()``) vs the same work in Rust (the benches crate's ``disaggrt-baseline``
   binary: same pool geometry, same in-process tcp memory server). Runs alternate
   between the two so machine load hits both alike. Target: Python >= 0.8x Rust, with
   NumPy's huge-page advice off as in the Rust Vec (NumPy's default reported beside).
   Also: >= 100x the original's ~10 MB/s (BENCHMARKS.md), with NumPy's defaults, and
   >= 1 GB/s write + materialize combined (issue #16). Materialize is reported beside a
   raw tcp transport read of the same bytes into a fresh array, in the same run.
2. ``npjoin`` inner join of 1M x 1M float32 keys (prepare + join) vs pandas ``merge``
   of the same keys. Target: >= 1.0x pandas (reported, not a contract).

Writes ``benches/results/python.jsonl`` and ``benches/results/python.md`` and prints
MET/MISSED per target.

    .venv/bin/python benches/python/bench_python.py [--mib 256] [--reps 7] [--join-rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

#: Throughput of the original disaggrt write + materialize (BENCHMARKS.md).
ORIGINAL_MBPS = 10

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def build_rust_baseline() -> str:
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(REPO, "target"))
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "scad-benches", "--bin", "disaggrt-baseline"],
                   cwd=REPO, check=True)
    return os.path.join(target, "release", "disaggrt-baseline")


def rust_once(exe: str, mib: int):
    out = subprocess.run([exe, str(mib), "1"], capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    return doc["write_s"][0], doc["materialize_s"][0]


def set_numpy_hugepages(enabled: bool) -> bool:
    """NumPy asks the kernel for transparent huge pages on large arrays (madvise); the
    Rust baseline's Vec does not. The verdict compares the two without it, so it
    measures the binding, not the page size; the default is reported beside it."""
    core = getattr(np, "_core", None) or np.core
    return core.multiarray._set_madvise_hugepage(enabled)


def python_once(mib: int):
    import disagg
    from disaggrt import buffer_pool_lib, rdma_array
    from scad import _native

    nbytes = mib << 20
    server = _native.MemoryServer(nbytes + (1 << 20))
    action = disagg.LibdAction(None, "bench")
    try:
        action.add_transport(f"mem;rdma_tcp;url,{server.url};")
        t = action.get_transport("mem", "rdma")
        t.reg(buffer_pool_lib.buffer_size)
        pool = buffer_pool_lib.buffer_pool({"mem": t})  # 16 MiB in 64 KiB pages, as in Rust
        data = (np.arange(nbytes // 4) % 1000).astype(np.float32)
        t0 = time.perf_counter()
        ra = rdma_array.remote_array(pool, input_ndarray=data, transport_name="mem")
        ra.get_array_metadata()  # flushes
        t1 = time.perf_counter()
        back = ra.materialize()
        t2 = time.perf_counter()
        if not np.array_equal(back, data):
            raise AssertionError("materialized data differ")
        del back
        # Baseline: the raw tcp transport reading the same bytes into a fresh array.
        (_, addr, n), = ra.get_array_metadata().remote_mem_metadata.values()
        t3 = time.perf_counter()
        raw = np.empty(n, dtype=np.uint8)
        t._ep.read_into(addr, raw)
        t4 = time.perf_counter()
        if not np.array_equal(raw.view(np.float32), data):
            raise AssertionError("raw read differs")
        return t1 - t0, t2 - t1, t4 - t3
    finally:
        action.terminate()
        server.shutdown()


def bench_disaggrt(mib: int, reps: int, rows: list) -> bool:
    exe = build_rust_baseline()
    py_w, py_m, rs_w, rs_m, hp_w, hp_m = [], [], [], [], [], []
    raw_hp, raw_4k = [], []
    for _ in range(reps):
        previous = set_numpy_hugepages(True)
        w, m, r = python_once(mib)
        hp_w.append(w)
        hp_m.append(m)
        raw_hp.append(r)
        set_numpy_hugepages(False)
        w, m, r = python_once(mib)
        set_numpy_hugepages(previous)
        py_w.append(w)
        py_m.append(m)
        raw_4k.append(r)
        w, m = rust_once(exe, mib)
        rs_w.append(w)
        rs_m.append(m)
    nbytes = mib << 20
    py_total = statistics.median([a + b for a, b in zip(py_w, py_m)])
    rs_total = statistics.median([a + b for a, b in zip(rs_w, rs_m)])
    # Each Python run is paired with the Rust run right after it, so load that drifts
    # during the benchmark hits both sides of a pair alike; the verdict uses the
    # median of the per-pair ratios (the ratio of medians is printed too).
    ratio = statistics.median([(rw + rm) / (pw + pm) for pw, pm, rw, rm in zip(py_w, py_m, rs_w, rs_m)])
    met = ratio >= 0.8
    met_original = False
    hp_ratio = statistics.median([(rw + rm) / (pw + pm) for pw, pm, rw, rm in zip(hp_w, hp_m, rs_w, rs_m)])
    for name, w, m in (("rust", rs_w, rs_m), ("python", py_w, py_m), ("python, numpy huge pages", hp_w, hp_m)):
        for phase, ts in (("write+flush", w), ("materialize", m)):
            rows.append(row("disaggrt", f"{name} {phase} {mib} MiB float32", nbytes, ts))
        tot = [a + b for a, b in zip(w, m)]
        note = "numpy default: madvise(MADV_HUGEPAGE) on large arrays" if "huge" in name else (
            "numpy huge-page advice off, as the Rust Vec" if name == "python" else "")
        r = row("disaggrt", f"{name} write+materialize {mib} MiB float32", 2 * nbytes, tot, note=note)
        if "huge" in name:
            # BENCHMARKS.md also asks for >= 100x the original disaggrt (~10 MB/s, a
            # documented figure: the original cannot run here). Judged on NumPy's
            # default configuration, which is what element programs get.
            # Conservative: the array's size over the time to write and read it back.
            mbps = nbytes / statistics.median(tot) / 1e6
            r.update(vs_baseline=f"{hp_ratio:.2f}x rust (median of paired runs); {mbps / ORIGINAL_MBPS:.0f}x original",
                     target=">= 100x original", verdict="MET" if mbps >= 100 * ORIGINAL_MBPS else "MISSED")
            print(f"disaggrt with numpy defaults: {mbps:.0f} MB/s = {mbps / ORIGINAL_MBPS:.0f}x the original's "
                  f"~{ORIGINAL_MBPS} MB/s (target >= 100x): {'MET' if mbps >= 100 * ORIGINAL_MBPS else 'MISSED'}")
            met_original = mbps >= 100 * ORIGINAL_MBPS
        elif name == "python":
            r.update(vs_baseline=f"{ratio:.2f}x rust (median of paired runs; {rs_total / py_total:.2f}x of medians)",
                     target=">= 0.8x", verdict="MET" if met else "MISSED")
        rows.append(r)
    # The raw tcp transport reading the same bytes into a fresh array (same run, same
    # server): what materialize is measured against.
    rows.append(row("disaggrt", f"raw tcp read {mib} MiB into a fresh array, numpy huge pages", nbytes, raw_hp,
                    note="Endpoint.read_into: no pool, no dtype"))
    rows.append(row("disaggrt", f"raw tcp read {mib} MiB into a fresh array", nbytes, raw_4k,
                    note="Endpoint.read_into, numpy huge-page advice off"))
    for name, m, raw in (("numpy defaults", hp_m, raw_hp), ("huge pages off", py_m, raw_4k)):
        ratio_raw = statistics.median([r / x for x, r in zip(m, raw)])
        print(f"materialize vs raw tcp read ({name}): {nbytes / statistics.median(m) / 1e6:.0f} MB/s vs "
              f"{nbytes / statistics.median(raw) / 1e6:.0f} MB/s = {ratio_raw:.2f}x (median of paired runs)")
    combined = 2 * nbytes / statistics.median([a + b for a, b in zip(hp_w, hp_m)]) / 1e6
    met_1gb = combined >= 1000
    r = row("disaggrt", f"python write+materialize {mib} MiB float32, combined", 2 * nbytes,
            [a + b for a, b in zip(hp_w, hp_m)], note="numpy defaults; issue #16 target")
    r.update(vs_baseline=f"{combined:.0f} MB/s", target=">= 1000 MB/s", verdict="MET" if met_1gb else "MISSED")
    rows.append(r)
    print(f"disaggrt write+materialize combined (numpy defaults): {combined:.0f} MB/s (target >= 1000 MB/s): "
          f"{'MET' if met_1gb else 'MISSED'}")
    print(f"disaggrt write+materialize {mib} MiB: python {py_total:.3f}s, rust {rs_total:.3f}s (medians) "
          f"-> {ratio:.2f}x rust, median of paired runs (target >= 0.8x): {'MET' if met else 'MISSED'}; "
          f"with numpy's default huge-page advice {hp_ratio:.2f}x")
    return met and met_original and met_1gb


def bench_join(n: int, reps: int, rows: list) -> bool:
    import pandas as pd
    from npjoin import join

    rng = np.random.default_rng(11)
    left = rng.integers(0, n, n).astype(np.float32)
    right = rng.integers(0, n, n).astype(np.float32)
    ldf = pd.DataFrame({"k": left, "i": np.arange(n)})
    rdf = pd.DataFrame({"k": right, "j": np.arange(n)})
    ours, theirs = [], []
    pairs = None
    for _ in range(reps):
        t0 = time.perf_counter()
        table, sorter, count, ngroups = join.prepare_join_float32(left)
        li, ri = join.join_on_table_float32(table, sorter, count, ngroups, right)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        merged = pd.merge(ldf, rdf, on="k")
        theirs.append(time.perf_counter() - t0)
        pairs = len(li)
        if len(merged) != pairs:
            raise AssertionError(f"npjoin found {pairs} pairs, pandas {len(merged)}")
    speed = statistics.median(theirs) / statistics.median(ours)
    met = speed >= 1.0
    rows.append(row("npjoin", f"pandas merge {n} x {n} float32 keys", 0, theirs, note=f"{pairs} pairs"))
    r = row("npjoin", f"npjoin prepare+join {n} x {n} float32 keys", 0, ours, note=f"{pairs} pairs")
    r.update(vs_baseline=f"{speed:.2f}x pandas", target=">= 1.0x", verdict="MET" if met else "MISSED")
    rows.append(r)
    print(f"npjoin {n} x {n}: {statistics.median(ours):.3f}s vs pandas merge {statistics.median(theirs):.3f}s "
          f"-> {speed:.2f}x pandas (target >= 1.0x): {'MET' if met else 'MISSED'}")
    return met


def row(bench: str, variant: str, nbytes: int, times: list, note: str = "") -> dict:
    med = statistics.median(times)
    return {"bench": bench, "variant": variant, "bytes": nbytes, "median_s": med, "min_s": min(times),
            "max_s": max(times), "gb_per_s": (nbytes / med / 1e9) if nbytes else None, "note": note,
            "reps": len(times), "unix_time": int(time.time())}


def write_results(rows: list, args) -> None:
    out = os.path.join(REPO, "benches", "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "python.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    lines = [
        "# Python wheel benchmarks", "",
        f"`.venv/bin/python benches/python/bench_python.py --mib {args.mib} --reps {args.reps} "
        f"--join-rows {args.join_rows}` — in-process memory servers over loopback tcp, "
        "2 cores shared by servers and client; Python and Rust runs alternate. Times are "
        "medians (min..max) of the repetitions; every ratio is against a baseline measured "
        "in the same run.", "",
        f"Machine: {os.cpu_count()} cores; load average at the end of the run: {load}.", "",
        "| bench | variant | GB/s | median ms (min..max) | note | vs baseline | target | verdict |",
        "|---|---|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        gb = f"{r['gb_per_s']:.2f}" if r["gb_per_s"] else ""
        lines.append(f"| {r['bench']} | {r['variant']} | {gb} | {r['median_s'] * 1e3:.1f} "
                     f"({r['min_s'] * 1e3:.1f}..{r['max_s'] * 1e3:.1f}) | {r['note']} | "
                     f"{r.get('vs_baseline', '')} | {r.get('target', '')} | {r.get('verdict', '')} |")
    with open(os.path.join(out, "python.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--join-rows", type=int, default=1_000_000)
    args = p.parse_args()
    rows: list = []
    met = [bench_disaggrt(args.mib, args.reps, rows), bench_join(args.join_rows, args.reps, rows)]
    write_results(rows, args)
    print(f"targets met: {sum(met)}/{len(met)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
