"""aiohttp without its TLS set-up at import: the certificate store loads at the first TLS handshake instead.

`aiohttp.connector` builds two default SSL contexts when it is imported, and each loads the system's CA
bundle: about 0.1 s of every tito process's start-up on the CI VM, though replays and servers talk plain HTTP
on loopback or a Unix socket. `defer_aiohttp_tls()` imports the connector with those two contexts left
without their default certificates, and gives them a class whose first handshake loads exactly what
`ssl.create_default_context()` would have loaded (`set_default_verify_paths`), so https works as ever.
"""

from __future__ import annotations

import ssl
import sys
from typing import Any


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


def defer_aiohttp_tls() -> None:
    """Import `aiohttp.connector` with its default contexts' certificates loaded on first use; a no-op once it
    is imported (the contexts are then already complete)."""
    if "aiohttp.connector" in sys.modules:
        return
    deferred: list[ssl.SSLContext] = []

    def defer(context: ssl.SSLContext) -> None:
        deferred.append(context)

    own_method = ssl.SSLContext.__dict__.get("set_default_verify_paths")
    ssl.SSLContext.set_default_verify_paths = defer  # type: ignore[method-assign]
    try:
        import aiohttp.connector as connector
    finally:
        if own_method is None:
            del ssl.SSLContext.set_default_verify_paths  # the C implementation is inherited again
        else:
            ssl.SSLContext.set_default_verify_paths = own_method  # type: ignore[method-assign]
    own = (connector._SSL_CONTEXT_VERIFIED, connector._SSL_CONTEXT_UNVERIFIED)
    for context in deferred:
        if any(context is c for c in own) and type(context) is ssl.SSLContext:
            context.__class__ = CertsOnFirstUse
        else:  # a context made by something else aiohttp imported: complete it now
            context.set_default_verify_paths()
