"""aiohttp without its TLS set-up at import: the certificate store loads at the first TLS handshake instead.

`aiohttp.connector` builds two default SSL contexts when it is imported, and each loads the system's CA
bundle: about 0.1 s of every tito process's start-up on the CI VM, though replays and servers talk plain HTTP
on loopback or a Unix socket. After `defer_aiohttp_tls()`, whenever the connector is first imported, those two
contexts are made without their default certificates and given a class whose first handshake loads exactly
what `ssl.create_default_context()` would have loaded (`set_default_verify_paths`), so https works as ever.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import ssl
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

CONNECTOR = "aiohttp.connector"


class CertsOnFirstUse(ssl.SSLContext):
    """An SSLContext whose default verify paths are loaded before its first handshake, not when it is made."""

    _certs_pending = True

    def load_pending_certs(self) -> None:
        if self._certs_pending:
            ssl.SSLContext.set_default_verify_paths(self)
            self._certs_pending = False

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        self.load_pending_certs()
        return super().wrap_socket(*args, **kwargs)

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:  # asyncio's and uvloop's TLS transports
        self.load_pending_certs()
        return super().wrap_bio(*args, **kwargs)


@contextlib.contextmanager
def verify_paths_deferred() -> Iterator[list[ssl.SSLContext]]:
    """Meanwhile, contexts asking for the default verify paths (`create_default_context`) get none yet; the
    list names them, for `settle` to complete."""
    deferred: list[ssl.SSLContext] = []

    def defer(context: ssl.SSLContext) -> None:
        deferred.append(context)

    own_method = ssl.SSLContext.__dict__.get("set_default_verify_paths")
    ssl.SSLContext.set_default_verify_paths = defer  # type: ignore[method-assign,assignment]
    try:
        yield deferred
    finally:
        if own_method is None:
            del ssl.SSLContext.set_default_verify_paths  # the C implementation is inherited again
        else:
            ssl.SSLContext.set_default_verify_paths = own_method  # type: ignore[method-assign]


def settle(deferred: Sequence[ssl.SSLContext], own: Sequence[Any]) -> None:
    """`own` contexts load their certificates at their first handshake; any other deferred one now."""
    for context in deferred:
        if any(context is c for c in own) and type(context) is ssl.SSLContext:
            context.__class__ = CertsOnFirstUse
        else:  # a context made by something else meanwhile: complete it now
            context.set_default_verify_paths()


class _ConnectorLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self.loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        with verify_paths_deferred() as deferred:
            self.loader.exec_module(module)
        settle(
            deferred, (getattr(module, "_SSL_CONTEXT_VERIFIED", None), getattr(module, "_SSL_CONTEXT_UNVERIFIED", None))
        )


class _ConnectorFinder(importlib.abc.MetaPathFinder):
    """Finds `aiohttp.connector` once, as the import system would, and loads it through `_ConnectorLoader`."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != CONNECTOR:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)  # once: the real finders answer from here on
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ConnectorLoader(spec.loader)
        return spec


def defer_aiohttp_tls() -> None:
    """From now on, the first import of `aiohttp.connector` leaves its default contexts' certificates to their
    first handshake. Costs nothing until then; a no-op once the connector is imported (its contexts are then
    complete already)."""
    if CONNECTOR in sys.modules or any(isinstance(f, _ConnectorFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _ConnectorFinder())
