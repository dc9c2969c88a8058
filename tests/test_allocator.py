"""A long-running server gives malloc's free memory back to the system (`trajectory/runtime/allocator.py`)."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tito_rl.trajectory.runtime import allocator
from tito_rl.trajectory.runtime.allocator import TRIM_ENV, Trimmer, trim_every_s
from tito_rl.trajectory.runtime.server_process import TRIMMER, prepare_to_serve

glibc = pytest.mark.skipif(allocator._TRIM is None, reason="no glibc malloc_trim on this platform")

# A heap left as a proxy leaves it: blocks of a prompt's size, most freed, a few kept among them so the
# free memory lies between live blocks (no single free run at the top for malloc to give back by itself).
FRAGMENTED = textwrap.dedent(
    """
    import random, sys
    from tito_rl.trajectory.runtime.allocator import trim

    def rss():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) // 1024

    rnd = random.Random(1)
    blocks = [bytearray(rnd.randint(600, 120_000)) for _ in range(8_000)]
    kept = blocks[::5]
    del blocks
    before = rss()
    assert trim() is True
    print(before, rss(), len(kept))
    """
)


@glibc
def test_a_trim_gives_freed_memory_back_to_the_system() -> None:
    out = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, check=True).stdout
    before, after, _ = map(int, out.split())
    # 8,000 blocks of 60 kB on average (under malloc's mmap threshold: all in the heap), four in five freed: about
    # 380 MB free between live blocks before the trim
    assert before > 350, out
    assert after < before / 2, out


def test_the_trim_period_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRIM_ENV, raising=False)
    assert trim_every_s() == allocator.TRIM_EVERY_S
    monkeypatch.setenv(TRIM_ENV, "0")
    assert trim_every_s() == 0.0
    monkeypatch.setenv(TRIM_ENV, "2.5")
    assert trim_every_s() == 2.5
    monkeypatch.setenv(TRIM_ENV, "often")
    with pytest.raises(SystemExit, match=r"^tito: TITO_MALLOC_TRIM_S='often' is not a number of seconds$"):
        trim_every_s()


@glibc
async def test_the_trimmer_trims_on_its_period_until_stopped() -> None:
    trimmer = Trimmer(every_s=0.01)
    trimmer.start()
    for _ in range(3_000):  # a hang's bound (30 s), not a timing
        await asyncio.sleep(0.01)
        if trimmer.trims >= 3:
            break
    await trimmer.stop()
    done = trimmer.trims
    assert done >= 3
    await asyncio.sleep(0.05)
    assert trimmer.trims == done  # stopped: no trim after


async def test_a_period_of_zero_turns_trimming_off() -> None:
    trimmer = Trimmer(every_s=0)
    trimmer.start()
    await asyncio.sleep(0.03)
    await trimmer.stop()
    assert trimmer.trims == 0


@glibc
async def test_a_served_app_trims_while_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRIM_ENV, "0.01")
    app = web.Application()
    prepare_to_serve(app)
    server = TestServer(app)
    await server.start_server()
    try:
        trimmer = app[TRIMMER]
        for _ in range(3_000):  # a hang's bound, not a timing
            await asyncio.sleep(0.01)
            if trimmer.trims >= 2:
                break
        assert trimmer.trims >= 2
    finally:
        await server.close()
        gc.unfreeze()  # prepare_to_serve froze this test process's objects
    assert trimmer._task is None  # stopped with the app
