"""Drop-in replacement of the original Scad ``disagg`` module (libd's Python binding).

Element programs receive a :class:`LibdAction` as the second argument of ``main``
and reach their memory elements through ``action.get_transport(name, 'rdma')``.
Backed by scad-core's ``Action``/``Endpoint``: every transfer runs in Rust without the
GIL, calls on an unconfigured transport block until ``config_transport`` (or raise
``TimeoutError`` after the action's timeout), and errors are Python exceptions.
"""

from __future__ import annotations

import operator
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from scad import _native
from scad._native import ScadError, TerminatedError

__all__ = [
    "LibdAction",
    "LibdRDMATransport",
    "LibdRDMAServerTransport",
    "LocalRuntime",
    "ScadError",
    "TerminatedError",
]

TRANSPORT_TYPES = ("rdma", "rdma_server")


class LibdRDMATransport:
    """A client transport to one memory element (``get_transport(name, 'rdma')``)."""

    def __init__(self, action: "LibdAction", name: str, endpoint: "_native.Endpoint"):
        self._action = action
        self.name = name
        self._ep = endpoint

    def reg(self, size: int, trans: Optional["LibdRDMATransport"] = None) -> None:
        """Registers a zeroed local buffer of ``size`` bytes, or shares ``trans``'s."""
        if trans is not None:
            if not isinstance(trans, LibdRDMATransport):
                raise TypeError("reg(size, trans): trans must be a transport from get_transport")
            self._ep.reg_shared(trans._ep)
        else:
            n = _index("reg", "size", size)
            if n == 0:
                raise ValueError("reg: size must be positive")
            self._ep.reg(n)

    @property
    def buf(self) -> "_native.RegisteredBytes":
        """The registered buffer: writable and zero-copy (``np.asarray(trans.buf)``,
        ``struct.pack_into(fmt, trans.buf, off, ...)``, ``trans.buf[a:b]``;
        ``trans.buf()`` gives a memoryview). Raises ``MemoryError`` if none."""
        return self._ep.buffer()

    def read(self, size: int, addr: int, offset: int = 0) -> int:
        """Copies ``size`` bytes from remote ``addr`` into the buffer at ``offset``."""
        self._ep.read(_index("read", "size", size), _index("read", "addr", addr), _index("read", "offset", offset))
        return 0

    def write(self, size: int, addr: int, offset: int = 0) -> int:
        """Copies ``size`` bytes of the buffer at ``offset`` to remote ``addr``."""
        self._ep.write(_index("write", "size", size), _index("write", "addr", addr),
                       _index("write", "offset", offset))
        return 0

    def get_msg(self) -> Optional[bytes]:
        """Messages are not used by memory transports; always ``None``."""
        return None

    def stats(self) -> Dict[str, int]:
        """Calls and bytes moved through this transport."""
        return dict(self._ep.stats())

    def __repr__(self) -> str:
        return f"<LibdRDMATransport {self.name!r}>"


def _index(op: str, what: str, v: Any) -> int:
    """``v`` as a non-negative int (NumPy integers welcome)."""
    try:
        i = operator.index(v)
    except TypeError:
        raise TypeError(f"{op}: {what} must be an integer, not {type(v).__name__}") from None
    if i < 0:
        raise ValueError(f"{op}: {what} must be non-negative, not {i}")
    return i


class LibdRDMAServerTransport:
    """The serving side of a memory element (``get_transport(name, 'rdma_server')``)."""

    def __init__(self, action: "LibdAction", name: str):
        self._action = action
        self.name = name
        self.server: Optional[_native.MemoryServer] = None

    def serve(self) -> int:
        """Serves the configured address space until the action terminates."""
        config = self._action._native.server_config(self.name)
        if config["impl"] != "rdma_tcp_server":
            raise ScadError(f"{config['impl']} is served by the Rust memory_server binary")
        self.server = _native.MemoryServer(config["size"], config["bind"], config["token"])
        try:
            self._action._terminated.wait()
        finally:
            self.server.shutdown()
        return 0


