"""Every way a cassette can be unreadable, each with its own class and a one-line message."""

from __future__ import annotations


class CassetteError(Exception):
    """Base class: every way a cassette can be unreadable has its own subclass and message."""


class CorruptCassetteError(CassetteError):
    """Bytes that are not what the writer wrote (bad magic, failed checksum, undecodable record)."""


class TruncatedHeaderError(CassetteError):
    """The file ends before its header record is complete: nothing in it can be trusted."""


class UnsupportedVersionError(CassetteError):
    """A cassette written in a format version this tito cannot read."""


class TokenizerMismatchError(CassetteError):
    """Replaying token ids with a different tokenizer than the recording's would silently diverge."""
