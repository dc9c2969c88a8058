"""The sglang loader: parsers without sglang's runtime, and a clear error for a missing or other version."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from tito_rl.trajectory.adapters.parsing import sglang_loader
from tito_rl.trajectory.adapters.parsing.sglang_loader import (
    SGLANG_VERSION,
    XGRAMMAR_VERSION,
    SglangInstallError,
    check_version,
)

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter: what a tito process has loaded depends on what ran before in it."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_parsers_load_without_sglangs_runtime_or_torch() -> None:
    done = run_python(
        "import sys\n"
        "from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers\n"
        "p = parsers()\n"
        "import sglang, xgrammar\n"
        "print(sorted(m for m in ('torch', 'triton', 'tvm_ffi', 'sglang.lang', 'sglang.srt.managers')"
        " if m in sys.modules))\n"
        "print(hasattr(sglang, 'Runtime'), xgrammar.StructuralTag is xgrammar.structural_tag.StructuralTag)\n"
        "print(p.ReasoningParser('qwen3').parse_non_stream('<think>a</think>b'))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[]", "False True", "('a', 'b')"]
    assert done.stderr == ""  # no advice, warnings or leak reports from the libraries loaded


def test_a_different_version_is_an_error_naming_the_pinned_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.5.22")
    with pytest.raises(SglangInstallError) as e:
        check_version("sglang", SGLANG_VERSION)
    assert str(e.value).startswith(f"sglang 0.5.22 is installed, but tito's parsers need sglang=={SGLANG_VERSION}")
    assert sglang_loader.INSTALL_COMMAND in str(e.value)


def test_a_missing_package_is_an_error_with_the_install_command() -> None:
    with pytest.raises(SglangInstallError) as e:
        check_version("no-such-distribution-tito", "1.0")
    assert str(e.value) == (
        "no-such-distribution-tito is not installed; tito's parsers need "
        f"no-such-distribution-tito==1.0: {sglang_loader.INSTALL_COMMAND}"
    )


def test_tito_serve_with_another_sglang_says_which_version_it_needs() -> None:
    done = run_python(
        "import importlib.metadata, sys\n"
        "real = importlib.metadata.version\n"
        "importlib.metadata.version = lambda name: '0.5.22' if name == 'sglang' else real(name)\n"
        "from tito_rl.main import main\n"
        "sys.exit(main(['serve', '--engine', 'http://127.0.0.1:9']))\n"
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        f"tito serve: sglang 0.5.22 is installed, but tito's parsers need sglang=={SGLANG_VERSION} "
        f"(they are loaded from that version's modules): {sglang_loader.INSTALL_COMMAND}\n"
    )


def test_the_pins_installed_are_the_pins_checked() -> None:
    pins = [
        line
        for line in (ROOT / "requirements-parsers.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert pins == [f"sglang=={SGLANG_VERSION}", f"xgrammar=={XGRAMMAR_VERSION}"]
    assert importlib.metadata.version("sglang") == SGLANG_VERSION
    assert importlib.metadata.version("xgrammar") == XGRAMMAR_VERSION


def test_stand_ins_are_held_only_where_the_parsers_never_call_them() -> None:
    done = run_python(
        "import sys, types\n"
        "from tito_rl.trajectory.adapters.parsing.sglang_loader import STAND_IN_DOC, parsers\n"
        "p = parsers()\n"
        "def stand_in(v):\n"
        "    return (isinstance(v, types.ModuleType) and v.__doc__ == STAND_IN_DOC) or (\n"
        "        isinstance(v, type) and v.__module__ in ('transformers', 'IPython.display', 'tqdm')\n"
        "        and v.__module__ not in sys.modules)\n"
        "print(sorted(n for n, m in list(sys.modules.items())\n"
        "             if n != 'tito_rl.trajectory.adapters.parsing.sglang_loader'\n"
        "             and any(stand_in(v) for v in vars(m).values())))\n"
        "print([n for n in ('transformers', 'IPython', 'numpy', 'requests', 'pybase64', 'tqdm') if n in sys.modules])\n"
        "import numpy, requests, tqdm, transformers, IPython.display\n"
        "print(numpy.zeros(2).tolist(), callable(tqdm.tqdm), transformers.PreTrainedTokenizerBase.__module__)\n"
        "print(p.ReasoningParser('qwen3').parse_non_stream('<think>a</think>b'))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "['sglang.srt.parser.reasoning_parser', 'sglang.utils']",
        "[]",
        "[0.0, 0.0] True transformers.tokenization_utils_base",
        "('a', 'b')",
    ]


def test_openai_runs_its_init_only_when_a_name_of_it_is_asked_for() -> None:
    done = run_python(
        "import sys\n"
        "from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers\n"
        "parsers()\n"
        "from pydantic._internal import _config\n"
        "print('openai._client' in sys.modules, 'OpenAI' in vars(sys.modules['openai']),"
        " 'openai.types.responses.response_create_params' in sys.modules, _config.config_defaults['defer_build'])\n"
        "import openai\n"
        "from openai import OpenAI\n"
        "from openai.types import Batch\n"
        "from openai.types.chat import ChatCompletionChunk\n"
        "from importlib.metadata import version\n"
        "print(OpenAI is openai.OpenAI, openai.__version__ == version('openai'), Batch.__module__,"
        " openai.types.responses.ResponseOutputText.__module__)\n"
        "print(getattr(openai, 'no_such_name', 'missing'))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "False False False False",
        "True True openai.types.batch openai.types.responses.response_output_text",
        "missing",
    ]


def test_a_bare_model_rebuild_while_the_parsers_load_waits_for_first_use() -> None:
    """xgrammar completes 11 structural-tag models with a bare `model_rebuild()` at import (a third of its load):
    deferred, they build on first use from their module's names, recursive references included, and give the
    same schema and validation; pydantic's own `model_rebuild` is back afterwards."""
    done = run_python(
        "import pydantic\n"
        "original = pydantic.BaseModel.__dict__['model_rebuild']\n"
        "from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers\n"
        "parsers()\n"
        "import xgrammar.structural_tag as st\n"
        "print(pydantic.BaseModel.__dict__['model_rebuild'] is original, st.SequenceFormat.__pydantic_complete__)\n"
        "tag = {'type': 'structural_tag', 'format': {'type': 'sequence', 'elements': [\n"
        "    {'type': 'const_string', 'value': 'a'},\n"
        "    {'type': 'sequence', 'elements': [{'type': 'const_string', 'value': 'b'}]}]}}\n"
        "parsed = st.StructuralTag.model_validate(tag)\n"
        "print(type(parsed.format.elements[1]).__name__, parsed.format.elements[1].elements[0].value)\n"
        "import json, hashlib\n"
        "schema = json.dumps(st.StructuralTag.model_json_schema(), sort_keys=True)\n"
        "print(hashlib.sha256(schema.encode()).hexdigest())\n"
    )
    assert done.returncode == 0, done.stderr
    deferred = done.stdout.splitlines()
    eager = run_python(  # xgrammar imported on its own, its models built at import as it means them to be
        "import sys, types, importlib.util\n"
        "spec = importlib.util.find_spec('xgrammar')\n"
        "sys.modules['xgrammar'] = importlib.util.module_from_spec(spec)\n"
        "import xgrammar.structural_tag as st\n"
        "print(st.SequenceFormat.__pydantic_complete__)\n"
        "import json, hashlib\n"
        "schema = json.dumps(st.StructuralTag.model_json_schema(), sort_keys=True)\n"
        "print(hashlib.sha256(schema.encode()).hexdigest())\n"
    )
    assert eager.returncode == 0, eager.stderr
    assert deferred[:2] == ["True False", "SequenceFormat b"]
    assert eager.stdout.splitlines() == ["True", deferred[2]]  # the same schema, built later
