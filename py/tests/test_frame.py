"""scad.RemoteFrame: Arrow/Polars round trips, metadata hand-off, kernels against Python
Polars on the same data, errors, and the local memory budget."""
import datetime as dt
import decimal
import json
import threading

import numpy as np
import pytest

pl = pytest.importorskip("polars")
pa = pytest.importorskip("pyarrow")
from polars.testing import assert_frame_equal  # noqa: E402

import scad  # noqa: E402
from scad.frame import col, lit, when  # noqa: E402


@pytest.fixture
def env(store):
    return scad.FrameEnv(store, chunk_rows=500)


def mixed(n=2000, seed=1):
    """Ints, floats, strings, decimals, dates and booleans, all with nulls."""
    rng = np.random.default_rng(seed)
    null = rng.random(n) < 0.1
    k = rng.integers(0, 50, n)
    return pl.DataFrame({
        "k": pl.Series([None if z else int(v) for z, v in zip(null, k)], dtype=pl.Int64),
        "k2": pl.Series(rng.integers(0, 3, n), dtype=pl.Int32),
        "x": pl.Series([None if z else float(v) for z, v in zip(np.roll(null, 1), rng.normal(size=n))]),
        "s": pl.Series([None if z else f"name-{v}" + "x" * int(v % 20) for z, v in zip(np.roll(null, 2), k)]),
        "amt": pl.Series([None if z else decimal.Decimal(int(v)).scaleb(-2) for z, v in
                          zip(np.roll(null, 3), rng.integers(-10**6, 10**6, n))], dtype=pl.Decimal(9, 2)),
        "d": pl.Series([None if z else dt.date(2000, 1, 1) + dt.timedelta(days=int(v)) for z, v in
                        zip(np.roll(null, 4), rng.integers(0, 3000, n))], dtype=pl.Date),
        "b": pl.Series([None if z else bool(v) for z, v in zip(np.roll(null, 5), rng.integers(0, 2, n))]),
        "u": pl.Series(rng.integers(0, 200, n), dtype=pl.UInt32),
    })


def canon(df, by=None):
    by = by or df.columns
    return df.sort(by, nulls_last=True, maintain_order=True)


def same(got, want, by=None):
    assert_frame_equal(canon(got, by), canon(want, by), check_dtypes=True)


# -- round trips -----------------------------------------------------------------------------------

def test_polars_round_trip_keeps_values_types_and_nulls(env):
    df = mixed()
    rf = scad.RemoteFrame.from_polars(env, df)
    assert len(rf) == df.height and rf.columns == df.columns
    assert rf.chunk_count == 4  # 2000 rows in chunks of 500
    assert rf.schema["amt"] == "decimal(9,2)" and rf.schema["d"] == "date" and rf.schema["s"] == "string"
    assert_frame_equal(rf.to_polars(), df)
    assert_frame_equal(rf.to_polars(columns=["s", "k"]), df.select("s", "k"))
    # Consumers of the PyCapsule interface read the lazy stream.
    assert_frame_equal(pl.DataFrame(rf), df)
    # Keys, dates and amounts of small ranges are stored packed, read back whole.
    assert 0 < rf.stored_nbytes < rf.nbytes


def test_pyarrow_round_trip_of_plain_strings_decimals_dates(env):
    t = pa.table({
        "id": pa.array([1, 2, None, 4], pa.int32()),
        "name": pa.array(["a", None, "ccc", "dddd" * 10], pa.string()),
        "big": pa.array(["x" * 5, "y", "z", None], pa.large_string()),
        "price": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-3.50"), decimal.Decimal("0.01")],
                          pa.decimal128(7, 2)),
        "day": pa.array([dt.date(1999, 12, 31), dt.date(2000, 2, 29), None, dt.date(1970, 1, 1)], pa.date32()),
        "f": pa.array([0.5, None, float("inf"), -2.0], pa.float32()),
    })
    rf = scad.RemoteFrame.from_arrow(env, t)
    back = rf.to_arrow()
    assert back.num_rows == 4
    assert back.schema.field("price").type == pa.decimal128(7, 2)
    assert back.schema.field("day").type == pa.date32()
    for name in t.column_names:
        assert back.column(name).to_pylist() == t.column(name).to_pylist(), name
    # The lazy stream gives the same table.
    assert pa.table(rf).to_pylist() == back.to_pylist()
    # Batches of a RecordBatchReader are written as they come.
    reader = pa.RecordBatchReader.from_batches(t.schema, t.to_batches(max_chunksize=1))
    assert scad.RemoteFrame.from_arrow(env, reader).to_arrow().to_pylist() == back.to_pylist()


