#@ type: compute
#@ parents: [load, ctr]
#@ corunning:
#@   store:
#@     trans: store
#@     type: rdma
"""TPC-DS q1, step 3: the per-store limit (avg(ctr_total_return) * 1.2, as DuckDB
computes it: the exact sum divided as DOUBLE, times 1.2), customers above their
store's limit (npjoin hash join on the store key), stores in TN (semi join), their
c_customer_id (npjoin hash join on the customer key), ORDER BY c_customer_id LIMIT 100.

Checks the answer against DuckDB's reference (``reference/q1.csv`` beside the data)
when it is there."""
import os

import numpy as np

from disaggrt import buffer_pool_lib, rdma_array, util
from npjoin import join

STATE = b"TN"
LIMIT = 100


def reference(data_dir):
    path = os.path.join(data_dir, "reference", "q1.csv")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return lines[1:]  # header: c_customer_id


def main(params, action):
    load = params["load"]
    parts = params["ctr"] if isinstance(params["ctr"], list) else [params["ctr"]]
    trans = action.get_transport("store", "rdma")
    trans.reg(buffer_pool_lib.buffer_size)
    pool = buffer_pool_lib.buffer_pool({"store": trans}, load["alloc"])
    meta = load["meta"]
    ctr_meta = rdma_array.merge_arrays_metadata([util.loadMeta(p["ctr"]) for p in parts])
    ctr = rdma_array.remote_array(pool, metadata=ctr_meta).materialize()
    stores = rdma_array.remote_array(pool, metadata=util.loadMeta(meta["stores"])).materialize()
    customers = rdma_array.remote_array(pool, metadata=util.loadMeta(meta["customers"])).materialize()

    # avg(ctr_total_return) * 1.2 per store, over the non-NULL totals.
    valid = ctr[ctr["total_valid"]]
    store_keys, labels = np.unique(valid["store_sk"], return_inverse=True)
    sums = np.zeros(len(store_keys), dtype=np.int64)
    np.add.at(sums, labels.reshape(-1), valid["total_cents"])
    counts = np.bincount(labels.reshape(-1), minlength=len(store_keys))
    limits = sums.astype(np.float64) / (counts.astype(np.float64) * 100.0) * 1.2

    # ctr1 JOIN limits ON store WHERE ctr_total_return > limit (NULL totals never pass).
    table, sorter, count, ngroups = join.prepare_join(np.ascontiguousarray(store_keys))
    lidx, cidx = join.join_on_table(table, sorter, count, ngroups, np.ascontiguousarray(valid["store_sk"]))
    above = valid["total_cents"][cidx].astype(np.float64) / 100.0 > limits[lidx]
    high = valid[cidx[above]]

    # AND s_store_sk = ctr_store_sk AND s_state = 'TN' (store's key is unique: a semi join).
    tn = np.ascontiguousarray(stores["store_sk"][stores["state"] == STATE])
    table, sorter, count, ngroups = join.prepare_join(tn)
    _, hidx = join.join_on_table(table, sorter, count, ngroups, np.ascontiguousarray(high["store_sk"]))
    high = high[np.sort(hidx)]

    # AND ctr_customer_sk = c_customer_sk, SELECT c_customer_id ORDER BY c_customer_id LIMIT 100.
    table, sorter, count, ngroups = join.prepare_join(np.ascontiguousarray(customers["customer_sk"]))
    cust_idx, _ = join.join_on_table(table, sorter, count, ngroups, np.ascontiguousarray(high["customer_sk"]))
    ids = np.sort(customers["customer_id"][cust_idx], kind="stable")[:LIMIT]
    answer = [i.decode() for i in ids]

    ref = reference(load["data_dir"])
    return {
        "rows": len(answer),
        "c_customer_id": answer,
        "matches_reference": None if ref is None else answer == ref,
        "groups": int(len(ctr)),
        "stores": int(len(store_keys)),
    }
