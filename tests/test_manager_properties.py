"""Properties of linearization over random sessions (routing forks, drift, rewrites, sub-agents)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.records import TurnRecord
from tito_rl.trajectory.synthetic import SyntheticSession, assistant, system, tool, user


def unique_logprobs(turn: int, n: int) -> list[float]:
    """Logprob encodes (turn, position), so a trained token can be traced to the output it came from."""
    return [-(turn * 10_000 + k + 1) for k in range(n)]


def decode(lp: float) -> tuple[int, int]:
    v = int(-lp) - 1
    return divmod(v, 10_000)


actions = st.lists(
    st.tuples(
        st.sampled_from(["extend", "extend", "extend", "branch", "subagent", "user", "rewrite"]),
        st.integers(0, 50),  # which history / where to drift
        st.sampled_from(["none", "none", "prompt", "response"]),  # token drift injected into the prompt
        st.integers(0, 4),  # reply shape
    ),
    min_size=1,
    max_size=14,
)


def reply_for(shape: int, i: int) -> dict:
    if shape == 0:
        return assistant(f"a{i}")
    if shape == 1:
        return assistant("", ("run", {"n": i}))
    if shape == 2:
        return assistant(f"t{i}", ("run", {"n": i}), ("look", {"m": i}), reasoning=f"why{i}")
    if shape == 3:
        return assistant(" ".join(f"w{j}" for j in range(i % 5 + 1)))
    return assistant("")


def run_session(steps, threshold: int) -> tuple[TrajectoryManager, list[TurnRecord]]:
    m = TrajectoryManager(fork_threshold_tokens=threshold)
    s = SyntheticSession(m)
    histories: list[list[dict]] = []
    records: list[TurnRecord] = []
    for i, (action, pick, drift, shape) in enumerate(steps):
        if not histories or action == "subagent":
            msgs = [system(f"S{i % 2}"), user(f"task{i}")]
        else:
            base = histories[pick % len(histories)]
            if action == "branch":
                msgs = base[:-1] + [user(f"alt{i}")] if base[-1]["role"] == "user" else base + [user(f"alt{i}")]
            elif action == "user":
                msgs = base + [user(f"more{i}")]
            elif action == "rewrite" and len(base) > 2 and base[-2]["role"] == "assistant":
                msgs = base[:-2] + [assistant(f"rewritten{i}"), base[-1]]
            else:
                msgs = base + [tool(f"out{i}")]
        reply = reply_for(shape, i)
        ids = s.template.render(msgs)
        names = s.vocab.decode(ids).split()
        if drift != "none" and len(names) > 2:
            gens = [k for k, n in enumerate(names) if n == "<gen>"][:-1]
            at = (gens[pick % len(gens)] + 1) if (drift == "response" and gens) else 1 + pick % (len(names) - 2)
            names.insert(at, "<DRIFT>")
        out_ids = s.template.reply_ids(reply)
        record = s.turn(msgs, reply, prompt=" ".join(names), logprobs=unique_logprobs(i, len(out_ids)))
        records.append(record)
        histories.append(msgs + [reply])
    return m, records


@settings(max_examples=150, deadline=None)
@given(actions, st.sampled_from([0, 1, 3, 1024]))
def test_trained_tokens_come_from_one_output_and_train_once(steps, threshold) -> None:
    m, records = run_session(steps, threshold)
    seen: set[tuple[int, int]] = set()
    for sample in m.samples("s", 1.0):
        n = sample.response_length
        assert len(sample.loss_mask) == len(sample.rollout_log_probs) == n
        assert 0 < n <= len(sample.tokens)
        # slime's layout: the response region starts right after the prompt of the sample's first turn
        first_turn = sample.metadata["turns"][0]
        assert sample.tokens[: len(sample.tokens) - n] == records[first_turn].prompt_ids
        assert 1 in sample.loss_mask
        response = sample.tokens[len(sample.tokens) - n :]
        for tok, mask, lp in zip(response, sample.loss_mask, sample.rollout_log_probs, strict=True):
            if mask == 0:
                assert lp == 0.0  # context inside the response region is zero-padded
                continue
            turn, k = decode(lp)
            assert records[turn].output_ids[k] == tok  # the engine's own token, with its own logprob
            assert (turn, k) not in seen  # no output slice is trained twice
            seen.add((turn, k))
        # trained runs are contiguous slices of one output
        runs, prev = [], None
        for mask, lp in zip(sample.loss_mask, sample.rollout_log_probs, strict=True):
            cur = decode(lp) if mask else None
            if cur and prev and cur[0] == prev[0] and cur[1] == prev[1] + 1:
                runs[-1].append(cur)
            elif cur:
                runs.append([cur])
            prev = cur
        for run in runs:
            assert [k for _, k in run] == list(range(run[0][1], run[0][1] + len(run)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=12))
def test_clean_session_is_one_sample_equal_to_last_prompt_plus_output(shapes) -> None:
    m = TrajectoryManager()
    s = SyntheticSession(m)
    s.template.drop_old_reasoning = False  # a template that re-renders history faithfully: no drift at all
    msgs = [system("S"), user("go")]
    records = []
    for i, (shape, with_user) in enumerate(shapes):
        reply = reply_for(shape, i)
        records.append(s.turn(msgs, reply))
        msgs = msgs + [reply, user(f"u{i}") if with_user else tool(f"r{i}")]
    samples = m.samples("s", 1.0)
    assert len(samples) == 1
    assert samples[0].tokens == records[-1].prompt_ids + records[-1].output_ids
    assert sum(samples[0].loss_mask) == sum(len(r.output_ids) for r in records)
