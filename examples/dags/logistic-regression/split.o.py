#@ type: compute
#@ parents: [load]
#@ dependents: [train]
#@ corunning:
#@   store:
#@     trans: store
#@     type: rdma
"""Splits the data set into folds: metadata only, no data moved."""
from disaggrt import buffer_pool_lib, rdma_array, util

FOLDS = 3


def main(params, action):
    trans = action.get_transport("store", "rdma")
    trans.reg(buffer_pool_lib.buffer_size)
    pool = buffer_pool_lib.buffer_pool({"store": trans}, params["load"]["alloc"])
    meta = params["load"][0]["meta"]
    rx = rdma_array.remote_array(pool, metadata=util.loadMeta(meta["x"]))
    ry = rdma_array.remote_array(pool, metadata=util.loadMeta(meta["y"]))
    rows = rx.shape[0]
    bounds = [rows * k // FOLDS for k in range(FOLDS + 1)]
    folds = []
    for k in range(FOLDS):
        lo, hi = bounds[k], bounds[k + 1]
        train_x = [rx.get_slice(a, b).get_array_metadata() for a, b in ((0, lo), (hi, rows)) if b > a]
        train_y = [ry.get_slice(a, b).get_array_metadata() for a, b in ((0, lo), (hi, rows)) if b > a]
        folds.append({
            "train_x": util.dumpMeta(rdma_array.merge_arrays_metadata(train_x)),
            "train_y": util.dumpMeta(rdma_array.merge_arrays_metadata(train_y)),
            "test_x": util.dumpMeta(rx.get_slice(lo, hi).get_array_metadata()),
            "test_y": util.dumpMeta(ry.get_slice(lo, hi).get_array_metadata()),
        })
    return {"meta": folds, "alloc": pool.get_buffer_metadata()}
