"""sglang's parsers loaded by a helper process while this one loads the tokenizer, so start-up uses both cores.

Importing the parsers (hundreds of pydantic models) is about as long as loading the tokenizer, and each holds the
GIL: a thread cannot overlap them. `start()` forks a helper before either begins; it imports the parsers on the
other core and answers this process's parses over a pipe, running the same code (`sglang_parsers`) on the same
text, so a parse gives the same result either way. A parse through the pipe costs a round trip (about 0.5 ms
with the wake-ups of this VM) where one in process costs about 0.1 ms: the helper is for short runs, such as a
replay of a few cassettes, and `load_here()` ends it in favour of the parsers in process; a server answers its
first requests through it while the parsers load in process (`take_over`). Anything wrong with the helper (it
died, its answer cannot be read) ends it the same way, so the helper never changes a result.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
from typing import IO, Any

_ACTIVE: ParserProcess | None = None
HELPER_ENV = "TITO_PARSER_HELPER"
# Up to this many parses, a run keeps the helper; beyond, the ~0.4 ms each costs over the pipe outweighs the
# half second the parsers take to load in process (`settle`).
SHORT_RUN_PARSES = 1000
_PLANNED = 0  # parses the replays of this process have said they will ask for (`settle`)


class Channel:
    """One end of the pipe pair: pickled messages, answered in the order asked."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.reader: IO[bytes] = os.fdopen(read_fd, "rb")
        self.writer: IO[bytes] = os.fdopen(write_fd, "wb")

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)  # whole, or nothing written
        self.writer.write(data)
        self.writer.flush()

    def recv(self) -> Any:
        return pickle.load(self.reader)  # EOFError once the other end is closed

    def close(self) -> None:
        for f in (self.writer, self.reader):
            with contextlib.suppress(OSError):
                f.close()


class ParserProcess:
    """This process's end of the helper: a parse or a check of parser names, asked and answered in order."""

    def __init__(self, conn: Channel, pid: int) -> None:
        self.conn = conn
        self.pid = pid

    def close(self) -> None:
        """End the helper now, even mid-load (it holds nothing worth saving), and reap it."""
        self.conn.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def start() -> ParserProcess | None:
    """Fork the helper and make it the one parses go to until `stop()` or `load_here()`; call before the
    tokenizer is loaded. None where it would not help or not be safe: no core likely idle (`wanted`), no fork,
    the parsers already loaded, or other threads running (a fork copies only this one)."""
    global _ACTIVE, _PLANNED
    if (
        _ACTIVE is not None
        or not wanted()
        or not hasattr(os, "fork")
        or threading.active_count() > 1
        or "sglang.srt.function_call.function_call_parser" in sys.modules
    ):
        return _ACTIVE
    asks, answers = os.pipe(), os.pipe()  # (read, write) each
    sys.stdout.flush()
    sys.stderr.flush()  # nothing buffered before the fork may be written twice
    pid = os.fork()
    if pid == 0:  # the helper: never returns
        os.close(asks[1])
        os.close(answers[0])
        _serve(Channel(asks[0], answers[1]))
    os.close(asks[0])
    os.close(answers[1])
    _ACTIVE, _PLANNED = ParserProcess(Channel(answers[0], asks[1]), pid), 0
    return _ACTIVE


def wanted() -> bool:
    """Whether a helper would overlap anything: another core is likely idle (the load average leaves one
    free). On busy cores, CI running many short tito commands at once say, it would only add its work to
    theirs, and a command that ends before it parses (an unusable input, `--help`) would waste it.
    `TITO_PARSER_HELPER=1` always starts one, `=0` never."""
    forced = os.environ.get(HELPER_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return cpus >= 2 and load < cpus - 0.5


def active() -> ParserProcess | None:
    return _ACTIVE


def stop() -> None:
    """End the helper, if any: later parses load the parsers here when they first need them."""
    global _ACTIVE
    helper, _ACTIVE = _ACTIVE, None
    if helper is not None:
        helper.close()


def load_here() -> None:
    """Parse in this process from now on: the parsers are loaded here, and the helper, if any, ends."""
    stop()
    from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers

    parsers()


async def take_over() -> None:
    """In a server, once it serves: the parsers load in this process on a thread while the helper answers the
    first requests' parses; then parses run here, the helper ends, and what the load made is frozen out of the
    collector as the rest of the start-up is (`trajectory.runtime.server_process`). The thread shares the GIL with the
    requests for that half second, where before the server did not listen at all."""
    if _ACTIVE is None:
        return
    import asyncio
    import gc

    from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers

    await asyncio.get_running_loop().run_in_executor(None, parsers)
    stop()
    gc.freeze()


def settle(parses: int) -> None:
    """Before a replay, how many parses it will ask for (its engine exchanges), added to those of the replays
    before it in this process: the helper stays while the total is a short run's; past it (or with no helper),
    the parsers load here."""
    global _PLANNED
    _PLANNED += parses
    if _ACTIVE is None or _PLANNED > SHORT_RUN_PARSES:
        load_here()


def ask(request: tuple[Any, ...]) -> tuple[bool, Any]:
    """(True, the helper's answer), or (False, None) when there is no helper or it has failed: then the caller
    parses in this process, as `load_here()` has arranged. An exception the parse raised is raised here."""
    helper = _ACTIVE
    if helper is None:
        return False, None
    try:
        helper.conn.send(request)
        ok, value = helper.conn.recv()
    except (OSError, EOFError, pickle.PickleError):  # gone, or an answer that cannot be read: parse here from now
        load_here()
        return False, None
    if not ok:
        raise value
    return True, value


def _serve(conn: Channel) -> None:
    """The helper's whole life: load the parsers, then answer until this process's end of the pipe closes."""
    import gc

    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the replay, which ends the pipe
        gc.disable()  # a short-lived process of long-lived objects
        from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers as load_parsers
        from tito_rl.trajectory.adapters.parsing.sglang_parsers import SglangParsers

        load_parsers()  # now, while the other process loads everything else: the point of the helper

        parsers: dict[tuple[str | None, str | None], SglangParsers] = {}
        while True:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                break
            kind, reasoning, tool = request[:3]
            try:
                parser = parsers.get((reasoning, tool))
                if parser is None:
                    parser = SglangParsers(reasoning, tool)
                    parser.check_names()
                    parsers[(reasoning, tool)] = parser
                answer: tuple[bool, Any] = (True, parser.parse(*request[3:]) if kind == "parse" else None)
            except Exception as exc:  # noqa: BLE001 - the caller raises it, as a parse in process would
                answer = (False, exc)
            try:
                conn.send(answer)
            except Exception:  # noqa: BLE001 - an exception that does not pickle: its text instead
                conn.send((False, RuntimeError(f"{type(answer[1]).__name__}: {answer[1]}")))
    except BaseException:  # noqa: BLE001 - whatever happens, the helper leaves no traceback and no atexit work
        code = 1
    os._exit(code)
