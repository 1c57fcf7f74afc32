"""COMPAT.md: element files, rundisagg (-m N@name:port, -i/__OW_PAR, params[p]['meta'] and
params[p][0]['meta']), wskgen, memory_server, scad run."""
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import DAGS, run_cli
from scad import _native
from scad.dag import DagError, ElementError, load_dag, parse_element
from scad.runner import ParentOutput, load_parent_outputs, parse_memory_spec


def write(path, text):
    with open(path, "w") as f:
        f.write(textwrap.dedent(text).lstrip())
    return str(path)


def test_memory_specs():
    assert parse_memory_spec("mem1:2333") == [("mem1", "mem1;rdma_tcp;url,tcp://127.0.0.1:2333;")]
    assert parse_memory_spec("3@m:4000") == [
        (f"m@{i}", f"m@{i};rdma_tcp;url,tcp://127.0.0.1:{4000 + i};") for i in range(3)]
    assert parse_memory_spec("x:1:local:size,4096") == [("x", "x;rdma_local;size,4096;")]
    assert parse_memory_spec("r:7:rdma")[0][1] == "r;rdma_uverbs;url,tcp://127.0.0.1:7;"
    for bad in ["mem1", "mem1:port", "0@m:1", "m:1:carrier-pigeon", "m:70000"]:
        with pytest.raises(ValueError):
            parse_memory_spec(bad)


def test_parent_output_both_indexings(tmp_path):
    (tmp_path / "rundisagg.a.json").write_text(json.dumps({"meta": 1}))
    (tmp_path / "rundisagg.b@0.json").write_text(json.dumps({"meta": 10}))
    (tmp_path / "rundisagg.b@1.json").write_text(json.dumps({"meta": 11}))
    (tmp_path / "rundisagg.bb.json").write_text(json.dumps({"meta": 99}))  # not b's
    p = load_parent_outputs(str(tmp_path), ["a", "b"])
    assert p["a"]["meta"] == 1 and p["a"][0]["meta"] == 1 and isinstance(p["a"], ParentOutput)
    assert [o["meta"] for o in p["b"]] == [10, 11]
    with pytest.raises(FileNotFoundError):
        load_parent_outputs(str(tmp_path), ["c"])


def test_element_headers(tmp_path):
    e = parse_element(write(tmp_path / "c.o.py", """
        #@ type: compute
        #@ parents: [a]
        #@ corunning: {mem: {trans: t1, type: rdma}}
        #@ parallelism: 2
        #@ limits: {cpu: 1, mem: 128 MB}
        def main(params, action): return {}
    """))
    assert (e.name, e.kind, e.parents, e.parallelism, e.transport_of("mem")) == ("c", "compute", ["a"], 2, "t1")
    m = parse_element(write(tmp_path / "m.o.yaml", "type: memory\ncorunning: [c]\nlimits: {mem: 512 MB}\n"))
    assert m.kind == "memory" and m.memory_bytes == 512 << 20
    bad = {
        "nohdr.o.py": "def main(p, a): return {}\n",
        "badyaml.o.py": "#@ type: compute\n#@ parents: [a\n",
        "list.o.py": "#@ - 1\n#@ - 2\n",
        "kind.o.py": "#@ type: memory\n",
        "par.o.py": "#@ type: compute\n#@ parallelism: 0\n",
        "parents.o.py": "#@ parents: 3\n",
        "mem.o.yaml": "type: memory\nlimits: {mem: lots}\n",
        "notmap.o.yaml": "- 1\n",
    }
    for name, text in bad.items():
        with pytest.raises(ElementError):
            parse_element(write(tmp_path / name, text))
    with pytest.raises(ElementError):
        parse_element(write(tmp_path / "x.py", "#@ type: compute\n"))


def test_dag_errors_before_anything_starts(tmp_path):
    d = tmp_path / "cyc"
    d.mkdir()
    write(d / "a.o.py", "#@ parents: [b]\ndef main(p, a): return {}\n")
    write(d / "b.o.py", "#@ parents: [a]\ndef main(p, a): return {}\n")
    with pytest.raises(DagError, match="cycle"):
        load_dag(str(d))
    m = tmp_path / "miss"
    m.mkdir()
    write(m / "a.o.py", "#@ parents: [ghost]\ndef main(p, a): return {}\n")
    with pytest.raises(DagError, match="ghost"):
        load_dag(str(m))
    r = run_cli("run", str(d))
    assert r.returncode == 2 and "cycle" in r.stderr
    r = run_cli("run", str(m), "-d", str(tmp_path / "out"))
    assert r.returncode == 2 and "ghost" in r.stderr
    assert not (tmp_path / "out").exists()  # nothing started
    w = run_cli("wskgen", str(m))
    assert w.returncode == 2


