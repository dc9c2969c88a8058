"""The golden's tree lines: what a reader must see of a turn that the message contents alone do not show."""

from tito_rl.trajectory.golden import render_tree
from tito_rl.trajectory.records import TurnRecord
from tito_rl.trajectory.tree import MessageTree

SYSTEM = {"role": "system", "content": "S"}
USER = {"role": "user", "content": "count the primes"}


def routed(*replies: tuple[dict, str]) -> list[str]:
    """Each reply routed under the same prompt; the rendered tree lines."""
    tree = MessageTree(fork_threshold_tokens=0)
    for i, (reply, finish) in enumerate(replies):
        tree.route([SYSTEM, USER], reply, TurnRecord([1, 2, 3], [10 + i, 11], finish_reason=finish), i, [])
    return render_tree(tree.export()["nodes"])


def test_a_reply_that_only_thinks_shows_its_reasoning_and_a_cut_turn_its_finish():
    """Claude Code drops a thinking-only reply, or one cut inside its thinking, and asks again: without the
    reasoning and the finish such a dead-end leaf is a blank line in the golden."""
    lines = routed(
        ({"role": "assistant", "content": "", "reasoning_content": "Ten primes, sum 129."}, "stop"),
        ({"role": "assistant", "content": "", "reasoning_content": "Count them with"}, "length"),
    )
    assert lines[2:] == [
        '├─ n3 assistant [turn 0] thinks "Ten primes, sum 129."',
        '└─ n4 assistant [turn 1, finish length] thinks "Count them with"',
    ]


def test_a_reply_with_text_or_calls_keeps_its_line_and_a_clean_stop_adds_nothing():
    lines = routed(
        ({"role": "assistant", "content": "There are ten.", "reasoning_content": "Ten."}, "stop"),
        ({"role": "assistant", "content": "The primes below 30 are", "reasoning_content": "x"}, "length"),
    )
    assert lines[2:] == [
        '├─ n3 assistant [turn 0] "There are ten."',
        '└─ n4 assistant [turn 1, finish length] "The primes below 30 are"',
    ]
