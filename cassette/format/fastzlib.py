"""zlib's inflate and CRC-32 by Intel's ISA-L where its wheel is installed (`isal`), zlib's own elsewhere: the same
bytes and checksums, several times as fast. Reading a cassette checks a CRC over every record and inflates most of
them, and the audit checksums every prompt: these are a fifth of an audit's time with zlib's."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

crc32: Callable[..., int]
decompressobj: Callable[[], Any]
try:
    from isal import isal_zlib

    crc32, decompressobj = isal_zlib.crc32, isal_zlib.decompressobj
except ImportError:  # pragma: no cover - a platform without its wheel
    crc32, decompressobj = zlib.crc32, zlib.decompressobj
