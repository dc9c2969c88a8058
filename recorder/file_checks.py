"""What `tito scenario` and `tito profile` share: YAML files checked against a typed model without running them, one
line per file, and the model's JSON Schema for editors."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

EXIT_OK, EXIT_INVALID = 0, 2


def check_files(command: str, paths: Sequence[str], summary: Callable[[str], str], error: type[Exception]) -> int:
    """`PATH: ok (SUMMARY)` for each valid file, `tito COMMAND check: ERROR` on stderr for each invalid one (`error`
    is the model's one-line error); exit 2 when any was invalid."""
    invalid = 0
    for path in paths:
        try:
            said = summary(path)
        except error as exc:
            print(f"tito {command} check: {exc}", file=sys.stderr)
            invalid += 1
            continue
        print(f"{path}: ok ({said})")
    return EXIT_INVALID if invalid else EXIT_OK


def print_schema(schema: dict[str, Any]) -> int:
    print(json.dumps(schema, indent=2, sort_keys=True))
    return EXIT_OK
