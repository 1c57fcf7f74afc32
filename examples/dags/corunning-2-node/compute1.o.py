#@ type: compute
#@ dependents: [compute2]
#@ corunning:
#@   mem1:
#@     trans: mem1
#@     type: rdma
#@ limits: {cpu: 1, mem: 128 MB}
"""Writes an int into memory element mem1 through the transport's buffer."""
import struct

VALUE = 12345
ADDR = 0


def main(params, action):
    trans = action.get_transport("mem1", "rdma")
    trans.reg(4096)
    struct.pack_into("@i", trans.buf, 0, VALUE)
    trans.write(4, ADDR, 0)
    return {"written": VALUE, "addr": ADDR}
