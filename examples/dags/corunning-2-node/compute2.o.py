#@ type: compute
#@ parents: [compute1]
#@ corunning:
#@   mem1:
#@     trans: mem1
#@     type: rdma
"""Reads the int compute1 wrote back from mem1."""
import struct


def main(params, action):
    trans = action.get_transport("mem1", "rdma")
    trans.reg(4096)
    addr = params["compute1"]["addr"]
    trans.read(4, addr, 0)
    (fetched,) = struct.unpack_from("@i", trans.buf, 0)
    expected = params["compute1"][0]["written"]
    return {"fetched": fetched, "ok": fetched == expected}
