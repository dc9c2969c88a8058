"""sglang's parsers without sglang's serving runtime: the one way tito imports sglang.

`import sglang` runs `sglang/__init__.py`, which loads the serving runtime (torch, triton, transformers'
model code): seconds per process, gigabytes installed, and triton's leak report at every exit, though the
reasoning and tool-call parsers use none of it. Here `sglang` is registered as its bare package (its folder,
`__init__` not run), so `sglang.srt...` modules import with only what they import themselves.

xgrammar gets the same treatment: its `__init__` loads its compiled grammar engine, which imports torch,
while the parsers only need its structural-tag models (`xgrammar.structural_tag` and
`xgrammar.builtin_structural_tag`, plain pydantic). The bare `xgrammar` exports just those names; the
grammar engine (constrained decoding) is not available through it.

Libraries the parser modules import only for names the parsers never call are stood in for while they load:
transformers (`PreTrainedTokenizerBase`, a type annotation in the reasoning parser; importing transformers costs
about a second), and what `sglang.utils` imports for its notebook, HTTP and media helpers (IPython, numpy,
requests, pybase64, tqdm: a third of a second), of which the parsers call only `convert_json_schema_to_str`.
The stand-ins are removed from `sys.modules` once the parsers are loaded, so a later `import numpy` anywhere in
the process gets the real library; one already imported is used as it is. `tests/test_sglang_loader.py` checks
that only those two modules hold a stand-in.

sglang's OpenAI protocol models subclass and reference openai's type models, so those load for real; but
`openai/__init__.py` (the whole HTTP client) and `openai/types/__init__.py` (every type of the API) need not run
for that. While the parsers load, `openai` and `openai.types` are registered as packages whose `__init__` runs
the first time something asks them for a name they have not loaded (`import openai; openai.OpenAI` works as
ever): a fifth of the parsers' load.

Both steps rely on the pinned versions' layout, so the installed versions are checked first.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from tito_rl.trajectory.runtime.quiet_imports import quiet_transformers

SGLANG_VERSION = "0.5.23"
XGRAMMAR_VERSION = "0.2.7"
INSTALL_COMMAND = f"pip install --no-deps sglang=={SGLANG_VERSION} xgrammar=={XGRAMMAR_VERSION}"

# What `xgrammar/__init__.py` exports from its pure-Python structural-tag modules.
_XGRAMMAR_EXPORTS = {
    "xgrammar.structural_tag": ("StructuralTag",),
    "xgrammar.builtin_structural_tag": (
        "get_builtin_structural_tag",
        "get_model_structural_tag",
        "normalize_tool_choice",
        "register_model_structural_tag",
    ),
}


STAND_IN_DOC = f"tito's stand-in while sglang's parsers load ({__name__})"
# Packages whose __init__ runs only when a name it defines is first asked for (see the module docstring).
_DEFERRED_INITS = ("openai", "openai.types", "openai.types.responses", "openai.types.chat", "openai.types.shared")
# Modules the parser modules import, with the names they take from them; none is called on a parse.
_STAND_INS = {
    "transformers": ("PreTrainedTokenizerBase",),
    "IPython": (),
    "IPython.display": ("HTML", "display"),
    "numpy": (),
    "requests": (),
    "pybase64": (),
    "tqdm": ("tqdm",),
}


class SglangInstallError(ImportError):
    """sglang or xgrammar is missing, or not the version tito's parsers are pinned to."""


@dataclass(frozen=True)
class Parsers:
    """The classes the adapter calls (see ../shared/notes/sglang-http.md, "Parsers")."""

    FunctionCallParser: Any
    ReasoningParser: Any
    Tool: Any
    Function: Any


def sglang_module(name: str) -> ModuleType:
    """`sglang.<name>` (e.g. "api.v1.api_types"), imported without sglang's runtime."""
    _prepare()
    return importlib.import_module(f"sglang.{name}")


@cache
def parsers() -> Parsers:
    """sglang's reasoning and tool-call parsers and the tool models they take; loaded once per process."""
    _prepare()
    for name in _DEFERRED_INITS:
        _deferred_package(name)
    with _standing_in(_STAND_INS), _deferred_model_builds():
        protocol = sglang_module("srt.entrypoints.openai.protocol")
        return Parsers(
            sglang_module("srt.function_call.function_call_parser").FunctionCallParser,
            sglang_module("srt.parser.reasoning_parser").ReasoningParser,
            protocol.Tool,
            protocol.Function,
        )


