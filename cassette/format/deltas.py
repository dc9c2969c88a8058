"""Deltas: a prompt stored as the tokens it adds to the session's context, a request body as the bytes it
changes in the previous one. A long session costs a few bytes per new token instead of its whole history per turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.packing import common_prefix_bytes, packed_prefix_len


@dataclass(frozen=True)
class TokenDelta:
    """A token array as `prefix` tokens of the session's context plus a packed tail (all packed bytes)."""

    prefix: int
    tail: bytes

    def apply(self, base: bytes, more: bytes = b"") -> bytes:
        """The array; its base is `base` followed by `more` (a reader's context and its last output, not joined:
        each is copied once, into the result)."""
        keep = 4 * self.prefix
        if keep > len(base) + len(more):
            raise CorruptCassetteError(
                f"token delta keeps {self.prefix} tokens of a {(len(base) + len(more)) // 4}-token context"
            )
        if keep <= len(base):
            return b"".join((memoryview(base)[:keep], self.tail))
        return b"".join((base, memoryview(more)[: keep - len(base)], self.tail))


@dataclass(frozen=True)
class BytesDelta:
    prefix: int
    suffix: int
    middle: bytes

    def apply(self, base: bytes) -> bytes:
        if self.prefix + self.suffix > len(base):
            raise CorruptCassetteError("bytes delta keeps more than its base holds")
        view = memoryview(base)
        return b"".join((view[: self.prefix], self.middle, view[len(base) - self.suffix :]))  # one copy, not three


@dataclass(frozen=True)
class LogprobColumn:
    values: list[float]

    def apply(self, output_ids: list[int]) -> list[list[Any]]:
        if len(output_ids) != len(self.values):
            raise CorruptCassetteError("logprob column and output_ids differ in length")
        return [[lp, tid, None] for lp, tid in zip(self.values, output_ids, strict=True)]


def token_delta(base: bytes, tokens: bytes) -> TokenDelta:
    prefix = packed_prefix_len(base, tokens)
    return TokenDelta(prefix, tokens[4 * prefix :])


def bytes_delta(base: bytes, data: bytes) -> BytesDelta:
    prefix = common_prefix_bytes(base, data)
    rest_base, rest_data = base[prefix:], data[prefix:]
    suffix = common_prefix_bytes(rest_base[::-1], rest_data[::-1])
    return BytesDelta(prefix, suffix, rest_data[: len(rest_data) - suffix])
