"""reasoning-gym adaptor: splits, scoring with each dataset's own scorer, clear config errors."""

import json

import pytest

pytest.importorskip("reasoning_gym")

from reasoning_gym.utils import SYSTEM_PROMPTS  # noqa: E402

from rlpost.envs.gym import build_splits, score, score_strict  # noqa: E402

DATASETS = ["basic_arithmetic", "chain_sum", "leg_counting", "spell_backward"]


def tagged(answer: str) -> str:
    return f"<think>working</think>\n<answer>{answer}</answer>"


def test_splits_are_disjoint_sized_and_fixed_by_the_seed():
    cfg = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 1}
    train, heldout = build_splits("chain_sum", cfg, n_train=60, n_heldout=20, seed=0, system_prompt="default")
    assert len(train) == 60 and len(heldout) == 20
    held_q = [r["messages"][-1]["content"] for r in heldout]
    assert len(set(held_q)) == 20  # held-out questions are distinct
    assert not {r["messages"][-1]["content"] for r in train} & set(held_q)  # and never trained on
    assert build_splits("chain_sum", cfg, 60, 20, seed=0, system_prompt="default") == (train, heldout)
    other_train, other_heldout = build_splits("chain_sum", cfg, 60, 20, seed=1, system_prompt="default")
    assert other_heldout != heldout and other_train != train


def test_row_layout_and_json_round_trip():
    train, heldout = build_splits("leg_counting", {"max_animals": 3}, 4, 2, seed=0, system_prompt="default")
    row = heldout[0]
    assert row["messages"][0] == {"role": "system", "content": SYSTEM_PROMPTS["default"]}
    assert row["messages"][-1]["role"] == "user" and row["messages"][-1]["content"] == row["gym"]["entry"]["question"]
    assert row["answer"] == row["gym"]["entry"]["answer"]
    assert row["gym"]["name"] == "leg_counting" and row["gym"]["config"] == {"max_animals": 3}
    assert json.loads(json.dumps(train + heldout)) == train + heldout  # rows can go to .jsonl and back


def test_system_prompt_choices():
    none = build_splits("chain_sum", {}, 1, 1, seed=0, system_prompt=None)[1][0]
    named = build_splits("chain_sum", {}, 1, 1, seed=0, system_prompt="DeepSeekZero")[1][0]
    custom = build_splits("chain_sum", {}, 1, 1, seed=0, system_prompt="Be brief.")[1][0]
    assert [m["role"] for m in none["messages"]] == ["user"]
    assert named["messages"][0]["content"] == SYSTEM_PROMPTS["DeepSeekZero"]
    assert custom["messages"][0]["content"] == "Be brief."


@pytest.mark.parametrize("name", DATASETS)
def test_gold_answer_in_tags_scores_one(name):
    _, heldout = build_splits(name, {}, 2, 3, seed=0, system_prompt="default")
    for row in heldout:
        reward, info = score(tagged(row["answer"]), row)
        assert reward == 1.0, (name, row["answer"], info)
        assert info == {"extracted": row["answer"], "tagged": True, "score": 1.0}


@pytest.mark.parametrize("name", DATASETS)
def test_wrong_answer_scores_below_one(name):
    row = build_splits(name, {}, 1, 1, seed=0, system_prompt="default")[1][0]
    assert score(tagged("zzz"), row)[0] == 0.0
    # a near miss may earn the dataset's partial credit, never full credit: for numeric
    # datasets "<gold>9" has the gold as a substring, credit len(gold) / len(answer) < 1
    assert score(tagged(row["answer"] + "9"), row)[0] < 1.0


def test_untagged_completion_fallback_and_strict():
    row = build_splits("basic_arithmetic", {}, 1, 1, seed=0, system_prompt="default")[1][0]
    gold = row["answer"]
    reward, info = score(f"  {gold}\n", row)  # no tags: the whole stripped completion is the answer
    assert reward == 1.0 and info["tagged"] is False and info["extracted"] == gold
    assert score_strict(f"  {gold}\n", row) == (0.0, {"extracted": None, "tagged": False, "score": 0.0})
    # the last <answer> block wins, as in reasoning_gym.utils.extract_answer
    assert score(f"<answer>zzz</answer> <answer>{gold}</answer>", row)[0] == 1.0


def test_arc_grid_survives_the_json_round_trip():
    # ARC scorers compare the parsed board with metadata["output"] as a tuple of tuples; the
    # JSON-safe row holds lists, which _RESTORE turns back (else the gold would score 0.05).
    row = build_splits("arc_agi", {}, 1, 1, seed=0, system_prompt=None)[1][0]
    row = json.loads(json.dumps(row))
    assert score(tagged(row["answer"]), row)[0] == 1.0


def test_upstream_reward_holes_are_closed():
    halting = build_splits("game_of_life_halting", {}, 1, 1, seed=0, system_prompt=None)[1][0]
    wrong = "False" if halting["answer"] == "True" else "True"
    assert score(tagged(halting["answer"]), halting)[0] == 1.0
    assert score(tagged(wrong), halting)[0] == 0.0  # upstream: bool("False") is True -> 1.0

    p24 = build_splits("puzzle24", {}, 1, 1, seed=0, system_prompt=None)[1][0]
    assert score(tagged(p24["answer"]), p24)[0] == 1.0
    assert sorted(p24["gym"]["entry"]["metadata"]["numbers"]) != [1, 2, 3, 4]
    assert score(tagged("1*2*3*4"), p24)[0] < 1.0  # upstream: 24 from any four numbers -> 1.0

    coin = build_splits("coin_flip", {}, 1, 1, seed=0, system_prompt=None)[1][0]
    assert score(tagged(coin["answer"]), coin)[0] == 1.0
    assert score(tagged("0"), coin)[0] == 0.0  # upstream: a prefix of the gold -> 1.0


def test_a_scorer_that_raises_scores_zero():
    row = build_splits("prime_factorization", {}, 1, 1, seed=0, system_prompt=None)[1][0]
    reward, info = score(tagged("not a number"), row)
    assert reward == 0.0 and "ValueError" in info["scorer_error"]


def test_unknown_dataset_name_is_named_with_suggestions():
    with pytest.raises(ValueError, match=r"unknown reasoning-gym dataset 'basic_arithmetc'.*'basic_arithmetic'"):
        build_splits("basic_arithmetc", {}, 1, 1, seed=0, system_prompt=None)


def test_bad_config_key_is_named_with_the_valid_ones():
    with pytest.raises(ValueError, match=r"'chain_sum' has no config key 'max_term'.*max_terms"):
        build_splits("chain_sum", {"max_term": 3}, 1, 1, seed=0, system_prompt=None)
    with pytest.raises(ValueError, match=r"'seed' is set by build_splits"):
        build_splits("chain_sum", {"seed": 3}, 1, 1, seed=0, system_prompt=None)
    with pytest.raises(ValueError, match="rejected the config"):  # a valid key with a bad value
        build_splits("chain_sum", {"min_terms": 5, "max_terms": 2}, 1, 1, seed=0, system_prompt=None)


def test_too_small_a_question_space_fails_loudly():
    # leg_counting with one animal of one instance: far fewer than 200 distinct questions
    cfg = {"min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 1}
    with pytest.raises(ValueError, match="distinct held-out questions"):
        build_splits("leg_counting", cfg, 10, 200, seed=0, system_prompt=None)