def test_rundisagg_with_n_at_name_and_ow_par(tmp_path):
    s = [_native.MemoryServer(1 << 20, "127.0.0.1:0") for _ in range(2)]
    try:
        # N@NAME:PORT needs consecutive ports: find two free ones by retrying.
        if s[1].port != s[0].port + 1:
            for x in s:
                x.shutdown()
            s = _consecutive_servers()
        write(tmp_path / "parent.o.py", """
            #@ type: compute
            def main(params, action):
                return {"meta": "from-parent"}
        """)
        prog = write(tmp_path / "child.o.py", """
            #@ type: compute
            #@ parents: [parent]
            import os
            from disaggrt import util
            def main(params, action):
                out = []
                for i in range(2):
                    t = action.get_transport(f"m@{i}", "rdma")
                    t.reg(64)
                    t.buf[0:1] = bytes([40 + i])
                    t.write(1, 0)
                    t.read(1, 0, 8)
                    out.append(t.buf[8])
                return {"vals": out, "par": util.getParIndex(), "env": os.environ.get("__OW_PAR"),
                        "a": params["parent"]["meta"], "b": params["parent"][0]["meta"]}
        """)
        r = run_cli("rundisagg", str(tmp_path / "parent.o.py"), "-d", str(tmp_path))
        assert r.returncode == 0, r.stderr
        r = run_cli("rundisagg", prog, "-m", f"2@m:{s[0].port}", "-d", str(tmp_path), "-i", "1", "-p")
        assert r.returncode == 0, r.stderr
        res = json.loads((tmp_path / "rundisagg.child@1.json").read_text())
        assert res == {"vals": [40, 41], "par": 1, "env": "1", "a": "from-parent", "b": "from-parent"}
        assert json.loads(r.stdout) == res
        assert s[0].stats()["bytes_written"] == 1 and s[1].stats()["bytes_written"] == 1
        bad = run_cli("rundisagg", prog, "-m", "nonsense", "-d", str(tmp_path))
        assert bad.returncode == 2 and "NAME:PORT" in bad.stderr
    finally:
        for x in s:
            x.shutdown()


def test_memory_server_on_a_taken_port_is_an_oserror_with_its_errno():
    a = _native.MemoryServer(1 << 20, "127.0.0.1:0")
    try:
        with pytest.raises(OSError, match="cannot bind") as e:
            _native.MemoryServer(1 << 20, f"127.0.0.1:{a.port}")
        assert e.value.errno == errno.EADDRINUSE
        assert a.stats()["bytes_written"] == 0  # the running server is untouched
    finally:
        a.shutdown()


def _consecutive_servers():
    for base in range(41000, 42000, 2):
        try:
            a = _native.MemoryServer(1 << 20, f"127.0.0.1:{base}")
        except OSError:
            continue
        try:
            b = _native.MemoryServer(1 << 20, f"127.0.0.1:{base + 1}")
        except OSError:
            a.shutdown()
            continue
        return [a, b]
    pytest.skip("no two consecutive free ports")