@contextlib.contextmanager
def _deferred_model_builds() -> Iterator[None]:
    """pydantic models defined meanwhile build their validators when first used, not when defined: the
    parsers' modules define hundreds (sglang's protocol, openai's types) and a parse uses a handful. The
    models behave the same; only when their build runs moves. pydantic's default is restored afterwards.

    A module may also complete its models itself with a bare `Model.model_rebuild()` (xgrammar's structural
    tags do for 11, to resolve their forward references: a third of its import); such a call is skipped, and
    the model is completed by pydantic's own rebuild on first use, as any deferred model is, from the module's
    names, which hold those references by then. A call with arguments (pydantic's own, or a caller's
    namespace) runs as ever."""
    try:
        from pydantic import BaseModel
        from pydantic._internal import _config
    except ImportError:  # another pydantic layout: models build as they are defined
        yield
        return
    defaults = getattr(_config, "config_defaults", None)
    rebuild = BaseModel.__dict__.get("model_rebuild")
    if not isinstance(defaults, dict) or "defer_build" not in defaults or not isinstance(rebuild, classmethod):
        yield
        return

    def model_rebuild(cls: type[BaseModel], *args: Any, **kwargs: Any) -> bool | None:
        if args or kwargs or cls.__pydantic_complete__:
            built: bool | None = rebuild.__func__(cls, *args, **kwargs)
            return built
        return None  # built on first use

    before = defaults["defer_build"]
    defaults["defer_build"] = True
    BaseModel.model_rebuild = classmethod(model_rebuild)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        defaults["defer_build"] = before
        BaseModel.model_rebuild = rebuild  # type: ignore[method-assign,assignment]


@contextlib.contextmanager
def _standing_in(modules: dict[str, tuple[str, ...]]) -> Iterator[None]:
    """Placeholder modules for those of `modules` not imported yet, removed again afterwards."""
    placed: dict[str, ModuleType] = {}
    for name, attributes in modules.items():
        if name in sys.modules:
            continue
        module = placed[name] = ModuleType(name, STAND_IN_DOC)
        for attribute in attributes:
            setattr(module, attribute, type(attribute, (), {"__module__": name}))
        sys.modules[name] = module
    try:
        yield
    finally:
        for name, module in placed.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


def check_version(distribution: str, expected: str) -> None:
    """Raise SglangInstallError naming `expected` unless exactly that version of `distribution` is installed."""
    try:
        installed = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise SglangInstallError(
            f"{distribution} is not installed; tito's parsers need {distribution}=={expected}: {INSTALL_COMMAND}"
        ) from None
    if installed != expected:
        raise SglangInstallError(
            f"{distribution} {installed} is installed, but tito's parsers need "
            f"{distribution}=={expected} (they are loaded from that version's modules): "
            f"{INSTALL_COMMAND}"
        )


@cache
def _prepare() -> None:
    check_version("sglang", SGLANG_VERSION)
    check_version("xgrammar", XGRAMMAR_VERSION)
    quiet_transformers()  # sglang's reasoning parser imports transformers
    _bare_package("sglang")
    xgrammar = _bare_package("xgrammar")
    if xgrammar is not None:
        with _deferred_model_builds():  # its structural-tag models too (see parsers())
            for module_name, names in _XGRAMMAR_EXPORTS.items():
                module = importlib.import_module(module_name)
                for name in names:
                    setattr(xgrammar, name, getattr(module, name))


def _deferred_package(name: str) -> None:
    """Register package `name` (unless imported) with its `__init__` run on the first name it is asked for
    that it does not hold yet: a module `__getattr__` (PEP 562) that runs it into the module, then answers.
    A name the `__init__` only re-exports from a submodule (`from .mod import Name as Name`) is answered by
    importing that submodule alone: `from openai.types.responses import ResponseOutputText` need not load the
    two hundred other response types."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    module, loader = importlib.util.module_from_spec(spec), spec.loader
    exports = _reexports(spec.origin)

    def complete(attribute: str) -> Any:
        if attribute in exports and module.__dict__.get("__getattr__") is complete:
            submodule, original = exports[attribute]
            value = getattr(importlib.import_module(f"{name}.{submodule}"), original)
            module.__dict__[attribute] = value
            return value
        if module.__dict__.get("__getattr__") is complete:
            del module.__dict__["__getattr__"]
            loader.exec_module(module)
        try:
            return module.__dict__[attribute]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}") from None

    module.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:  # as the import system binds a submodule to its package
        setattr(sys.modules[parent], child, module)


_REEXPORT = re.compile(r"^from \.(\w+) import (\w+) as (\w+)$", re.M)


def _reexports(init_file: str | None) -> dict[str, tuple[str, str]]:
    """exported name -> (submodule, its name there), for the `__init__`'s plain re-export lines."""
    if not init_file:
        return {}
    try:
        with open(init_file, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return {}
    return {alias: (submodule, original) for submodule, original, alias in _REEXPORT.findall(text)}


def _bare_package(name: str) -> ModuleType | None:
    """Register package `name` without running its `__init__`; None when it is already imported."""
    if name in sys.modules:
        return None
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise SglangInstallError(f"{name} is not an installed package: {INSTALL_COMMAND}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    return module
