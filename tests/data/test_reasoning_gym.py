"""reasoning-gym tasks and their verifier: what the source generates, the reward scores with the task's own check."""

from __future__ import annotations

import pytest

from areal.errors import ConfigError
from areal.rewards import ReasoningGymResult, extract_rg_answer, reasoning_gym_score

pytestmark = pytest.mark.eval  # needs the eval extra: python -m pytest -m eval
pytest.importorskip("reasoning_gym", reason="reasoning-gym tasks need the 'reasoning-gym' package (areal[eval])")

from areal.data import reasoning_gym_tasks  # noqa: E402

SUMS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def take(source, n):
    it = iter(source)
    return [next(it) for _ in range(n)]


def test_the_reference_answer_scores_one_and_a_wrong_one_zero_round_trip():
    tasks = take(reasoning_gym_tasks("chain_sum", "train", size=60, seed=3, options=SUMS), 20)
    score = reasoning_gym_score()
    right = score([f"<answer>{t['answer']}</answer>" for t in tasks], [t["rg"] for t in tasks])
    wrong = score([f"<answer>{int(t['answer']) + 1}</answer>" for t in tasks], [t["rg"] for t in tasks])
    assert [r.reward for r in right] == [1.0] * 20 and [r.reason for r in right] == [None] * 20
    assert [r.reward for r in wrong] == [0.0] * 20 and {r.reason for r in wrong} == {"wrong_answer"}


def test_the_reward_rebuilds_exactly_the_entry_the_source_generated():
    import reasoning_gym

    tasks = take(reasoning_gym_tasks("letter_counting", None, size=10, seed=7), 10)
    direct = reasoning_gym.create_dataset("letter_counting", size=10, seed=7)
    score = reasoning_gym_score()
    for t in tasks:
        entry = score.entry(t["rg"])
        assert entry == direct[t["rg"]["index"]]
        assert t["prompt"].startswith(entry["question"]) and t["answer"] == str(entry["answer"])


def test_splits_are_disjoint_by_question_and_cover_the_set():
    train = reasoning_gym_tasks("chain_sum", "train", size=300, seed=0, options=SUMS)
    test = reasoning_gym_tasks("chain_sum", "test", size=300, seed=0, options=SUMS)
    question = lambda t: t["prompt"]  # noqa: E731
    # one-digit sums repeat within 300 draws: each question is kept once, on one side
    distinct = {question(t) for t in reasoning_gym_tasks("chain_sum", None, size=300, seed=0, options=SUMS).tasks}
    assert len(train) + len(test) == len(distinct) < 300 and 0.1 < len(test) / len(distinct) < 0.3
    assert not {question(t) for t in train.tasks} & {question(t) for t in test.tasks}
    assert len({question(t) for t in train.tasks}) == len(train)


def test_a_prose_answer_is_read_by_the_fallback_and_not_by_the_strict_convention():
    [task] = take(reasoning_gym_tasks("chain_sum", None, size=1, seed=1, options=SUMS), 1)
    prose = f"Let me add them. The final answer is {task['answer']}."
    assert reasoning_gym_score()([prose], [task["rg"]])[0].reward == 1.0
    strict = reasoning_gym_score(fallback=False)([prose], [task["rg"]])[0]
    assert strict == ReasoningGymResult(0.0, "no_answer", None)


def test_extraction_prefers_the_last_tag_then_the_last_number_or_line():
    assert extract_rg_answer("<answer>3</answer> then <answer> 4 </answer>", "4") == "4"
    assert extract_rg_answer("1 + 2 is 3, not 5.", "3") == "5"  # the last number, right or wrong
    assert extract_rg_answer("Reversed:\nolleh.\n", "olleh") == "olleh"
    assert extract_rg_answer("no digits here", "12") is None and extract_rg_answer("", "x") is None


def test_an_unknown_task_name_is_a_config_error_with_close_names():
    with pytest.raises(ConfigError, match=r"reasoning-gym has no task 'chain_summ' \(like it: chain_sum"):
        reasoning_gym_tasks("chain_summ")


def test_an_unknown_option_is_a_config_error_listing_the_options():
    with pytest.raises(ConfigError, match=r"'chain_sum' refuses options \{'terms': 2\}.*its options: .*min_terms"):
        reasoning_gym_tasks("chain_sum", options={"terms": 2})


def test_source_fields_and_replay():
    source = reasoning_gym_tasks("chain_sum", "train", size=40, seed=0, options=SUMS)
    assert source.fields == ("task_id", "prompt", "answer", "rg")
    first = take(source, 5)
    state = source.state()
    after = take(source, 3)
    again = reasoning_gym_tasks("chain_sum", "train", size=40, seed=0, options=SUMS)
    again.restore(state)
    assert take(again, 3) == after and first[0]["task_id"].startswith("chain_sum/0/")
