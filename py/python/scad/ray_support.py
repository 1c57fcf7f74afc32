"""What the Ray runners share (``scad run --ray`` in :mod:`scad.ray_runner`, queries in
:mod:`scad.distributed`): the memory element actor, Ray's import, the actors'
namespace, stopping an actor and an element's own error inside Ray's. Imports nothing
of ``disagg``, so ``import disagg`` (which imports ``scad``) stays free of cycles."""

from __future__ import annotations

from typing import Any, Dict

from . import _native

INSTALL_HINT = "pip install 'scad[ray]' (or pip install 'ray>=2.40,<3')"

#: Ray namespace of the memory element actors (``ray.get_actor(name, namespace=NAMESPACE)``).
NAMESPACE = "scad"


class RayUnavailableError(RuntimeError):
    """Ray is not installed in this Python environment."""


def _ray():
    try:
        import ray
    except ImportError:
        raise RayUnavailableError(f"--ray needs Ray: {INSTALL_HINT}") from None
    return ray


class MemoryElement:
    """A memory element as a Ray actor: a memory server on the actor's node,
    protected by ``token``."""

    def __init__(self, size: int, token: str):
        import ray

        self._host = ray.util.get_node_ip_address()
        self._server = _native.MemoryServer(size, f"{self._host}:0", token)

    def address(self) -> Dict[str, Any]:
        """Where the server listens: ``host``, ``port`` and ``url``."""
        return {"host": self._host, "port": self._server.port, "url": self._server.url}

    def stats(self) -> Dict[str, int]:
        """Bytes read and written by clients so far."""
        return self._server.stats()

    def shutdown(self) -> None:
        """Stops the server (the actor is killed after)."""
        self._server.shutdown()


def _stop(ray, actor) -> None:
    """Stops a memory element: its server first (so its port is closed when this
    returns), then the actor."""
    try:
        ray.get(actor.shutdown.remote(), timeout=10)
    except Exception:  # dead already, or hung: the kill below ends it either way
        pass
    ray.kill(actor, no_restart=True)


def _cause(exc: BaseException) -> str:
    """The element's own error inside Ray's wrapper (``RayTaskError.cause``)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"
    text = str(exc).strip().splitlines()
    return text[-1] if text else type(exc).__name__
