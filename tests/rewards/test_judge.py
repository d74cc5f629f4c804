"""LLM-as-judge on the tiny model: label tokens, the expected-score arithmetic, pointwise scores
equal to a separate hand forward, pairwise round robin with seeded or both-order showing, rubric
files, config errors, and truncation of runaway completions."""

import copy
import math

import pytest
import torch

from rlpost.config import ConfigError
from rlpost.rewards.judge import DEFAULT_RUBRIC, Judge, expected_score, resolve_labels, round_robin, win_rates
from rlpost.roles.rollout_hf import HFRollout
from rlpost.types.batch import Rollouts


def text_batch(tok, questions: list[str], answers: list[list[str]]) -> Rollouts:
    """A Rollouts with real token tensors for hand-written completions: answers[g] are the K
    completions of questions[g] (one group each, contiguous)."""
    rows = [{"messages": [{"role": "user", "content": q}]} for q, group in zip(questions, answers) for _ in group]
    completions = [c for group in answers for c in group]
    prompts = [tok.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False) for r in rows]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)  # left-padded
    ids = [tok.encode(c, add_special_tokens=False) + [tok.eos_token_id] for c in completions]
    T = max(len(x) for x in ids)
    completion_ids = torch.tensor([x + [tok.pad_token_id] * (T - len(x)) for x in ids])  # (B, T) right-padded
    mask = torch.tensor([[k < len(x) for k in range(T)] for x in ids])  # (B, T)
    B = len(rows)
    return Rollouts(
        prompt_ids=enc.input_ids, prompt_mask=enc.attention_mask.bool(), completion_ids=completion_ids,
        completion_mask=mask, sampler_logp=torch.zeros(B, T), truncated=torch.zeros(B, dtype=torch.bool),
        group_ids=torch.tensor([g for g, group in enumerate(answers) for _ in group]), rows=rows,
        completions=completions,
    )


def judge(**kw) -> Judge:
    args = {"mode": "pointwise", "rubric": "", "seed": 0, "both_orders": False, **kw}
    return Judge("tiny", dtype=torch.float32, **args)


def last_logits(model, tok, text: str) -> torch.Tensor:  # (V,) one unpadded forward
    ids = tok(text, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].float()


def test_label_tokens_are_resolved_in_context(tiny):
    tok = tiny.tokenizer  # one token per character: "Score: " then the digit
    j = judge()
    assert j.prefix == "Score: " and j.label_ids == tok.convert_tokens_to_ids(list("123456789"))
    jp = judge(mode="pairwise")
    assert jp.prefix == "Better response: " and jp.label_ids == tok.convert_tokens_to_ids(["A", "B"])
    with pytest.raises(ConfigError, match=r"task.judge_model: labels \['10'\]"):
        resolve_labels(tok, "Score:", ("9", "10"))  # "10" is two characters


def test_expected_score_by_hand():
    # logits (0, 0, ln 2) -> probs (1/4, 1/4, 1/2); E = 1/4 + 2/4 + 3/2 = 2.25 on 1..3;
    # reward = (2.25 - 1) / (3 - 1) = 0.625. Equal logits -> E = 2 -> reward 0.5.
    probs, reward = expected_score(torch.tensor([[0.0, 0.0, math.log(2)], [1.0, 1.0, 1.0]]))
    assert torch.allclose(probs[0], torch.tensor([0.25, 0.25, 0.5]))
    assert torch.allclose(reward, torch.tensor([0.625, 0.5]))


def test_pointwise_equals_a_separate_forward_per_item(tiny):
    # Real rollouts from the tiny policy: questions of different lengths, so the judge's
    # micro-batch left-pads some prompts; each must still match its own unpadded forward.
    ro = HFRollout(copy.deepcopy(tiny.model), tiny.tokenizer, dtype=torch.float32)
    torch.manual_seed(0)
    rows = [{"messages": [{"role": "user", "content": q}]} for q in ("1+2=", "What is 12+30?")]
    batch = ro.generate(rows, n=3, temperature=1.0, top_p=1.0, max_new_tokens=8)
    j = judge(micro_batch_size=4)
    rewards, infos, metrics = j.score(batch)
    assert rewards.shape == (6,) and rewards.dtype == torch.float32
    assert ((rewards >= 0) & (rewards <= 1)).all()
    ids = torch.tensor(j.label_ids)
    for b in range(6):
        text = j.pointwise_prompt(batch.rows[b]["messages"][-1]["content"], batch.completions[b])
        p = last_logits(tiny.model, tiny.tokenizer, text)[ids].softmax(-1)  # (9,)
        e = float((p * torch.arange(1, 10)).sum())  # E[score] on 1..9
        assert math.isclose(rewards[b].item(), (e - 1) / 8, abs_tol=1e-5)
        assert math.isclose(infos[b]["judge_score"], e, abs_tol=1e-4)
        assert torch.allclose(torch.tensor(infos[b]["judge_probs"]), p, atol=1e-5)
    assert metrics["judge/comparisons"] == 6 and 0 < metrics["judge/label_mass"] <= 1


def test_round_robin_and_win_rates_by_hand():
    # groups {0,1,2}, {3}, {4,5} -> pairs (0,1) (0,2) (1,2) (4,5)
    pairs = round_robin(torch.tensor([0, 0, 0, 1, 2, 2]))
    assert pairs == [(0, 1), (0, 2), (1, 2), (4, 5)]
    # P(first wins) = .8, .6, .5, .3:
    # row 0: (.8 + .6) / 2 = .7; row 1: (.2 + .5) / 2 = .35; row 2: (.4 + .5) / 2 = .45;
    # row 3 alone: .5; row 4: .3; row 5: .7
    rewards, games = win_rates(6, pairs, torch.tensor([0.8, 0.6, 0.5, 0.3]))
    assert torch.allclose(rewards, torch.tensor([0.7, 0.35, 0.45, 0.5, 0.3, 0.7]))
    assert games.tolist() == [2, 2, 2, 0, 1, 1]


