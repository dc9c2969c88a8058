"""Golden cases for the trajectory manager, each a function returning the session's rendered samples.

Shared by the golden test and by `tito demo`-style inspection; every case pins behaviour of one rule.
"""

from __future__ import annotations

from collections.abc import Callable

from tito_rl.trajectory.golden import render_samples
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.synthetic import SyntheticSession, assistant, system, tool, user

CASES: dict[str, Callable[[], str]] = {}


def case(fn: Callable[[], str]) -> Callable[[], str]:
    CASES[fn.__name__] = fn
    return fn


def session(**options) -> tuple[TrajectoryManager, SyntheticSession]:
    m = TrajectoryManager(**options)
    return m, SyntheticSession(m)


def render(m: TrajectoryManager, s: SyntheticSession, sid: str = "s", reward: float = 1.0, **kw) -> str:
    text = render_samples(m.samples(sid, reward), s.vocab.name, **kw)
    forks = m.stats(sid).forks
    return text + (f"\nforks: {forks}" if forks else "")


def names(s: SyntheticSession, messages) -> str:
    return s.vocab.decode(s.template.render(messages))


S, U = system("S"), user("compute")
CALL = assistant("", ("calc", {"x": 1}))
OK = assistant("ok")


@case
def single_turn() -> str:
    m, s = session()
    s.turn([S, U], OK)
    return render(m, s)


@case
def clean_multi_turn_with_tools() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    s.turn([S, U, CALL, tool("2")], OK)
    return render(m, s)


@case
def different_system_prompts() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    s.turn([system("sub"), user("find")], assistant("found"))
    s.turn([S, U, CALL, tool("2")], OK)
    return render(m, s)


@case
def user_fork() -> str:
    m, s = session()
    s.turn([S, U], OK)
    s.turn([S, U, OK, user("again")], assistant("twice"))
    s.turn([S, U, OK, user("other")], assistant("else"))
    return render(m, s)


@case
def sibling_assistants() -> str:
    m, s = session()
    s.turn([S, U], assistant("one"))
    s.turn([S, U], assistant("two"))
    return render(m, s)


@case
def fork_under_shared_generated_turn() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    s.turn([S, U, CALL, tool("2")], OK)
    s.turn([S, U, CALL, tool("3")], assistant("three"))
    return render(m, s)


@case
def identical_messages_drifted_prompt_ids() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    msgs = [S, U, CALL, tool("2")]
    s.turn(msgs, OK, prompt=names(s, msgs).replace("system:S", "system:S <DRIFT>"))
    return render(m, s)


@case
def multiple_tool_results() -> str:
    m, s = session()
    two = assistant("", ("a", {"p": 1}), ("b", {"q": 2}))
    s.turn([S, U], two)
    s.turn([S, U, two, tool("ra", "1"), tool("rb", "2")], OK)
    return render(m, s)


@case
def session_isolation() -> str:
    m = TrajectoryManager()
    a, b = SyntheticSession(m, "a"), SyntheticSession(m, "b")
    b.template = a.template
    a.turn([S, U], CALL)
    b.turn([S, U], OK)
    a.turn([S, U, CALL, tool("2")], assistant("done"))
    return render(m, a, "a") + "\n" + render(m, b, "b")


@case
def empty_response() -> str:
    m, s = session()
    s.turn([S, U], OK, output="")
    out = render(m, s)
    return out + f"\nsamples={len(m.samples('s'))} dropped={m.stats('s').dropped_builders}"


@case
def logprob_propagation_and_zero_padding() -> str:
    m, s = session()
    s.turn([S, U], CALL, logprobs=[-0.5, -0.25, -0.125])
    s.turn([S, U, CALL, tool("2")], OK, logprobs=[-1.5, -0.75])
    return render(m, s, logprobs=True)


@case
def drift_in_prompt_region_forks() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    msgs = [S, U, CALL, tool("2")]
    s.turn(msgs, OK, prompt=names(s, msgs).replace("user:compute", "user:compute <DRIFT>"))
    return render(m, s)


@case
def short_drift_in_last_response_realigns() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    msgs = [S, U, CALL, tool("2")]
    s.turn(msgs, OK, prompt=names(s, msgs).replace("arg:x=1", "arg:x=1 <DRIFT>"))
    st = m.stats("s")
    return render(m, s) + f"\nrealigns={st.realigns} realigned_tokens={st.realigned_tokens}"


@case
def threshold_one_forks_what_would_realign() -> str:
    m, s = session(fork_threshold_tokens=1)
    s.turn([S, U], CALL)
    msgs = [S, U, CALL, tool("2")]
    s.turn(msgs, OK, prompt=names(s, msgs).replace("arg:x=1", "arg:x=1 <DRIFT>"))
    return render(m, s)


@case
def threshold_zero_disables_realign_and_merge() -> str:
    m, s = session(fork_threshold_tokens=0)
    s.turn([S, U], CALL)
    msgs = [S, U, CALL, tool("2")]
    s.turn(msgs, OK, prompt=names(s, msgs).replace("arg:x=1", "arg:x=1 <DRIFT>"))
    rewrite = assistant("", ("calc", {"x": 2}))
    s.turn([S, U, rewrite, tool("2")], assistant("again"))
    return render(m, s) + f"\nmerges={m.stats('s').merges}"


