#@ type: compute
#@ parents: [load]
#@ dependents: [answer]
#@ corunning:
#@   store:
#@     trans: store
#@     type: rdma
#@ parallelism: 2
"""TPC-DS q1, step 2 (``customer_total_return``), one hash partition per instance:
returns in year 2000 (an npjoin hash join with date_dim), partitioned by
(customer, store) with ``npjoin.partition_on_pair``, grouped and summed per
(customer, store). Each instance writes its groups into the remote array ``load``
reserved for it."""
import numpy as np

from disaggrt import buffer_pool_lib, rdma_array, util
from npjoin import join

YEAR = 2000
CTR = np.dtype([("customer_sk", "<i8"), ("store_sk", "<i8"), ("total_cents", "<i8"), ("total_valid", "?")])


def main(params, action):
    part = util.getParIndex()
    load = params["load"]
    trans = action.get_transport("store", "rdma")
    trans.reg(buffer_pool_lib.buffer_size)
    pool = buffer_pool_lib.buffer_pool({"store": trans}, load["alloc"])
    meta = load["meta"]
    parts = len(meta["ctr_parts"])
    dates = rdma_array.remote_array(pool, metadata=util.loadMeta(meta["dates"])).materialize()
    returns = rdma_array.remote_array(pool, metadata=util.loadMeta(meta["returns"])).materialize()

    # WHERE sr_returned_date_sk = d_date_sk AND d_year = 2000 (date_dim's key is unique,
    # so the join keeps each matching return once).
    days = np.ascontiguousarray(dates["date_sk"][dates["year"] == YEAR])
    table, sorter, count, ngroups = join.prepare_join(days)
    _, ridx = join.join_on_table(table, sorter, count, ngroups, np.ascontiguousarray(returns["date_sk"]))
    r = returns[np.sort(ridx)]

    # This instance's share of the (customer, store) groups.
    psorter, bounds = join.partition_on_pair(np.ascontiguousarray(r["customer_sk"]),
                                            np.ascontiguousarray(r["store_sk"]), parts)
    mine = r[psorter[bounds[part]:bounds[part + 1]]]

    # GROUP BY sr_customer_sk, sr_store_sk: sum(sr_return_amt) (NULL if all amounts are NULL).
    pairs = np.stack([mine["customer_sk"], mine["store_sk"]], axis=1)
    uniq, labels = np.unique(pairs, axis=0, return_inverse=True)
    labels = labels.reshape(-1).astype(np.int64)
    order, counts = join.groupsort_indexer(labels, len(uniq))
    starts = np.concatenate([[0], np.cumsum(counts[1:])[:-1]]).astype(np.int64)
    amounts = np.where(mine["amt_valid"], mine["amt_cents"], 0)[order]
    valid = mine["amt_valid"][order].astype(np.int64)
    out = np.empty(len(uniq), dtype=CTR)
    out["customer_sk"], out["store_sk"] = uniq[:, 0], uniq[:, 1]
    if len(uniq):
        out["total_cents"] = np.add.reduceat(amounts, starts)
        out["total_valid"] = np.add.reduceat(valid, starts) > 0

    target = rdma_array.remote_array(pool, metadata=util.loadMeta(meta["ctr_parts"][part]))
    if len(out):
        target.write_rows(0, out)
    pool.flush()
    return {"groups": len(out), "ctr": util.dumpMeta(target.get_slice(0, len(out)).get_array_metadata()),
            "returns_in_year": int(len(r))}