def test_wskgen_output(tmp_path):
    out = tmp_path / "action.json"
    r = run_cli("wskgen", os.path.join(DAGS, "logistic-regression"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    f = doc["functions"][0]
    assert f["name"] == "logistic-regression" and doc["publish"] is True
    objs = {o["name"]: o for o in f["objects"]}
    assert set(objs) == {"load", "split", "train", "store"}
    t = objs["train"]
    assert t["exec"]["kind"] == "python:3" and t["exec"]["main"] == "main" and "def main" in t["exec"]["code"]
    assert t["porusParams"]["parallelism"] == 3 and t["porusParams"]["runtimeType"] == "compute"
    assert t["porusParams"]["relationships"] == {"corunning": ["store"], "dependents": [], "parents": ["split"]}
    assert objs["split"]["porusParams"]["relationships"]["dependents"] == ["train"]
    assert objs["store"]["porusParams"]["runtimeType"] == "memory"
    assert objs["store"]["limits"]["resources"]["mem"] == 256
    assert set(t["limits"]) == {"concurrency", "logs", "resources", "timeout"}


def test_memory_server_console_script():
    with subprocess.Popen([sys.executable, "-m", "scad.cli", "memory_server", "0", "tcp", "--size", "4M",
                           "--bind", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as p:
        try:
            line = p.stdout.readline()
            assert line.startswith("listening on 127.0.0.1:"), line
            port = int(line.rsplit(":", 1)[1])
            import disagg
            a = disagg.LibdAction(None, "c")
            a.add_transport(f"m;rdma_tcp;url,tcp://127.0.0.1:{port};")
            t = a.get_transport("m", "rdma")
            t.reg(8)
            t.buf[0:2] = b"ok"
            t.write(2, (4 << 20) - 2)
            with pytest.raises(IndexError):
                t.write(2, (4 << 20) - 1)
            a.terminate()
        finally:
            p.send_signal(signal.SIGTERM)
            assert p.wait(20) == 0
    bad = run_cli("memory_server", "--size", "lots")
    assert bad.returncode != 0 and "size" in bad.stderr


def test_scad_run_corunning_example(tmp_path):
    rep = tmp_path / "report.json"
    r = run_cli("run", os.path.join(DAGS, "corunning-2-node"), "-d", str(tmp_path / "out"), "--json", str(rep))
    assert r.returncode == 0, r.stderr + r.stdout
    doc = json.loads(rep.read_text())
    assert doc["results"]["compute2"] == {"fetched": 12345, "ok": True}
    by = {e["name"]: e for e in doc["elements"]}
    assert by["compute1"]["bytes_written"] == 4 and by["compute2"]["bytes_read"] == 4
    assert by["mem1"]["bytes_written"] == 4 and by["compute1"]["status"] == "ok"
    assert "compute2" in r.stdout


def test_scad_run_logistic_regression(tmp_path):
    rep = tmp_path / "report.json"
    r = run_cli("run", os.path.join(DAGS, "logistic-regression"), "-d", str(tmp_path / "out"), "--json", str(rep))
    assert r.returncode == 0, r.stderr + r.stdout
    doc = json.loads(rep.read_text())
    folds = doc["results"]["train"]
    assert sorted(f["fold"] for f in folds) == [0, 1, 2]
    for f in folds:
        assert f["accuracy"] > 0.9  # separable blobs; a broken pipeline scores ~0.5
        assert f["train_rows"] + f["test_rows"] == 20000
    by = {e["name"]: e for e in doc["elements"]}
    assert by["train"]["instances"] == 3 and by["train"]["bytes_read"] >= 3 * 20000 * 17 * 4


def test_scad_run_failure_tears_down(tmp_path):
    d = tmp_path / "dag"
    d.mkdir()
    write(d / "a.o.py", "#@ corunning: {m: {trans: m}}\ndef main(p, a):\n    raise RuntimeError('boom')\n")
    write(d / "b.o.py", "#@ parents: [a]\ndef main(p, a): return {}\n")
    out = tmp_path / "out"
    r = run_cli("run", str(d), "-d", str(out))
    assert r.returncode == 1 and "boom" in r.stderr
    assert not (out / "rundisagg.b.json").exists()


def test_runtime_invoke_uses_memory_templates_of_the_dag(tmp_path):
    write(tmp_path / "big.o.yaml", "type: memory\nlimits: {mem: 2 MB}\n")
    prog = write(tmp_path / "scale.o.py", """
        #@ type: compute
        def main(params, action):
            action.runtime.invoke("big", "more")
            t = action.get_transport("more", "rdma")
            t.reg(8)
            t.write(8, (2 << 20) - 8)
            try:
                t.write(8, (2 << 20) - 4)
                beyond = "accepted"
            except IndexError:
                beyond = "IndexError"
            action.runtime.release("more")
            return {"beyond": beyond, "left": action._native.names()}
    """)
    r = run_cli("rundisagg", prog, "-d", str(tmp_path), "-p")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"beyond": "IndexError", "left": []}


def test_memory_server_flags_match_the_binary():
    r = run_cli("memory_server", "--help")
    for flag in ["--size", "--bind", "--token", "--max-connections", "--max-frame", "--idle-timeout",
                 "--list-devices", "--device", "--rdma-port", "--gid-index"]:
        assert flag in r.stdout, flag
    assert "[default: 2333]" in r.stdout
    r = run_cli("memory_server", "--list-devices")
    assert r.returncode == 0 and r.stdout.strip()


def test_scad_run_jobs_one_still_runs_parallel_instances(tmp_path):
    d = tmp_path / "dag"
    d.mkdir()
    write(d / "fan.o.py", """
        #@ type: compute
        #@ parallelism: 3
        from disaggrt import util
        def main(params, action):
            return {"i": util.getParIndex()}
    """)
    write(d / "sink.o.py", """
        #@ type: compute
        #@ parents: [fan]
        def main(params, action):
            return {"seen": sorted(o["i"] for o in params["fan"])}
    """)
    rep = tmp_path / "r.json"
    r = run_cli("run", str(d), "-j", "1", "-d", str(tmp_path / "out"), "--json", str(rep))
    assert r.returncode == 0, r.stderr
    assert json.loads(rep.read_text())["results"]["sink"] == {"seen": [0, 1, 2]}


class _ServerProcess:
    """A ``memory_server`` console-script process on a free loopback port."""

    def __init__(self, size="4M"):
        self.p = subprocess.Popen([sys.executable, "-m", "scad.cli", "memory_server", "0", "tcp", "--size", size,
                                   "--bind", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
        line = self.p.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), line
        self.port = int(line.rsplit(":", 1)[1])

    def stop(self):
        self.p.send_signal(signal.SIGTERM)
        try:
            assert self.p.wait(20) == 0
        finally:
            self.p.stdout.close()


def test_rundisagg_takes_several_memories_after_one_m_and_repeated_m(tmp_path):
    """run_tpcds.sh: ``rundisagg step3.o.py -m "1_out_mem:30441" "2_out_mem:30442"
    "3_out_mem:30443"`` (argparse nargs='+'); repeated -m works too, and mixes."""
    prog = write(tmp_path / "step3.o.py", """
        #@ type: compute
        def main(params, action):
            out = {}
            for i, name in enumerate(["1_out_mem", "2_out_mem", "3_out_mem"]):
                t = action.get_transport(name, "rdma")
                t.reg(16)
                t.buf[0:1] = bytes([params_seed() + i])
                t.write(1, 100)
                t.read(1, 100, 8)
                out[name] = t.buf[8]
            return out

        def params_seed():
            import os
            return int(os.environ.get("SEED", "10"))
    """)
    servers = [_ServerProcess() for _ in range(3)]
    try:
        specs = [f"{n}_out_mem:{s.port}" for n, s in zip((1, 2, 3), servers)]
        forms = {
            "one -m, three values": ["-m", *specs],
            "-m repeated": ["-m", specs[0], "-m", specs[1], "-m", specs[2]],
            "mixed": ["-m", specs[0], specs[1], "-m", specs[2]],
        }
        for seed, (form, margs) in zip((10, 20, 30), forms.items()):
            r = run_cli("rundisagg", prog, *margs, "-d", str(tmp_path), "-p", env={"SEED": str(seed)})
            assert r.returncode == 0, f"{form}: {r.stderr}"
            res = json.loads((tmp_path / "rundisagg.step3.json").read_text())
            assert res == {"1_out_mem": seed, "2_out_mem": seed + 1, "3_out_mem": seed + 2}, form
        # The original's long option names, and the element file after the memories.
        r = run_cli("rundisagg", "-m", *specs, prog, "--output_dir", str(tmp_path), "--print_output",
                    env={"SEED": "40"})
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"1_out_mem": 40, "2_out_mem": 41, "3_out_mem": 42}
        # Each server saw its own transport's writes (one byte per run).
        import disagg
        a = disagg.LibdAction(None, "check", timeout=10)
        for i, s in enumerate(servers):
            a.add_transport(f"s{i};rdma_tcp;url,tcp://127.0.0.1:{s.port};")
            t = a.get_transport(f"s{i}", "rdma")
            t.reg(1)
            t.read(1, 100)
            assert t.buf[0] == 40 + i
        a.terminate()
        missing = run_cli("rundisagg", "-m", *specs)
        assert missing.returncode == 2 and "objectfile" in missing.stderr
    finally:
        for s in servers:
            s.stop()


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_memory_server_script_and_embedded_server_commit_memory_only_when_written():
    """The wheel's memory_server (and its embedded MemoryServer) map their address space:
    an 8 GiB server is small until written (the process includes the Python interpreter
    and the wheel)."""
    s = _ServerProcess("8G")
    try:
        start = _rss(s.p.pid)
        import disagg
        a = disagg.LibdAction(None, "rss", timeout=10)
        a.add_transport(f"m;rdma_tcp;url,tcp://127.0.0.1:{s.port};")
        t = a.get_transport("m", "rdma")
        t.reg(16 << 20)
        t.buf[0:16 << 20] = b"\x07" * (16 << 20)
        t.write(16 << 20, (8 << 30) - (16 << 20))
        written = _rss(s.p.pid)
        a.terminate()
        print(f"memory_server script --size 8G: {start / 2**20:.1f} MiB at start, "
              f"{written / 2**20:.1f} MiB after writing 16 MiB")
        assert start < 128 << 20
        assert written - start < 64 << 20
    finally:
        s.stop()
    before = _rss(os.getpid())
    big = _native.MemoryServer(8 << 30)
    try:
        assert _rss(os.getpid()) - before < 64 << 20
    finally:
        big.shutdown()


def test_scad_run_gives_its_servers_a_token_off_loopback():
    """Protected mode serves loopback clients only: `scad run --host ADDR` on another
    address starts its memory servers with a token of the run's own (passed to the
    elements in their -m specs)."""
    from scad.runner import _is_loopback
    assert _is_loopback("127.0.0.1") and _is_loopback("127.1.2.3") and _is_loopback("localhost")
    assert _is_loopback("::1")
    assert not _is_loopback("10.213.77.1") and not _is_loopback("0.0.0.0") and not _is_loopback("myhost")
    specs = parse_memory_spec("mem:2333:tcp:token,abc", "10.213.77.1")
    assert specs == [("mem", "mem;rdma_tcp;url,tcp://10.213.77.1:2333;token,abc;")]
