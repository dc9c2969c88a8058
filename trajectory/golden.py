"""Golden rendering: a sample as one reviewable string.

Trained tokens (loss 1) are wrapped in `[...]`, context tokens are bare, and `|` marks where the
response region starts. Token names come from a semantic test vocabulary or from a real tokenizer
(decoded text with whitespace made visible). Long sessions stay reviewable: long context runs collapse
to a count and a digest, long trained spans to their ends and length, so every trained span's
boundaries and length remain visible while the golden stays small.
"""

from __future__ import annotations

import hashlib
import json
import sys
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tito_rl.trajectory.channels import routes_digest, versions_text
from tito_rl.trajectory.events import SessionStats, coverage_text
from tito_rl.trajectory.linearize import Span
from tito_rl.trajectory.records import Sample

if TYPE_CHECKING:
    from tito_rl.trajectory.manager import Linearization

TokenNames = Callable[[int], str]
VISIBLE_WS = str.maketrans({" ": "·", "\n": "↵", "\t": "→", "\r": "␍"})
VISIBLE_BREAKS = str.maketrans({"\n": "↵", "\t": "→", "\r": "␍"})  # message snippets: spaces stay spaces


class TokenizerNames:
    """Names for a real tokenizer: each id decoded on its own, whitespace made visible."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        name = self._cache.get(token_id)
        if name is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            name = self._cache[token_id] = text.translate(VISIBLE_WS) or f"<{token_id}>"
        return name


def digest(ids: Sequence[int]) -> str:
    return hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()[:8]


def _runs(sample: Sample) -> list[tuple[str, int, int]]:
    """(kind, start, end) runs over the tokens: kind is 'prompt', 'context' or 'trained'."""
    first = sample.prompt_length
    kinds = ["prompt"] * first + ["trained" if m else "context" for m in sample.loss_mask]
    runs: list[tuple[str, int, int]] = []
    for i, kind in enumerate(kinds):
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1], i + 1)
        else:
            runs.append((kind, i, i + 1))
    return runs


def render_sample(
    sample: Sample,
    names: TokenNames,
    *,
    logprobs: bool = False,
    collapse_context: int | None = None,
    collapse_trained: int | None = None,
) -> str:
    """One line per sample. `collapse_*` = longest run shown in full; None shows everything."""
    first = sample.prompt_length
    out: list[str] = []
    for kind, start, end in _runs(sample):
        if start == first and first > 0:
            out.append("|")
        ids = sample.tokens[start:end]
        if kind == "trained":
            lps = sample.rollout_log_probs[start - first : end - first]
            shown = [f"{names(t)}@{lp:g}" if logprobs else names(t) for t, lp in zip(ids, lps, strict=True)]
            if collapse_trained is not None and len(ids) > collapse_trained:
                out.append(f"[{' '.join(shown[:3])} … {' '.join(shown[-3:])}]({len(ids)})")
            else:
                out.extend(f"[{s}]" for s in shown)
            continue
        if collapse_context is not None and len(ids) > collapse_context:
            out.append(f"{names(ids[0])} «{len(ids) - 2} #{digest(ids[1:-1])}» {names(ids[-1])}")
            continue
        if kind == "context" and logprobs:
            lps = sample.rollout_log_probs[start - first : end - first]
            out.extend(f"{names(t)}@{lp:g}" for t, lp in zip(ids, lps, strict=True))
        else:
            out.extend(names(t) for t in ids)
    return " ".join(out)


def render_samples(samples: Sequence[Sample], names: TokenNames, **options: Any) -> str:
    """All samples of a session, each with a header line naming its reward, sizes and turns."""
    lines: list[str] = []
    for i, s in enumerate(samples):
        trained = sum(s.loss_mask)
        turns = s.metadata.get("trained_turns")
        header = f"#{i} reward={s.reward:g} response={s.response_length} trained={trained}"
        if turns is not None:
            header += f" turns={_turns_text(turns)}"
        lines += [header, render_sample(s, names, **options)]
    return "\n".join(lines)


# --- session goldens: what a cassette's `.golden` file holds per session ----------------------------------

FOLD_RUN = 16  # a run of more tokens than this shows its first and last FOLD_ENDS, a count and a digest
FOLD_ENDS = 6
SNIPPET_CHARS = 72


@dataclass
class GoldenFinish:
    """One linearization of a session, as the golden shows it."""

    reward: float
    live_samples: int | None  # samples the live run stored at this finish; None: it stored none
    linearization: Linearization
    tree: dict[str, Any]


def render_session(
    name: str,
    finishes: Sequence[GoldenFinish],
    names: TokenNames,
    drops: int = 0,
    wire_events: Sequence[str] = (),
    unsampled: int = 0,
    exchanges: int = 0,
) -> str:
    """A session's section: per finish its stats, tree, decisions and samples, one fact per line.
    `wire_events`: exchanges the tree can not show (failures, retries, aborts), listed only when there are any.
    `unsampled`: finishes where neither the recording nor the target had samples (a gateway without a session
    API): the session's `exchanges` were verified on their replies and engine calls only."""
    lines = [f"== session {name} =="]
    if drops:
        lines.append(f"dropped through the session API: {drops} time(s)")
    if unsampled:
        lines.append(
            f"no samples on either side at {unsampled} finish(es): {exchanges} exchange(s) verified on "
            "their replies and engine calls"
        )
    if wire_events:
        lines.append("wire events:")
        lines += ["  " + event for event in wire_events]
    for n, finish in enumerate(finishes, 1):
        live = "none (never finished live)" if finish.live_samples is None else str(finish.live_samples)
        lines.append(f"finish {n} of {len(finishes)}: reward {finish.reward:g}, live samples {live}")
        target = finish.tree.get("target")
        if target:  # a foreign target: its samples, and what its driver says of them; its tree is its own
            lines.append(
                f"stats (target {target}): "
                + target_stats(finish.linearization.stats, finish.tree.get("untrained_turns"))
            )
        else:
            lines.append("stats: " + _stats(finish.linearization.stats))
            lines.append("tree:")
            lines += ["  " + line for line in render_tree(finish.tree.get("nodes", []))] or ["  (empty)"]
            lines.append("decisions:")
            lines += ["  " + e.describe() for e in finish.linearization.events] or ["  none"]
        lines.append("samples:")
        result = finish.linearization
        for i, sample in enumerate(result.samples):
            spans = result.spans[i] if i < len(result.spans) else []
            lines += ["  " + line for line in render_sample_runs(i, sample, spans, names)]
        if not result.samples:
            lines.append("  none")
    return "\n".join(lines) + "\n"


