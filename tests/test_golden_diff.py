"""Golden diffs a person can read: the changed tokens of a long line marked, colour only on a terminal (and
never with NO_COLOR), and a cut that says how to see the rest."""

from __future__ import annotations

import io

from tito_rl.replayer.goldens import diff_view as golden_diff
from tito_rl.replayer.goldens import files as goldens
from tito_rl.replayer.goldens.diff_view import DiffStyle, render, use_color, word_diff

OLD_SAMPLE = "  sample 0: reward 1, 283 tokens, response 80 from token 203 (trained 21, masked 59), turns 0,1"
NEW_SAMPLE = "  sample 0: reward 1, 284 tokens, response 81 from token 203 (trained 21, masked 60), turns 0,1"
OLD_RUN = (
    "    trained      21  turn 1   [<think>] [↵] [The] [·log] [·has] [·] «9 #aae03f87» [·] [4] [2] [·lines] [.] "
    "[<|im_end|>] and a long tail of tokens that did not change at all"
)
NEW_RUN = OLD_RUN.replace("[·has]", "[·had]")


def test_word_diff_marks_each_changed_token_and_folds_long_unchanged_runs() -> None:
    assert word_diff(OLD_SAMPLE, NEW_SAMPLE) == (
        "  sample 0: reward 1, [-283-]{+284+} tokens, response [-80-]{+81+} from token 203 (trained 21, masked "
        "[-59-]{+60+}), turns 0,1"
    )
    marked = word_diff(OLD_RUN, NEW_RUN)
    assert "[·[-has-]{+had+}]" in marked
    assert marked.startswith("…") and marked.endswith("…") and len(marked) < len(OLD_RUN) // 2
    assert word_diff("a b", "a b c") == "a b{+ c+}" and word_diff("a b c", "a c") == "a [-b -]c"


def test_a_changed_pair_gets_a_marks_line_and_unlike_lines_do_not() -> None:
    old = "\n".join(["keep", OLD_SAMPLE, "realign(divergence inside the response of turn 0) turn=1 at=205", "end"])
    new = "\n".join(["keep", NEW_SAMPLE, "completely other words here", "end"])
    lines = render(goldens.unified_diff(old, new, "s"), DiffStyle())
    assert lines[:3] == ["--- s (golden)", "+++ s (replay)", "@@ -1,4 +1,4 @@"]
    body = lines[4:-1]
    assert body == [
        "-" + OLD_SAMPLE,
        "-realign(divergence inside the response of turn 0) turn=1 at=205",
        "+" + NEW_SAMPLE,
        "?" + word_diff(OLD_SAMPLE, NEW_SAMPLE),
        "+completely other words here",
    ]


def test_colour_highlights_changed_tokens_in_place_instead_of_a_marks_line() -> None:
    lines = render(goldens.unified_diff(OLD_RUN, NEW_RUN, "s"), DiffStyle(color=True))
    removed, added = lines[3], lines[4]
    hl = golden_diff.BOLD + golden_diff.REVERSE
    assert removed.startswith(golden_diff.RED + "-") and f"[·{hl}has{golden_diff.RESET}{golden_diff.RED}]" in removed
    assert added.startswith(golden_diff.GREEN + "+") and f"{hl}had{golden_diff.RESET}" in added
    assert len(lines) == 5 and not any(line.startswith("?") for line in lines)
    assert lines[2].startswith(golden_diff.CYAN + "@@")


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_colour_only_on_a_terminal_and_never_with_no_color() -> None:
    assert use_color(Stream(tty=True), {}) is True
    assert use_color(Stream(tty=False), {}) is False
    assert use_color(Stream(tty=True), {"NO_COLOR": "1"}) is False
    assert use_color(Stream(tty=True), {"NO_COLOR": ""}) is True  # no-color.org: set and not empty


def test_a_long_diff_is_cut_naming_the_flag_that_shows_it_whole() -> None:
    old = "\n".join(f"line {i}" for i in range(100))
    raw = goldens.unified_diff(old, "", "s")
    cut = render(raw, DiffStyle(limit=10, more="--full-diff shows it whole"))
    assert cut[:10] == raw[:10] and cut[10:] == [f"… {len(raw) - 10} more diff line(s) cut; --full-diff shows it whole"]
    assert render(raw, DiffStyle(limit=10, full=True)) == raw
