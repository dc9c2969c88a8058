"""The live conformance table as data: its cells by target, written to markdown and read back from it.

A whole live run (every scenario through every target) takes most of an hour on a small machine; a gateway added
later is recorded alone and its columns merged into the table the page already holds (`live_conformance --merge`):
the other targets' cells are read back from the page as they were written, never recomputed or edited, and the
merged targets are named in the table's first line.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

SCENARIOS_ROW = "scenarios (sessions)"
EVERY_TITLE = "On every scenario each target recorded"
SCENARIO_TITLE = (
    "**Scenario by scenario** (the rules that fired; `-`: not recorded through that target, its wire not served)."
)
LATER = "not in this column's run (the scenario or the target came later)"
_COMMON = re.compile(r"^\*\*On the (\d+) scenario\(s\) every (other )?target recorded \((.*)\)\.\*\*$")
_HEADER = re.compile(r"^Recorded live .*? Targets: (.*?)(; not run here: (.*?))?(; merged in a later run: (.*?))?\.$")


class TableError(ValueError):
    """The page's live block is not a table this module wrote."""


@dataclass
class LiveTable:
    """What the live block shows. `first` and `every`: target → row label → cell (the row `scenarios (sessions)`
    first); `by_scenario`: scenario → target → cell. `apart`: the targets left out of the first table, each with
    the scenarios it recorded."""

    intro: str  # the header line up to "Targets: "
    targets: list[str]
    missing: dict[str, str] = field(default_factory=dict)
    merged: list[str] = field(default_factory=list)  # targets whose columns a later run added
    common: list[str] = field(default_factory=list)
    apart: dict[str, list[str]] = field(default_factory=dict)
    first: dict[str, dict[str, str]] = field(default_factory=dict)
    every: dict[str, dict[str, str]] = field(default_factory=dict)
    by_scenario: dict[str, dict[str, str]] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)  # the rows of the two summary tables, in order

    @property
    def compared(self) -> list[str]:
        return [t for t in self.targets if t not in self.apart]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _split(line: str) -> list[str]:
    """A markdown row's cells, `\\|` kept as written inside a cell."""
    cells = re.split(r"(?<!\\)\|", line.strip())
    return [c.strip() for c in cells[1:-1]]