def _stats(stats: SessionStats) -> str:
    forks = ", ".join(f"{k} {v}" for k, v in stats.forks.items()) or "none"
    return (
        f"turns {stats.turns}, side turns {stats.side_turns}, leaves {stats.leaves}, samples {stats.samples}, "
        f"forks {forks}, branches {stats.branches}, merges {stats.merges}, realigns {stats.realigns} "
        f"({stats.realigned_tokens} tokens), dedup tokens {stats.dedup_tokens}, dropped {stats.dropped_builders}, "
        f"masked {stats.masked_tokens}, trained {stats.trained_tokens}, emitted {stats.emitted_tokens}, "
        f"coverage {coverage_text(stats.trained_tokens, stats.emitted_tokens)}"
    )


TARGET_FIGURES = ("turns", "samples", "realigns", "merges", "masked", "trained", "untrained turns")


def target_stats(stats: SessionStats, untrained_turns: int | None) -> str:
    """A foreign target's figures (what its driver says); `parse_target_stats` reads them back."""
    forks = ", ".join(f"{k} {v}" for k, v in stats.forks.items()) or "none"
    untrained = "" if untrained_turns is None else f", untrained turns {untrained_turns}"
    return (
        f"turns {stats.turns}, samples {stats.samples}, forks {forks}, realigns {stats.realigns}, "
        f"merges {stats.merges}, masked {stats.masked_tokens}, trained {stats.trained_tokens}{untrained}"
    )


