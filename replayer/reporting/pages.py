"""Writing a command's HTML page (`tito inspect --html`, `tito audit --html`): one place for the one-line error."""

from __future__ import annotations

import sys


def write_page(command: str, path: str, html: str) -> bool:
    """Write `html` to `path`; False, with `<command>: cannot write <path>: <why>` on stderr, where it cannot."""
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(html)
    except OSError as exc:
        print(f"{command}: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return False
    return True
