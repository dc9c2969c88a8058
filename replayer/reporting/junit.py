"""`tito replay --junit-xml FILE`: the replay as a JUnit XML report, which CI systems show test by test.

One test case per session (`classname`: the cassette's path, `name`: the session), failed with its one-line
result as the message and its first difference or golden diff as the text, or skipped with the reason. No
times are written: like everything `tito replay` prints, the report is the same bytes for the same replay.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from xml.etree import ElementTree as ET


def junit_tree(cases: Sequence[Any], suite: str = "tito replay") -> ET.ElementTree:
    """`cases`: outcomes with `cassette`, `session`, `ok`, `skipped`, `line` and `details`."""
    failures = sum(not c.ok for c in cases)
    skipped = sum(bool(c.skipped) and c.ok for c in cases)
    root = ET.Element(
        "testsuites", name=suite, tests=str(len(cases)), failures=str(failures), errors="0", skipped=str(skipped)
    )
    element = ET.SubElement(
        root, "testsuite", name=suite, tests=str(len(cases)), failures=str(failures), errors="0", skipped=str(skipped)
    )
    for case in cases:
        test = ET.SubElement(element, "testcase", classname=str(case.cassette), name=case.session)
        if not case.ok:
            failure = ET.SubElement(test, "failure", message=case.line)
            failure.text = "\n".join([case.line, *case.details])
        elif case.skipped:
            ET.SubElement(test, "skipped", message=case.skipped)
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(path: str | os.PathLike[str], cases: Sequence[Any]) -> None:
    junit_tree(cases).write(path, encoding="utf-8", xml_declaration=True)
