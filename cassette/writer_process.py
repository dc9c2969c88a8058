"""The cassette writer in a process of its own, so that recording never holds up the proxy's event loop.

Recording one turn (redaction, prompt deltas, msgpack, zlib) costs the proxy about 0.7 ms of CPU. That
work ran after the reply, but every other session's request waited behind it on the one event loop, and
it was most of what the recording proxy added at p99 over `tito serve`. Here the proxy only packs each tap
call (msgpack, tens of microseconds) into a pipe. A child process at idle CPU priority runs the real writer
(`tito_rl.cassette.writer`): it redacts, encodes and appends, and the cassette is byte for byte the one an
in-process writer makes.

Crash safety is kept. The pipe is blocking: a tap call returns once its bytes are in the kernel's pipe buffer,
and the child reads them even after a `kill -9` of the proxy, because a dead writer end reads as EOF, not as
lost data. A call cut in the middle by the kill is the exchange in flight; it is dropped whole. A full pipe
blocks the proxy, so back-pressure never drops data or grows memory.
The child lives only to drain the pipe. It ignores SIGINT and SIGTERM, so a terminal's Ctrl-C or a stop signal
to the process group cannot cut it short; the proxy's graceful stop closes the pipe, and that ends the child.
Secrets cross the pipe in memory only: the writer redacts them before anything reaches disk.

The child answers on its stdout, one JSON object a line (`Layout`'s options say what it writes): the bytes
written so far (at most once a second, and at each session's end), and once a `--max-bytes` cap is reached. The
proxy reads them in a thread (`WriterProcessTap.bytes_written`, `.capped`, `on_event`); once capped it stops
sending, so the traffic it keeps serving costs nothing more.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import msgpack

from tito_rl.cassette.format.records import Header
from tito_rl.cassette.rotation import CappedTap, RotatingTap, Rotation
from tito_rl.cassette.writer import CassetteWriter, PerSessionTap, RecordObserver, open_writer
from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange

AGENT_FIELDS = tuple(f.name for f in fields(AgentExchange))
ENGINE_FIELDS = tuple(f.name for f in fields(EngineExchange))
PIPE_BYTES = 1 << 20  # how far the child may fall behind before a tap call waits for it
F_SETPIPE_SZ = 1031  # Linux fcntl; where it is missing the pipe keeps its default size
READY = b"ready\n"
BYTES_EVERY_S = 1.0  # how often at most the child reports the bytes written (besides each session's end)


@dataclass(frozen=True)
class Layout:
    """What `out` becomes: one cassette, one per session (`per_session`), or a folder of cassettes rotated every
    `rotation` (`cassette.rotation`); `max_bytes`: the cap on everything written (None: none)."""

    per_session: bool = False
    rotation: Rotation | None = None
    max_bytes: int | None = None
    observer: str | None = None  # `module:attribute`, each cassette's RecordObserver (its factory), reporting back
    observer_options: tuple[tuple[str, str], ...] = ()  # keyword arguments the factory is given (`--max-staleness`)

    def argv(self) -> list[str]:
        out = ["--per-session"] if self.per_session else []
        if self.rotation is not None:
            out += [
                "--rotate-sessions",
                str(self.rotation.sessions or 0),
                "--rotate-bytes",
                str(self.rotation.bytes or 0),
            ]
        if self.max_bytes is not None:
            out += ["--max-bytes", str(self.max_bytes)]
        if self.observer is not None:
            out += ["--observer", self.observer]
            for key, value in self.observer_options:
                out += ["--observer-option", f"{key}={value}"]
        return out


class RecorderError(RuntimeError):
    """The writer process could not start, or stopped: nothing more can be recorded."""


class WriterProcessTap:
    """A `TrafficTap` whose calls are carried out, in order, by a writer process; see the module docstring."""

    def __init__(
        self,
        out: Path,
        header: Header,
        per_session: bool = False,
        layout: Layout | None = None,
        on_event: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """`on_event(event)`: each of the child's reports (module docstring), in the thread that reads them."""
        self.out = out
        self.layout = layout or Layout(per_session=per_session)
        self.on_event = on_event
        self.bytes_written = 0
        self.capped = False
        # absolute: the child runs in the checkout, not in the caller's folder a relative `out` is meant in
        argv = [sys.executable, "-m", "tito_rl.cassette.writer_process", str(Path(out).absolute()), *self.layout.argv()]
        # Its own session: a terminal's Ctrl-C goes to the proxy, which then closes the pipe in order.
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._pipe = self._proc.stdin
        self._fd = self._pipe.fileno()
        with contextlib.suppress(OSError):
            import fcntl

            fcntl.fcntl(self._fd, F_SETPIPE_SZ, PIPE_BYTES)
        self._packer = msgpack.Packer(use_bin_type=True, default=_pipe_value)
        self._closed = False
        self.failure: str | None = None  # why recording stopped, once it has
        self._send(("header", header.to_dict()))
        # The child creates the file before it says ready: an unwritable --out fails here, not on a request.
        answer = self._proc.stdout.readline()
        while answer not in (READY, b""):  # reports made while the cassette was opened (an observer's first)
            self._event(answer)
            answer = self._proc.stdout.readline()
        if answer != READY:
            self._proc.stdout.close()
            self._pipe.close()
            raise RecorderError(
                f"the cassette writer could not start (exit code {self._proc.wait()}); its error is printed above"
            )
        self._reports = threading.Thread(target=self._read_reports, name="tito-writer-reports", daemon=True)
        self._reports.start()

    def _read_reports(self) -> None:
        assert self._proc.stdout is not None
        with self._proc.stdout as lines:
            for line in lines:
                self._event(line)

    def _event(self, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if "bytes" in event:
            self.bytes_written = int(event["bytes"])
        if event.get("event") == "capped":
            self.capped = True
        if self.on_event is not None:
            self.on_event(event)

    @property
    def pid(self) -> int:
        return self._proc.pid

    # TrafficTap

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        self._send(("agent_request", session, source, dict(headers)))

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        self._send(("agent_exchange", session, source, [getattr(exchange, n) for n in AGENT_FIELDS]))

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        self._send(("engine_exchange", session, source, [getattr(exchange, n) for n in ENGINE_FIELDS]))

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        self._send(("session_finished", session, source, reward, samples))

    def session_dropped(self, session: str, source: str) -> None:
        self._send(("session_dropped", session, source))

    def engine_event(self, exchange: EngineExchange) -> None:
        self._send(("engine_event", "", "", [getattr(exchange, n) for n in ENGINE_FIELDS]))

    def close(self) -> None:
        """Ends the pipe and waits until the child has written everything sent before."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(BrokenPipeError):
            self._pipe.close()
        code = self._proc.wait()
        self._reports.join()
        if code != 0:
            raise RecorderError(
                f"the cassette writer exited with code {code}: {self.out} may miss the last "
                "exchanges; its error is printed above"
            )

    def _send(self, call: tuple[Any, ...]) -> None:
        if self._closed:
            raise RecorderError(f"the recording to {self.out} is closed")
        if self.capped:  # the child writes nothing more: nor is anything sent
            return
        view = memoryview(self._packer.pack(call))
        try:
            while view:  # straight into the pipe, no user-space buffer; a signal may cut a write() short
                view = view[os.write(self._fd, view) :]
        except BrokenPipeError:
            self._closed = True
            self.failure = (
                f"the cassette writer stopped (exit code {self._proc.wait()}): nothing more is "
                f"recorded to {self.out}; its error is in tito record's output"
            )
            raise RecorderError(self.failure) from None


def _lower_priority() -> None:
    """Run only when the proxy's core has nothing else to do, and give way to the proxy at once when it
    wakes up: with SCHED_IDLE the kernel preempts this process on the proxy's wakeup, not at the next tick."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(19)


def _apply(tap: CassetteWriter | PerSessionTap | RotatingTap | CappedTap, call: list[Any]) -> None:
    op, session, source, *rest = call
    if op == "agent_request":
        tap.agent_request(session, source, rest[0])
    elif op == "agent_exchange":
        tap.agent_exchange(session, source, AgentExchange(*rest[0]))
    elif op == "engine_exchange":
        tap.engine_exchange(session, source, EngineExchange(*rest[0]))
    elif op == "session_finished":
        tap.session_finished(session, source, rest[0], rest[1])
    elif op == "session_dropped":
        tap.session_dropped(session, source)
    elif op == "engine_event":
        tap.engine_event(EngineExchange(*rest[0]))
    else:
        raise ValueError(f"unknown tap call {op!r}")


PIPE_ARRAY = 100  # msgpack ext code, on the pipe only: a numpy array (a finished sample's channels)


def _pipe_value(value: Any) -> Any:
    """A numpy array (`Sample.to_dict(arrays=True)`: a sample's routes and kept sets) as its dtype, shape and bytes,
    so that a long MoE sample's 38M route ids cross the pipe as one buffer, not as Python ints."""
    if type(value).__module__ == "numpy" and hasattr(value, "dtype") and value.dtype.kind in "iu":
        head = json.dumps([value.dtype.str, list(value.shape)]).encode()
        return msgpack.ExtType(PIPE_ARRAY, len(head).to_bytes(4, "little") + head + value.tobytes())
    raise TypeError(f"cannot send {type(value).__name__} to the cassette writer")


def _pipe_ext(code: int, data: bytes) -> Any:
    if code != PIPE_ARRAY:
        return msgpack.ExtType(code, data)
    import numpy as np

    size = int.from_bytes(data[:4], "little")
    dtype, shape = json.loads(data[4 : 4 + size])
    return np.frombuffer(data, dtype=dtype, offset=4 + size).reshape(shape)


def _calls(stdin: int) -> Any:
    """Every complete call in the pipe, in order, until EOF; a partial last call (the writer was killed in
    the middle of it) is dropped."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=1 << 31, ext_hook=_pipe_ext)
    while chunk := os.read(stdin, PIPE_BYTES):
        unpacker.feed(chunk)
        yield from unpacker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tito_rl.cassette.writer_process", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--per-session", action="store_true")
    parser.add_argument("--rotate-sessions", type=int, help="0: not by sessions")
    parser.add_argument("--rotate-bytes", type=int, help="0: not by bytes")
    parser.add_argument("--max-bytes", type=int)
    parser.add_argument(
        "--observer", metavar="MODULE:ATTRIBUTE", help="factory(header, report) of each cassette's RecordObserver"
    )
    parser.add_argument(
        "--observer-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword argument of the observer's factory (a string)",
    )
    args = parser.parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _lower_priority()
    calls = _calls(sys.stdin.fileno())
    first = next(calls, None)
    if not (isinstance(first, list) and len(first) == 2 and first[0] == "header"):
        print("tito record: the cassette writer got no header", file=sys.stderr)
        return 2
    try:
        tap = _open(args, Header(**first[1]))
    except OSError as exc:
        print(f"tito record: cannot write the cassette {args.out}: {exc}", file=sys.stderr)
        return 2
    os.write(sys.stdout.fileno(), READY)
    reported, last = -1, 0.0
    try:
        for call in calls:
            _apply(tap, call)
            now = time.monotonic()
            due = call[0] in ("session_finished", "session_dropped") or now - last >= BYTES_EVERY_S
            if due and tap.bytes_written != reported:
                reported, last = tap.bytes_written, now
                _report({"event": "bytes", "bytes": reported})
    except Exception as exc:  # noqa: BLE001 - said once, clearly; the proxy sees the broken pipe
        print(f"tito record: recording to {args.out} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    finally:
        tap.close()
        _report({"event": "closed", "bytes": tap.bytes_written})
    return 0


def _report(event: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the proxy was killed: nobody reads
        os.write(sys.stdout.fileno(), json.dumps(event).encode() + b"\n")


def _observer(name: str | None, options: list[str] | None = None) -> Callable[[Header], RecordObserver] | None:
    """`module:attribute` loaded: the command that started the writer names it (the layers below never import
    what sits above them, `tito_rl.commands`); `options`: `KEY=VALUE` keyword arguments for it."""
    if name is None:
        return None
    module, _, attribute = name.partition(":")
    factory = getattr(importlib.import_module(module), attribute)
    kwargs = dict(option.partition("=")[::2] for option in options or ())
    return lambda header: _Guarded(factory(header, _report, **kwargs))


class _Guarded:
    """An observer whose failure is said once and ends its observing, never the recording."""

    def __init__(self, inner: RecordObserver) -> None:
        self.inner: RecordObserver | None = inner

    def record(self, record: Any) -> None:
        self._call("record", record)

    def close(self) -> None:
        self._call("close")

    def _call(self, what: str, *args: Any) -> None:
        if self.inner is None:
            return
        try:
            getattr(self.inner, what)(*args)
        except Exception as exc:  # noqa: BLE001 - said once; the cassette is what must not be lost
            self.inner = None
            print(
                f"tito record: the live audit stopped ({type(exc).__name__}: {exc}); recording goes on without it",
                file=sys.stderr,
                flush=True,
            )


def _open(args: argparse.Namespace, header: Header) -> CassetteWriter | PerSessionTap | RotatingTap | CappedTap:
    tap: CassetteWriter | PerSessionTap | RotatingTap
    observer = _observer(args.observer, args.observer_option)
    if args.rotate_sessions or args.rotate_bytes:
        tap = RotatingTap(args.out, header, Rotation(args.rotate_sessions or None, args.rotate_bytes or None), observer)
    else:
        tap = open_writer(args.out, header, args.per_session, observer)
    if args.max_bytes is None:
        return tap

    def capped(written: int) -> None:
        print(
            f"tito record: --max-bytes {args.max_bytes} reached ({written} bytes written to {args.out}): recording "
            "stopped, every cassette closed; the proxy keeps serving",
            file=sys.stderr,
            flush=True,
        )
        _report({"event": "capped", "bytes": written})

    return CappedTap(tap, args.max_bytes, capped)


if __name__ == "__main__":
    sys.exit(main())
