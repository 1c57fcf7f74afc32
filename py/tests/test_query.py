"""scad.sql / scad.QuerySession: SQL over RemoteFrames against Python Polars on the same
data, answers to PyArrow and Polars without copying, EXPLAIN, errors as exceptions, and
the budget (spilling joins, a join that cannot fit)."""
import threading

import numpy as np
import pytest

pl = pytest.importorskip("polars")
pa = pytest.importorskip("pyarrow")
from polars.testing import assert_frame_equal  # noqa: E402

import scad  # noqa: E402
from scad import _native  # noqa: E402


@pytest.fixture
def big_server():
    s = _native.MemoryServer(256 << 20)
    yield s
    s.shutdown()


@pytest.fixture
def store(big_server):
    return scad.Store({"mem0": big_server.url}, pool_bytes=8 << 20)


@pytest.fixture
def env(store):
    return scad.FrameEnv(store, chunk_rows=4096)


def fact(n, keys, seed=1):
    """A fact table: key (with nulls), quantity, price and a string column."""
    rng = np.random.default_rng(seed)
    k = rng.integers(0, keys, n)
    null = rng.random(n) < 0.05
    return pl.DataFrame({
        "k": pl.Series([None if z else int(v) for z, v in zip(null, k)], dtype=pl.Int64),
        "qty": pl.Series(rng.integers(1, 100, n), dtype=pl.Int64),
        "price": rng.random(n) * 100,
        "note": [f"n{v % 97}" for v in range(n)],
    })


def dim(n, keys, seed=2):
    """A dimension table: key (duplicates when n > keys), category, weight."""
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        "d": pl.Series(np.arange(n) % keys, dtype=pl.Int64),
        "cat": [f"cat-{v % 7}" for v in rng.integers(0, 1000, n)],
        "w": pl.Series(rng.integers(0, 10, n), dtype=pl.Int32),
    })


def same(got, want, by):
    assert_frame_equal(got.sort(by, nulls_last=True), want.sort(by, nulls_last=True),
                       check_dtypes=False, check_exact=False, rel_tol=1e-9)


@pytest.fixture
def tables(env):
    f, d = fact(20_000, 500), dim(1_000, 500)
    return f, d, scad.RemoteFrame.from_polars(env, f), scad.RemoteFrame.from_polars(env, d)


JOIN_GROUP_BY = """
    SELECT d.cat, count(*) AS n, sum(f.qty) AS qty, sum(f.price * d.w) AS paid
    FROM fact f JOIN dim d ON f.k = d.d
    WHERE f.qty > 10
    GROUP BY d.cat
    ORDER BY d.cat
"""


def polars_join_group_by(f, d):
    return (f.filter(pl.col("qty") > 10).join(d, left_on="k", right_on="d")
            .group_by("cat")
            .agg(pl.len().cast(pl.Int64).alias("n"), pl.col("qty").sum(),
                 (pl.col("price") * pl.col("w")).sum().alias("paid"))
            .sort("cat"))


# -- answers ---------------------------------------------------------------------------------------

def test_join_group_by_matches_polars(tables):
    f, d, rf, rd = tables
    result = scad.sql(JOIN_GROUP_BY, fact=rf, dim=rd)
    want = polars_join_group_by(f, d)
    assert result.ordered and result.rows == len(result) == want.height
    assert result.columns == ["cat", "n", "qty", "paid"]
    got = result.to_polars()
    assert got["cat"].to_list() == want["cat"].to_list()  # in ORDER BY order
    assert got["n"].to_list() == want["n"].to_list() and got["qty"].to_list() == want["qty"].to_list()
    assert np.allclose(got["paid"].to_numpy(), want["paid"].to_numpy(), rtol=1e-9)
    s = result.stats
    assert set(s) == {"elapsed_s", "rows", "peak_local_bytes", "budget", "scan_bytes", "spill_files",
                      "spill_bytes_written", "spill_bytes_read", "bytes_moved"}
    assert s["rows"] == want.height and s["budget"] is None and s["spill_files"] == 0
    # Only the columns the query uses are scanned.
    assert 0 < s["scan_bytes"] < rf.nbytes + rd.nbytes
    assert s["bytes_moved"] == s["scan_bytes"] + s["spill_bytes_written"] + s["spill_bytes_read"]


