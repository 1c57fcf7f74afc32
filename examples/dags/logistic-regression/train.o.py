#@ type: compute
#@ parents: [split]
#@ corunning:
#@   store:
#@     trans: store
#@     type: rdma
#@ parallelism: 3
"""Trains logistic regression on one fold (this instance's __OW_PAR) and scores it."""
import numpy as np

from disaggrt import buffer_pool_lib, rdma_array, util

EPOCHS, RATE = 200, 0.5


def main(params, action):
    fold = util.getParIndex()
    trans = action.get_transport("store", "rdma")
    trans.reg(buffer_pool_lib.buffer_size)
    pool = buffer_pool_lib.buffer_pool({"store": trans}, params["split"]["alloc"])
    f = params["split"]["meta"][fold]
    load = lambda k: rdma_array.remote_array(pool, metadata=util.loadMeta(f[k])).materialize()
    x, y, tx, ty = load("train_x"), load("train_y"), load("test_x"), load("test_y")
    w = np.zeros(x.shape[1], dtype=np.float64)
    b = 0.0
    for _ in range(EPOCHS):
        p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
        g = p - y
        w -= RATE * (x.T @ g) / len(y)
        b -= RATE * g.mean()
    pred = (1.0 / (1.0 + np.exp(-(tx @ w + b)))) > 0.5
    accuracy = float((pred == (ty > 0.5)).mean())
    return {"fold": fold, "accuracy": accuracy, "train_rows": int(len(y)), "test_rows": int(len(ty))}
