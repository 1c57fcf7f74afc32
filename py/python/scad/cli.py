"""Console scripts: ``memory_server``, ``rundisagg``, ``wskgen`` and ``scad``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import List, Optional

from . import _native

__all__ = ["memory_server_main", "rundisagg_main", "wskgen_main", "scad_main"]


def memory_server_main(argv: Optional[List[str]] = None) -> int:
    """``memory_server [PORT] [tcp] --size 1G ...``: the Rust memory server, in the wheel."""
    args = ["memory_server"] + (sys.argv[1:] if argv is None else list(argv))
    try:
        return _native.memory_server_main(args)
    except (OSError, ValueError, _native.ScadError) as e:
        print(f"memory_server: {e}", file=sys.stderr)
        return 1


def _rundisagg_parser(prog: str = "rundisagg") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Run one compute element against running memory servers.")
    p.add_argument("objectfile", nargs="?", help="the compute element (<name>.o.py)")
    # nargs="+" as in the original (`-m a:1 b:2 c:3`, run_tpcds.sh), and "extend" so
    # that -m may also be repeated (`-m a:1 -m b:2`).
    p.add_argument("-m", "--memory", action="extend", nargs="+", default=[], metavar="[N@]NAME:PORT[:IMPL[:ARGS]]",
                   help="memory elements to connect: one or more after each -m, and -m may be repeated; "
                        "N@NAME:PORT gives NAME@0..N-1 on consecutive ports")
    p.add_argument("-d", "--dir", "--output_dir", dest="dir", default="/tmp",
                   help="where parents' outputs are and the result goes (default /tmp)")
    p.add_argument("-p", "--print", "--print_output", dest="print", action="store_true",
                   help="print the result as JSON")
    p.add_argument("-i", "--index", type=int, default=None, help="instance index (sets env __OW_PAR)")
    p.add_argument("--host", default="127.0.0.1", help="host of the memory servers (default 127.0.0.1)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for an unconfigured transport")
    return p


def rundisagg_main(argv: Optional[List[str]] = None) -> int:
    from .dag import ElementError
    from .runner import parse_memory_spec, run_element

    parser = _rundisagg_parser()
    args = parser.parse_args(argv)
    if args.objectfile is None:
        # `-m` takes every value after it, so `rundisagg -m a:1 b:2 prog.o.py` leaves the
        # element file among the memories: take it back from there.
        files = [m for m in args.memory if m.endswith(".py") or ":" not in m]
        if not files:
            parser.error("the following arguments are required: objectfile")
        args.objectfile = files[-1]
        args.memory.remove(files[-1])
    try:
        memories = [m for spec in args.memory for m in parse_memory_spec(spec, args.host)]
        result = run_element(args.objectfile, memories, args.dir, args.index, timeout=args.timeout)
    except (ElementError, ValueError, FileNotFoundError) as e:
        print(f"rundisagg: {e}", file=sys.stderr)
        return 2
    if args.print:
        print(json.dumps(result, indent=2))
    return 0


def wskgen_main(argv: Optional[List[str]] = None) -> int:
    from .dag import DagError, ElementError
    from .wskgen import generate

    p = argparse.ArgumentParser(prog="wskgen", description="Generate the OpenWhisk JSON of a Scad DAG.")
    p.add_argument("dir", help="DAG directory")
    p.add_argument("-o", "--output", default="-", help="output file (default stdout)")
    p.add_argument("-n", "--name", default="", help="function name (default: the directory name)")
    args = p.parse_args(argv)
    try:
        doc = generate(args.dir, args.name)
    except (DagError, ElementError) as e:
        print(f"wskgen: {e}", file=sys.stderr)
        return 2
    text = json.dumps(doc, indent=2)
    if args.output == "-":
        print(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


def scad_main(argv: Optional[List[str]] = None) -> int:
    from .dag import DagError, ElementError
    from .runner import DagRunError, run_dag

    argv = sys.argv[1:] if argv is None else list(argv)
    # The other tools take their own arguments (including --help) unchanged.
    passthrough = {"rundisagg": rundisagg_main, "wskgen": wskgen_main, "memory_server": memory_server_main}
    if argv and argv[0] in passthrough:
        return passthrough[argv[0]](argv[1:])
    p = argparse.ArgumentParser(prog="scad", description="Scad tools.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a whole element DAG locally")
    r.add_argument("dagdir")
    r.add_argument("-d", "--dir", default=None, help="output directory (default: a new temporary one)")
    r.add_argument("-j", "--jobs", type=int, default=None, help="element instances run at once (default: CPUs)")
    r.add_argument("--host", default=None, help="address the memory servers listen on (default 127.0.0.1)")
    r.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run on Ray: memory elements as actors, compute elements as tasks; ADDRESS of the "
                        "cluster (`auto`: the one this machine joined), none: a new local Ray instance")
    r.add_argument("--timeout", type=float, default=60.0)
    r.add_argument("--json", default=None, help="also write the report as JSON here")
    r.add_argument("-q", "--quiet", action="store_true", help="do not echo element output")
    qd = sub.add_parser("query-dag", help="write a SQL query as an element DAG for `scad run`")
    qd.add_argument("outdir")
    qd.add_argument("--sql", required=True, help="file with the query")
    qd.add_argument("--table", action="append", default=[], metavar="NAME=PARQUET", help="a table (repeatable)")
    qd.add_argument("--budget", default=None, help="local memory of every task (e.g. 64M)")
    qd.add_argument("--partitions", type=int, default=2,
                    help="partitions plans use: a stage runs as up to that many parallel tasks (default 2)")
    qd.add_argument("--memory", default="1G", help="size of the memory element (default 1G)")
    for name in passthrough:
        sub.add_parser(name, help=f"same as the {name} command", add_help=False)
    args = p.parse_args(argv)
    if args.cmd == "query-dag":
        return _query_dag(args)
    log = None if args.quiet else (lambda s: print(s, file=sys.stderr))
    try:
        if args.ray is not None:
            from .ray_runner import RayUnavailableError, run_dag_ray

            if args.jobs is not None or args.host is not None:
                print("scad run: --ray places elements itself; -j and --host do not apply", file=sys.stderr)
                return 2
            try:
                report = run_dag_ray(args.dagdir, args.ray or None, args.dir, args.timeout, log)
            except RayUnavailableError as e:
                print(f"scad run: {e}", file=sys.stderr)
                return 2
        else:
            report = run_dag(args.dagdir, args.dir, args.jobs, args.host or "127.0.0.1", args.timeout, log)
    except (DagError, ElementError) as e:
        print(f"scad run: {e}", file=sys.stderr)
        return 2
    except DagRunError as e:
        print(f"scad run: failed: {e}", file=sys.stderr)
        return 1
    print(report.table())
    for name, res in report.results.items():
        print(f"{name}: {json.dumps(res)[:2000]}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report.to_json(), f, indent=2)
    return 0

def _query_dag(args: argparse.Namespace) -> int:
    """``scad query-dag``: writes the DAG, prints its stages."""
    from . import ScadError, parse_size
    from .stages import write_stage_dag

    tables = {}
    for t in args.table:
        name, sep, path = t.partition("=")
        if not sep or not name or not path:
            print(f"scad query-dag: --table {t!r} is not NAME=PARQUET", file=sys.stderr)
            return 2
        tables[name] = path
    try:
        with open(args.sql, encoding="utf-8") as f:
            sql = f.read()
        budget = None if args.budget is None else parse_size(args.budget)
        plan = write_stage_dag(sql, tables, args.outdir, budget=budget,
                               memory_mb=max(1, parse_size(args.memory) >> 20), partitions=args.partitions)
    except (OSError, ValueError, ScadError) as e:
        print(f"scad query-dag: {e}", file=sys.stderr)
        return 2
    for s in plan["stages"]:
        print(f"stage_{s['id']}: {s['tasks']} task(s), reads {s['inputs']}: {s['operator']}")
    print(f"wrote {args.outdir}: run it with `scad run {args.outdir}`")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(scad_main())