def parse_target_stats(text: str) -> dict[str, Any]:
    """`target_stats`' line back as figures: the conformance table reads a recorded target's from its golden
    where the target itself is not installed. `forks` is a dict by reason; absent figures are absent."""
    figures: dict[str, Any] = {}
    current = None
    for item in text.strip().split(", "):
        name, _, value = item.rpartition(" ")
        if name in TARGET_FIGURES:
            current = name
            figures[name.replace(" ", "_")] = int(value) if value.isdigit() else {}
            continue
        if item.startswith("forks "):
            current, (reason, _, value) = "forks", item[len("forks ") :].rpartition(" ")
            figures["forks"] = {} if value == "none" else {reason: int(value)}
        elif current == "forks" and value.isdigit():
            figures["forks"][name] = int(value)
    return figures


def render_tree(nodes: list[dict[str, Any]]) -> list[str]:
    """One line per message node. A chain stays flat; a node with several children opens branches."""
    children: dict[int | None, list[dict[str, Any]]] = {}
    for node in nodes:
        parent = node["parent"] if node["parent"] not in (0, None) else None
        children.setdefault(parent, []).append(node)
    lines: list[str] = []

    def walk(node: dict[str, Any], prefix: str, first: str) -> None:
        while True:
            lines.append(first + _node_line(node))
            kids = children.get(node["id"], [])
            if len(kids) != 1:
                break
            node, first = kids[0], prefix
        for i, kid in enumerate(kids):
            last = i == len(kids) - 1
            walk(kid, prefix + ("   " if last else "│  "), prefix + ("└─ " if last else "├─ "))

    roots = children.get(None, [])
    for i, root in enumerate(roots):
        if len(roots) == 1:
            walk(root, "", "")
        else:
            last = i == len(roots) - 1
            walk(root, "   " if last else "│  ", "└─ " if last else "├─ ")
    return lines


def _node_line(node: dict[str, Any]) -> str:
    message = node.get("message") or {}
    text = _snippet(message.get("content"))
    parts = [f"n{node['id']} {node['role']}"]
    if node.get("turn") is not None:
        finish = f", finish {node['finish']}" if node.get("finish") else ""  # cut by the token limit, aborted
        parts.append(f"[turn {node['turn']}{'' if node.get('generated') else ', not trained (merged)'}{finish}]")
    if text:
        parts.append(text)
    calls = message.get("tool_calls") or []
    if calls:
        parts.append(
            "calls " + ", ".join(_snippet(f"{c.get('name')}({_compact(c.get('arguments'))})", 48) for c in calls)
        )
    elif not text and node.get("reasoning"):
        # A reply that only thinks (a client may drop it and ask again) would otherwise be a blank line.
        parts.append("thinks " + _snippet(node["reasoning"]))
    if node.get("leaf") and node.get("samples"):
        parts.append("→ sample " + ", ".join(map(str, node["samples"])))
    return " ".join(parts)


def _turns_text(turns: Any) -> str:
    """tito's manager lists turn indices; another target's metadata may hold anything (a count): as it is."""
    if isinstance(turns, list | tuple):
        return ",".join(map(str, turns)) or "-"
    return _compact(turns)