def render(table: LiveTable) -> str:
    header = f"{table.intro}Targets: {', '.join(table.targets)}"
    if table.missing:
        header += f"; not run here: {'; '.join(f'{t} ({why})' for t, why in table.missing.items())}"
    if table.merged:
        header += f"; merged in a later run: {', '.join(table.merged)}"
    lines = [header + ".", ""]
    compared = table.compared
    if table.apart:
        names = "; ".join(f"{t}: {', '.join(sorted(s)) or 'none'}" for t, s in table.apart.items())
        first = (
            f"On the {len(table.common)} scenario(s) every other target recorded ({', '.join(table.common) or 'none'}; "
            f"{', '.join(table.apart)} recorded none of them, only its own: {names})"
        )
    else:
        first = f"On the {len(table.common)} scenario(s) every target recorded ({', '.join(table.common) or 'none'})"
    for title, columns, cells in ((first, compared, table.first), (EVERY_TITLE, table.targets, table.every)):
        lines += [f"**{title}.**", "", "| | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
        lines += [
            f"| {label} | " + " | ".join(_cell(cells[t][label]) for t in columns) + " |" for label in table.labels
        ]
        lines.append("")
    lines += [
        SCENARIO_TITLE,
        "",
        "| scenario | " + " | ".join(table.targets) + " |",
        "|---|" + "---|" * len(table.targets),
    ]
    for name in sorted(table.by_scenario):
        row = table.by_scenario[name]
        lines.append(f"| {name} | " + " | ".join(_cell(row.get(t, "-")) for t in table.targets) + " |")
    return "\n".join(lines)


def parse(text: str) -> LiveTable:
    """The table `render` wrote (cells kept as written, `\\|` included); `TableError` where it is not one."""
    lines = text.strip().splitlines()
    head = _HEADER.match(lines[0]) if lines else None
    if head is None:
        raise TableError(f"the live block does not start with a table's header line: {lines[0] if lines else ''!r}")
    missing = dict(re.findall(r"([\w-]+) \((.*?)\)(?:; |$)", head.group(3) or ""))
    table = LiveTable(
        intro=lines[0][: lines[0].index("Targets: ")],
        targets=[t.strip() for t in head.group(1).split(",")],
        missing=missing,
        merged=[t.strip() for t in (head.group(5) or "").split(",") if t.strip()],
    )
    titles = [i for i, line in enumerate(lines) if line.startswith("**")]
    if len(titles) != 3 or not (common := _COMMON.match(lines[titles[0]])):
        raise TableError("the live block does not hold the three tables `live_conformance` writes")
    listed = common.group(3)
    if common.group(2):  # "<common>; <apart> recorded none of them, only its own: <t>: <s, ...>; ..."
        shared, _, own = listed.partition("; ")
        _, _, own = own.partition(" recorded none of them, only its own: ")
        for part in own.split("; "):
            name, _, scenarios = part.partition(": ")
            table.apart[name] = [] if scenarios == "none" else scenarios.split(", ")
        listed = shared
    table.common = [] if listed == "none" else listed.split(", ")
    for start, cells in ((titles[0], table.first), (titles[1], table.every)):
        columns = _split(lines[start + 2])[1:]
        for line in lines[start + 4 :]:
            if not line.startswith("| "):
                break
            label, *row = _split(line)
            if start == titles[0]:
                table.labels.append(label)
            for target, value in zip(columns, row, strict=True):
                cells.setdefault(target, {})[label] = value.replace("\\|", "|")
    columns = _split(lines[titles[2] + 2])[1:]
    for line in lines[titles[2] + 4 :]:
        if line.startswith("| "):
            name, *row = _split(line)
            table.by_scenario[name] = {t: v.replace("\\|", "|") for t, v in zip(columns, row, strict=True)}
    return table


def merge(
    old: LiveTable,
    new: LiveTable,
    order: list[str],
    runs_through: Callable[[str, str], bool],
    column_over: Callable[[str, list[str]], dict[str, str] | None],
) -> LiveTable:
    """`old` with `new`'s targets' columns in place of theirs (or added, in `order`); the other columns as `old`
    wrote them. A scenario only the new run recorded reads, for an old target that would have run it, that it was
    not in that column's run (`runs_through(scenario, target)`). A new target that did not record all of the first
    table's scenarios cannot be compared there without recomputing the others: it is set apart.
    `column_over(target, scenarios)`: a new target's cells summed over those scenarios, None where it lacks one."""
    names = set(new.targets)
    kept = [t for t in old.targets if t not in names]
    targets = sorted([*kept, *new.targets], key=lambda t: (order.index(t) if t in order else len(order), t))
    table = LiveTable(
        intro=old.intro,
        targets=targets,
        missing={t: why for t, why in {**old.missing, **new.missing}.items() if t not in targets},
        merged=[*[t for t in old.merged if t not in names], *new.targets],
        common=old.common,
        apart={t: s for t, s in old.apart.items() if t not in names},
        labels=old.labels,
    )
    for target in targets:
        source = new if target in names else old
        table.every[target] = source.every[target]
        if target in old.first and target not in names:
            table.first[target] = old.first[target]
    for target in new.targets:
        column = column_over(target, old.common)
        if column is not None:
            table.first[target] = column
        else:
            table.apart[target] = sorted(s for s, row in new.by_scenario.items() if _recorded(row.get(target, "-")))
    table.apart = {t: table.apart[t] for t in targets if t in table.apart}
    for name in sorted({*old.by_scenario, *new.by_scenario}):
        row: dict[str, str] = {}
        for target in targets:
            if target in names:
                row[target] = new.by_scenario.get(name, {}).get(target, "-")
            elif name in old.by_scenario:
                row[target] = old.by_scenario[name].get(target, "-")
            else:
                row[target] = LATER if runs_through(name, target) else "-"
        table.by_scenario[name] = row
    return table


def _recorded(cell: str) -> bool:
    return cell != "-" and not cell.startswith("not recorded") and cell != LATER