def test_empty_and_all_null_frames(env):
    empty = pl.DataFrame({"a": pl.Series([], dtype=pl.Int64), "s": pl.Series([], dtype=pl.String)})
    rf = scad.RemoteFrame.from_polars(env, empty)
    assert len(rf) == 0 and rf.columns == ["a", "s"]
    assert_frame_equal(rf.to_polars(), empty)
    nulls = pl.DataFrame({"a": pl.Series([None, None], dtype=pl.Int64), "s": pl.Series([None, None], dtype=pl.String)})
    assert_frame_equal(scad.RemoteFrame.from_polars(env, nulls).to_polars(), nulls)


def test_unsupported_input_is_a_clear_error(env):
    with pytest.raises(TypeError, match="__arrow_c_stream__"):
        scad.RemoteFrame.from_arrow(env, [1, 2, 3])
    with pytest.raises(TypeError, match="unsupported data type"):
        scad.RemoteFrame.from_polars(env, pl.DataFrame({"l": [[1, 2], [3]]}))
    with pytest.raises(ValueError, match="arrow_array_stream"):
        scad._native.Frame.from_stream(env._env, pa.array([1]).__arrow_c_array__()[0])


# -- metadata hand-off -------------------------------------------------------------------------------

def test_meta_json_opens_the_frame_in_another_element(server, env):
    df = mixed(700)
    rf = scad.RemoteFrame.from_polars(env, df)
    meta = rf.meta
    assert json.loads(meta)["rows"] == 700
    # Another "element": its own store and pool, connected to the same memory element.
    other = scad.FrameEnv(scad.Store({"mem0": server.url}, pool_bytes=1 << 20))
    again = scad.RemoteFrame.from_meta(other, meta)
    assert_frame_equal(again.to_polars(), df)
    # Results it writes must not land on top of the frame it received.
    other.reserve(meta)
    extra = scad.RemoteFrame.from_polars(other, mixed(700, seed=9))
    assert_frame_equal(again.to_polars(), df)
    assert extra.height == 700


def test_bad_metadata_is_rejected(server, env):
    rf = scad.RemoteFrame.from_polars(env, mixed(100))
    with pytest.raises(ValueError, match="not valid JSON"):
        scad.RemoteFrame.from_meta(env, "{not json")
    m = json.loads(rf.meta)
    m["rows"] += 1
    with pytest.raises(ValueError, match="invalid frame metadata"):
        scad.RemoteFrame.from_meta(env, json.dumps(m))
    m = json.loads(rf.meta)
    m["version"] = 999
    with pytest.raises(ValueError):
        scad.RemoteFrame.from_meta(env, json.dumps(m))
    m = json.loads(rf.meta)
    for c in m["chunks"]:
        c["element"] = "elsewhere"
    with pytest.raises(ValueError, match="elsewhere"):
        scad.RemoteFrame.from_meta(env, json.dumps(m))


# -- kernels against Python Polars --------------------------------------------------------------------

@pytest.fixture
def data(env):
    df = mixed(3000)
    return df, scad.RemoteFrame.from_polars(env, df)


def test_filter_with_comparisons_logic_is_in_between_nulls(data):
    df, rf = data
    cases = [
        ((col("k") > 10) & col("s").is_in(["name-11", "name-20", "name-3"]),
         (pl.col("k") > 10) & pl.col("s").is_in(["name-11", "name-20", "name-3"])),
        (col("x").is_null() | ~col("b"), pl.col("x").is_null() | ~pl.col("b")),
        (col("d").is_between(dt.date(2001, 1, 1), dt.date(2003, 6, 30)),
         pl.col("d").is_between(dt.date(2001, 1, 1), dt.date(2003, 6, 30))),
        (col("amt") >= decimal.Decimal("1234.50"), pl.col("amt") >= decimal.Decimal("1234.50")),
        ((col("k2") != 1) & (col("x") * 2 + 1 < 0.5), (pl.col("k2") != 1) & (pl.col("x") * 2 + 1 < 0.5)),
        (col("k").is_in([1, 2, 3, None]) ^ (col("u") % 2 == 0), pl.col("k").is_in([1, 2, 3]) ^ (pl.col("u") % 2 == 0)),
        (col("d") == dt.date(2004, 2, 3), pl.col("d") == dt.date(2004, 2, 3)),
    ]
    for ours, theirs in cases:
        got = rf.filter(ours).to_polars()
        want = df.filter(theirs)
        assert got.height == want.height, ours
        same(got, want)