def test_session_runs_several_queries_and_takes_results_back_as_tables(env, tables):
    f, d, rf, rd = tables
    session = scad.QuerySession(env, fact=rf)
    session.register("dim", rd)
    assert session.tables == ["dim", "fact"]
    per_key = session.sql("SELECT k, sum(qty) AS qty FROM fact WHERE k IS NOT NULL GROUP BY k")
    assert not per_key.ordered
    same(per_key.to_polars(), f.filter(pl.col("k").is_not_null()).group_by("k").agg(pl.col("qty").sum()), ["k"])
    # The answer back in memory elements, as a table of the next query.
    frame = per_key.to_remote_frame()
    assert isinstance(frame, scad.RemoteFrame) and len(frame) == per_key.rows
    session.register("per_key", frame)
    total = session.sql("SELECT sum(qty) AS total FROM per_key").to_polars()
    assert total["total"][0] == f.filter(pl.col("k").is_not_null())["qty"].sum()


def test_answers_go_to_arrow_and_polars_without_copying(tables):
    f, d, rf, rd = tables
    result = scad.sql("SELECT k, qty, price, note FROM fact WHERE qty < 50", fact=rf)
    want = f.filter(pl.col("qty") < 50)
    t = result.to_arrow()
    assert isinstance(t, pa.Table) and t.num_rows == want.height
    assert t.column_names == ["k", "qty", "price", "note"]
    assert t.schema.field("qty").type == pa.int64()
    same(pl.from_arrow(t), want, ["qty", "price"])
    same(result.to_polars(), want, ["qty", "price"])
    # Both streams share the answer's buffers: the same addresses, nothing copied.
    t2 = pa.table(result)
    a = t.column("price").chunks[0].buffers()[1]
    b = t2.column("price").chunks[0].buffers()[1]
    assert a.address == b.address
    assert_frame_equal(pl.DataFrame(result), result.to_polars())
    assert result.schema["qty"] == "Int64"
    assert "rows" in repr(result)


def test_explain_and_explain_analyze(tables):
    f, d, rf, rd = tables
    plan = scad.explain(JOIN_GROUP_BY, fact=rf, dim=rd)
    assert "RemoteScanExec" in plan and "HashJoinExec" in plan
    result = scad.sql(JOIN_GROUP_BY, fact=rf, dim=rd)
    analyzed = result.explain_analyze()
    assert "RemoteScanExec" in analyzed and "output_rows" in analyzed
    assert f"rows={result.rows}" in analyzed


def test_sql_takes_the_env_from_the_tables_or_from_env(env, tables):
    f, d, rf, rd = tables
    small = scad.FrameEnv(env.store, budget=32 << 20)
    assert scad.sql("SELECT count(*) AS n FROM dim", dim=rd).stats["budget"] is None
    r = scad.sql("SELECT count(*) AS n FROM dim", env=small, dim=rd)
    assert r.stats["budget"] == 32 << 20 and r.to_polars()["n"][0] == d.height
    with pytest.raises(ValueError, match="env"):
        scad.sql("SELECT 1")
    assert scad.sql("SELECT 1 AS one", env=env).to_polars()["one"][0] == 1
    with pytest.raises(TypeError, match="RemoteFrame"):
        scad.sql("SELECT * FROM t", env=env, t=f)
    with pytest.raises(TypeError, match="FrameEnv"):
        scad.QuerySession(env._env)


def test_sql_calls_on_one_env_share_a_session_and_not_their_tables(env, tables):
    f, d, rf, rd = tables
    started = _native.env_sessions_started()
    first = scad.sql("SELECT count(*) AS n FROM dim", env=env, dim=rd)
    assert first.to_polars()["n"][0] == d.height
    # The second call's "dim" is another frame; the first call's tables are gone.
    second = scad.sql("SELECT count(*) AS n FROM dim", env=env, dim=rf)
    assert second.to_polars()["n"][0] == f.height
    with pytest.raises(scad.UnknownNameError, match="dim"):
        scad.sql("SELECT count(*) AS n FROM dim", env=env, fact=rf)
    assert "RemoteScan" in scad.explain("SELECT max(qty) FROM fact", env=env, fact=rf)
    with pytest.raises(scad.UnknownNameError, match="fact"):
        scad.explain("SELECT max(qty) FROM fact", env=env)
    # A failing call leaves nothing registered either.
    with pytest.raises(scad.QueryError):
        scad.sql("SELECT nope(k) FROM fact", env=env, fact=rf)
    with pytest.raises(scad.UnknownNameError, match="fact"):
        scad.sql("SELECT count(*) FROM fact", env=env)
    assert _native.env_sessions_started() == started + 1
    # Another env object has a session of its own; an answer outlives its call.
    other = scad.FrameEnv(env.store, chunk_rows=4096)
    assert scad.sql("SELECT 1 AS one", env=other).rows == 1
    assert _native.env_sessions_started() == started + 2
    assert first.to_remote_frame().to_polars()["n"][0] == d.height