@case
def drift_in_earlier_response_forks() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    s.turn([S, U, CALL, tool("2")], OK)
    msgs = [S, U, CALL, tool("2"), OK, user("more")]
    s.turn(msgs, assistant("done"), prompt=names(s, msgs).replace("arg:x=1", "arg:x=1 <DRIFT>"))
    return render(m, s)


@case
def dedup_across_leaves() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    s.turn([S, U, CALL, tool("2")], OK)
    s.turn([S, U, CALL, tool("9")], assistant("nine"))
    st = m.stats("s")
    return render(m, s) + f"\ndedup_tokens={st.dedup_tokens}"


@case
def foreign_assistant_messages() -> str:
    m, s = session()
    fewshot = assistant("example")
    s.turn([S, user("q"), fewshot, U], OK)
    return render(m, s)


@case
def drain_semantics() -> str:
    m, s = session()
    s.turn([S, U], OK)
    first = render_samples(m.finish("s", 2.0), s.vocab.name)
    after = m.finish("s", 2.0)
    gone = f"after finish: {len(after)} samples, sessions={m.sessions()}"
    s.turn([S, user("fresh")], assistant("new"))
    return f"{first}\n{gone}\n{render(m, s)}"


@case
def short_rewrite_merged() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    rewrite = assistant("", ("calc", {"x": 2}))  # the client re-renders the call differently
    s.turn([S, U, rewrite, tool("2")], OK)
    st = m.stats("s")
    return render(m, s) + f"\nmerges={st.merges} leaves={st.leaves}"


@case
def long_rewrite_forks() -> str:
    m, s = session(fork_threshold_tokens=3)
    s.turn([S, U], CALL)  # 3 output tokens: not shorter than the threshold
    rewrite = assistant("", ("calc", {"x": 2}))
    s.turn([S, U, rewrite, tool("2")], OK)
    st = m.stats("s")
    return render(m, s) + f"\nmerges={st.merges} leaves={st.leaves} branches={st.branches}"


@case
def ambiguous_siblings_fork() -> str:
    m, s = session()
    s.turn([S, U], assistant("one"))
    s.turn([S, U], assistant("two"))
    s.turn([S, U, assistant("uno"), user("next")], assistant("three"))
    kinds = sorted({e.kind for e in m.events("s")})
    return render(m, s) + f"\nleaves={m.stats('s').leaves} events={kinds}"


@case
def merged_node_matched_by_later_replays() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    rewrite = assistant("", ("calc", {"x": 2}))
    s.turn([S, U, rewrite, tool("2")], OK)
    s.turn([S, U, rewrite, tool("2"), OK, user("more")], assistant("done"))
    st = m.stats("s")
    return render(m, s) + f"\nmerges={st.merges} leaves={st.leaves}"


@case
def tree_fork_plus_token_drift() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    s.turn([S, U, CALL, tool("2")], OK)
    msgs = [S, U, CALL, tool("3")]
    s.turn(msgs, assistant("three"), prompt=names(s, msgs).replace("user:compute", "user:compute <DRIFT>"))
    return render(m, s)


@case
def three_leaves_sharing_two_generated_turns() -> str:
    m, s = session()
    s.turn([S, U], CALL)
    s.turn([S, U, CALL, tool("2")], CALL)
    for r in ("a", "b", "c"):
        s.turn([S, U, CALL, tool("2"), CALL, tool(r)], assistant(r))
    return render(m, s)


@case
def long_mixed_session_realign_then_fork() -> str:
    m, s = session()
    think = assistant("", ("ls", {"d": "."}), reasoning="look")
    s.turn([S, U], think)
    h = [S, U, think, tool("files")]
    # The client echoes turn 0 without its reasoning: drift inside the last response, short -> realign.
    dropped = assistant("", ("ls", {"d": "."}))
    s.turn(h, CALL, prompt=names(s, [S, U, dropped, tool("files")]))
    h = h + [CALL, tool("2")]
    # The next honest echo has the reasoning again: the held tokens now differ in context -> fork.
    s.turn(h, OK)
    h = h + [OK, user("thanks")]
    s.turn(h, assistant("bye"))
    st = m.stats("s")
    return render(m, s) + f"\nrealigns={st.realigns} forks={st.forks} samples={st.samples}"


@case
def end_of_turn_newline_is_context() -> str:
    m, s = session()
    s.turn([S, U], OK)
    s.turn([S, U, OK, user("more")], assistant("fine"))
    return render(m, s)


@case
def reward_split_policy() -> str:
    m, s = session(reward_policy="split")
    s.turn([S, U], assistant("one"))
    s.turn([S, U], assistant("two"))
    return render(m, s, reward=1.0)


@case
def truncated_and_ill_formed_metadata() -> str:
    m, s = session()
    s.turn([S, U], OK, finish_reason="length", ill_formed=True)
    meta = m.samples("s")[0].metadata
    return render(m, s) + f"\ntruncated={meta['truncated']} ill_formed={meta['ill_formed']}"
