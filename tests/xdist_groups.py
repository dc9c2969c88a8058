"""`make test`'s scheduling (`pytest -n 4 --dist loadgroup`): what must share a worker does, the longest work starts
first.

xdist's own `loadgroup` groups tests by their `xdist_group` mark, by renaming each test's node id in the worker
(`item._nodeid`); pytest 9 reads `item._id`, so under pytest 9 the rename is lost and every test is scheduled alone.
This scheduler reads the groups from what the controller has, the node ids, instead:

- a cassette's sessions replayed through a driver's gateway: the plugin's group (`tito-gateway-<target>`, from the
  cassette's header), so one worker starts that gateway once for all of them;
- a test module that declares `pytestmark = pytest.mark.xdist_group("NAME")` (a module whose module-scoped fixture
  records or starts something slow): the module runs in one worker, so that fixture is made once, not once per
  worker that runs one of its tests.

xdist then sends the biggest groups first; `pytest_collection_modifyitems` (conftest) puts the tests marked `slow`
before the rest, so that among single tests the longest start first and none is left alone at the end.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

MODULE_GROUP = re.compile(r"^pytestmark = pytest\.mark\.xdist_group\([\"']([^\"']+)[\"']\)", re.M)


class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no types
    """xdist's `loadgroup`, with the groups read as described above."""

    def _split_scope(self, nodeid: str) -> str:
        return group_of(self.config, nodeid.split("::", 1)[0]) or nodeid


def group_of(config: pytest.Config, path: str) -> str | None:
    return _group(config, str(config.rootpath / path))


@cache
def _group(config: pytest.Config, path: str) -> str | None:
    if path.endswith(".tito"):
        from tito_rl.cassette.reader import CassetteReader
        from tito_rl.replayer.pytest_plugin.plugin import gateway_group

        try:
            with CassetteReader(path) as reader:
                return gateway_group(config, reader.header, Path(path))
        except Exception:  # noqa: BLE001 - an unreadable cassette is an item of its own, which fails where it runs
            return None
    if path.endswith(".py"):
        try:
            found = MODULE_GROUP.search(Path(path).read_text())
        except OSError:
            return None
        return found.group(1) if found else None
    return None