def test_sql_calls_on_one_env_from_threads_each_see_their_tables(env, tables):
    f, d, rf, rd = tables
    errors, counts = [], {}

    def run(i):
        try:
            frame, want = (rd, d.height) if i % 2 else (rf, f.height)
            for _ in range(3):
                n = scad.sql("SELECT count(*) AS n FROM t", env=env, t=frame).to_polars()["n"][0]
                assert n == want, (i, n, want)
            counts[i] = n
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(counts) == 4


def test_queries_release_the_gil(env, tables):
    f, d, rf, rd = tables
    session = scad.QuerySession(env, fact=rf, dim=rd)
    results = [None] * 3

    def work(i):
        results[i] = session.sql(f"SELECT count(*) AS n FROM fact WHERE qty % 3 = {i}").to_polars()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        assert results[i]["n"][0] == f.filter(pl.col("qty") % 3 == i).height


# -- errors ----------------------------------------------------------------------------------------

def test_unknown_tables_and_columns_raise_unknown_name_error(tables):
    f, d, rf, rd = tables
    session = scad.QuerySession(rf.env, fact=rf)
    with pytest.raises(scad.UnknownNameError, match="no_such_table") as e:
        session.sql("SELECT * FROM no_such_table")
    # An UnknownNameError is a KeyError and a QueryError (a ScadError).
    assert isinstance(e.value, KeyError) and isinstance(e.value, scad.QueryError)
    assert isinstance(e.value, scad.ScadError)
    assert not str(e.value).startswith("'")  # no KeyError quotes
    with pytest.raises(KeyError, match="no_such_column"):
        session.sql("SELECT no_such_column FROM fact")
    with pytest.raises(KeyError, match="no_such_column"):
        session.explain("SELECT k FROM fact WHERE no_such_column > 1")
    # The session still works.
    assert session.sql("SELECT count(*) AS n FROM fact").rows == 1


def test_bad_sql_ddl_and_dml_raise_query_error(tables):
    f, d, rf, rd = tables
    session = scad.QuerySession(rf.env, fact=rf)
    with pytest.raises(scad.QueryError, match="SELEC") as e:
        session.sql("SELEC 1")
    assert not isinstance(e.value, KeyError)
    with pytest.raises(scad.QueryError):
        session.sql("SELECT k + note FROM fact")
    with pytest.raises(scad.QueryError, match="(?i)ddl"):
        session.sql("CREATE TABLE t AS SELECT 1")
    with pytest.raises(scad.QueryError, match="(?i)ddl"):
        session.sql("DROP TABLE fact")
    with pytest.raises(scad.QueryError, match="(?i)dml|insert"):
        session.sql("INSERT INTO fact SELECT * FROM fact")
    assert session.tables == ["fact"]
    assert session.sql("SELECT count(*) AS n FROM fact").to_polars()["n"][0] == f.height
    with pytest.raises(ValueError, match="empty"):
        session.register("  ", rf)
    with pytest.raises(TypeError):
        session.sql(42)


def test_sql_the_engine_cannot_run_raises_not_implemented_error(tables):
    f, d, rf, rd = tables
    with pytest.raises(NotImplementedError, match="Pivot"):
        scad.sql("SELECT * FROM fact PIVOT (sum(qty) FOR note IN ('n1'))", fact=rf)
    with pytest.raises(NotImplementedError, match="FETCH"):
        scad.sql("SELECT k FROM fact ORDER BY k OFFSET 1 ROWS FETCH NEXT 1 ROWS WITH TIES", fact=rf)


# -- the budget ------------------------------------------------------------------------------------

def test_a_big_join_at_a_tiny_budget_spills_and_matches_polars(env):
    f, d = fact(20_000, 2_000, seed=3), dim(5_000, 2_000, seed=4)
    rf, rd = scad.RemoteFrame.from_polars(env, f), scad.RemoteFrame.from_polars(env, d)
    budget = (rf.nbytes + rd.nbytes) // 10  # less than the join needs to hold its build side
    tiny = scad.FrameEnv(env.store, budget=budget, chunk_rows=4096)
    session = scad.QuerySession(tiny, fact=rf, dim=rd)
    result = session.sql("SELECT f.k, f.qty, d.w FROM fact f JOIN dim d ON f.k = d.d")
    s = result.stats
    assert s["spill_files"] > 0 and s["spill_bytes_written"] > 0 and s["spill_bytes_read"] > 0, s
    assert s["peak_local_bytes"] <= s["budget"] == budget
    assert session.spill_bytes_held == 0
    want = f.join(d, left_on="k", right_on="d").select("k", "qty", "w")
    same(result.to_polars(), want, ["k", "qty", "w"])
    assert "spill" in result.explain_analyze().lower()