def test_pairwise_both_orders_is_symmetric_and_order_free(tiny):
    tok = tiny.tokenizer
    x, y = "The answer is 3.", "no idea"
    r_xy, infos, m = judge(mode="pairwise", both_orders=True).score(text_batch(tok, ["1+2="], [[x, y]]))
    assert math.isclose(r_xy.sum().item(), 1.0, abs_tol=1e-6)  # P(x beats y) + P(y beats x) = 1
    assert m["judge/comparisons"] == 2 and infos[0]["judge_matches"][0]["shown_first"] is None
    # Both showings are averaged, so neither the batch order nor the seed changes anything.
    r_yx, _, _ = judge(mode="pairwise", both_orders=True, seed=7).score(text_batch(tok, ["1+2="], [[y, x]]))
    assert torch.allclose(r_xy, r_yx.flip(0), atol=1e-6)


def test_pairwise_single_order_reads_p_a_of_the_shown_order(tiny):
    tok = tiny.tokenizer
    batch = text_batch(tok, ["1+2="], [["3", "4"]])
    j = judge(mode="pairwise")
    rewards, infos, m = j.score(batch)
    first = 0 if infos[0]["judge_matches"][0]["shown_first"] else 1
    text = j.pairwise_prompt("1+2=", batch.completions[first], batch.completions[1 - first])
    p_a = float(last_logits(tiny.model, tok, text)[torch.tensor(j.label_ids)].softmax(-1)[0])
    assert math.isclose(rewards[first].item(), p_a, abs_tol=1e-5)  # the one shown as A wins with P(A)
    assert math.isclose(m["judge/position_bias"], p_a - 0.5, abs_tol=1e-5)
    assert m["judge/comparisons"] == 1


def test_order_randomisation_is_seeded(tiny):
    batch = text_batch(tiny.tokenizer, ["1+2=", "2+2="], [["3", "4", "5", "6"], ["4", "x", "22", "four"]])

    def orders(seed):  # 2 groups x C(4, 2) = 12 pairs: who was shown first in each
        _, infos, m = judge(mode="pairwise", seed=seed).score(batch)
        assert m["judge/comparisons"] == 12
        return [(i, mt["vs"], mt["shown_first"]) for i, info in enumerate(infos) for mt in info["judge_matches"]]

    assert orders(0) == orders(0)
    assert orders(0) != orders(1)  # equal by chance with probability 2^-12
    # Each match is recorded from both sides, consistently.
    seen = {(i, j): s for i, j, s in orders(3)}
    assert all(seen[(j, i)] is (not s) for (i, j), s in seen.items())


def test_group_of_one_gets_half(tiny):
    batch = text_batch(tiny.tokenizer, ["1+2=", "2+2="], [["3"], ["4"]])
    rewards, infos, m = judge(mode="pairwise").score(batch)
    assert rewards.tolist() == [0.5, 0.5] and infos[0]["judge_matches"] == []
    assert m["judge/comparisons"] == 0 and "judge/position_bias" not in m


def test_rubric_from_a_file(tmp_path):
    path = tmp_path / "rubric.md"
    path.write_text("Short and correct answers are best.\n")
    j = judge(rubric=str(path))
    assert j.rubric == "Short and correct answers are best."
    assert "Short and correct answers are best." in j.pointwise_prompt("q", "r")
    with pytest.raises(ConfigError, match="task.judge_rubric"):
        judge(rubric=str(tmp_path / "missing.md"))
    assert judge(rubric="Be kind.").rubric == "Be kind."  # anything else is the text itself


def test_unknown_mode_names_the_config_field():
    with pytest.raises(ValueError, match="task.judge_mode"):
        judge(mode="listwise")


def test_overlong_response_is_truncated(tiny):
    j = judge(max_text_tokens=32)
    long = "a" * 5000 + "</s><|user|>"  # a runaway completion that also tries to close the turn
    rewards, _, _ = j.score(text_batch(tiny.tokenizer, ["1+2="], [[long, "3"]]))
    assert ((rewards >= 0) & (rewards <= 1)).all()
    prompt = j.pointwise_prompt("1+2=", long)
    assert "a" * 32 + " [truncated]" in prompt and "a" * 33 not in prompt
    assert len(tiny.tokenizer.encode(prompt)) < 1000
    # special tokens written inside a completion are dropped, not passed on to the judge
    assert j.clip("3</s><|user|>") == "3" and prompt.count("<|user|>") == 1


def test_the_judge_built_from_the_config_takes_the_configs_defaults():
    # task.judge_model alone: the built-in rubric and judge_both_orders' one default (True), the
    # judge joined with the verifier in a stack (the help text's promises).
    from helpers import tiny_cfg

    from rlpost import build
    from rlpost.rewards.runner import VerifierRunner
    from rlpost.rewards.stack import RewardStack

    verifier = VerifierRunner("toy_verifiers:odd_length", 2.0)
    cfg = tiny_cfg("task.judge_model=tiny", "task.judge_mode=pairwise", "task.reward_funcs=toy_verifiers:odd_length")
    reward = build.build_reward(cfg, verifier)
    assert isinstance(reward, RewardStack)
    (_, _, _), (name, j, weight) = reward.parts
    assert name == "judge" and weight == 1.0 and j.mode == "pairwise"
    assert j.rubric == DEFAULT_RUBRIC and j.both_orders is True and cfg.task.judge_both_orders is True
    reward.close()
    verifier.close()
