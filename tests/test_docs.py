"""The README stays the short daily-loop guide, its links and the docs' links lead somewhere, and its example
test runs.

Links are checked as GitHub renders them: a relative path must exist, and a `#fragment` must be the slug of a
heading in the target file (lower case, punctuation other than `-` and `_` dropped, spaces as `-`).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
LINK = re.compile(r"\]\(([^)\s]+)\)")
SET_UP = [
    "make demo   # installs into .venv, then replays a recorded Claude Code session: no engine, no GPU",
    "make test   # installs into .venv, then runs make lint (ruff, mypy) and the whole test suite",
]


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def prose(page: Path) -> str:
    """The page without code blocks and inline code (where `[...](...)` is not a link)."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def test_readme_is_short_and_keeps_its_set_up() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    assert "## Set-up: two commands" in text
    for line in SET_UP:
        assert line in text
    for marker in ("install-figures", "corpus-table"):
        assert f"<!-- {marker}:start -->" in text and f"<!-- {marker}:end -->" in text
    steps = [text.index(f"**{n}. ") for n in range(1, 7)]
    assert steps == sorted(steps)  # record, replay in CI, update goldens, one session, look inside, what if


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_somewhere(page: Path) -> None:
    broken = []
    for target in LINK.findall(prose(page)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, broken


def test_code_names_only_docs_that_exist() -> None:
    named = set()
    for folder in ("trajectory", "cassette", "fake_engine", "recorder", "replayer", "tito_rl", "benchmarks", "tests"):
        for source in (ROOT / folder).rglob("*.py"):
            named |= set(re.findall(r"\bdocs/[\w-]+\.md", source.read_text(encoding="utf-8")))
    assert named, "no code names a docs page (fake_engine/policies/scripted.py should)"
    assert sorted(n for n in named if not (ROOT / n).is_file()) == []


@pytest.mark.slow
def test_readme_example_test_runs(tmp_path: Path) -> None:
    """The README's pytest example, copied into a file and run from the checkout (its cassette path is relative)."""
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "def test_" in b)
    test_file = tmp_path / "test_readme_example.py"
    test_file.write_text(example, encoding="utf-8")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",
            str(test_file),
            "--rootdir",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"\b2 passed\b", proc.stdout), proc.stdout[-2000:]


DOC_PAGES = [*PAGES, ROOT / "cassettes" / "FORMAT.md"]
SOURCE_PATH = re.compile(
    r"(?<![\w./-])((?:trajectory|cassette|fake_engine|recorder|replayer|tito_rl|benchmarks|tests)"
    r"/[\w/]*?\w+\.py)\b"
)
DOTTED = re.compile(r"(?<![\w.])tito_rl(?:\.\w+)+")
OLD_IMPORT = re.compile(
    r"^\s*(?:from|import) (?:trajectory|cassette|fake_engine|recorder|replayer|tito_cli)\b"
    r"|-m (?:trajectory|recorder|replayer|fake_engine|tito_cli)\b",
    re.M,
)


def resolves(dotted: str) -> bool:
    """`tito_rl.a.b.name`: its longest importable module prefix, and the rest an attribute chain of it."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts), 1, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


@pytest.mark.parametrize("page", DOC_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_code_that_exists(page: Path) -> None:
    """Every source file a page names exists, every `tito_rl.` name imports, and no example imports tito by a bare
    folder name (PyPI's `recorder`, `replayer` and `trajectory` are other projects)."""
    text = page.read_text(encoding="utf-8")
    missing = [p for p in sorted(set(SOURCE_PATH.findall(text))) if not (ROOT / p).is_file()]
    dangling = [d for d in sorted(set(DOTTED.findall(text))) if not resolves(d)]
    old = OLD_IMPORT.findall(text)
    assert (missing, dangling, old) == ([], [], [])


def test_the_docs_checks_catch_stale_names() -> None:
    assert resolves("tito_rl.cassette.writer.CassetteWriter")
    assert not resolves("tito_rl.recorder.cassette.format") and not resolves("tito_rl.cassette.writer.NoSuchName")
    assert OLD_IMPORT.findall("from recorder.cassette.format import Header\npython -m replayer.conformance")
    assert SOURCE_PATH.findall("see `replayer/replay/cli.py` and trajectory/adapters/") == ["replayer/replay/cli.py"]