def test_select_and_with_columns_match_polars(data):
    df, rf = data
    got = rf.select("k", (col("x") * 2 - col("k")).alias("y"), col("amt").cast("float64").alias("a"),
                    (col("k2") + 1).alias("k2p"), col("s").fill_null("?").alias("s2"), (-col("x")).abs().alias("ax"))
    want = df.select("k", (pl.col("x") * 2 - pl.col("k")).alias("y"), pl.col("amt").cast(pl.Float64).alias("a"),
                     (pl.col("k2") + 1).alias("k2p"), pl.col("s").fill_null("?").alias("s2"),
                     (-pl.col("x")).abs().alias("ax"))
    assert_frame_equal(got.to_polars(), want)
    got = rf.with_columns(when(col("k") > 40).then(lit("hi")).when(col("k") > 20).then(lit("mid"))
                          .otherwise(lit("lo")).alias("band"), (col("k") // 7).alias("k"))
    want = df.with_columns(pl.when(pl.col("k") > 40).then(pl.lit("hi")).when(pl.col("k") > 20).then(pl.lit("mid"))
                           .otherwise(pl.lit("lo")).alias("band"), (pl.col("k") // 7).alias("k"))
    assert_frame_equal(got.to_polars(), want)


@pytest.mark.parametrize("how", ["inner", "left", "right", "full", "semi", "anti"])
def test_joins_on_one_and_two_keys_match_polars(env, data, how):
    df, rf = data
    dim = pl.DataFrame({"dk": pl.Series(list(range(0, 60, 2)) * 2, dtype=pl.Int64),
                        "dk2": pl.Series([0] * 30 + [1] * 30, dtype=pl.Int32),
                        "label": [f"L{i}" for i in range(60)], "x": [float(i) for i in range(60)]})
    rdim = scad.RemoteFrame.from_polars(env, dim)
    got = rf.join(rdim, left_on="k", right_on="dk", how=how).to_polars()
    want = df.join(dim, left_on="k", right_on="dk", how=how)
    assert got.columns == want.columns
    same(got, want)
    got = rf.join(rdim, left_on=["k", "k2"], right_on=["dk", "dk2"], how=how).to_polars()
    want = df.join(dim, left_on=["k", "k2"], right_on=["dk", "dk2"], how=how)
    same(got, want)


def test_group_by_aggregations_match_polars(store, data):
    df, rf = data
    aggs = [col("x").sum().alias("sx"), col("x").mean().alias("mx"), col("s").count().alias("n"),
            col("s").n_unique().alias("u"), col("d").min().alias("dmin"), col("amt").max().alias("amax"),
            col("u").len().alias("len")]
    got = rf.group_by("k", "k2").agg(*aggs).to_polars()
    want = df.group_by("k", "k2").agg(pl.col("x").sum().alias("sx"), pl.col("x").mean().alias("mx"),
                                      pl.col("s").count().alias("n"), pl.col("s").n_unique().alias("u"),
                                      pl.col("d").min().alias("dmin"), pl.col("amt").max().alias("amax"),
                                      pl.col("u").len().alias("len"))
    same(got, want, by=["k", "k2"])
    # Sums as exact decimals.
    got = rf.group_by(["k2"]).agg(col("amt").sum()).to_polars()
    same(got, df.group_by("k2").agg(pl.col("amt").sum()), by=["k2"])
    # Order-sensitive and statistical aggregations: first/last in the frame's order
    # (nulls included), median, sample std/var, and arithmetic over aggregations; a
    # frame of many chunks, so the scan runs in several partitions.
    rf = scad.RemoteFrame.from_polars(scad.FrameEnv(store, chunk_rows=128), df)
    got = rf.group_by("k2").agg(col("x").first().alias("fx"), col("s").last().alias("ls"),
                                col("x").median().alias("md"), col("x").std().alias("sd"),
                                col("x").var().alias("vr"),
                                (col("x").sum() / col("x").count()).alias("avg")).to_polars()
    want = df.group_by("k2").agg(pl.col("x").first().alias("fx"), pl.col("s").last().alias("ls"),
                                 pl.col("x").median().alias("md"), pl.col("x").std().alias("sd"),
                                 pl.col("x").var().alias("vr"),
                                 (pl.col("x").sum() / pl.col("x").count()).alias("avg"))
    same(got, want, by=["k2"])


def test_sort_limit_distinct_match_polars(data):
    df, rf = data
    got = rf.sort(["k", "x"], descending=[True, False], nulls_last=True).to_polars()
    assert_frame_equal(got, df.sort(["k", "x"], descending=[True, False], nulls_last=True, maintain_order=True))
    top = rf.sort("x", limit=25, nulls_last=True).to_polars()
    assert_frame_equal(top.select("x"), df.sort("x", nulls_last=True).head(25).select("x"))
    assert_frame_equal(rf.limit(123).to_polars(), df.head(123))
    assert rf.limit(10**6).height == df.height
    same(rf.select("k2", "b").unique().to_polars(), df.select("k2", "b").unique())
    assert rf.unique(subset=["k2"]).height == df["k2"].n_unique()


# -- errors --------------------------------------------------------------------------------------------

def test_unknown_columns_raise_key_error(env, data):
    df, rf = data
    with pytest.raises(KeyError, match="nope"):
        rf.filter(col("nope") > 1)
    with pytest.raises(KeyError, match="nope"):
        rf.select("nope")
    with pytest.raises(KeyError, match="nope"):
        rf.join(rf, on="nope")
    with pytest.raises(KeyError, match="nope"):
        rf.group_by("nope").agg(col("x").sum())
    with pytest.raises(KeyError, match="nope"):
        rf.sort("nope")
    with pytest.raises(KeyError, match="nope"):
        rf.to_polars(columns=["nope"])


def test_bad_arguments_and_expressions(data):
    df, rf = data
    with pytest.raises(ValueError, match="unknown join type"):
        rf.join(rf, on="k", how="outer")
    with pytest.raises(TypeError, match="Polars expressions are not accepted"):
        rf.select(pl.col("k"))
    with pytest.raises(TypeError, match="truth value"):
        bool(col("k") > 1)
    with pytest.raises(ValueError, match="unknown data type"):
        rf.select(col("k").cast("complex"))
    with pytest.raises(ValueError, match="invalid expression"):
        rf._raw.filter('{"op": "frobnicate"}')
    with pytest.raises(TypeError, match="one kind"):
        col("k").is_in([1, "a"])
    with pytest.raises(TypeError):
        rf.join(rf, left_on=["k", "k2"], right_on=["k", "s"])  # Int32 vs String key


# -- the budget ------------------------------------------------------------------------------------------

def test_verbs_within_a_small_budget_match_and_report_stats(store):
    base = scad.FrameEnv(store, chunk_rows=256)
    rng = np.random.default_rng(5)
    n = 40_000
    fact = pl.DataFrame({"k": rng.integers(0, 20_000, n), "q": rng.integers(0, 100, n),
                         "name": [f"item-{i % 977}" for i in range(n)]})
    dim = pl.DataFrame({"d": np.arange(20_000, dtype=np.int64), "w": rng.random(20_000)})
    lf = scad.RemoteFrame.from_polars(base, fact)
    rd = scad.RemoteFrame.from_polars(base, dim)
    budget = rd.nbytes // 4  # a quarter of the build side
    small = scad.FrameEnv(store, budget=budget, chunk_rows=256)
    assert small.budget == budget
    joined = lf.with_env(small).join(rd, left_on="k", right_on="d")
    s = small.stats()
    assert s["peak_local_bytes"] <= budget, s
    assert s["spill_files"] > 0, s  # it had to spill to remote memory
    assert s["bytes_in"] > 0 and s["bytes_out"] > 0 and s["time_s"] > 0
    same(joined.to_polars(), fact.join(dim, left_on="k", right_on="d"))
    small.reset_stats()
    grouped = lf.with_env(small).group_by("k").agg(col("q").sum(), col("name").n_unique().alias("names"))
    s = small.stats()
    assert s["peak_local_bytes"] <= budget, s
    same(grouped.to_polars(), fact.group_by("k").agg(pl.col("q").sum(), pl.col("name").n_unique().alias("names")),
         by=["k"])
    # A full sort spills sorted runs to memory elements and merges them; ties keep
    # the frame's order.
    small.reset_stats()
    ordered = lf.with_env(small).sort("k").to_polars()
    assert small.stats()["spill_files"] > 0, small.stats()
    assert small.stats()["peak_local_bytes"] <= budget, small.stats()
    assert_frame_equal(ordered, fact.sort("k", maintain_order=True))
    # The top-k does stream.
    top = lf.with_env(small).sort(["k", "q", "name"], limit=10).to_polars()
    assert_frame_equal(top, fact.sort(["k", "q", "name"]).head(10))


def test_a_zero_budget_is_refused_and_none_is_unlimited(store):
    with pytest.raises(ValueError, match="at least one byte"):
        scad.FrameEnv(store, budget=0)
    with pytest.raises(OverflowError):
        scad.FrameEnv(store, budget=-1)
    assert scad.FrameEnv(store).budget is None
    assert scad.FrameEnv(store, budget=None).budget is None
    assert scad.FrameEnv(store, budget=1).budget == 1


def test_kernels_run_in_threads_without_the_gil(data):
    df, rf = data
    results = {}

    def work(i):
        results[i] = rf.filter(col("k2") == i).group_by("k").agg(col("u").sum()).to_polars()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        same(results[i], df.filter(pl.col("k2") == i).group_by("k").agg(pl.col("u").sum()), by=["k"])


def test_free_gives_memory_back(store, env):
    rf = scad.RemoteFrame.from_polars(env, mixed(500))
    rf.free()
    rf2 = scad.RemoteFrame.from_polars(env, mixed(500))
    assert_frame_equal(rf2.to_polars(), mixed(500))
