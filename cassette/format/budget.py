"""Bounded decoding: a cassette is untrusted input (it can come from a pull request), so what its bytes may
decode to is bounded while they are decoded, never after."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tito_rl.cassette.format.errors import CorruptCassetteError

DECODE_RATIO = 256  # decoded bytes per stored byte (the committed corpus: under 20; a delta or zlib bomb: more)
DECODE_FLOOR = 16 << 20  # decoded bytes any cassette may reach, whatever its size


@dataclass
class DecodeBudget:
    """How much one reader's cassette may decode to: `DECODE_RATIO` bytes per byte read so far (and at least
    `DECODE_FLOOR`), counting decompressed records (inflated no further than the budget has left), delta-resolved
    prompts and bodies and expanded masks. A zlib bomb or a delta bomb (many tiny records each re-using a huge
    context) stops with one error early, in bounded memory and time, instead of decoding without end. The bound
    is the file's, not a record's: one record may compress far better than the rest (a sample's logprobs are
    mostly zeros) and still read."""

    stored: int = 0
    decoded: int = 0
    built: dict[int, Any] = field(default_factory=dict)  # id of a list this frame's decoding built -> its items

    def read(self, n: int) -> None:
        self.stored += n
        self.built = {}

    def built_here(self, values: list[Any], items: Any) -> list[Any]:
        """`values`, a list the decoder made from packed bytes, all of type `items` (int, float, or Any for
        data such as logprob triples): known, so not walked again by the record checks."""
        self.built[id(values)] = items
        return values

    def left(self) -> int:
        return max(0, max(DECODE_FLOOR, DECODE_RATIO * self.stored) - self.decoded)

    def spend(self, n: int, what: str) -> None:
        if n > self.left():
            raise CorruptCassetteError(
                f"corrupt cassette: {what} decodes past {DECODE_RATIO}x the {self.stored} bytes read "
                f"({self.decoded + n} bytes; a decompression bomb?)"
            )
        self.decoded += n