def test_a_one_key_join_over_the_budget_raises_budget_exceeded_and_frees_its_spills(env, store):
    # Every row shares one key: the build side cannot be split by hashing. An inner
    # join would go through it piece by piece; a full join keeps every build row and
    # cannot, so it names the key.
    f = pl.DataFrame({"k": pl.Series([1] * 20_000, dtype=pl.Int64), "qty": pl.Series(range(20_000), dtype=pl.Int64)})
    d = pl.DataFrame({"d": pl.Series([1] * 20_000, dtype=pl.Int64), "w": pl.Series(range(20_000), dtype=pl.Int64)})
    rf, rd = scad.RemoteFrame.from_polars(env, f), scad.RemoteFrame.from_polars(env, d)
    tiny = scad.FrameEnv(store, budget=(rf.nbytes + rd.nbytes) // 50)
    session = scad.QuerySession(tiny, fact=rf, dim=rd)
    with pytest.raises(scad.BudgetExceededError, match=r"skewed key .* (k|d)=1"):
        session.sql("SELECT f.qty, d.w FROM fact f FULL JOIN dim d ON f.k = d.d")
    assert session.spill_bytes_held == 0
    # The session still answers what fits.
    assert session.sql("SELECT count(*) AS n FROM fact").to_polars()["n"][0] == 20_000


# -- a query as tasks ------------------------------------------------------------------------------
def test_a_query_run_task_by_task_through_specs_equals_the_query(env, tables, big_server):
    """The driver hands out task specs (JSON), each task runs over a store of its own
    (as a worker process would), the answer equals the query's and nothing stays
    allocated; a reported failure fails the query naming the task."""
    import json

    import pyarrow as pa

    f, d, ff, df = tables
    session = scad.QuerySession(env, partitions=3, fact=ff, dim=df)
    free_before = json.loads(env.store.allocation_state())
    query = _native.DistributedQuery(session._raw, JOIN_GROUP_BY)
    plan = json.loads(query.plan())
    assert any(s["tasks"] == 3 for s in plan["stages"])
    ran = 0
    while not query.is_over:
        # Every other spec without the tables, which then come apart (as a driver
        # hands them to its workers once).
        bare = ran % 2 == 1
        ready = query.next_task(with_tables=not bare)
        assert ready is not None, "no task ready while none runs"
        stage, task, spec = ready
        assert (json.loads(spec)["tables"] == {}) == bare
        assert (json.loads(spec)["stage"], json.loads(spec)["task"]) == (stage, task)
        started = query.clock()
        worker = scad.Store({"mem0": big_server.url}, pool_bytes=4 << 20)
        out = _native.run_task(worker._store, spec, query.tables() if bare else None)
        assert json.loads(out)["stage"] == json.loads(spec)["stage"]
        query.task_done(out, started)
        ran += 1
    assert ran == sum(s["tasks"] for s in plan["stages"])
    answer, info = query.finish()
    assert info["ordered"] and info["shuffle_bytes"] > 0 and len(json.loads(info["tasks"])) == ran
    got = pl.DataFrame(pa.table(answer))
    assert_frame_equal(got, session.sql(JOIN_GROUP_BY).to_polars(), check_exact=False, rel_tol=1e-9)
    assert json.loads(env.store.allocation_state()) == free_before
    with pytest.raises(ValueError, match="finished"):
        query.next_task()

    failing = _native.DistributedQuery(session._raw, JOIN_GROUP_BY)
    spec = json.loads(failing.next_task()[2])
    failing.task_failed(spec["stage"], spec["task"], "worker lost")
    assert failing.next_task() is None and failing.is_over
    with pytest.raises(scad.ScadError, match=f"stage {spec['stage']} task {spec['task']} failed: worker lost"):
        failing.finish()
    with pytest.raises(ValueError, match="task must be a number from 0"):
        session.run_stage_task(JOIN_GROUP_BY, 0, -1)
    with pytest.raises(ValueError, match="stage must be a number from 0"):
        session.run_stage(JOIN_GROUP_BY, True)
    with pytest.raises(ValueError, match="task output"):
        _native.DistributedQuery(session._raw, JOIN_GROUP_BY).task_done("{}", 0.0)
    assert json.loads(env.store.allocation_state()) == free_before
