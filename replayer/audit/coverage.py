"""Emitted-token coverage: each token the engine emitted for an agent turn, traced into the finish's samples.

A call's output lies in a sample where the sample's tokens start with the call's prompt (by digest) and go on
with its output: those positions are the call's, the longest such match winning where two calls would claim the
same ones. Each trained position (loss mask 1) is then the call's token trained once more, with the sample's
logprob compared to the engine's; a trained position no call claims is a token the engine never sampled.

Side requests (title generation, probes), aborted calls and dropped sessions are set aside, not counted in
coverage: the agent never took their output as a turn. A finish counts the calls made since the session's
previous finish; calls after a session's last finish (the recording stopped first) are not judged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tito_rl.replayer.audit.protocol import Example, Findings, Side, clip, decode
from tito_rl.replayer.audit.traffic import (
    Call,
    Finish,
    RuleFamily,
    SessionState,
    as_floats,
    as_ids,
    as_mask,
    traced_calls,
)

LOGPROB_TOLERANCE = 1e-6  # a sample stores the engine's float as it came: any real difference is larger


class Coverage(RuleFamily):
    rules = (
        "coverage",
        "trained-twice",
        "never-trained",
        "trained-not-emitted",
        "logprob-mismatch",
        "missing-logprobs",
    )

    def __init__(self, findings: Findings) -> None:
        self.findings = findings

    def call(self, state: SessionState, call: Call, prompt: np.ndarray | None) -> None:
        if not call.generated:
            return
        missing = len(call.output) if call.logprobs is None else int(np.count_nonzero(np.isnan(call.logprobs)))
        if missing:
            example = None
            if self.findings.wants_example("missing-logprobs"):
                example = Example(
                    state.name,
                    None,
                    call.seq,
                    None,
                    f"engine call seq {call.seq} returned {len(call.output)} tokens, {missing} without a logprob",
                    [Side("engine output", clip(decode(call.output[:32])))],
                )
                call.examples.append(example)
            self.findings.add("missing-logprobs", state.name, missing, "engine", example)

    def finish(self, state: SessionState, finish: Finish) -> None:
        figure = self.findings.figure(state.name)
        calls = [c for c in finish.calls if c.generated]
        if finish.dropped:
            figure.dropped_tokens += sum(len(c.output) for c in calls if not c.side)
            figure.side_tokens += sum(len(c.output) for c in calls if c.side)
            return
        assert finish.record is not None
        figure.finished = True
        trained = [np.zeros(len(c.output), dtype=np.int32) for c in calls]
        bad_logprob = [np.zeros(len(c.output), dtype=bool) for c in calls]
        as_context = [False] * len(calls)
        for number, sample in enumerate(finish.record.samples):
            self._sample(state, finish, number, sample, calls, trained, bad_logprob, as_context)
        self._account(state, finish, calls, trained, bad_logprob, as_context)

    def _sample(
        self,
        state: SessionState,
        finish: Finish,
        number: int,
        sample: dict[str, Any],
        calls: list[Call],
        trained: list[np.ndarray],
        bad_logprob: list[np.ndarray],
        as_context: list[bool],
    ) -> None:
        tokens = as_ids(sample.get("tokens"))
        length = int(sample.get("response_length") or 0)
        start = len(tokens) - length
        mask = as_mask(sample.get("loss_mask"))
        if len(mask) != length:  # no mask: every response token counts as trained (what a trainer would do)
            mask = np.ones(length, dtype=np.int8)
        raw = sample.get("rollout_log_probs")
        logprobs = as_floats(raw) if raw is not None and len(raw) == length else None
        owner = np.full(len(tokens), -1, dtype=np.int32)  # the call each position belongs to
        found = [(n, -i, i, p) for p, i, n in traced_calls(calls, tokens)]
        # the longest match owns a position; between equal ones (a re-send generated again with the same tokens,
        # as a deterministic engine does) the call trained least so far, so each generation is traced to a sample
        # of its own, as distinct outputs would be, not one generation to both and the other to none
        matches = [(n, -int(np.add.reduce(trained[i])), -i, i, p) for n, _, i, p in found]
        for n, _, _, i, p in sorted(matches, reverse=True):
            free = owner[p : p + n] == -1
            owner[p : p + n][free] = i
        trained_at = np.zeros(len(tokens), dtype=bool)
        trained_at[start:] = mask == 1
        for n, _, _, i, p in matches:
            mine = p + np.flatnonzero(owner[p : p + n] == i)  # a match owns positions in its own span only
            if not len(mine):
                continue
            offsets = mine - p
            hit = trained_at[mine]
            np.add.at(trained[i], offsets[hit], 1)
            if (~hit).any():
                as_context[i] = True
            call = calls[i]
            if logprobs is not None and call.logprobs is not None and hit.any():
                engine = call.logprobs[offsets[hit]]
                sampled = logprobs[mine[hit] - start]
                wrong = ~(np.abs(engine - sampled) <= LOGPROB_TOLERANCE) & ~np.isnan(engine)
                bad_logprob[i][offsets[hit][wrong]] = True
        unowned = np.flatnonzero(trained_at & (owner == -1))
        if len(unowned):
            example = None
            if self.findings.wants_example("trained-not-emitted"):
                at = int(unowned[0])
                example = Example(
                    state.name,
                    _exchange_before(calls, owner, at),
                    finish.record.seq if finish.record else None,
                    at,
                    f"sample {number}: {len(unowned)} trained token(s) no engine call "
                    "emitted, first at sample token " + str(at),
                    [
                        Side("sample (trained)", clip(decode(tokens[at : at + 24]))),
                        Side("sample before it", clip(decode(tokens[max(0, at - 24) : at]), tail=True)),
                    ],
                )
            self.findings.add("trained-not-emitted", state.name, len(unowned), None, example)
        if logprobs is None and (mask == 1).any():
            self.findings.add(
                "missing-logprobs",
                state.name,
                int((mask == 1).sum()),
                "sample",
                Example(
                    state.name,
                    None,
                    finish.record.seq if finish.record else None,
                    None,
                    f"sample {number} has no rollout_log_probs for its response",
                )
                if self.findings.wants_example("missing-logprobs")
                else None,
            )

    def _account(
        self,
        state: SessionState,
        finish: Finish,
        calls: list[Call],
        trained: list[np.ndarray],
        bad_logprob: list[np.ndarray],
        as_context: list[bool],
    ) -> None:
        figure = self.findings.figure(state.name)
        emitted = covered = 0
        for i, call in enumerate(calls):
            n = len(call.output)
            if call.side:
                figure.side_tokens += n
                continue
            if call.aborted:
                figure.aborted_tokens += n
                continue
            counts = trained[i]
            emitted += n
            once = counts == 1
            covered += int((once & ~bad_logprob[i]).sum())
            twice = int((counts >= 2).sum())
            if twice:
                at = int(np.flatnonzero(counts >= 2)[0])
                self.findings.add(
                    "trained-twice",
                    state.name,
                    twice,
                    "token",
                    self._example(
                        "trained-twice",
                        state,
                        call,
                        at,
                        f"{twice} token(s) of engine call seq {call.seq} trained {int(counts.max())} times",
                    ),
                )
            wrong = int((bad_logprob[i] & (counts >= 1)).sum())
            if wrong:
                at = int(np.flatnonzero(bad_logprob[i])[0])
                self.findings.add(
                    "logprob-mismatch",
                    state.name,
                    wrong,
                    None,
                    self._example(
                        "logprob-mismatch",
                        state,
                        call,
                        at,
                        f"{wrong} trained token(s) of engine call seq {call.seq} "
                        f"carry another logprob than the engine's (first: {call.logprobs[at]:.6g} from the engine)"
                        if call.logprobs is not None
                        else "",
                    ),
                )
            never = int((counts == 0).sum())
            if never:
                reason = self._reason(state, finish, call, as_context[i])
                at = int(np.flatnonzero(counts == 0)[0])
                self.findings.add(
                    "never-trained",
                    state.name,
                    never,
                    reason,
                    self._example(
                        "never-trained",
                        state,
                        call,
                        at,
                        f"{never} of {n} token(s) of engine call seq {call.seq} in no "
                        f"sample's trained tokens ({reason})",
                    ),
                )
        self._retries_trained(state, finish, calls, trained)
        figure.emitted += emitted
        figure.covered += covered
        if covered < emitted:
            self.findings.add(
                "coverage",
                state.name,
                emitted - covered,
                None,
                Example(
                    state.name,
                    None,
                    finish.record.seq if finish.record else None,
                    None,
                    f"coverage {covered}/{emitted} = {covered / emitted:.3f}: {emitted - covered} emitted token(s) not "
                    "trained exactly once with the engine's logprob",
                )
                if self.findings.wants_example("coverage")
                else None,
            )

    def _reason(self, state: SessionState, finish: Finish, call: Call, context: bool) -> str:
        """Why a turn's tokens are in no sample's trained tokens, as far as the traffic shows it."""
        if call.index in state.breaks:  # a later prompt re-rendered this output: the sample holds that instead
            return "realign"
        exchange = finish.exchanges.get(call.exchange) if call.exchange is not None else None
        if exchange is not None and exchange.answer is not call:
            return "superseded"  # the exchange generated again after it (an engine-side retry)
        if (exchange is not None and exchange.regenerated) or any(
            e.regenerated and e.retry_of == call.exchange for e in finish.exchanges.values()
        ):
            return "retried"
        return "masked" if context else "dropped turn"

    def _retries_trained(
        self, state: SessionState, finish: Finish, calls: list[Call], trained: list[np.ndarray]
    ) -> None:
        """A re-sent turn generated again and trained from both generations: the turn trained twice."""
        by_exchange = {c.exchange: i for i, c in enumerate(calls) if c.exchange is not None and not c.side}
        for exchange in finish.exchanges.values():
            if not exchange.regenerated or exchange.retry_of not in by_exchange:
                continue
            first, again = by_exchange[exchange.retry_of], by_exchange.get(exchange.index)
            if again is None or not trained[first].any() or not trained[again].any():
                continue
            count = int((trained[again] > 0).sum())
            example = None
            if self.findings.wants_example("trained-twice"):
                example = Example(
                    state.name,
                    exchange.index,
                    calls[again].seq,
                    0,
                    f"exchange {exchange.index} re-sends exchange {exchange.retry_of}; both generations are trained",
                    [
                        Side("first generation", clip(decode(calls[first].output[:24]))),
                        Side("second generation", clip(decode(calls[again].output[:24]))),
                    ],
                )
            self.findings.add("trained-twice", state.name, count, "retry", example)

    def _example(self, rule: str, state: SessionState, call: Call, at: int, detail: str) -> Example | None:
        if not self.findings.wants_example(rule):
            return None
        return Example(
            state.name,
            call.exchange,
            call.seq,
            at,
            detail,
            [
                Side("engine output", clip(decode(call.output[at : at + 24]))),
                Side("before it", clip(decode(call.output[max(0, at - 24) : at]), tail=True)),
            ],
        )


def _exchange_before(calls: list[Call], owner: np.ndarray, at: int) -> int | None:
    """The exchange of the last call owning a position before `at` in a sample: where the untraced tokens follow."""
    earlier = owner[:at][owner[:at] >= 0]
    return calls[int(earlier[-1])].exchange if len(earlier) else None