def _compact(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _snippet(value: Any, limit: int = SNIPPET_CHARS) -> str:
    if value is None or value == "":
        return ""
    text = value if isinstance(value, str) else _compact(value)
    # Cut, then translate: the translation maps characters one to one, and a long message costs no more.
    text = text.translate(VISIBLE_BREAKS) if len(text) <= limit else text[: limit - 1].translate(VISIBLE_BREAKS) + "…"
    return '"' + text + '"'


def render_sample_runs(index: int, sample: Sample, spans: Sequence[Span], names: TokenNames) -> list[str]:
    """A sample's header line, then one line per run: the prompt, then the response region's context, and
    each turn's output, trained or masked (trained by an earlier sample, or before the first trained token),
    with its length, its turn and its tokens (long runs folded)."""
    first = sample.prompt_length
    trained = sum(sample.loss_mask)
    turns = sample.metadata.get("turns")
    header = (
        f"sample {index}: reward {sample.reward:g}, {len(sample.tokens)} tokens, "
        f"response {sample.response_length} from token {first} "
        f"(trained {trained}, masked {sample.response_length - trained})"
    )
    if turns is not None:
        header += f", turns {_turns_text(turns)}"
    lines = [header, *channel_lines(sample)]
    for kind, start, end, turn in span_runs(sample, spans):
        ids = sample.tokens[start:end]
        label = f"turn {turn}" if turn is not None else ""
        shown = _tokens(ids, names, bracket=kind == "trained")
        lines.append(f"  {kind:<8}{end - start:>7}  {label:<8} {shown}".rstrip())
    return lines


def channel_lines(sample: Sample) -> list[str]:
    """The sample's channels, one compact line each, only where it has them: routes by shape and digest (and
    the rows no answer covered), kept sets by size and digest, the weight versions where routes or kept sets
    came too or the versions change (an engine names a version with every answer: a sample of one version
    and no other channel shows none, as before channels were read)."""
    lines: list[str] = []
    routes = sample.rollout_routed_experts
    if routes is not None:
        line = f"  routes   {'x'.join(map(str, routes.shape))} #{routes_digest(routes)}"
        unknown = sample.metadata.get("routes_unknown_rows") or []
        if unknown:
            line += " unknown rows " + ",".join(f"{a}..{b - 1}" if b - a > 1 else str(a) for a, b in unknown)
        lines.append(line)
    ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
    if ids is not None and offsets is not None:
        with_sets = int((offsets[1:] > offsets[:-1]).sum())
        lines.append(f"  top-p    {with_sets} tokens with kept sets, {len(ids)} ids #{routes_digest(ids)}")
    versions = sample.weight_versions
    if versions and (lines or len(set(versions)) > 1):
        lines.append(f"  versions {versions_text(versions)}")
    return lines


def span_runs(sample: Sample, spans: Sequence[Span]) -> list[tuple[str, int, int, int | None]]:
    """(kind, start, end, turn) from the builder's spans: no walk over every token of a 150k-token sample."""
    first, total = sample.prompt_length, len(sample.tokens)
    runs: list[tuple[str, int, int, int | None]] = [("prompt", 0, first, None)] if first else []
    at = first
    for span in sorted((s for s in spans if s.length), key=lambda s: s.start):
        start, end = max(span.start, first), span.start + span.length
        if end <= start:
            continue  # an output inside the prompt region (the first-trained layout)
        if start > at:
            runs.append(("context", at, start, None))
        runs.append(("trained" if span.trained else "masked", start, end, span.turn_index))
        at = end
    if at < total:
        runs.append(("context", at, total, None))
    return runs


def _tokens(ids: Sequence[int], names: TokenNames, bracket: bool) -> str:
    def show(part: Sequence[int]) -> str:
        return " ".join(f"[{names(t)}]" if bracket else names(t) for t in part)

    if len(ids) <= FOLD_RUN:
        return show(ids)
    middle = ids[FOLD_ENDS:-FOLD_ENDS]
    return f"{show(ids[:FOLD_ENDS])} «{len(middle)} #{packed_digest(middle)}» {show(ids[-FOLD_ENDS:])}"


def packed_digest(ids: Sequence[int]) -> str:
    """`digest` over the ids as little-endian uint32 bytes: the same role at C speed, for long runs."""
    packed = array("I", ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return hashlib.sha1(packed.tobytes()).hexdigest()[:8]
