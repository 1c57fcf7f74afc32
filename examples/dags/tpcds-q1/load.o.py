#@ type: compute
#@ dependents: [ctr, answer]
#@ corunning:
#@   store:
#@     trans: store
#@     type: rdma
"""TPC-DS q1, step 1: reads the four tables q1 needs from dsdgen's ``|``-delimited text
files (only the columns q1 uses) and writes them to remote memory as structured arrays.

The data directory is ``$SCAD_TPCDS_DIR`` (default: ``data/tpcds/sf0.01`` of this
repository), as ``benches/tpcds/gen_data.py --sf 0.01`` writes it. NULL keys become -1 (TPC-DS
surrogate keys start at 1); a NULL amount is marked in ``amt_valid``.

It also reserves the remote arrays the ``ctr`` instances write their partial results
into, so the parallel instances never allocate over each other.
"""
import os

import numpy as np

from disaggrt import buffer_pool_lib, rdma_array, util

PARTS = 2  # = ctr's parallelism

RETURNS = np.dtype([("date_sk", "<i8"), ("customer_sk", "<i8"), ("store_sk", "<i8"),
                    ("amt_cents", "<i8"), ("amt_valid", "?")])
DATES = np.dtype([("date_sk", "<i8"), ("year", "<i8")])
STORES = np.dtype([("store_sk", "<i8"), ("state", "S2")])
CUSTOMERS = np.dtype([("customer_sk", "<i8"), ("customer_id", "S16")])
CTR = np.dtype([("customer_sk", "<i8"), ("store_sk", "<i8"), ("total_cents", "<i8"), ("total_valid", "?")])


def data_dir():
    d = os.environ.get("SCAD_TPCDS_DIR")
    if not d:
        repo = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
        d = os.path.join(repo, "data", "tpcds", "sf0.01")
    if not os.path.isdir(os.path.join(d, "text")):
        raise FileNotFoundError(f"{d}/text not found: run `.venv/bin/python benches/tpcds/gen_data.py --sf 0.01` "
                                "or set SCAD_TPCDS_DIR to a directory it wrote")
    return d


def columns(path, wanted):
    """The wanted columns (by position) of a .dat file, as lists of strings."""
    out = [[] for _ in wanted]
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("|")
            for k, c in enumerate(wanted):
                out[k].append(fields[c])
    return out


def keys(values):
    return np.array([int(v) if v else -1 for v in values], dtype=np.int64)


def cents(values):
    """DECIMAL(7,2) text to exact integer cents (0 where NULL) and validity."""
    out = np.zeros(len(values), dtype=np.int64)
    valid = np.zeros(len(values), dtype=bool)
    for i, v in enumerate(values):
        if not v:
            continue
        neg = v.startswith("-")
        whole, _, frac = v.lstrip("+-").partition(".")
        c = int(whole or "0") * 100 + int((frac + "00")[:2])
        out[i] = -c if neg else c
        valid[i] = True
    return out, valid


def main(params, action):
    d = data_dir()
    text = os.path.join(d, "text")
    trans = action.get_transport("store", "rdma")
    trans.reg(buffer_pool_lib.buffer_size)
    pool = buffer_pool_lib.buffer_pool({"store": trans})

    # store_returns: sr_returned_date_sk(0), sr_customer_sk(3), sr_store_sk(7), sr_return_amt(11)
    date_sk, customer_sk, store_sk, amt = columns(os.path.join(text, "store_returns.dat"), [0, 3, 7, 11])
    returns = np.empty(len(date_sk), dtype=RETURNS)
    returns["date_sk"], returns["customer_sk"], returns["store_sk"] = keys(date_sk), keys(customer_sk), keys(store_sk)
    returns["amt_cents"], returns["amt_valid"] = cents(amt)
    # date_dim: d_date_sk(0), d_year(6)
    dsk, year = columns(os.path.join(text, "date_dim.dat"), [0, 6])
    dates = np.empty(len(dsk), dtype=DATES)
    dates["date_sk"], dates["year"] = keys(dsk), keys(year)
    # store: s_store_sk(0), s_state(24)
    ssk, state = columns(os.path.join(text, "store.dat"), [0, 24])
    stores = np.empty(len(ssk), dtype=STORES)
    stores["store_sk"], stores["state"] = keys(ssk), [s.encode() for s in state]
    # customer: c_customer_sk(0), c_customer_id(1)
    csk, cid = columns(os.path.join(text, "customer.dat"), [0, 1])
    customers = np.empty(len(csk), dtype=CUSTOMERS)
    customers["customer_sk"], customers["customer_id"] = keys(csk), [c.encode() for c in cid]

    meta = {}
    for name, arr in (("returns", returns), ("dates", dates), ("stores", stores), ("customers", customers)):
        ra = rdma_array.remote_array(pool, input_ndarray=arr, transport_name="store")
        meta[name] = util.dumpMeta(ra.get_array_metadata())
    # Room for each ctr instance's groups (at most one group per return row).
    parts = [rdma_array.init_empty_remote_array(pool, "store", CTR, (max(len(returns), 1),))
             for _ in range(PARTS)]
    meta["ctr_parts"] = [util.dumpMeta(p.get_array_metadata()) for p in parts]
    return {
        "meta": meta,
        "alloc": pool.get_buffer_metadata(),
        "data_dir": d,
        "rows": {"store_returns": len(returns), "date_dim": len(dates), "store": len(stores),
                 "customer": len(customers)},
    }
