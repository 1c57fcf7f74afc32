#@ type: compute
#@ dependents: [split]
#@ corunning:
#@   store:
#@     trans: store
#@     type: rdma
"""Makes a labelled data set (two Gaussian blobs) and writes it to remote memory."""
import numpy as np

from disaggrt import buffer_pool_lib, rdma_array, util

ROWS, FEATURES, SEED = 20000, 16, 7


def main(params, action):
    trans = action.get_transport("store", "rdma")
    trans.reg(buffer_pool_lib.buffer_size)
    pool = buffer_pool_lib.buffer_pool({"store": trans})
    rng = np.random.default_rng(SEED)
    y = rng.integers(0, 2, ROWS).astype(np.float32)
    centers = np.where(y[:, None] > 0, 0.6, -0.6).astype(np.float32)
    x = (rng.standard_normal((ROWS, FEATURES), dtype=np.float32) + centers).astype(np.float32)
    rx = rdma_array.remote_array(pool, input_ndarray=x, transport_name="store")
    ry = rdma_array.remote_array(pool, input_ndarray=y, transport_name="store")
    return {
        "meta": {"x": util.dumpMeta(rx.get_array_metadata()), "y": util.dumpMeta(ry.get_array_metadata())},
        "alloc": pool.get_buffer_metadata(),
        "rows": ROWS,
    }
