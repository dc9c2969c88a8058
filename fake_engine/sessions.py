"""Telling sessions and turns apart without the rid (random per call, so useless for replays).

Session: the router's `X-SMG-Routing-Key` when present, else a digest of the prompt's opening (everything
up to the end of the first user message: system prompt, tools and the task). Turn: how many assistant
turns the prompt already holds. Both are pure functions of the request, hence stable across replays.
"""

from __future__ import annotations

import hashlib
from array import array

IM_START = 151644
IM_END = 151645
ROLE_USER = 872
ROLE_ASSISTANT = 77091


def _positions(ids: list[int], first: int, second: int) -> list[int]:
    out = []
    start = 0
    try:
        while True:
            i = ids.index(first, start)
            if i + 1 < len(ids) and ids[i + 1] == second:
                out.append(i)
            start = i + 1
    except ValueError:
        return out


def opening_end(input_ids: list[int]) -> int:
    """Index just past the first user message's `<|im_end|>`, or the whole prompt if there is none."""
    users = _positions(input_ids, IM_START, ROLE_USER)
    if not users:
        return len(input_ids)
    try:
        return input_ids.index(IM_END, users[0]) + 1
    except ValueError:
        return len(input_ids)


def last_user_start(input_ids: list[int]) -> int | None:
    """Index of the last user message's `<|im_start|>` (tool results are user messages too), or None."""
    users = _positions(input_ids, IM_START, ROLE_USER)
    return users[-1] if users else None


def last_assistant_end(input_ids: list[int]) -> int | None:
    """Index of the `<|im_end|>` that closes the prompt's last finished assistant message (the previous turn's last
    generated token), or None when the prompt holds none."""
    for start in reversed(_positions(input_ids, IM_START, ROLE_ASSISTANT)):
        try:
            return input_ids.index(IM_END, start)
        except ValueError:
            continue  # the open generation prompt
    return None


def assistant_turns_after(input_ids: list[int], start: int) -> int:
    """`turn_index` of the prompt from `start` on: the assistant turns that follow a given message."""
    return turn_index(input_ids[start:])


def prompt_digest(input_ids: list[int]) -> str:
    head = input_ids[: opening_end(input_ids)]
    return "p:" + hashlib.sha256(array("q", head).tobytes()).hexdigest()[:16]


def session_key(input_ids: list[int], routing_key: str | None) -> str:
    return f"k:{routing_key}" if routing_key else prompt_digest(input_ids)


NEWLINE = 198  # the `\n` that ends the generation prompt `<|im_start|>assistant\n`


def open_reply(input_ids: list[int]) -> list[int]:
    """The reply tokens after the prompt's open generation prompt: a gateway continuing a generation the engine
    aborted (a weight update's `abort_all_requests`) sends the prompt and the partial output again, as slime's
    partial rollout does; [] where the prompt ends at the generation prompt, or holds no open one."""
    starts = _positions(input_ids, IM_START, ROLE_ASSISTANT)
    if not starts or IM_END in input_ids[starts[-1] :]:
        return []
    head = starts[-1] + 2
    if head < len(input_ids) and input_ids[head] == NEWLINE:
        head += 1
    return input_ids[head:]


def continued_tokens(input_ids: list[int], output_ids: list[int]) -> int:
    """How many of a turn's output tokens the prompt already holds as its open reply (`open_reply`): a model
    continues after them, so they are not generated again. 0 unless they are a strict prefix of the output."""
    tail = open_reply(input_ids)
    if tail and len(tail) < len(output_ids) and output_ids[: len(tail)] == tail:
        return len(tail)
    return 0


def turn_index(input_ids: list[int]) -> int:
    """Assistant turns already in the prompt; a trailing generation prompt does not count."""
    starts = _positions(input_ids, IM_START, ROLE_ASSISTANT)
    if starts and IM_END not in input_ids[starts[-1] :]:
        return len(starts) - 1  # the last one is the open generation prompt
    return len(starts)
