"""Top-p kept sets (slime's sampling masks): `kept-set-invalid`.

An engine answer's kept sets are read by the dialect view (`top_p_token_ids` / `_offsets`, checked there: offsets
`output + 1` long, rising from 0 to the ids' count); a sample's `rollout_top_p_token_ids` / `_offsets` are CSR over
its response region, offsets `response_length + 1` long (slime asserts it), and each trained token's set holds the
token sampled (the engine sampled it from that set: a trainer masking with a set that lacks it trains on -inf).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tito_rl.replayer.audit.protocol import Example, Findings, Side, clip, decode
from tito_rl.replayer.audit.traffic import Call, Finish, RuleFamily, SessionState, as_ids, as_mask


def outside(sampled: np.ndarray, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per token, whether its sampled id is not among its kept ids `ids[offsets[i]:offsets[i + 1]]`."""
    counts = np.diff(offsets)
    if not len(counts):
        return np.zeros(0, dtype=bool)
    hits = np.repeat(sampled.astype(np.int64), counts) == ids.astype(np.int64)
    found = np.zeros(len(counts), dtype=np.int64)
    owners = np.repeat(np.arange(len(counts)), counts)
    np.add.at(found, owners, hits)
    out: np.ndarray = found == 0
    return out


def _ints(value: Any) -> np.ndarray | None:
    try:
        array = np.asarray(value, dtype=np.int64).reshape(-1)
    except (ValueError, TypeError, OverflowError):
        return None
    return array


class KeptRules(RuleFamily):
    rules = ("kept-set-invalid",)

    def __init__(self, findings: Findings) -> None:
        self.findings = findings

    def call(self, state: SessionState, call: Call, prompt: np.ndarray | None) -> None:
        view = call.view
        if view.kept is None:
            if "top_p" in view.channel_error:
                self.findings.channels = True
                self._add(state, call.exchange, call.seq, None, 1, "engine offsets", view.channel_error, call)
            return
        self.findings.channels = True
        kept = view.kept
        bad = outside(call.output, np.asarray(kept.ids), np.asarray(kept.offsets))
        if bad.any():
            at = int(np.flatnonzero(bad)[0])
            self._add(
                state,
                call.exchange,
                call.seq,
                at,
                int(bad.sum()),
                "engine",
                f"engine call seq {call.seq}: {int(bad.sum())} sampled token(s) outside their kept set, first {at}",
                call,
                [Side("sampled", str(int(call.output[at]))), Side("kept set", str(kept.of(at)))],
            )

    def finish(self, state: SessionState, finish: Finish) -> None:
        record = finish.record
        if record is None or not isinstance(record.samples, list):
            return
        for number, sample in enumerate(record.samples):
            if not isinstance(sample, dict):
                continue
            ids_value, offsets_value = sample.get("rollout_top_p_token_ids"), sample.get("rollout_top_p_token_offsets")
            if ids_value is None and offsets_value is None:
                continue
            self.findings.channels = True
            self._sample(state, record.seq, number, sample, ids_value, offsets_value)

    def _sample(
        self, state: SessionState, seq: int, number: int, sample: dict[str, Any], ids_value: Any, offsets_value: Any
    ) -> None:
        length = int(sample.get("response_length") or 0)
        ids, offsets = _ints(ids_value), _ints(offsets_value)
        if ids is None or offsets is None or len(offsets) != length + 1:
            got = "missing" if offsets is None or ids is None else f"{len(offsets)} entries"
            self._add(
                state,
                None,
                seq,
                None,
                1,
                "offsets",
                f"sample {number}: kept-set offsets {got} for response length {length} (needs {length + 1})",
            )
            return
        if offsets[0] != 0 or int(offsets[-1]) != len(ids) or (np.diff(offsets) < 0).any():
            self._add(
                state,
                None,
                seq,
                None,
                1,
                "offsets",
                f"sample {number}: kept-set offsets do not rise from 0 to the {len(ids)} ids",
            )
            return
        tokens = as_ids(sample.get("tokens"))
        response = tokens[len(tokens) - length :].astype(np.int64)
        mask = as_mask(sample.get("loss_mask"))
        trained = mask == 1 if len(mask) == length else np.ones(length, dtype=bool)
        empty = (np.diff(offsets) == 0) & trained
        bad = outside(response, ids, offsets) & trained & ~empty
        for kind, where in (("empty", empty), ("sampled outside", bad)):
            if where.any():
                at = int(np.flatnonzero(where)[0])
                self._add(
                    state,
                    None,
                    seq,
                    len(tokens) - length + at,
                    int(where.sum()),
                    kind,
                    f"sample {number}: {int(where.sum())} trained token(s) "
                    + ("with an empty kept set" if kind == "empty" else "outside their kept set")
                    + f", first response token {at}",
                    None,
                    [
                        Side("sampled", clip(decode(response[at : at + 1]))),
                        Side("kept set", str([int(i) for i in ids[offsets[at] : offsets[at + 1]]])),
                    ],
                )

    def _add(
        self,
        state: SessionState,
        exchange: int | None,
        seq: int | None,
        token: int | None,
        count: int,
        kind: str,
        detail: str,
        call: Call | None = None,
        sides: list[Side] | None = None,
    ) -> None:
        example = None
        if self.findings.wants_example("kept-set-invalid"):
            example = Example(state.name, exchange, seq, token, detail, sides or [])
            if call is not None:
                call.examples.append(example)
        self.findings.add("kept-set-invalid", state.name, count, kind, example)
