"""aiohttp imported through `trajectory/runtime/lazy_tls.py`: no certificate store loaded at import, the same store as
`ssl.create_default_context()` by the first TLS handshake, and contexts made by anything else left whole.
Each check runs in a fresh interpreter: this one has imported aiohttp already."""

from __future__ import annotations

import subprocess
import sys

from tests.process_helpers import ROOT


def run_fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_certificates_load_at_the_first_handshake_of_an_https_request() -> None:
    out = run_fresh("""
import asyncio, ssl
from tito_rl.trajectory.runtime.lazy_tls import defer_aiohttp_tls
defer_aiohttp_tls()
import aiohttp, aiohttp.connector as c
expected = ssl.create_default_context().cert_store_stats()
assert expected["x509_ca"] > 0, expected  # the machine has a CA bundle, or this test shows nothing
verified, unverified = c._SSL_CONTEXT_VERIFIED, c._SSL_CONTEXT_UNVERIFIED
assert verified.cert_store_stats()["x509_ca"] == 0 and unverified.cert_store_stats()["x509_ca"] == 0
assert verified.verify_mode == ssl.CERT_REQUIRED and verified.check_hostname
assert "set_default_verify_paths" not in ssl.SSLContext.__dict__  # ssl itself is as it was

async def attempt(**kwargs):
    async def drop(reader, writer):
        writer.close()
    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with aiohttp.ClientSession() as session:
        try:
            await session.get(f"https://127.0.0.1:{port}/", **kwargs)
        except aiohttp.ClientError:
            pass  # the server hangs up during the handshake: what matters is that one started
    server.close()

asyncio.run(attempt())
assert verified.cert_store_stats() == expected, (verified.cert_store_stats(), expected)
assert unverified.cert_store_stats()["x509_ca"] == 0
asyncio.run(attempt(ssl=False))
assert unverified.cert_store_stats() == expected
print("ok")
""")
    assert out == "ok"


def test_a_context_made_by_anything_else_meanwhile_is_completed_at_once() -> None:
    out = run_fresh("""
import ssl
from tito_rl.trajectory.runtime.lazy_tls import settle, verify_paths_deferred
with verify_paths_deferred() as deferred:
    own, other = ssl.create_default_context(), ssl.create_default_context()
    assert own.cert_store_stats()["x509_ca"] == 0 and len(deferred) == 2
settle(deferred, (own,))
assert other.cert_store_stats() == ssl.create_default_context().cert_store_stats() and type(other) is ssl.SSLContext
assert own.cert_store_stats()["x509_ca"] == 0 and type(own).__name__ == "CertsOnFirstUse"
print("ok")
""")
    assert out == "ok"


def test_nothing_is_imported_until_aiohttp_is() -> None:
    out = run_fresh("""
import sys
from tito_rl.trajectory.runtime.lazy_tls import defer_aiohttp_tls
defer_aiohttp_tls()
defer_aiohttp_tls()  # once is enough
assert "aiohttp" not in sys.modules and sum(type(f).__name__ == "_ConnectorFinder" for f in sys.meta_path) == 1
import aiohttp
assert type(sys.modules["aiohttp.connector"]._SSL_CONTEXT_VERIFIED).__name__ == "CertsOnFirstUse"
assert not any(type(f).__name__ == "_ConnectorFinder" for f in sys.meta_path)
print("ok")
""")
    assert out == "ok"


def test_aiohttp_imported_before_is_left_alone() -> None:
    out = run_fresh("""
import ssl
import aiohttp.connector as c
from tito_rl.trajectory.runtime.lazy_tls import defer_aiohttp_tls
defer_aiohttp_tls()
assert type(c._SSL_CONTEXT_VERIFIED) is ssl.SSLContext
assert c._SSL_CONTEXT_VERIFIED.cert_store_stats()["x509_ca"] > 0
print("ok")
""")
    assert out == "ok"
