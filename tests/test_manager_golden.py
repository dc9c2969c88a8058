"""Golden strings for every manager rule: trained tokens in [brackets], `|` where the response region starts
(right after the prompt of the sample's first turn, as slime lays samples out).

Each golden was read and checked by hand against the rule it pins (see docs/manager.md, "How the manager decides").
"""

import pytest

from tests.manager_cases import CASES

GOLDENS = {
    "single_turn": (
        "#0 reward=1 response=2 trained=2 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:ok] [</ast>]"
    ),
    "clean_multi_turn_with_tools": (
        "#0 reward=1 response=10 trained=5 turns=0,1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>] <nl> <tool> tool:2 </tool> <gen> [r:ok] [</ast>]"
    ),
    "different_system_prompts": (
        "#0 reward=1 response=2 trained=2 turns=1\n"
        "<sys> system:sub </sys> <usr> user:find </usr> <gen> | [r:found] [</ast>]\n"
        "#1 reward=1 response=10 trained=5 turns=0,2\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>] <nl> <tool> tool:2 </tool> <gen> [r:ok] [</ast>]"
    ),
    "user_fork": (
        "#0 reward=1 response=9 trained=4 turns=0,1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:ok] [</ast>] <nl> <usr> user:again </usr> <gen> [r:twice] [</ast>]\n"
        "#1 reward=1 response=9 trained=2 turns=2\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | r:ok </ast> <nl> <usr> user:other </usr> <gen> [r:else] [</ast>]"
    ),
    "sibling_assistants": (
        "#0 reward=1 response=2 trained=2 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:one] [</ast>]\n"
        "#1 reward=1 response=2 trained=2 turns=1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:two] [</ast>]"
    ),
    "fork_under_shared_generated_turn": (
        "#0 reward=1 response=10 trained=5 turns=0,1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>] <nl> <tool> tool:2 </tool> <gen> [r:ok] [</ast>]\n"
        "#1 reward=1 response=10 trained=2 turns=2\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | call:calc arg:x=1 </ast> <nl> <tool> tool:3 </tool> <gen> [r:three] [</ast>]"
    ),
    "identical_messages_drifted_prompt_ids": (
        "#0 reward=1 response=3 trained=3 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>]\n"
        "#1 reward=1 response=2 trained=2 turns=1\n"
        "<sys> system:S <DRIFT> </sys> <usr> user:compute </usr> <gen> call:calc arg:x=1 </ast> <nl> <tool> tool:2 </tool> <gen> | [r:ok] [</ast>]\n"
        "forks: {'prompt': 1}"
    ),
    "multiple_tool_results": (
        "#0 reward=1 response=15 trained=7 turns=0,1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:a] [arg:p=1] [call:b] [arg:q=2] [</ast>] <nl> <tool> tool:ra </tool> <tool> tool:rb </tool> <gen> [r:ok] [</ast>]"
    ),
    "session_isolation": (
        "#0 reward=1 response=10 trained=5 turns=0,1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>] <nl> <tool> tool:2 </tool> <gen> [r:done] [</ast>]\n"
        "#0 reward=1 response=2 trained=2 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:ok] [</ast>]"
    ),
    "empty_response": ("\nsamples=0 dropped=1"),
    "logprob_propagation_and_zero_padding": (
        "#0 reward=1 response=10 trained=5 turns=0,1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc@-0.5] [arg:x=1@-0.25] [</ast>@-0.125] <nl>@0 <tool>@0 tool:2@0 </tool>@0 <gen>@0 [r:ok@-1.5] [</ast>@-0.75]"
    ),
    "drift_in_prompt_region_forks": (
        "#0 reward=1 response=3 trained=3 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>]\n"
        "#1 reward=1 response=2 trained=2 turns=1\n"
        "<sys> system:S </sys> <usr> user:compute <DRIFT> </usr> <gen> call:calc arg:x=1 </ast> <nl> <tool> tool:2 </tool> <gen> | [r:ok] [</ast>]\n"
        "forks: {'prompt': 1}"
    ),
    "short_drift_in_last_response_realigns": (
        "#0 reward=1 response=11 trained=2 turns=1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | call:calc arg:x=1 <DRIFT> </ast> <nl> <tool> tool:2 </tool> <gen> [r:ok] [</ast>]\n"
        "realigns=1 realigned_tokens=3"
    ),
    "threshold_one_forks_what_would_realign": (
        "#0 reward=1 response=3 trained=3 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>]\n"
        "#1 reward=1 response=2 trained=2 turns=1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> call:calc arg:x=1 <DRIFT> </ast> <nl> <tool> tool:2 </tool> <gen> | [r:ok] [</ast>]\n"
        "forks: {'threshold': 1}"
    ),
    "threshold_zero_disables_realign_and_merge": (
        "#0 reward=1 response=3 trained=3 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>]\n"
        "#1 reward=1 response=2 trained=2 turns=1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> call:calc arg:x=1 <DRIFT> </ast> <nl> <tool> tool:2 </tool> <gen> | [r:ok] [</ast>]\n"
        "#2 reward=1 response=2 trained=2 turns=2\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> call:calc arg:x=2 </ast> <nl> <tool> tool:2 </tool> <gen> | [r:again] [</ast>]\n"
        "forks: {'threshold': 1}\n"
        "merges=0"
    ),
    "drift_in_earlier_response_forks": (
        "#0 reward=1 response=10 trained=5 turns=0,1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>] <nl> <tool> tool:2 </tool> <gen> [r:ok] [</ast>]\n"
        "#1 reward=1 response=2 trained=2 turns=2\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> call:calc arg:x=1 <DRIFT> </ast> <nl> <tool> tool:2 </tool> <gen> r:ok </ast> <nl> <usr> user:more </usr> <gen> | [r:done] [</ast>]\n"
        "forks: {'earlier-response': 1}"
    ),
    "dedup_across_leaves": (
        "#0 reward=1 response=10 trained=5 turns=0,1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>] <nl> <tool> tool:2 </tool> <gen> [r:ok] [</ast>]\n"
        "#1 reward=1 response=10 trained=2 turns=2\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | call:calc arg:x=1 </ast> <nl> <tool> tool:9 </tool> <gen> [r:nine] [</ast>]\n"
        "dedup_tokens=3"
    ),
    "foreign_assistant_messages": (
        "#0 reward=1 response=2 trained=2 turns=0\n"
        "<sys> system:S </sys> <usr> user:q </usr> <gen> r:example </ast> <nl> <usr> user:compute </usr> <gen> | [r:ok] [</ast>]"
    ),
    "drain_semantics": (
        "#0 reward=2 response=2 trained=2 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:ok] [</ast>]\n"
        "after finish: 0 samples, sessions=[]\n"
        "#0 reward=1 response=2 trained=2 turns=0\n"
        "<sys> system:S </sys> <usr> user:fresh </usr> <gen> | [r:new] [</ast>]"
    ),
    "short_rewrite_merged": (
        "#0 reward=1 response=2 trained=2 turns=1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> call:calc arg:x=2 </ast> <nl> <tool> tool:2 </tool> <gen> | [r:ok] [</ast>]\n"
        "merges=1 leaves=1"
    ),
    "long_rewrite_forks": (
        "#0 reward=1 response=3 trained=3 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>]\n"
        "#1 reward=1 response=2 trained=2 turns=1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> call:calc arg:x=2 </ast> <nl> <tool> tool:2 </tool> <gen> | [r:ok] [</ast>]\n"
        "merges=0 leaves=2 branches=1"
    ),
    "ambiguous_siblings_fork": (
        "#0 reward=1 response=2 trained=2 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:one] [</ast>]\n"
        "#1 reward=1 response=2 trained=2 turns=1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:two] [</ast>]\n"
        "#2 reward=1 response=2 trained=2 turns=2\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> r:uno </ast> <nl> <usr> user:next </usr> <gen> | [r:three] [</ast>]\n"
        "leaves=3 events=['ambiguous', 'branch']"
    ),
    "merged_node_matched_by_later_replays": (
        "#0 reward=1 response=9 trained=4 turns=1,2\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> call:calc arg:x=2 </ast> <nl> <tool> tool:2 </tool> <gen> | [r:ok] [</ast>] <nl> <usr> user:more </usr> <gen> [r:done] [</ast>]\n"
        "merges=1 leaves=1"
    ),
    "tree_fork_plus_token_drift": (
        "#0 reward=1 response=10 trained=5 turns=0,1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>] <nl> <tool> tool:2 </tool> <gen> [r:ok] [</ast>]\n"
        "#1 reward=1 response=2 trained=2 turns=2\n"
        "<sys> system:S </sys> <usr> user:compute <DRIFT> </usr> <gen> call:calc arg:x=1 </ast> <nl> <tool> tool:3 </tool> <gen> | [r:three] [</ast>]\n"
        "forks: {'prompt': 1}"
    ),
    "three_leaves_sharing_two_generated_turns": (
        "#0 reward=1 response=18 trained=8 turns=0,1,2\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [call:calc] [arg:x=1] [</ast>] <nl> <tool> tool:2 </tool> <gen> [call:calc] [arg:x=1] [</ast>] <nl> <tool> tool:a </tool> <gen> [r:a] [</ast>]\n"
        "#1 reward=1 response=18 trained=2 turns=3\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | call:calc arg:x=1 </ast> <nl> <tool> tool:2 </tool> <gen> call:calc arg:x=1 </ast> <nl> <tool> tool:b </tool> <gen> [r:b] [</ast>]\n"
        "#2 reward=1 response=18 trained=2 turns=4\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | call:calc arg:x=1 </ast> <nl> <tool> tool:2 </tool> <gen> call:calc arg:x=1 </ast> <nl> <tool> tool:c </tool> <gen> [r:c] [</ast>]"
    ),
    "long_mixed_session_realign_then_fork": (
        "#0 reward=1 response=11 trained=3 turns=1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | call:ls arg:d=. </ast> <nl> <tool> tool:files </tool> <gen> [call:calc] [arg:x=1] [</ast>]\n"
        "#1 reward=1 response=2 trained=2 turns=2\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> <think> think:look </think> call:ls arg:d=. </ast> <nl> <tool> tool:files </tool> <gen> call:calc arg:x=1 </ast> <nl> <tool> tool:2 </tool> <gen> | [r:ok] [</ast>]\n"
        "#2 reward=1 response=2 trained=2 turns=3\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> call:ls arg:d=. </ast> <nl> <tool> tool:files </tool> <gen> call:calc arg:x=1 </ast> <nl> <tool> tool:2 </tool> <gen> r:ok </ast> <nl> <usr> user:thanks </usr> <gen> | [r:bye] [</ast>]\n"
        "forks: {'prompt': 2}\n"
        "realigns=1 forks={'prompt': 2} samples=3"
    ),
    "end_of_turn_newline_is_context": (
        "#0 reward=1 response=9 trained=4 turns=0,1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:ok] [</ast>] <nl> <usr> user:more </usr> <gen> [r:fine] [</ast>]"
    ),
    "reward_split_policy": (
        "#0 reward=0.5 response=2 trained=2 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:one] [</ast>]\n"
        "#1 reward=0.5 response=2 trained=2 turns=1\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:two] [</ast>]"
    ),
    "truncated_and_ill_formed_metadata": (
        "#0 reward=1 response=1 trained=1 turns=0\n"
        "<sys> system:S </sys> <usr> user:compute </usr> <gen> | [r:ok]\n"
        "truncated=True ill_formed=True"
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    assert CASES[name]() == GOLDENS[name]


def test_every_case_has_a_golden() -> None:
    assert set(GOLDENS) == set(CASES)