class LocalRuntime:
    """``action.runtime``: start and drop memory elements without OpenWhisk.

    ``invoke(template, trans, props)`` starts a new memory element like ``template``
    (its ``limits.mem``, overridden by ``props``) as an in-process memory server and
    connects transport ``trans`` to it; ``release(name)`` drops every transport to
    element ``name`` and stops elements this runtime started.
    """

    DEFAULT_MEM = 512 << 20

    def __init__(self, action: "LibdAction", templates: Optional[Dict[str, Dict[str, Any]]] = None):
        self._action = action
        self.templates: Dict[str, Dict[str, Any]] = dict(templates or {})
        self._element_of: Dict[str, str] = {}
        self._servers: Dict[str, _native.MemoryServer] = {}
        self._lock = threading.Lock()

    def invoke(self, template: str, trans: str, props: Optional[Dict[str, Any]] = None) -> str:
        spec = dict(self.templates.get(template, {}))
        if props:
            spec.update(props)
        mem = (spec.get("limits") or {}).get("mem", spec.get("mem", self.DEFAULT_MEM))
        size = mem if isinstance(mem, int) else _native.parse_size(str(mem))
        server, address = self._start(trans, size)
        try:
            self._action.add_transport(f"{trans};rdma_tcp;{address}")
        except BaseException:
            server.shutdown()
            raise
        with self._lock:
            self._servers[trans] = server
            self._element_of[trans] = trans
            self.templates.setdefault(trans, spec)
        return trans

    def _start(self, name: str, size: int) -> Tuple[Any, str]:
        """Starts memory element ``name`` of ``size`` bytes: a handle with
        ``shutdown()`` and the durl fields that reach it (``url,...;`` and a token)."""
        server = _native.MemoryServer(size)
        return server, f"url,{server.url};"

    def release(self, name: str) -> None:
        names = self._action._native.names()
        targets = [t for t in names if t == name or t.startswith(name + "@") or self._element_of.get(t) == name]
        if not targets and name not in self._servers:
            raise KeyError(f"no transport to element {name!r} (known: {', '.join(names)})")
        for t in targets:
            self._action._native.release(t)
            self._action._forget(t)
        with self._lock:
            server = self._servers.pop(name, None)
        if server is not None:
            server.shutdown()

    def shutdown(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for s in servers:
            s.shutdown()


class LibdAction:
    """The runtime's handle on one element: its named transports.

    ``cv`` is a ``threading.Condition`` notified whenever a transport changes state;
    keyword arguments are runtime options (``plugins``, ``post_url``, ``server_url``,
    ``name``; here also ``timeout`` in seconds and ``templates`` for the local runtime).
    """

    def __init__(self, cv: Optional[threading.Condition], aid: Any, **kwargs: Any):
        self.cv = cv if cv is not None else threading.Condition()
        self.aid = aid
        self.options = kwargs
        self.name = kwargs.get("name", str(aid))
        self._native = _native.Action(str(aid), float(kwargs.get("timeout", 60.0)))
        self._terminated = threading.Event()
        self.transports: Dict[str, Any] = {}
        self.profile_points: List[tuple] = []
        self.runtime = LocalRuntime(self, kwargs.get("templates"))

    def _notify(self) -> None:
        with self.cv:
            self.cv.notify_all()

    def _forget(self, name: str) -> None:
        for key in [k for k in self.transports if k == name or (isinstance(k, tuple) and k[0] == name)]:
            del self.transports[key]

    def add_transport(self, durl: str) -> int:
        """Adds a transport from a durl (keys may be missing); returns its state."""
        rv = self._native.add_transport(durl)
        self._notify()
        return rv

    def config_transport(self, name: str, durl: str) -> int:
        """Completes transport ``name``; wakes threads waiting on ``cv``."""
        rv = self._native.config_transport(name, durl)
        self._notify()
        return rv

    def get_transport(self, name: str, ttype: str = "rdma"):
        """The transport ``name`` of type ``'rdma'`` or ``'rdma_server'``."""
        if ttype not in TRANSPORT_TYPES:
            raise ValueError(f"unknown transport type {ttype!r} (expected one of {', '.join(TRANSPORT_TYPES)})")
        known = self._native.names()
        if name not in known:
            raise KeyError(f"no transport named {name!r} in action {self.aid!r} (known: {', '.join(known) or 'none'})")
        cached = self.transports.get(name)
        if cached is not None and (ttype == "rdma") == isinstance(cached, LibdRDMATransport):
            return cached
        if ttype == "rdma":
            t = LibdRDMATransport(self, name, self._native.endpoint(name))
        else:
            t = LibdRDMAServerTransport(self, name)
        self.transports[name] = t
        return t

    def profile(self, point: Any) -> None:
        """Records a named time point (read them from ``profile_points``)."""
        self.profile_points.append((point, time.time()))

    def transport_stats(self) -> Dict[str, Dict[str, int]]:
        """Bytes and calls per client transport obtained so far."""
        return {n: t.stats() for n, t in self.transports.items() if isinstance(t, LibdRDMATransport)}

    def terminate(self) -> None:
        """Drops every transport, stops servers this action started, wakes waiters."""
        self._terminated.set()
        self._native.terminate()
        self.runtime.shutdown()
        self._notify()
